//! Scopes: typed, path-shaped names of resources, and when two of them overlap.
//!
//! A scope is written `type:path`, for example `fs:/repo/src/app.py`, `stripe:charge:ch_1`,
//! `github:repo:org/name` or `db:tpcc:stock:w=1:i=42:s_quantity`. **Any well-formed
//! `type:path` is a scope**: nobody has to register its type first. Every scope is
//! canonicalised before the engine uses it, by its type's rule: the rule registered for the
//! type in the engine's [`ScopeRegistry`], or else the default rule. Registering a type only
//! changes how its scopes are canonicalised.
//!
//! # The rules
//!
//! **Type.** Everything before the first `:`: 1–64 ASCII letters, digits, `_` or `-`,
//! compared case-insensitively (the canonical type is lowercase: `Stripe:x` is `stripe:x`).
//!
//! **Default rule** (every type without a registered rule): [`PathStyle::Colon`],
//! [`CaseRule::Sensitive`]. The built-in rules of [`ScopeRegistry::default`] are `fs`
//! (Posix, case-sensitive), and `mail` and `db` (Colon, case-insensitive: mailboxes and SQL
//! identifiers).
//!
//! | style   | separator | canonicalisation                                                    |
//! |---------|-----------|---------------------------------------------------------------------|
//! | `Colon` | `:`       | empty segments (a leading, doubled or trailing `:`) are dropped; every other character, `/`, `\`, `.` included, belongs to its segment, and `.`/`..` segments are ordinary names (nothing is resolved) |
//! | `Posix` | `/`       | absolute (must start with `/`); `\` is read as `/`; empty segments (doubled or trailing `/`) and `.` are dropped; `..` removes the previous segment and is refused above the root |
//!
//! So under the default rule `github:repo:org/name` has the two segments `repo` and
//! `org/name` (write `github:repo:org:name` if the organisation should be a parent of its
//! repositories), and `web:https://a.io/x/` keeps its trailing `/`: the adapter chooses the
//! spelling, and one adapter should use one spelling per resource.
//!
//! In both styles whitespace around each segment (and around the whole text) is trimmed;
//! control characters are refused. With [`CaseRule::Insensitive`] the path is lowercased
//! (Unicode lowercase). A canonical text always parses back to itself.
//!
//! **Wildcard.** A segment that is exactly `*` is a declared wildcard: it matches any one
//! segment. `*` inside a segment (`W*`) is an ordinary character.
//!
//! **Overlap.** Two scopes overlap iff they have the same type and, segment by segment over
//! the shorter of the two, every pair of segments is equal or one of them is `*`. So
//! `fs:/a/b` overlaps `fs:/a/b/c` (segment prefix) but not `fs:/a/bc` (a string prefix only),
//! and `stripe:charge` overlaps `stripe:charge:ch_1` but not `stripe:charges:ch_1`.
//!
//! **Limits.** The text as given, and its canonical form, are each at most
//! [`MAX_SCOPE_BYTES`] bytes, and the canonical path has at most [`MAX_SCOPE_SEGMENTS`]
//! segments. A longer or deeper scope is refused with [`ScopeError::TooLong`] or
//! [`ScopeError::TooDeep`], naming the scope (its first [`SHOWN_CHARS`] characters), its
//! size and the limit.

use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// How a scope type separates and normalises its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PathStyle {
    /// `/`-separated absolute paths with `.`/`..` resolution (filesystems, URLs' paths).
    Posix,
    /// `:`-separated segments (entities, rows, columns, mailboxes).
    Colon,
}

impl PathStyle {
    fn separator(self) -> char {
        match self {
            PathStyle::Posix => '/',
            PathStyle::Colon => ':',
        }
    }
}

/// Whether a scope type's paths compare case-sensitively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CaseRule {
    /// `A` and `a` name different resources (POSIX files, order ids).
    Sensitive,
    /// `A` and `a` name the same resource; canonical form is lowercase (SQL identifiers, mail).
    Insensitive,
}

/// The canonicalisation rule of one scope type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeRule {
    /// Separator and normalisation.
    pub style: PathStyle,
    /// Case rule.
    pub case: CaseRule,
}

