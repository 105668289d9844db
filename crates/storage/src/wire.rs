//! The ledger's record format, owned here and shared by every backend: how an event is
//! encoded as the bytes a backend stores, and the hash chain over those bytes. The engine's
//! [`Event`] is a plain engine type; its stored form is specified on this page (the normative
//! copy; `docs/ledger.md` repeats it) and implemented by private record types that borrow from
//! the event when encoding, so appending clones nothing.
//!
//! # Record
//!
//! A stored event is one JSON object with its kind in `"event"` first, e.g.
//! `{"event":"effect_executed","tx":7,"effect":2,"output":"ok"}`, produced by [`encode`] and
//! read by [`decode`]. Integers are JSON numbers (`u64`, effect ids `u32`); `?` marks a field
//! written only when present (read as absent/false when missing).
//!
//! | `event` | fields, in order |
//! | --- | --- |
//! | `begin` | `tx`, `epoch`, `agent` (string), `group`?, `may_touch`? (list of scopes; absent: undeclared), `lease_until` (ns on the engine clock) |
//! | `read` | `tx`, `scope`, `version` |
//! | `effect_recorded` | `tx`, `effect`, `tool`, `class` (`reversible`, `reversible_with_cost`, `bufferable`, `gated`, `idempotent`), `scopes`, `key`, `args` (any JSON), `compensable`, `adapter_key`?, `compensation`? (a plan's compensation descriptor, any JSON; added within format 3) |
//! | `effect_executed` | `tx`, `effect`, `output` (any JSON; registers the compensation) |
//! | `effect_failed` | `tx`, `effect`, `error`, `unknown` |
//! | `sealed` | `tx` |
//! | `decided` | `tx`, `commit`, `stamp`? (commits), `reason`? (aborts: an object tagged by `kind`: `tool_failed` (with an optional `unavailable: true` for `AbortReason::ToolUnavailable`, added within format 2), `release_failed`, `vetoed`, `lost_branch`, `stale_read`, `lease_expired`, `wait_timeout`, `protocol_violation`, `explicit`, `write_conflict`, `lock_conflict`, `cascading_abort`, `phantom_tool`, with their fields), `at`? (commits: the decision's time, ns on the engine clock; added within format 3) |
//! | `release_started` | `tx`, `effect` |
//! | `released` | `tx`, `effect`, `output`?, `error`?, `unknown`? |
//! | `compensated` | `tx`, `effect`, `residue`?, `error`? |
//! | `settled` | `tx`, `committed`, `effects`: list of `[effect, disposition, tag]` (dispositions `accepted`, `applied`, `fired`, `discarded`, `compensated`, `compensation_failed`, `not_compensable`, `release_failed`, `not_released`, `unknown`, `replayed`; tags `clean`, `leaked`, `unresolved`, `partial-commit`) |
//! | `tool_changed` | `tool`, `version`, `present` (engine-wide: no transaction; its `tx` is 0) |
//! | `extension` | `stream` (string), `body` (any JSON): another component's record, ignored by the engine (engine-wide; its `tx` is 0) |
//! | `touched` | `scopes` (list of scopes), `undoes` (transaction id), `effect`, `done`? (absent: the compensation is about to run; `true`: it ended): a compensation of that settled transaction's effect writes the scopes; each record gives them a fresh version (engine-wide; its `tx` is 0; added in format 4) |
//!
//! # Version and the rule for adding fields
//!
//! The format version is [`LEDGER_FORMAT_VERSION`] (1, the first; 2 added `tool_changed`; 3
//! added `extension`; 4 added `touched`; and within 3, before its release, the optional `compensation` of
//! `effect_recorded`: a record without it reads as an effect with no durable compensation, so
//! ledgers of formats 1 to 3 written before it read unchanged; and the optional `at` of a
//! commit's `decided`: a record without it has no known commit time).
//! Within one version, fields may only be *added*, and must be optional (absent in older
//! records reads as a default), so older ledgers still read; removing a field, changing its
//! meaning or shape, or adding an event kind (or class, disposition, tag, abort reason) older
//! readers must understand bumps the version, and readers refuse a ledger whose version is
//! newer than theirs. An engine `Event` (or enum value) with no record form fails with
//! [`StoreError::Encode`] instead of writing something older readers misread (a backend that
//! encodes on its writer thread, as the SQLite store does, fails that commit and stops).
//!
//! # Chain
//!
//! Every stored event carries a 32-byte [`Chain`] value computed over the exact bytes stored
//! and the value of the event before it:
//!
//! ```text
//!   chain(0)   = genesis(ledger id) = BLAKE3("tidegate-ledger-genesis-v1" ‖ ledger id)
//!   chain(lsn) = BLAKE3("tidegate-ledger-chain-v1" ‖ chain(lsn − 1) ‖ lsn as u64 LE ‖ stored bytes)
//! ```
//!
//! So an event that is changed, dropped, duplicated, moved to another LSN, or taken from
//! another ledger breaks the chain at the first LSN that differs, and the chain value at the
//! last acknowledged LSN (kept by a durable backend where a lost tail cannot erase it) proves
//! that every event up to it is present and unchanged.

