//! Checkpoints: the replayed projections at one LSN, so that reopening replays only the events
//! after it instead of the whole ledger.
//!
//! A checkpoint is *the state replay reaches* after the events `1..=lsn`, not a copy of a live
//! engine: [`Replay`] applies events exactly as [`Core::recover`] does and encodes what it holds
//! at an LSN boundary. So, by construction,
//!
//! ```text
//!   Replay::load(checkpoint(1..=l)) + apply(l+1..=n)  ==  Replay::new() + apply(1..=n)
//! ```
//!
//! and the crash classification ([`Replay::finish`]) that follows is the same either way.
//! Unfinished transactions, in-doubt calls and interrupted settlements are part of the replayed
//! state, so a transaction that spans the checkpoint is handled like any other. A live engine's
//! state is not replay state (renewed leases, waiting sets, running late compensations are not
//! in the ledger), which is why the runtime keeps a replaying shadow instead of encoding its
//! live engine.
//!
//! # Format (version [`CHECKPOINT_FORMAT_VERSION`])
//!
//! ```text
//!   tidegate-checkpoint {"format":2,"ledger_format":3,"lsn":N,"len":L,"blake3":"<64 hex>"}\n
//!   <L bytes: the engine state as JSON>
//! ```
//!
//! Format 1 is the same with an FNV-1a 64 checksum (`"fnv1a64":"<16 hex>"`); it is still read.
//! Format 2 changed only the checksum: FNV-1a takes one multiply per byte (about 0.7 GB/s),
//! and a reopen verified hundreds of megabytes with it; BLAKE3 runs several times faster and
//! was already a dependency (keys.rs).
//!
//! A checkpoint may carry *sections* after the state: opaque bytes another projection of the
//! same ledger stored at the same LSN (the plan executor's, docs/plans.md "Checkpoints"). The
//! header lists them (`"sections":[{"name":"plans","len":M,"blake3":"…"}]`, omitted when
//! there are none), each is checksummed, and [`Checkpoint::section`] returns them verified. A
//! build that predates sections finds more bytes than its header's `len` and replays the whole
//! ledger (never wrong, only slower). [`Checkpoint::parse`] verifies everything once, so the
//! state and the sections can then be decoded separately (the runtime decodes them on two
//! threads).
//!
//! The header is read first, so a checkpoint from a newer format is refused
//! ([`CheckpointError::NewerFormat`]) without decoding its state. The state's JSON is the
//! serde form of the engine's internal state (every field of `Core` and its transactions except
//! the configuration, the registry of scope types and the outboxes); scopes are stored as their
//! canonical text and re-parsed with the engine's registry on load. The checksum catches damage
//! that would still parse. Rule for changes: within a version
//! fields may only be added, with `#[serde(default)]`; anything else bumps the version, and an
//! older checkpoint that cannot be read is not an error but a full replay.

use std::cell::RefCell;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Core, CoreConfig, RecoverError, Recovery};
use crate::ids::Timestamp;
use crate::ledger::{Event, LEDGER_FORMAT_VERSION};
use crate::scope::{Scope, ScopeRegistry};

/// The checkpoint format this build writes and the newest it reads.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 2;

/// The oldest checkpoint format this build reads (format 1 differs only in its checksum).
const OLDEST_FORMAT_READ: u32 = 1;

const MAGIC: &[u8] = b"tidegate-checkpoint ";

/// Why a checkpoint cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Written by a newer build: refuse rather than guess (the ledger after it may be newer
    /// too).
    #[error(
        "checkpoint at LSN {lsn} has {what} {found}, newer than {supported}, the newest this build \
         reads; open the data directory with a newer tidegate"
    )]
    NewerFormat {
        /// The checkpoint's LSN.
        lsn: u64,
        /// Which version: `"format version"` (the checkpoint's) or `"ledger format version"`
        /// (the events it was built from).
        what: &'static str,
        /// Its format version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// Damaged or inconsistent: the caller replays the whole ledger instead (and says so).
    #[error("checkpoint at LSN {lsn} is unusable: {detail}")]
    Corrupt {
        /// The LSN the store gave for it.
        lsn: u64,
        /// What is wrong.
        detail: String,
    },
    /// The state could not be encoded.
    #[error("the engine state could not be encoded as a checkpoint: {detail}")]
    Encode {
        /// Why.
        detail: String,
    },
}

