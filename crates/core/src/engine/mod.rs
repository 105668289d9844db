//! The settlement state machine.
//!
//! [`Core`] holds the engine's state and changes it only through its methods, each of which
//! takes the current time as an argument and returns what the caller must do next (call this
//! tool, run these compensations). Work that is not the caller's to do (wake a waiter, run an
//! abort that a lease expiry decided) is put in an outbox the runtime drains with
//! [`Core::take_actions`]; every fact is also put in the ledger outbox, drained with
//! [`Core::take_events`]. No method blocks, sleeps, reads a clock or performs I/O, so the
//! engine is deterministic and can be replayed. A method decides; the events it emits change
//! the state through one function, `Core::apply` (apply.rs), which replay runs too.
//!
//! The lifecycle of one transaction:
//!
//! ```text
//!  begin ─► Open ──seal──► Sealed ──request_commit──► Waiting ──try_commit──► Committing ──finish_commit──► (committed)
//!            │               │                           │   ▲  (Wait)            │ first release failed
//!            └───────────────┴───────── abort ───────────┴───┘                    ▼
//!                                                       Aborting ──compensated…──finish_abort──► (aborted)
//! ```

mod apply;
mod checkpoint;
pub(crate) use checkpoint::Text;
mod group;
mod integrity;
mod keys;
mod levels;
mod ops;
mod recover;
mod registry;
mod settle;
mod waits;

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

pub use crate::trace::TraceRecord;
pub use checkpoint::{CHECKPOINT_FORMAT_VERSION, Checkpoint, CheckpointError, Replay, sections as checkpoint_sections};
pub use group::GroupStart;
pub use ops::{BeginRequest, Begun, EffectView, ReadResult, Recorded, SealedView};
pub use recover::{InDoubt, RecoverError, Recovery, ReplayRule};
pub use registry::ToolVersion;
pub use settle::{AbortPlan, CompensationTask, Decision, ExecResult, ReleasePlan, ReleaseTask, Settlement};
pub use waits::{WaitCause, WaitsFor};

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
    /// Consistency level (docs/levels.md). Default: [`Level::L4`], every discipline on.
    pub level: Level,
    /// How L1 and above prevent stale generation. Default: [`Isolation::Serializable`].
    pub isolation: Isolation,
    /// Disciplines switched off one at a time, for the evaluation's ablations.
    pub ablation: Ablation,
    /// Emit one operation record per finished transaction ([`Core::take_traces`]).
    /// Default: off.
    pub trace: bool,
    /// The largest arguments of one effect, in bytes of their JSON; a larger
    /// [`Core::record_effect`] is refused ([`EngineError::ArgsTooLarge`]). Default:
    /// [`MAX_ARGS_BYTES`] (1 MiB).
    pub max_args_bytes: usize,
    /// How a key the engine derives (a call without an adapter key) names its transaction:
    /// `None`, the default, gives `tool:tx-<n>:<effect>` (`tool:tx-<n>:call:<id>` for a named
    /// call); `Some(prefix)` gives `<prefix><n>:<tool>:<effect>` (`<prefix><n>:<tool>:call:<id>`),
    /// so that an embedder that names transactions by public ids (a server's `tx_<tag>_`)
    /// records, and dispatches, keys in its own form. Either way the number is the effect's,
    /// the same before and after a restart. Only new keys use it; recorded keys are read back
    /// as recorded.
    pub derived_key_prefix: Option<Arc<str>>,
}

/// The default limit on one effect's arguments: 1 MiB of JSON (DESIGN §10: oversized
/// requests are refused). Tools that move more data pass a reference (a file, an object id).
pub const MAX_ARGS_BYTES: usize = 1 << 20;

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            lease: Duration::from_secs(30),
            ordering: Ordering::EpochOrder,
            level: Level::default(),
            isolation: Isolation::default(),
            ablation: Ablation::default(),
            trace: false,
            max_args_bytes: MAX_ARGS_BYTES,
            derived_key_prefix: None,
        }
    }
}