/// The longest scope accepted, in bytes (of the text as given and of its canonical form).
pub const MAX_SCOPE_BYTES: usize = 4096;

/// The most segments a canonical scope path may have.
pub const MAX_SCOPE_SEGMENTS: usize = 256;

/// How many characters of an over-long scope an error shows.
pub const SHOWN_CHARS: usize = 64;

impl ScopeRule {
    /// The rule of every type nobody registered: `:`-separated, case-sensitive.
    pub const DEFAULT: ScopeRule = ScopeRule { style: PathStyle::Colon, case: CaseRule::Sensitive };
}

impl Default for ScopeRule {
    fn default() -> Self {
        ScopeRule::DEFAULT
    }
}

/// The canonicalisation rules of an engine's scope types. Every well-formed type is
/// accepted; a type with no registered rule gets [`ScopeRule::DEFAULT`].
///
/// [`ScopeRegistry::default`] has the built-in rules of `fs` (Posix, case-sensitive), `mail`
/// and `db` (Colon, case-insensitive). [`ScopeRegistry::empty`] has none.
#[derive(Debug, Clone)]
pub struct ScopeRegistry {
    rules: HashMap<Box<str>, ScopeRule>,
}

impl Default for ScopeRegistry {
    fn default() -> Self {
        let mut reg = ScopeRegistry::empty();
        reg.rules.insert("fs".into(), ScopeRule { style: PathStyle::Posix, case: CaseRule::Sensitive });
        reg.rules.insert("db".into(), ScopeRule { style: PathStyle::Colon, case: CaseRule::Insensitive });
        reg.rules.insert("mail".into(), ScopeRule { style: PathStyle::Colon, case: CaseRule::Insensitive });
        reg
    }
}

impl ScopeRegistry {
    /// A registry without built-in rules: every type gets [`ScopeRule::DEFAULT`] until
    /// registered.
    pub fn empty() -> Self {
        ScopeRegistry { rules: HashMap::default() }
    }