impl CheckpointError {
    /// Whether retrying may succeed (never: the bytes or the build must change).
    pub fn retryable(&self) -> bool {
        false
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    ledger_format: u32,
    lsn: u64,
    len: u64,
    /// Format 2: the BLAKE3 hash of the state, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blake3: Option<String>,
    /// Format 1: the FNV-1a 64 hash of the state, hex (read, no longer written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fnv1a64: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sections: Vec<SectionHeader>,
}

#[derive(Serialize, Deserialize)]
struct SectionHeader {
    name: String,
    len: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blake3: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fnv1a64: Option<String>,
}

/// A checkpoint's sections by name, in order.
type Sections<'a> = Vec<(String, &'a [u8])>;

/// A checkpoint whose header, lengths and checksums were verified: its engine state (not yet
/// decoded) and its sections. Verify once, then decode the parts, possibly on different
/// threads ([`Replay::from_checkpoint`], [`Checkpoint::section`]).
#[derive(Debug)]
pub struct Checkpoint<'a> {
    lsn: u64,
    state: &'a [u8],
    sections: Sections<'a>,
}

impl<'a> Checkpoint<'a> {
    /// Verifies the checkpoint `bytes` a store returned for `lsn`: a newer format is
    /// [`CheckpointError::NewerFormat`]; a wrong magic, header, length, checksum or LSN is
    /// [`CheckpointError::Corrupt`]. The state is decoded later, by [`Replay::from_checkpoint`].
    pub fn parse(lsn: u64, bytes: &'a [u8]) -> Result<Checkpoint<'a>, CheckpointError> {
        parse(lsn, bytes).map(|(state, sections)| Checkpoint { lsn, state, sections })
    }

    /// The LSN it was taken at.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// The bytes of the section `name`, if it has one.
    pub fn section(&self, name: &str) -> Option<&'a [u8]> {
        self.sections.iter().find(|(n, _)| n == name).map(|&(_, b)| b)
    }

