//! The settlement state machine.
//!
//! [`Core`] holds the engine's state and changes it only through its methods, each of which
//! takes the current time as an argument and returns what the caller must do next (call this
//! tool, run these compensations). Work that is not the caller's to do (wake a waiter, run an
//! abort that a lease expiry decided) is put in an outbox the runtime drains with
//! [`Core::take_actions`]; every fact is also put in the ledger outbox, drained with
//! [`Core::take_events`]. No method blocks, sleeps, reads a clock or performs I/O, so the
//! engine is deterministic and can be replayed.
//!
//! The lifecycle of one transaction:
//!
//! ```text
//!  begin ─► Open ──seal──► Sealed ──request_commit──► Waiting ──try_commit──► Committing ──finish_commit──► (committed)
//!            │               │                           │   ▲  (Wait)            │ first release failed
//!            └───────────────┴───────── abort ───────────┴───┘                    ▼
//!                                                       Aborting ──compensated…──finish_abort──► (aborted)
//! ```

mod group;
mod integrity;
mod ops;
mod recover;
mod settle;

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use smallvec::SmallVec;

use crate::effect::{AbortReason, Disposition, EffectClass, HeldAck, Tag};
use crate::error::{EngineError, TxState};
use crate::ids::{EffectId, Epoch, GroupId, Timestamp, TxId, Version};
use crate::index::ScopeIndex;
use crate::ledger::Event;
use crate::scope::{Scope, ScopeRegistry};

pub use group::GroupStart;
pub use ops::{BeginRequest, Begun, EffectView, ReadResult, Recorded, SealedView};
pub use recover::{InDoubt, RecoverError, Recovery};
pub use settle::{AbortPlan, CompensationTask, Decision, ExecResult, ReleasePlan, ReleaseTask, Settlement};

/// How commits are ordered among transactions on overlapping scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Ordering {
    /// A transaction commits only after every earlier-epoch transaction that may touch its
    /// scopes has finished (waits, no aborts from ordering). The default.
    #[default]
    EpochOrder,
    /// Never wait: whoever asks first commits; a transaction whose reads were overwritten by
    /// an earlier commit aborts as a stale read (aborts instead of waits).
    FirstCommitterWins,
}

/// Engine settings. Every default is given on its field.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CoreConfig {
    /// Lease of an open or sealed transaction, renewed by each of its reads and effects.
    /// Default: 30 s.
    #[serde(with = "duration_ms")]
    pub lease: Duration,
    /// Commit ordering. Default: [`Ordering::EpochOrder`].
    pub ordering: Ordering,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig { lease: Duration::from_secs(30), ordering: Ordering::EpochOrder }
    }
}

mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Work the runtime must do that no caller is waiting on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Action {
    /// A waiting transaction may now decide: wake its committer.
    Wake(TxId),
    /// An abort the engine decided on its own (lease expiry, protocol violation, lost
    /// branch): run its compensations, then call [`Core::finish_abort`].
    RunAbort(AbortPlan),
    /// An effect completed after its transaction aborted: compensate it and report with
    /// [`Core::late_compensated`].
    LateCompensate(CompensationTask),
}

/// The status of one recorded effect.
#[derive(Debug, Clone, PartialEq)]
enum EffStatus {
    /// An eager call is running.
    InFlight,
    /// An eager call returned.
    Executed,
    /// An eager call failed; `unknown` if it may have taken effect.
    Failed { unknown: bool },
    /// Held until commit.
    Held(HeldAck),
    /// Held and released at commit.
    Released,
    /// Held; its release failed (`unknown`: it may nevertheless have taken effect).
    ReleaseFailed { error: String, unknown: bool },
    /// The key had executed before; its outcome was returned.
    Replayed,
    /// Compensated on abort (`residue` for reversible-with-cost).
    Compensated { residue: Option<String> },
    /// Compensation failed after retries.
    CompensationFailed(String),
    /// Returned after its transaction aborted; its late compensation is running.
    Compensating,
}

#[derive(Debug)]
struct Eff {
    tool: Arc<str>,
    class: EffectClass,
    scopes: SmallVec<[Scope; 2]>,
    key: Arc<str>,
    /// Whether the key is in the engine-wide key table (adapter-supplied keys only).
    global_key: bool,
    args: Arc<Value>,
    compensable: bool,
    status: EffStatus,
    output: Option<Arc<Value>>,
}

#[derive(Debug)]
struct Tx {
    epoch: Epoch,
    agent: Arc<str>,
    group: Option<GroupId>,
    state: TxState,
    may_touch: Option<SmallVec<[Scope; 2]>>,
    reads: SmallVec<[(Scope, Version); 4]>,
    effects: Vec<Eff>,
    /// Scopes currently claimed in the index at this transaction's epoch.
    claims: SmallVec<[Scope; 4]>,
    /// Counted in `undeclared` (open, no may-touch): blocks every scope.
    blocks_all: bool,
    lease_until: Timestamp,
    /// The lease length, renewed on each read and effect.
    lease: Duration,
    in_flight: u32,
    reason: Option<AbortReason>,
    began: Timestamp,
}

#[derive(Debug)]
enum KeyState {
    /// Owned by an unfinished transaction.
    Pending,
    /// Executed and final; a retry returns this output.
    Done(Arc<Value>),
    /// Executed with an unknown or unresolved outcome; never run again.
    Unresolved,
}

#[derive(Debug)]
struct KeyEntry {
    tx: TxId,
    effect: EffectId,
    state: KeyState,
}

