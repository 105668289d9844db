//! Scopes: typed, path-shaped names of resources, and when two of them overlap.
//!
//! A scope is written `type:path`, for example `fs:/repo/src/app.py`, `retail:order:W123` or
//! `db:tpcc:stock:w=1:i=42:s_quantity`. Every scope is canonicalised before the engine uses it,
//! by the rules its type declares in a [`ScopeRegistry`]:
//!
//! | style   | separator | canonicalisation                                                    |
//! |---------|-----------|---------------------------------------------------------------------|
//! | `Posix` | `/`       | absolute; `\` becomes `/`; duplicate separators, `.` and a trailing `/` are dropped; `..` removes the previous segment (never above the root) |
//! | `Colon` | `:`       | empty segments (duplicate or trailing `:`) are dropped                |
//!
//! In both styles whitespace around each segment is trimmed, so a canonical text always
//! parses back to itself.
//!
//! Each type is case-sensitive or case-insensitive (insensitive paths are lowercased). A segment
//! that is exactly `*` is a declared wildcard: it matches any one segment.
//!
//! Two scopes **overlap** iff they have the same type and, segment by segment over the shorter
//! of the two, every pair of segments is equal or one of them is `*`. So `fs:/a/b` overlaps
//! `fs:/a/b/c` (segment prefix) but not `fs:/a/bc` (a string prefix only).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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

/// The scope types an engine accepts, with their rules. Unknown types are refused.
///
/// The default registry knows `fs` (Posix, case-sensitive), `db` and `mail` (Colon,
/// case-insensitive), and `kv`, `retail`, `travel`, `web`, `ui`, `bench` (Colon, case-sensitive).
#[derive(Debug, Clone)]
pub struct ScopeRegistry {
    rules: HashMap<Box<str>, ScopeRule>,
}

impl Default for ScopeRegistry {
    fn default() -> Self {
        let mut reg = ScopeRegistry { rules: HashMap::new() };
        let posix = |case| ScopeRule { style: PathStyle::Posix, case };
        let colon = |case| ScopeRule { style: PathStyle::Colon, case };
        reg.rules.insert("fs".into(), posix(CaseRule::Sensitive));
        reg.rules.insert("db".into(), colon(CaseRule::Insensitive));
        reg.rules.insert("mail".into(), colon(CaseRule::Insensitive));
        for name in ["kv", "retail", "travel", "web", "ui", "bench"] {
            reg.rules.insert(name.into(), colon(CaseRule::Sensitive));
        }
        reg
    }
}

impl ScopeRegistry {
    /// An empty registry (no type is accepted until registered).
    pub fn empty() -> Self {
        ScopeRegistry { rules: HashMap::new() }
    }

    /// Registers (or replaces) a scope type. The name must be lowercase ASCII letters, digits,
    /// `_` or `-`.
    pub fn register(&mut self, name: &str, rule: ScopeRule) -> Result<(), ScopeError> {
        if !valid_type_name(name) || name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ScopeError::BadType { scope: name.to_owned() });
        }
        self.rules.insert(name.into(), rule);
        Ok(())
    }

    /// The rule of a type, if registered.
    pub fn rule(&self, kind: &str) -> Option<ScopeRule> {
        self.rules.get(kind).copied()
    }

    /// Canonicalises `text` into a [`Scope`], or says precisely why it cannot.
    pub fn parse(&self, text: &str) -> Result<Scope, ScopeError> {
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
        let kind = kind_raw.to_ascii_lowercase();
        let Some(rule) = self.rules.get(kind.as_str()).copied() else {
            let mut known: Vec<&str> = self.rules.keys().map(|k| &**k).collect();
            known.sort_unstable();
            return Err(ScopeError::UnknownType { scope: text.to_owned(), kind, known: known.join(", ") });
        };
        let mut out = String::with_capacity(trimmed.len() + 1);
        out.push_str(&kind);
        out.push(':');
        let kind_len = out.len();
        let mut segments: Vec<&str> = Vec::new();
        match rule.style {
            PathStyle::Posix => {
                let normalised;
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
                out.push('/');
                push_joined(&mut out, &segments, '/', rule.case);
            }
            PathStyle::Colon => {
                segments.extend(path.split(':').filter(|s| !s.trim().is_empty()).map(str::trim));
                if segments.is_empty() {
                    return Err(ScopeError::EmptyPath { scope: text.to_owned() });
                }
                push_joined(&mut out, &segments, ':', rule.case);
            }
        }
        let segs_start = match rule.style {
            PathStyle::Posix => kind_len + 1,
            PathStyle::Colon => kind_len,
        };
        Ok(Scope { text: Arc::from(out), kind_len: kind_len as u32, segs_start: segs_start as u32, style: rule.style })
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
    #[error("scope `{scope}` has no type; expected `type:path`, e.g. `retail:order:W1`")]
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
    /// The type is not registered.
    #[error("scope `{scope}` has unknown type `{kind}`; known types: {known}")]
    UnknownType {
        /// The text given.
        scope: String,
        /// The type found.
        kind: String,
        /// The registered types, comma-separated.
        known: String,
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
}