    /// Every section, by name, in order.
    pub fn sections(&self) -> &[(String, &'a [u8])] {
        &self.sections
    }
}

/// The checksum `what` must carry in `format`, checked against `bytes`.
fn verify(format: u32, what: &str, blake: Option<&str>, fnv: Option<&str>, bytes: &[u8]) -> Result<(), String> {
    let (name, want, got) = match (format, blake, fnv) {
        (1, _, Some(want)) => ("fnv1a64", want, format!("{:016x}", fnv1a64(bytes))),
        (_, Some(want), _) if format >= 2 => ("blake3", want, blake3::hash(bytes).to_hex().to_string()),
        _ => {
            let field = if format == 1 { "fnv1a64" } else { "blake3" };
            return Err(format!("{what}: the header has no `{field}` checksum (format {format} requires one)"));
        }
    };
    if got == want { Ok(()) } else { Err(format!("{what}: {name} checksum {got} does not match the header's {want}")) }
}

/// The verified bytes after the header: the engine state, then each section.
fn parse(lsn: u64, bytes: &[u8]) -> Result<(&[u8], Sections<'_>), CheckpointError> {
    let corrupt = |detail: String| CheckpointError::Corrupt { lsn, detail };
    let rest =
        bytes.strip_prefix(MAGIC).ok_or_else(|| corrupt("it does not start with the checkpoint magic".into()))?;
    let nl =
        rest.iter().position(|&b| b == b'\n').ok_or_else(|| corrupt("its header line is not terminated".into()))?;
    let (head, body) = (&rest[..nl], &rest[nl + 1..]);
    let header: Header = serde_json::from_slice(head).map_err(|e| corrupt(format!("header: {e}")))?;
    if header.format > CHECKPOINT_FORMAT_VERSION {
        return Err(CheckpointError::NewerFormat {
            lsn,
            what: "format version",
            found: header.format,
            supported: CHECKPOINT_FORMAT_VERSION,
        });
    }
    if header.format < OLDEST_FORMAT_READ {
        return Err(corrupt(format!(
            "format version {} is older than {OLDEST_FORMAT_READ}, the oldest this build reads",
            header.format
        )));
    }
    if header.ledger_format > LEDGER_FORMAT_VERSION {
        // Regression (issue 11): this named the checkpoint's own versions ("format
        // version 1, newer than 1") instead of the ledger format's.
        return Err(CheckpointError::NewerFormat {
            lsn,
            what: "ledger format version",
            found: header.ledger_format,
            supported: LEDGER_FORMAT_VERSION,
        });
    }
    if header.lsn != lsn {
        return Err(corrupt(format!("its header says LSN {}, the store says {lsn}", header.lsn)));
    }
    let total = header.sections.iter().try_fold(header.len, |acc, s| acc.checked_add(s.len));
    if total != Some(body.len() as u64) {
        return Err(corrupt(format!(
            "it holds {} bytes after its header, the header says {} of state and {} in {} section(s)",
            body.len(),
            header.len,
            header.sections.iter().map(|s| s.len).fold(0u64, u64::saturating_add),
            header.sections.len()
        )));
    }
    let len = usize::try_from(header.len).map_err(|_| corrupt("state length".into()))?;
    let (state, mut rest) = body.split_at(len);
    verify(header.format, "the state", header.blake3.as_deref(), header.fnv1a64.as_deref(), state).map_err(corrupt)?;
    let mut sections = Vec::with_capacity(header.sections.len());
    for s in &header.sections {
        let n = usize::try_from(s.len).map_err(|_| corrupt(format!("section `{}` length", s.name)))?;
        let (b, r) = rest.split_at(n);
        rest = r;
        verify(header.format, &format!("section `{}`", s.name), s.blake3.as_deref(), s.fnv1a64.as_deref(), b)
            .map_err(corrupt)?;
        sections.push((s.name.clone(), b));
    }
    Ok((state, sections))
}

/// The sections of the checkpoint `bytes` a store returned for `lsn`, by name, each verified
/// against its checksum (the engine state's own checks as in [`Replay::load`]).
pub fn sections(lsn: u64, bytes: &[u8]) -> Result<Sections<'_>, CheckpointError> {
    Checkpoint::parse(lsn, bytes).map(|c| c.sections)
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

thread_local! {
    /// The registry scopes are parsed with while a checkpoint is decoded on this thread.
    static REGISTRY: RefCell<Option<ScopeRegistry>> = const { RefCell::new(None) };
    /// Names decoded so far (tool names repeat once per remembered key).
    static NAMES: RefCell<rustc_hash::FxHashSet<Arc<str>>> = RefCell::default();
}

/// Installs `reg` for scope decoding on this thread until dropped.
struct RegistryGuard;

impl RegistryGuard {
    fn install(reg: &ScopeRegistry) -> RegistryGuard {
        REGISTRY.with(|r| *r.borrow_mut() = Some(reg.clone()));
        RegistryGuard
    }
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        REGISTRY.with(|r| *r.borrow_mut() = None);
        NAMES.with(|n| *n.borrow_mut() = Default::default());
    }
}

/// A string decoded without a copy when the input holds it unescaped (serde's own `Cow<str>`
/// always copies).
#[derive(Debug)]
pub(crate) struct Text<'a>(pub(crate) std::borrow::Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Text<'a>, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// Decodes a name, sharing one allocation per distinct name while a checkpoint loads.
pub(super) fn interned<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
    let Text(text) = Text::deserialize(d)?;
    Ok(NAMES.with(|n| {
        let mut n = n.borrow_mut();
        match n.get(&*text) {
            Some(a) => a.clone(),
            None => {
                let a: Arc<str> = Arc::from(&*text);
                n.insert(a.clone());
                a
            }
        }
    }))
}

