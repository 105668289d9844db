//! Ledger events: the append-only facts every projection is rebuilt from.
//!
//! # Format
//!
//! [`Event`] is an engine type: it has no serialised form of its own. The ledger's record
//! format (the bytes a store keeps, their version and the rule for adding fields) is owned by
//! `tidegate_storage::wire`, which converts events to and from its record types. Adding an
//! event kind here is also a format change there: until `wire` knows the kind, appending it
//! fails with an encode error instead of writing something older readers misread.
//! Inside the engine, an event's effect on the state is written once, in its arm of
//! `Core::apply` (engine/apply.rs), which live operations and replay both run.
//!
//! A compensation registration is not a separate event: [`Event::EffectExecuted`] carries
//! everything its compensation needs (the tool named in [`Event::EffectRecorded`], the
//! arguments, and the output), and it is appended before the agent is told the effect
//! happened. A compensation never edits history; [`Event::Compensated`] is a new fact.

use std::sync::Arc;

use serde_json::Value;

use crate::effect::{AbortReason, Disposition, EffectClass, Tag};
use crate::ids::{EffectId, Epoch, GroupId, Timestamp, TxId, Version};

/// The version of the event set this engine writes and understands, recorded in checkpoints.
/// `tidegate_storage::wire::LEDGER_FORMAT_VERSION` is the same number (asserted at compile
/// time there): a new event kind is a new format.
///
/// History: 1, the first; 2 adds [`Event::ToolChanged`] (the versioned tool registry); 3 adds
/// [`Event::Extension`] (opaque records of other components kept in the ledger); 4 adds
/// [`Event::Touched`] (a compensation of an effect whose transaction had already settled
/// advances its scopes' versions).
pub const LEDGER_FORMAT_VERSION: u32 = 4;

/// One ledger fact.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A transaction began.
    Begin {
        /// Transaction.
        tx: TxId,
        /// Its epoch.
        epoch: Epoch,
        /// The agent.
        agent: Arc<str>,
        /// Speculation group, if a branch.
        group: Option<GroupId>,
        /// Declared may-touch scopes (`None`: undeclared, blocks everything until sealed).
        may_touch: Option<Vec<String>>,
        /// When the lease expires unless renewed.
        lease_until: Timestamp,
    },
    /// A scope was read at a version.
    Read {
        /// Transaction.
        tx: TxId,
        /// Canonical scope.
        scope: Arc<str>,
        /// Version observed.
        version: Version,
    },
    /// An effect was recorded: before an eager call is made, or when a held effect is staged
    /// or queued.
    EffectRecorded {
        /// Transaction.
        tx: TxId,
        /// Issuance position.
        effect: EffectId,
        /// Tool name.
        tool: Arc<str>,
        /// Effect class.
        class: EffectClass,
        /// Canonical scopes.
        scopes: Vec<Arc<str>>,
        /// Idempotency key.
        key: Arc<str>,
        /// Arguments.
        args: Arc<Value>,
        /// Whether a compensation handler exists.
        compensable: bool,
        /// Whether the key came from the adapter (engine-wide) rather than being derived
        /// (local to the transaction).
        adapter_key: bool,
        /// A durable compensation descriptor (docs/plans.md: `{capability, args, key?,
        /// probe?, forward_probe?}`), recorded in the same append as the forward effect so
        /// that both or neither are in the ledger. The engine never looks inside; the plan
        /// executor holds it until the effect's plan ends. `None` for most effects.
        compensation: Option<Arc<Value>>,
    },
    /// An eager effect executed; registers its compensation.
    EffectExecuted {
        /// Transaction.
        tx: TxId,
        /// Issuance position.
        effect: EffectId,
        /// The tool's output.
        output: Arc<Value>,
    },
    /// An eager effect's call failed (known not to have taken effect, or unknown).
    EffectFailed {
        /// Transaction.
        tx: TxId,
        /// Issuance position.
        effect: EffectId,
        /// Error text.
        error: String,
        /// Whether the outcome is unknown (the call may have taken effect).
        unknown: bool,
    },
    /// The footprint was frozen.
    Sealed {
        /// Transaction.
        tx: TxId,
    },
    /// The commit or abort decision.
    Decided {
        /// Transaction.
        tx: TxId,
        /// `true` for commit.
        commit: bool,
        /// Commit stamp (versions written), for commits.
        stamp: Option<u64>,
        /// Why, for aborts.
        reason: Option<AbortReason>,
        /// When the engine decided (the `now` given to `Core::try_commit`): written for
        /// commits, the transaction's commit point on the engine's clock, which the plan
        /// executor's `no_commit` predicates compare with their time. `None` for aborts and in
        /// records written before the field existed.
        at: Option<Timestamp>,
    },
    /// A held effect is about to be released: written (durably) before its tool is called,
    /// so that recovery can tell "never attempted" (release it) from "outcome unknown"
    /// (never fire it again).
    ReleaseStarted {
        /// Transaction.
        tx: TxId,
        /// Issuance position.
        effect: EffectId,
    },
    /// A held effect was released at commit (or its release failed).
    Released {
        /// Transaction.
        tx: TxId,
        /// Issuance position.
        effect: EffectId,
        /// Output on success.
        output: Option<Arc<Value>>,
        /// Error text on failure.
        error: Option<String>,
        /// Whether a failed release may nevertheless have taken effect.
        unknown: bool,
    },
    /// A compensation ran (or failed).
    Compensated {
        /// Transaction.
        tx: TxId,
        /// Issuance position of the forward effect.
        effect: EffectId,
        /// Residue reported by a reversible-with-cost compensation.
        residue: Option<String>,
        /// Error text on failure.
        error: Option<String>,
    },
    /// Final per-effect tags; the transaction is finished.
    Settled {
        /// Transaction.
        tx: TxId,
        /// Committed or aborted.
        committed: bool,
        /// Per effect, in issuance order.
        effects: Vec<(EffectId, Disposition, Tag)>,
    },
    /// The tool registry changed (engine-wide; belongs to no transaction). `version` is the
    /// registry's version after the change, which is also the tool's new signature.
    ToolChanged {
        /// The tool's name.
        tool: Arc<str>,
        /// Registry version after the change.
        version: u64,
        /// `false`: the tool was removed.
        present: bool,
    },
    /// Scopes written by a compensation of an effect whose transaction had already settled:
    /// a plan's unwind or a verdict's compensation, an operator's retry, or the late result of
    /// a call that returned after its transaction's abort settled and is compensated then.
    /// Appended (durably) before the compensation is dispatched (`done: false`) and again with
    /// its outcome (`done: true`); each one gives every scope a fresh version (one new stamp),
    /// so a read made before or while the compensation wrote there is stale, and at L2 and
    /// above it dooms the unsettled transactions that read an overlapping scope
    /// (`cascading_abort` naming `undoes`). Engine-wide: it belongs to no running transaction
    /// and carries `tx` 0.
    Touched {
        /// Canonical scopes the compensation writes (the forward effect's).
        scopes: Vec<Arc<str>>,
        /// The settled transaction whose effect is undone.
        undoes: TxId,
        /// That effect.
        effect: EffectId,
        /// `false`: the compensation is about to run; `true`: it ended (its outcome is known
        /// or given up on).
        done: bool,
    },
    /// An opaque record of another component (e.g. the review manager's decision log) kept
    /// in the ledger for its durability and order. Engine-wide; the state machine ignores it
    /// both live and on replay.
    Extension {
        /// The component's stream name (records of one stream are read back together).
        stream: Arc<str>,
        /// The record (any JSON; the engine never looks inside).
        body: Arc<Value>,
    },
}