#[derive(Debug)]
struct Group {
    branches: SmallVec<[TxId; 4]>,
    winner: Option<TxId>,
}

/// The settlement engine's state. See the module docs.
#[derive(Debug)]
pub struct Core {
    cfg: CoreConfig,
    scopes: ScopeRegistry,
    next_tx: u64,
    next_epoch: u64,
    next_group: u64,
    stamp: u64,
    txs: HashMap<TxId, Tx>,
    /// Epochs of open transactions with no may-touch declaration (multiset).
    undeclared: BTreeMap<Epoch, u32>,
    leases: BTreeSet<(Timestamp, TxId)>,
    waiting: BTreeSet<(Epoch, TxId)>,
    index: ScopeIndex,
    keys: HashMap<Arc<str>, KeyEntry>,
    groups: HashMap<GroupId, Group>,
    late: HashMap<(TxId, EffectId), CompensationTask>,
    events: Vec<Event>,
    actions: Vec<Action>,
    committed: u64,
    aborted: u64,
}

/// Counters for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Transactions not yet finished.
    pub unfinished: usize,
    /// Of those, waiting to commit.
    pub waiting: usize,
    /// Committed since start.
    pub committed: u64,
    /// Aborted since start.
    pub aborted: u64,
    /// Adapter-supplied idempotency keys remembered.
    pub keys: usize,
}

impl Core {
    /// A new engine with the default scope registry.
    pub fn new(cfg: CoreConfig) -> Core {
        Core::with_scopes(cfg, ScopeRegistry::default())
    }

    /// A new engine with the given scope registry.
    pub fn with_scopes(cfg: CoreConfig, scopes: ScopeRegistry) -> Core {
        Core {
            cfg,
            scopes,
            next_tx: 1,
            next_epoch: 1,
            next_group: 1,
            stamp: 0,
            txs: HashMap::default(),
            undeclared: BTreeMap::new(),
            leases: BTreeSet::new(),
            waiting: BTreeSet::new(),
            index: ScopeIndex::default(),
            keys: HashMap::default(),
            groups: HashMap::default(),
            late: HashMap::default(),
            events: Vec::new(),
            actions: Vec::new(),
            committed: 0,
            aborted: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The scope registry, to canonicalise scopes before calling the engine.
    pub fn scopes(&self) -> &ScopeRegistry {
        &self.scopes
    }

    /// Drains the ledger events produced since the last call, in order.
    pub fn take_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain(..)
    }

    /// Whether events are waiting to be drained.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Drains the outbox of work no caller is waiting on.
    pub fn take_actions(&mut self) -> std::vec::Drain<'_, Action> {
        self.actions.drain(..)
    }

    /// Whether actions are waiting to be drained.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Monitoring counters.
    pub fn stats(&self) -> Stats {
        Stats {
            unfinished: self.txs.len(),
            waiting: self.waiting.len(),
            committed: self.committed,
            aborted: self.aborted,
            keys: self.keys.len(),
        }
    }

    /// The committed version of a scope (the latest commit stamp of an overlapping write).
    pub fn version(&self, scope: &Scope) -> Version {
        self.index.version(scope)
    }

    /// The state of an unfinished transaction.
    pub fn state(&self, tx: TxId) -> Result<TxState, EngineError> {
        self.tx(tx).map(|t| t.state)
    }

    /// The epoch of an unfinished transaction.
    pub fn epoch(&self, tx: TxId) -> Result<Epoch, EngineError> {
        self.tx(tx).map(|t| t.epoch)
    }

    /// The earliest lease deadline of an open or sealed transaction, if any.
    pub fn next_lease_deadline(&self) -> Option<Timestamp> {
        self.leases.first().map(|&(t, _)| t)
    }

    fn missing(&self, tx: TxId) -> EngineError {
        if tx.0 >= self.next_tx || tx.0 == 0 { EngineError::UnknownTx { tx } } else { EngineError::Settled { tx } }
    }

    fn tx(&self, tx: TxId) -> Result<&Tx, EngineError> {
        self.txs.get(&tx).ok_or_else(|| self.missing(tx))
    }

    fn tx_mut(&mut self, tx: TxId) -> Result<&mut Tx, EngineError> {
        if self.txs.contains_key(&tx) {
            Ok(self.txs.get_mut(&tx).expect("checked above"))
        } else {
            Err(self.missing(tx))
        }
    }
}

fn disposition_for_discard(status: &EffStatus) -> (Disposition, Tag) {
    match status {
        EffStatus::Held(_) => (Disposition::Discarded, Tag::Clean),
        EffStatus::Replayed => (Disposition::Replayed, Tag::Clean),
        EffStatus::Failed { unknown: false } => (Disposition::Discarded, Tag::Clean),
        EffStatus::Failed { unknown: true } | EffStatus::InFlight | EffStatus::Compensating => {
            (Disposition::Unknown, Tag::Unresolved)
        }
        EffStatus::Compensated { residue: None } => (Disposition::Compensated, Tag::Clean),
        EffStatus::Compensated { residue: Some(_) } => (Disposition::Compensated, Tag::Unresolved),
        EffStatus::CompensationFailed(_) => (Disposition::CompensationFailed, Tag::Unresolved),
        EffStatus::Executed => (Disposition::NotCompensable, Tag::Unresolved),
        EffStatus::Released => (Disposition::Fired, Tag::Leaked),
        EffStatus::ReleaseFailed { unknown: false, .. } => (Disposition::ReleaseFailed, Tag::Clean),
        EffStatus::ReleaseFailed { unknown: true, .. } => (Disposition::Unknown, Tag::Unresolved),
    }
}