/// The consistency level the engine enforces; each level adds one discipline to the one below
/// (docs/levels.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum Level {
    /// No checks: commits never wait and never validate (for comparison and measurement).
    L0,
    /// Prevents A1 stale generation with the chosen [`Isolation`] strategy, and orders
    /// commits on overlapping scopes by epoch.
    L1,
    /// Also prevents A3 causal cascade: a transaction waits for the unsettled commits whose
    /// writes it read and aborts if one is retracted.
    L2,
    /// Also prevents A6 tool-effect reordering: a transaction's calls reach the world in
    /// issuance order even when the agent issues them concurrently.
    L3,
    /// Also prevents A2 phantom tool: the tool registry is versioned; commit validates the
    /// signature of every tool used against the one visible at the transaction's first read.
    #[default]
    L4,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 5] = [Level::L0, Level::L1, Level::L2, Level::L3, Level::L4];

    /// `"L0"` … `"L4"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::L0 => "L0",
            Level::L1 => "L1",
            Level::L2 => "L2",
            Level::L3 => "L3",
            Level::L4 => "L4",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Level {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Level, EngineError> {
        Level::ALL.into_iter().find(|l| l.as_str().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            EngineError::InvalidArgument {
                field: "level",
                value: format!("{s:?}"),
                expected: "one of L0, L1, L2, L3, L4",
            }
        })
    }
}

/// How a level of L1 or above prevents stale generation (A1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Every read is validated at commit, read-only transactions included: a scope read at
    /// a version older than its current one aborts the transaction (`stale_read`).
    #[default]
    Serializable,
    /// Snapshot isolation: a writing transaction aborts (`write_conflict`) if a scope it
    /// writes was committed by another transaction since it began; reads are not validated
    /// (write skew is possible) and read-only transactions commit at once without waiting
    /// or validating (the read-only bypass).
    SnapshotIsolation,
    /// Pessimistic locking, no-wait, older wins: a transaction's may-touch scopes (or, if it
    /// declared none, each scope it touches) are its locks; a read or effect on a scope an
    /// earlier-epoch unfinished transaction holds aborts the later one at once
    /// (`lock_conflict`, retryable) instead of letting it read what may change.
    Pessimistic,
}

impl std::str::FromStr for Isolation {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Isolation, EngineError> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "serializable" => Ok(Isolation::Serializable),
            "si" | "snapshot" | "snapshot_isolation" => Ok(Isolation::SnapshotIsolation),
            "pessimistic" | "locking" => Ok(Isolation::Pessimistic),
            _ => Err(EngineError::InvalidArgument {
                field: "isolation",
                value: format!("{s:?}"),
                expected: "serializable, snapshot_isolation or pessimistic",
            }),
        }
    }
}

/// Disciplines removed one at a time, for the evaluation's ablations. Default: none removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Ablation {
    /// Commits never wait for earlier transactions on overlapping scopes.
    pub no_frontier: bool,
    /// Reads are never validated at commit (no stale-read abort).
    pub no_stale_read_abort: bool,
    /// One frontier for everything: a commit waits for every earlier unfinished transaction,
    /// whatever it touches.
    pub global_frontier: bool,
}