impl Event {
    /// The transaction the event belongs to; engine-wide events ([`Event::ToolChanged`],
    /// [`Event::Extension`], [`Event::Touched`]) return `TxId(0)`, an id never allocated.
    pub fn tx(&self) -> TxId {
        match self {
            Event::Begin { tx, .. }
            | Event::Read { tx, .. }
            | Event::EffectRecorded { tx, .. }
            | Event::EffectExecuted { tx, .. }
            | Event::EffectFailed { tx, .. }
            | Event::Sealed { tx }
            | Event::Decided { tx, .. }
            | Event::ReleaseStarted { tx, .. }
            | Event::Released { tx, .. }
            | Event::Compensated { tx, .. }
            | Event::Settled { tx, .. } => *tx,
            Event::ToolChanged { .. } | Event::Extension { .. } | Event::Touched { .. } => TxId(0),
        }
    }
}

/// The events one transition appended, shared by the store and every observer of the ledger
/// without copying: cloning a batch counts a reference.
///
/// The engine hands each batch out and keeps a handle on it; when the next transition finds
/// that no store or observer kept the previous batch, it reuses its allocation
/// ([`crate::Core::take_batch`]), so an engine whose listeners do not retain batches appends
/// without allocating.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch(Arc<Vec<Event>>);

impl Batch {
    /// A batch of `events`, in ledger order.
    pub fn new(events: Vec<Event>) -> Batch {
        Batch(Arc::new(events))
    }

    /// The events, in ledger order.
    pub fn events(&self) -> &[Event] {
        &self.0
    }

    /// Whether `self` and `other` are handles on the same batch (not merely equal events).
    pub fn same(&self, other: &Batch) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The batch's vector when this is its only handle, to be refilled.
    pub(crate) fn reusable(&mut self) -> Option<&mut Vec<Event>> {
        Arc::get_mut(&mut self.0)
    }
}

impl std::ops::Deref for Batch {
    type Target = [Event];

    fn deref(&self) -> &[Event] {
        &self.0
    }
}

impl From<Vec<Event>> for Batch {
    fn from(events: Vec<Event>) -> Batch {
        Batch::new(events)
    }
}

impl FromIterator<Event> for Batch {
    fn from_iter<I: IntoIterator<Item = Event>>(iter: I) -> Batch {
        Batch::new(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Batch {
    type Item = &'a Event;
    type IntoIter = std::slice::Iter<'a, Event>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