/// A scope is decoded from its canonical text, parsed with the registry of the engine whose
/// checkpoint is being loaded ([`Replay::load`]); elsewhere decoding a scope fails, since
/// canonical form depends on the registry. The text must parse to itself.
impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Scope, D::Error> {
        use serde::de::Error;
        let Text(text) = Text::deserialize(d)?;
        REGISTRY.with(|r| match &*r.borrow() {
            None => Err(D::Error::custom("a scope can only be decoded while loading a checkpoint")),
            Some(reg) => {
                let s = reg.parse(&text).map_err(|e| D::Error::custom(format!("scope `{text}`: {e}")))?;
                if s.as_str() == text {
                    Ok(s)
                } else {
                    Err(D::Error::custom(format!("scope `{text}` is not canonical (it parses to `{s}`)")))
                }
            }
        })
    }
}

/// Replays ledger events into an engine, from the start or from a checkpoint, and encodes
/// checkpoints of what it holds. See the module docs.
#[derive(Debug)]
pub struct Replay {
    core: Core,
    lsn: u64,
    applied: u64,
}

impl Replay {
    /// A replay of an empty ledger.
    pub fn new(cfg: CoreConfig, scopes: ScopeRegistry) -> Replay {
        Replay { core: Core::with_scopes(cfg, scopes), lsn: 0, applied: 0 }
    }

    /// A replay positioned after the events `1..=lsn`, from the checkpoint `bytes` a store
    /// returned for `lsn`. A newer format is [`CheckpointError::NewerFormat`]; anything
    /// unreadable, inconsistent or for another LSN is [`CheckpointError::Corrupt`] (replay
    /// the whole ledger instead).
    pub fn load(cfg: CoreConfig, scopes: ScopeRegistry, lsn: u64, bytes: &[u8]) -> Result<Replay, CheckpointError> {
        Replay::from_checkpoint(cfg, scopes, &Checkpoint::parse(lsn, bytes)?)
    }

    /// A replay positioned after the events of the verified checkpoint `c`: decodes its
    /// engine state ([`Replay::load`] parses and decodes in one call).
    pub fn from_checkpoint(
        cfg: CoreConfig,
        scopes: ScopeRegistry,
        c: &Checkpoint<'_>,
    ) -> Result<Replay, CheckpointError> {
        let (lsn, state) = (c.lsn, c.state);
        let corrupt = |detail: String| CheckpointError::Corrupt { lsn, detail };
        let mut core: Core = {
            let _reg = RegistryGuard::install(&scopes);
            serde_json::from_slice(state).map_err(|e| corrupt(format!("state: {e}")))?
        };
        for t in core.txs.values_mut() {
            // Replay gives every transaction the configured lease (the ledger does not log it).
            t.lease = cfg.lease;
        }
        core.cfg = cfg;
        core.scopes = scopes;
        core.dirty.keep_vacant_nodes();
        if !core.keeps_marks() {
            // Below L1 no marks are kept; a checkpoint written at L1 or above may hold some.
            core.dirty = crate::index::ScopeIndex::keeping_vacant_nodes();
            core.dirty_epochs.clear();
        } else if core.dirty.is_empty() && core.dirty_epochs.is_empty() {
            // A checkpoint from before dirty marks: rebuild them from the transactions.
            core.rebuild_dirty_marks();
        }
        core.check_integrity().map_err(|e| corrupt(format!("integrity: {e}")))?;
        if core.next_tx == 0 || core.next_epoch == 0 {
            return Err(corrupt("id allocators at 0".into()));
        }
        Ok(Replay { core, lsn, applied: 0 })
    }

    /// The LSN of the last event replayed (or of the checkpoint loaded).
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// Events applied since [`Replay::new`] or [`Replay::load`].
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Applies the event at LSN [`Replay::lsn`]` + 1`.
    pub fn apply(&mut self, ev: &Event) -> Result<(), RecoverError> {
        self.core.replay_event(ev).map_err(|(rule, detail)| RecoverError {
            index: self.lsn,
            lsn: self.lsn + 1,
            event: event_kind(ev).to_owned(),
            rule,
            detail,
        })?;
        // Replay re-derives; nothing it produces is a new fact or new work.
        if self.core.has_events() {
            self.core.events.clear();
        }
        if self.core.has_actions() {
            self.core.actions.clear();
        }
        self.core.traces.clear();
        self.lsn += 1;
        self.applied += 1;
        Ok(())
    }