impl Ablation {
    /// Nothing removed.
    pub fn none() -> Ablation {
        Ablation::default()
    }
    /// Without the frontier.
    pub fn no_frontier() -> Ablation {
        Ablation { no_frontier: true, ..Ablation::default() }
    }
    /// Without stale-read abort.
    pub fn no_stale_read_abort() -> Ablation {
        Ablation { no_stale_read_abort: true, ..Ablation::default() }
    }
    /// With one global frontier.
    pub fn global_frontier() -> Ablation {
        Ablation { global_frontier: true, ..Ablation::default() }
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
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Held; its release failed (`unknown`: it may nevertheless have taken effect), or was
    /// started and its outcome is not recorded yet (`apply::RELEASE_IN_DOUBT`, borrowed, so
    /// that starting a release allocates nothing).
    ReleaseFailed { error: std::borrow::Cow<'static, str>, unknown: bool },
    /// The key had executed before; its outcome was returned.
    Replayed,
    /// Compensated on abort (`residue` for reversible-with-cost).
    Compensated { residue: Option<String> },
    /// Compensation failed after retries.
    CompensationFailed(String),
    /// Returned after its transaction aborted; its late compensation is running.
    Compensating,
}

impl EffStatus {
    /// A held effect that has not reached the world yet: still held, or its release started
    /// and not yet reported.
    fn unreleased(&self) -> bool {
        match self {
            EffStatus::Held(_) => true,
            EffStatus::ReleaseFailed { error, unknown: true } => error == apply::RELEASE_IN_DOUBT,
            _ => false,
        }
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
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

// Serialised in checkpoints (checkpoint.rs); a field added here is checkpointed too: give it
// `#[serde(default)]` if older checkpoints lack it, `#[serde(skip)]` if replay does not rebuild it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
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
    /// The lease length, renewed on each read and effect. Not checkpointed: replay takes
    /// the configured lease (checkpoint.rs sets it on load).
    #[serde(skip)]
    lease: Duration,
    in_flight: u32,
    reason: Option<AbortReason>,
    began: Timestamp,
    /// What the consistency levels and the trace need (docs/levels.md).
    #[serde(default)]
    lv: LevelState,
}

/// Per-transaction state of the consistency levels. Its size follows what the transaction
/// observed and what is still unsettled, never the history.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(crate) struct LevelState {
    /// Commit stamp when the transaction began (its snapshot under snapshot isolation).
    pub(crate) snapshot: u64,
    /// Logical time (commit stamp) of each read, parallel to `Tx::reads`.
    pub(crate) read_at: SmallVec<[u64; 4]>,
    /// Causal predecessors: the committed transactions whose writes its reads observed.
    /// Settled ones are dropped at the commit decision; the rest are waited for (L2).
    pub(crate) preds: SmallVec<[TxId; 2]>,
    /// Registry version at the first read (or first effect): the pinned registry snapshot.
    pub(crate) reg_seen: Option<u64>,
    /// Issuance positions in the order the effects reached the world.
    pub(crate) ext_order: SmallVec<[u32; 4]>,
    /// A predecessor that was retracted after this transaction read its writes.
    pub(crate) doomed: Option<TxId>,
    /// Commit stamp once decided to commit.
    pub(crate) stamp: Option<u64>,
    /// Registry version at the commit decision.
    pub(crate) reg_decided: Option<u64>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum KeyState {
    /// Owned by an unfinished transaction.
    Pending,
    /// Executed and final; a retry returns this output.
    Done(KeyOutput),
    /// Executed with an unknown or unresolved outcome; never run again.
    Unresolved,
}

/// A finished key's output. A live engine shares it with the effect's record; a checkpoint
/// load keeps its JSON text and parses it on the first retry that needs it. A reopen decodes
/// every remembered key and a retry of a finished key is rare: parsing a million outputs into
/// value trees cost about a third of loading a large checkpoint. Encoded as the output itself
/// either way, so the checkpoint format does not change.
#[derive(Debug)]
enum KeyOutput {
    Value(Arc<Value>),
    Text(Box<serde_json::value::RawValue>),
}

impl KeyOutput {
    /// The output as a value (parsed from the text when loaded from a checkpoint).
    fn value(&self) -> Arc<Value> {
        match self {
            KeyOutput::Value(v) => v.clone(),
            // The text was checked to be JSON when the checkpoint was loaded.
            KeyOutput::Text(t) => Arc::new(serde_json::from_str(t.get()).unwrap_or_default()),
        }
    }
}

impl serde::Serialize for KeyOutput {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KeyOutput::Value(v) => v.serialize(s),
            KeyOutput::Text(t) => t.serialize(s),
        }
    }
}

impl<'de> serde::Deserialize<'de> for KeyOutput {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<KeyOutput, D::Error> {
        <Box<serde_json::value::RawValue>>::deserialize(d).map(KeyOutput::Text)
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyEntry {
    tx: TxId,
    effect: EffectId,
    state: KeyState,
    /// What the key was first used for, so that a reuse for another call is refused
    /// (keys.rs). `None` only in checkpoints written before it was kept: such a key is not
    /// checked until its ledger is replayed again.
    #[serde(default)]
    used_for: Option<keys::KeyUse>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Group {
    branches: SmallVec<[TxId; 4]>,
    winner: Option<TxId>,
}

/// The settlement engine's state. See the module docs.
///
/// Serialised in checkpoints (checkpoint.rs): the configuration, the registry of scope types
/// and the outboxes are not (the caller supplies the first two; the outboxes are empty after
/// replay). A field added here is checkpointed too: mark it `#[serde(default)]` if older
/// checkpoints lack it, `#[serde(skip)]` if it is not a function of the ledger.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Core {
    #[serde(skip)]
    cfg: CoreConfig,
    #[serde(skip)]
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
    #[serde(skip)]
    late: HashMap<(TxId, EffectId), CompensationTask>,
    /// The scopes of each call still in flight when its transaction's abort settled, until its
    /// late compensation is recorded: that compensation writes them after the settlement gave
    /// them their fresh version, so it advances them again ([`Event::Touched`]). Live only.
    #[serde(skip)]
    late_scopes: HashMap<(TxId, EffectId), SmallVec<[Scope; 2]>>,
    /// Compensations of settled transactions' effects running now (between their `touched`
    /// and `touched {done}`): reads and eager effects on their scopes are refused. Live only,
    /// like the running late compensations (a replay has none).
    #[serde(skip)]
    undoing: Vec<(TxId, EffectId, SmallVec<[Scope; 2]>)>,
    #[serde(skip)]
    events: Vec<Event>,
    #[serde(skip)]
    actions: Vec<Action>,
    committed: u64,
    aborted: u64,
    /// The versioned tool registry (L4).
    #[serde(default)]
    registry: registry::Registry,
    /// Transactions decided to commit and not yet settled: the writes a reader may observe
    /// before they are final (L2).
    committing: SmallVec<[TxId; 4]>,
    /// Operation records of finished transactions, when tracing.
    #[serde(skip)]
    traces: Vec<TraceRecord>,
    /// Below L2: commit stamps of retracted commits (rare), so that a later read of such a
    /// version names its writer as a predecessor in the trace.
    retracted: HashMap<u64, TxId>,
    /// Dirty marks: the scopes of the compensable eager effects of unfinished transactions,
    /// at their epochs (the isolation of eager effects, docs/engine.md). Kept at every level;
    /// consulted at L1 and above.
    #[serde(default)]
    dirty: ScopeIndex,
    /// How many dirty marks each epoch holds: whether another epoch holds any is O(1), so a
    /// transaction alone with its own marks queries nothing.
    #[serde(default)]
    dirty_epochs: BTreeMap<Epoch, u32>,
    /// Replay's checks of the ledger's order (recover.rs); unused by a live engine.
    #[serde(default = "recover::ReplayGuard::of_old_checkpoint")]
    guard: recover::ReplayGuard,
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
            late_scopes: HashMap::default(),
            undoing: Vec::new(),
            events: Vec::new(),
            actions: Vec::new(),
            committed: 0,
            aborted: 0,
            registry: registry::Registry::default(),
            committing: SmallVec::new(),
            traces: Vec::new(),
            retracted: HashMap::default(),
            dirty: ScopeIndex::keeping_vacant_nodes(),
            dirty_epochs: BTreeMap::new(),
            guard: recover::ReplayGuard::default(),
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

    /// The ledger events produced since the last [`Core::take_events`], in order, without
    /// draining them.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Drains the ledger events produced since the last call, in order.
    pub fn take_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain(..)
    }