    /// Registers (or replaces) the rule of a scope type. The name must be 1-64 lowercase ASCII
    /// letters, digits, `_` or `-`. Only how the type's scopes are canonicalised changes.
    pub fn register(&mut self, name: &str, rule: ScopeRule) -> Result<(), ScopeError> {
        if !valid_type_name(name) || name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ScopeError::BadType { scope: name.to_owned() });
        }
        self.rules.insert(name.into(), rule);
        Ok(())
    }

    /// The rule registered for a type, if any (see [`ScopeRegistry::rule_of`]).
    pub fn rule(&self, kind: &str) -> Option<ScopeRule> {
        self.rules.get(kind).copied()
    }

    /// The rule a type's scopes are canonicalised by: the registered one, else the default.
    pub fn rule_of(&self, kind: &str) -> ScopeRule {
        self.rule(kind).unwrap_or(ScopeRule::DEFAULT)
    }

    /// The types with a registered rule, sorted.
    pub fn registered(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.rules.keys().map(|k| &**k).collect();
        v.sort_unstable();
        v
    }

    /// Canonicalises `text` into a [`Scope`], or says precisely why it cannot (see the module
    /// docs for the rules and the limits).
    pub fn parse(&self, text: &str) -> Result<Scope, ScopeError> {
        if text.len() > MAX_SCOPE_BYTES {
            return Err(ScopeError::TooLong { scope: shown(text), bytes: text.len(), limit: MAX_SCOPE_BYTES });
        }
        let scope = self.canonicalise(text)?;
        if scope.text.len() > MAX_SCOPE_BYTES {
            return Err(ScopeError::TooLong { scope: shown(text), bytes: scope.text.len(), limit: MAX_SCOPE_BYTES });
        }
        Ok(scope)
    }

    /// [`ScopeRegistry::parse`] without the size limits, for scopes already recorded in a
    /// ledger (written before the limits existed): what was accepted once still replays.
    pub fn parse_logged(&self, text: &str) -> Result<Scope, ScopeError> {
        self.canonicalise_with(text, usize::MAX)
    }

    fn canonicalise(&self, text: &str) -> Result<Scope, ScopeError> {
        self.canonicalise_with(text, MAX_SCOPE_SEGMENTS)
    }

    fn canonicalise_with(&self, text: &str, max_segments: usize) -> Result<Scope, ScopeError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(ScopeError::Empty);
        }
        if let Some(c) = trimmed.chars().find(|c| c.is_control()) {
            return Err(ScopeError::ControlChar { scope: text.to_owned(), ch: c });
        }
        let Some((kind_raw, path)) = trimmed.split_once(':') else {
            return Err(ScopeError::MissingType { scope: text.to_owned() });
        };
        if !valid_type_name(kind_raw) {
            return Err(ScopeError::BadType { scope: text.to_owned() });
        }
        // The canonical text is built in the thread's scratch buffer and copied once into its
        // `Arc` (crate::text); the type is lowercased straight into it.
        let build = |out: &mut String| -> Result<(usize, ScopeRule), ScopeError> {
            out.extend(kind_raw.bytes().map(|b| char::from(b.to_ascii_lowercase())));
            let rule = self.rule_of(out);
            out.push(':');
            let kind_len = out.len();
            // A Posix path with `\` read as `/` (declared before `segments`, which borrow it).
            let normalised: String;
            let mut segments: SmallVec<[&str; 8]> = SmallVec::new();
            match rule.style {
                PathStyle::Posix => {
                    let path = if path.contains('\\') {
                        normalised = path.replace('\\', "/");
                        normalised.as_str()
                    } else {
                        path
                    };
                    if !path.starts_with('/') {
                        return Err(ScopeError::NotAbsolute { scope: text.to_owned() });
                    }
                    for seg in path.split('/').map(str::trim) {
                        match seg {
                            "" | "." => {}
                            ".." => {
                                if segments.pop().is_none() {
                                    return Err(ScopeError::AboveRoot { scope: text.to_owned() });
                                }
                            }
                            s => segments.push(s),
                        }
                    }
                    if segments.len() > max_segments {
                        return Err(too_deep(text, segments.len(), max_segments));
                    }
                    out.push('/');
                    push_joined(out, &segments, '/', rule.case);
                }
                PathStyle::Colon => {
                    segments.extend(path.split(':').filter(|s| !s.trim().is_empty()).map(str::trim));
                    if segments.is_empty() {
                        return Err(ScopeError::EmptyPath { scope: text.to_owned() });
                    }
                    if segments.len() > max_segments {
                        return Err(too_deep(text, segments.len(), max_segments));
                    }
                    push_joined(out, &segments, ':', rule.case);
                }
            }
            Ok((kind_len, rule))
        };
        let (text, (kind_len, rule)) = crate::text::shared(trimmed.len() + 1, build)?;
        let segs_start = match rule.style {
            PathStyle::Posix => kind_len + 1,
            PathStyle::Colon => kind_len,
        };
        Ok(Scope { text, kind_len: kind_len as u32, segs_start: segs_start as u32, style: rule.style })
    }
}

fn too_deep(text: &str, segments: usize, limit: usize) -> ScopeError {
    ScopeError::TooDeep { scope: shown(text), segments, limit }
}

/// The first [`SHOWN_CHARS`] characters of `text`, with `…` if there were more.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

fn valid_type_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn push_joined(out: &mut String, segments: &[&str], sep: char, case: CaseRule) {
    for (i, seg) in segments.iter().enumerate() {
        if i > 0 {
            out.push(sep);
        }
        match case {
            CaseRule::Sensitive => out.push_str(seg),
            CaseRule::Insensitive => out.extend(seg.chars().flat_map(char::to_lowercase)),
        }
    }
}

/// A canonical scope. Cheap to clone (one reference count).
///
/// Equality, ordering and hashing are on the canonical text, so two spellings of one resource
/// are equal once parsed.
#[derive(Clone)]
pub struct Scope {
    text: Arc<str>,
    kind_len: u32,
    segs_start: u32,
    style: PathStyle,
}

impl Scope {
    /// The canonical text, `type:path`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The canonical text as a shared string (no copy).
    pub fn as_arc(&self) -> Arc<str> {
        self.text.clone()
    }