use std::fmt;

use tidegate_core::Event;

use crate::{Lsn, StoreError};

mod record;

use record::Record;

/// The ledger format version written by this build (the `format_version` a backend stores).
/// History: 1, the first; 2 adds the `tool_changed` event (the versioned tool registry); 3 adds
/// the `extension` event (opaque records of other components, e.g. the review manager); 4
/// adds the `touched` event (a late compensation advances its scopes' versions).
/// A new event kind is both an engine change and a format change, so this is the engine's
/// number; the assertion below keeps the two from drifting apart.
pub const LEDGER_FORMAT_VERSION: u32 = 4;
const _: () = assert!(LEDGER_FORMAT_VERSION == tidegate_core::ledger::LEDGER_FORMAT_VERSION);

/// A link of the hash chain: BLAKE3 over the previous link, the LSN and the stored bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Chain(pub [u8; 32]);

impl Chain {
    /// The chain value before the first event of the ledger identified by `ledger_id`.
    pub fn genesis(ledger_id: &[u8]) -> Chain {
        let mut h = blake3::Hasher::new();
        h.update(b"tidegate-ledger-genesis-v1");
        h.update(ledger_id);
        Chain(*h.finalize().as_bytes())
    }

    /// The chain value of the event stored as `bytes` at `lsn`, after `self`.
    pub fn next(&self, lsn: Lsn, bytes: &[u8]) -> Chain {
        let mut h = blake3::Hasher::new();
        h.update(b"tidegate-ledger-chain-v1");
        h.update(&self.0);
        h.update(&lsn.to_le_bytes());
        h.update(bytes);
        Chain(*h.finalize().as_bytes())
    }

    /// Reads a stored value: exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Chain> {
        <[u8; 32]>::try_from(bytes).ok().map(Chain)
    }

    /// The first 8 bytes in hex, for messages.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chain({})", self.short())
    }
}

/// Encodes `event` as the bytes a backend stores (the `index`-th event of its batch, for the
/// error). Fails with [`StoreError::Encode`] if it cannot be represented.
pub fn encode(index: usize, event: &Event) -> Result<String, StoreError> {
    let record = Record::of(event).map_err(|detail| StoreError::Encode { index, detail })?;
    let body = serde_json::to_string(&record).map_err(|e| StoreError::Encode { index, detail: e.to_string() })?;
    if kind_range(&body).is_none() {
        return Err(StoreError::Encode {
            index,
            detail: format!("the JSON does not start with an \"event\" tag: {}", preview(&body)),
        });
    }
    Ok(body)
}

/// Decodes a stored event; the error says what is wrong, with a preview of the text.
pub fn decode(text: &str) -> Result<Event, String> {
    serde_json::from_str::<Record<'_>>(text)
        .map(Record::into_event)
        .map_err(|e| format!("body does not decode as an event ({e}): {}", preview(text)))
}

/// The record of `event` as a JSON value (for tools that show or export the ledger).
pub fn to_value(event: &Event) -> Result<serde_json::Value, StoreError> {
    let record = Record::of(event).map_err(|detail| StoreError::Encode { index: 0, detail })?;
    serde_json::to_value(&record).map_err(|e| StoreError::Encode { index: 0, detail: e.to_string() })
}

/// The `"event"` tag of an encoded event. The tag is written first, so it is found without
/// parsing the whole body.
pub fn kind_range(body: &str) -> Option<std::ops::Range<usize>> {
    const PREFIX: &str = "{\"event\":\"";
    let rest = body.strip_prefix(PREFIX)?;
    let len = rest.find('"')?;
    Some(PREFIX.len()..PREFIX.len() + len)
}

/// At most the first 80 characters of `s`, for error messages.
pub fn preview(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