    /// Moves the events produced since the last call into one [`crate::Batch`]. `spare` is
    /// the batch handed out last time: when nothing else holds it any more, its allocation is
    /// refilled (its old events dropped) instead of allocating a new one.
    pub fn take_batch(&mut self, spare: Option<crate::Batch>) -> crate::Batch {
        if let Some(mut batch) = spare
            && let Some(events) = batch.reusable()
        {
            events.clear();
            std::mem::swap(events, &mut self.events);
            return batch;
        }
        let fresh = Vec::with_capacity(self.events.len().max(4));
        crate::Batch::new(std::mem::replace(&mut self.events, fresh))
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

    /// The next commit stamp. A stamp is never `u64::MAX` (replay refuses it), so the value
    /// after it always exists; at the end of the range this is [`EngineError::Exhausted`].
    pub(super) fn next_stamp(&mut self) -> Result<u64, EngineError> {
        if self.stamp >= u64::MAX - 1 {
            return Err(EngineError::Exhausted { counter: "commit stamp", value: self.stamp });
        }
        self.stamp += 1;
        Ok(self.stamp)
    }

    fn missing(&self, tx: TxId) -> EngineError {
        if tx.0 >= self.next_tx || tx.0 == 0 { EngineError::UnknownTx { tx } } else { EngineError::Settled { tx } }
    }

    fn tx(&self, tx: TxId) -> Result<&Tx, EngineError> {
        self.txs.get(&tx).ok_or_else(|| self.missing(tx))
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