    /// The scope type, e.g. `fs`.
    pub fn kind(&self) -> &str {
        &self.text[..self.kind_len as usize - 1]
    }

    /// The canonical path after `type:`.
    pub fn path(&self) -> &str {
        &self.text[self.kind_len as usize..]
    }

    /// The path's segments (none for the Posix root `fs:/`).
    pub fn segments(&self) -> impl Iterator<Item = &str> + Clone {
        let rest = &self.text[self.segs_start as usize..];
        let sep = self.style.separator();
        rest.split(sep).filter(|s| !s.is_empty())
    }

    /// Whether any segment is the declared wildcard `*`.
    pub fn has_wildcard(&self) -> bool {
        self.segments().any(|s| s == "*")
    }

    /// Whether the two scopes can name a common resource (see the module docs).
    pub fn overlaps(&self, other: &Scope) -> bool {
        if Arc::ptr_eq(&self.text, &other.text) {
            return true;
        }
        self.kind() == other.kind()
            && self.segments().zip(other.segments()).all(|(a, b)| a == b || a == "*" || b == "*")
    }

    /// Whether every resource `inner` can name is also named by `self`: `self` is a segment
    /// prefix of `inner`, with `*` in `self` matching any segment (a `*` in `inner` is covered
    /// only by a `*` in `self`). Used to enforce declared may-touch sets.
    pub fn covers(&self, inner: &Scope) -> bool {
        if self.kind() != inner.kind() {
            return false;
        }
        let mut mine = self.segments();
        let mut theirs = inner.segments();
        loop {
            match (mine.next(), theirs.next()) {
                (None, _) => return true,
                (Some(_), None) => return false,
                (Some(a), Some(b)) => {
                    if a != "*" && a != b {
                        return false;
                    }
                }
            }
        }
    }
}

impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}
impl Eq for Scope {}
impl std::hash::Hash for Scope {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}
impl PartialOrd for Scope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scope {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({})", self.text)
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Why a scope was refused. Every variant names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope was empty or only whitespace.
    #[error("scope is empty; expected `type:path`, e.g. `fs:/repo/app.py`")]
    Empty,
    /// No `type:` prefix.
    #[error("scope `{scope}` has no type; expected `type:path`, e.g. `stripe:charge:ch_1`")]
    MissingType {
        /// The text given.
        scope: String,
    },
    /// The type is not `[A-Za-z0-9_-]{1,64}`.
    #[error(
        "scope `{scope}` has a malformed type; expected 1-64 ASCII letters, digits, `_` or `-` before the first `:`"
    )]
    BadType {
        /// The text given.
        scope: String,
    },
    /// A Posix path that does not start with `/`.
    #[error("scope `{scope}` is not absolute; expected a path starting with `/`")]
    NotAbsolute {
        /// The text given.
        scope: String,
    },
    /// `..` climbing above the root.
    #[error("scope `{scope}` climbs above the root with `..`")]
    AboveRoot {
        /// The text given.
        scope: String,
    },
    /// A Colon path with no segment.
    #[error("scope `{scope}` has an empty path; expected at least one segment after the type")]
    EmptyPath {
        /// The text given.
        scope: String,
    },
    /// A control character in the text.
    #[error("scope `{scope}` contains the control character {ch:?}")]
    ControlChar {
        /// The text given.
        scope: String,
        /// The character.
        ch: char,
    },
    /// The text, or its canonical form, is longer than [`MAX_SCOPE_BYTES`].
    #[error("scope `{scope}` is {bytes} bytes long; the limit is {limit} bytes")]
    TooLong {
        /// The text given, cut to its first [`SHOWN_CHARS`] characters.
        scope: String,
        /// Its length in bytes.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The canonical path has more than [`MAX_SCOPE_SEGMENTS`] segments.
    #[error("scope `{scope}` has {segments} segments; the limit is {limit}")]
    TooDeep {
        /// The text given, cut to its first [`SHOWN_CHARS`] characters.
        scope: String,
        /// How many segments its canonical path has.
        segments: usize,
        /// The limit.
        limit: usize,
    },
}