    /// Encodes the replayed state as a checkpoint at [`Replay::lsn`].
    pub fn checkpoint(&self) -> Result<Vec<u8>, CheckpointError> {
        self.checkpoint_with(&[])
    }

    /// Encodes the replayed state as a checkpoint at [`Replay::lsn`] followed by `sections`
    /// (name, bytes): other projections of the same events at the same LSN ([`sections`]
    /// reads them back).
    pub fn checkpoint_with(&self, sections: &[(&str, &[u8])]) -> Result<Vec<u8>, CheckpointError> {
        let state = serde_json::to_vec(&self.core).map_err(|e| CheckpointError::Encode { detail: e.to_string() })?;
        let header = Header {
            format: CHECKPOINT_FORMAT_VERSION,
            ledger_format: LEDGER_FORMAT_VERSION,
            lsn: self.lsn,
            len: state.len() as u64,
            blake3: Some(blake3::hash(&state).to_hex().to_string()),
            fnv1a64: None,
            sections: sections
                .iter()
                .map(|(name, b)| SectionHeader {
                    name: (*name).to_owned(),
                    len: b.len() as u64,
                    blake3: Some(blake3::hash(b).to_hex().to_string()),
                    fnv1a64: None,
                })
                .collect(),
        };
        let head = serde_json::to_vec(&header).map_err(|e| CheckpointError::Encode { detail: e.to_string() })?;
        let extra: usize = sections.iter().map(|(_, b)| b.len()).sum();
        let mut out = Vec::with_capacity(MAGIC.len() + head.len() + 1 + state.len() + extra);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&head);
        out.push(b'\n');
        out.extend_from_slice(&state);
        for (_, b) in sections {
            out.extend_from_slice(b);
        }
        Ok(out)
    }

    /// The replayed state in a canonical JSON form (object keys sorted), for comparing two
    /// replays: `ledger verify` checks that a checkpoint equals the replay of its events.
    pub fn state(&self) -> Result<serde_json::Value, CheckpointError> {
        let v = serde_json::to_value(&self.core).map_err(|e| CheckpointError::Encode { detail: e.to_string() })?;
        Ok(canonical(v))
    }

    /// Unfinished transactions in the replayed state.
    pub fn unfinished(&self) -> usize {
        self.core.txs.len()
    }

    /// Ends the replay: classifies the interrupted work and aborts the transactions whose
    /// leases ended by `now` (see [`Core::recover`]). [`Recovery::events`] counts the events
    /// this replay applied (the tail after a checkpoint).
    pub fn finish(self, now: Timestamp) -> (Core, Recovery) {
        Core::classify(self.core, self.applied, now)
    }
}

/// The kind of an event, as the ledger names it.
fn event_kind(ev: &Event) -> &'static str {
    match ev {
        Event::Begin { .. } => "begin",
        Event::Read { .. } => "read",
        Event::EffectRecorded { .. } => "effect_recorded",
        Event::EffectExecuted { .. } => "effect_executed",
        Event::EffectFailed { .. } => "effect_failed",
        Event::Sealed { .. } => "sealed",
        Event::Decided { .. } => "decided",
        Event::ReleaseStarted { .. } => "release_started",
        Event::Released { .. } => "released",
        Event::Compensated { .. } => "compensated",
        Event::Settled { .. } => "settled",
        Event::ToolChanged { .. } => "tool_changed",
        Event::Extension { .. } => "extension",
        Event::Touched { .. } => "touched",
    }
}

/// `v` with every object's keys in sorted order, whatever map type serde_json was built with.
fn canonical(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        Value::Object(m) => {
            let sorted: std::collections::BTreeMap<String, Value> =
                m.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        other => other,
    }
}
