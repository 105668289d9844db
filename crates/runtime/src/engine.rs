//! The engine handle: the state machine behind a lock, the store, the clock, and the tasks
//! that execute what the state machine decides.

use rustc_hash::FxHashMap as HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use tidegate_core::engine::{BeginRequest, Stats};
use tidegate_core::{Ablation, Action, Core, CoreConfig, Isolation, Level, Ordering, Scope, ScopeRegistry, TxId};
use tidegate_storage::{LedgerStore, Lsn, MemoryStore, StoreError};
use tokio::sync::Notify;

use crate::checkpoint::{CheckpointPolicy, Checkpointer, ReplayReport};
use crate::clock::{Clock, TokioClock};
use crate::hooks::PreCommitHook;
use crate::tool::{CallCtx, Tool};
use crate::trace::{FileTrace, TraceSink};
use crate::tx::Transaction;
use crate::{Error, Fence, Result};

/// The one retry-and-probe policy of every call the engine makes (eager calls, releases at
/// commit, compensations): bounded retry with exponential backoff for failures known not to
/// have taken effect, the tool's probe for unknown outcomes (whose "did not happen" answer is
/// retried in place within the same attempts), never a blind re-execution. Probe use is not
/// optional: an unknown outcome is always probed when the tool has a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first. Default: 4.
    pub attempts: u32,
    /// Backoff before the second attempt, doubled each time. Default: 20 ms.
    pub initial_backoff: Duration,
    /// Backoff cap. Default: 1 s.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 4, initial_backoff: Duration::from_millis(20), max_backoff: Duration::from_secs(1) }
    }
}

impl RetryPolicy {
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// Options of [`Tidegate::begin_with`].
#[derive(Debug, Clone, Default)]
pub struct TxOptions {
    /// The agent's name (for records and traces). Default: `"agent"`.
    pub agent: Option<String>,
    /// Scopes the transaction may touch. Declaring them lets transactions on other scopes
    /// commit without waiting for this one; touching anything else aborts it.
    pub may_touch: Option<Vec<String>>,
    /// Lease override.
    pub lease: Option<Duration>,
}

impl TxOptions {
    /// Options for `agent`.
    pub fn agent(agent: impl Into<String>) -> TxOptions {
        TxOptions { agent: Some(agent.into()), ..TxOptions::default() }
    }

    /// Declares the may-touch set.
    pub fn may_touch<I, S>(mut self, scopes: I) -> TxOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.may_touch = Some(scopes.into_iter().map(Into::into).collect());
        self
    }

    /// Overrides the lease.
    pub fn lease(mut self, lease: Duration) -> TxOptions {
        self.lease = Some(lease);
        self
    }
}

/// Builds a [`Tidegate`].
pub struct Builder {
    cfg: CoreConfig,
    scopes: ScopeRegistry,
    store: Option<Arc<dyn LedgerStore>>,
    clock: Option<Arc<dyn Clock>>,
    retry: RetryPolicy,
    trace: Option<Arc<dyn TraceSink>>,
    checkpoints: CheckpointPolicy,
    task_scope: Option<TaskScope>,
    tenant: Option<String>,
    observers: Vec<Arc<dyn crate::observer::AppendObserver>>,
}

/// Carries a caller's task-local context into the tasks the engine spawns to settle its
/// transactions (settlement runs in a task of its own so that it never depends on the
/// caller's future). Called on the caller's task when the engine spawns; the wrapper it returns
/// runs the settlement future inside the caller's context (e.g. a `tokio::task_local!` scope).
/// A binding whose handlers read a task-local (the Python package) sets it with
/// [`Builder::task_scope`].
pub type TaskScope =
    Arc<dyn Fn() -> Box<dyn FnOnce(BoxFuture<'static, ()>) -> BoxFuture<'static, ()> + Send> + Send + Sync>;

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder").field("cfg", &self.cfg).field("retry", &self.retry).finish_non_exhaustive()
    }
}

impl Builder {
    /// Adds an observer of every appended batch (see [`crate::AppendObserver`]): it sees the
    /// ledger from the first append after the build, in order, under the engine's lock.
    pub fn observer(mut self, observer: Arc<dyn crate::observer::AppendObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Lease of open transactions (default 30 s; must be positive, checked at build).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.cfg.lease = lease;
        self
    }

    /// Carries the caller's task-local context into the engine's settlement tasks (see
    /// [`TaskScope`]).
    pub fn task_scope(mut self, scope: TaskScope) -> Self {
        self.task_scope = Some(scope);
        self
    }

    /// The tenant this engine's plan executor serves (default `default`): a plan trigger
    /// naming another tenant is refused (docs/plans.md).
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Commit ordering (default [`Ordering::EpochOrder`]).
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.cfg.ordering = ordering;
        self
    }

    /// The scope types accepted (default [`ScopeRegistry::default`]).
    pub fn scopes(mut self, scopes: ScopeRegistry) -> Self {
        self.scopes = scopes;
        self
    }

    /// The ledger store (default: a new [`MemoryStore`]).
    pub fn store(mut self, store: Arc<dyn LedgerStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The clock (default: [`TokioClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Retry policy for releases and compensations.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The consistency level (default [`Level::L4`]; docs/levels.md).
    pub fn level(mut self, level: Level) -> Self {
        self.cfg.level = level;
        self
    }

    /// How L1 and above prevent stale generation (default [`Isolation::Serializable`]).
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.cfg.isolation = isolation;
        self
    }

    /// The largest arguments of one tool call, in bytes of JSON (default
    /// [`tidegate_core::engine::MAX_ARGS_BYTES`], 1 MiB); larger calls are refused with
    /// `EngineError::ArgsTooLarge` before anything is recorded.
    pub fn max_args_bytes(mut self, bytes: usize) -> Self {
        self.cfg.max_args_bytes = bytes;
        self
    }

    /// Names transactions in the keys the engine derives for calls without an adapter key:
    /// `<prefix><tx number>:<tool>:<effect number>` instead of `tool:tx-<n>:<effect>` (see
    /// `CoreConfig::derived_key_prefix`). A server passes its public transaction prefix, so the
    /// ledger, the plan executor and every dispatch carry the same key.
    pub fn derived_key_prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.cfg.derived_key_prefix = Some(prefix.into());
        self
    }

    /// Disciplines to switch off, for ablation studies (default: none).
    pub fn ablation(mut self, ablation: Ablation) -> Self {
        self.cfg.ablation = ablation;
        self
    }

    /// Emits one operation record per finished transaction to `sink` (default: none). See
    /// [`crate::trace`]; [`Builder::trace_file`] writes them to a JSON Lines file.
    pub fn trace(mut self, sink: Arc<dyn TraceSink>) -> Self {
        self.trace = Some(sink);
        self
    }

    /// Writes one operation record per finished transaction to `path` (created or
    /// truncated), in the trace format `tidegate check` reads.
    pub fn trace_file(self, path: impl AsRef<std::path::Path>) -> Result<Self> {
        let sink = Arc::new(FileTrace::create(path)?);
        Ok(self.trace(sink))
    }

    /// When to store checkpoints of the projections in the ledger store, so that reopening
    /// replays only the events after the last one (default [`CheckpointPolicy::default`];
    /// only for a store given with [`Builder::store`]).
    pub fn checkpoints(mut self, policy: CheckpointPolicy) -> Self {
        self.checkpoints = policy;
        self
    }

    /// Builds the engine. Background work (aborts decided by lease expiry, late
    /// compensations) runs on the current tokio runtime; outside one, the engine starts a
    /// small runtime of its own.
    ///
    /// Refuses a zero lease (every transaction would expire at once), a retry policy with
    /// no attempt, and a backoff whose cap is below its start.
    pub fn build(mut self) -> Result<Tidegate> {
        if self.cfg.lease.is_zero() {
            return Err(Error::InvalidArgument {
                field: "lease",
                value: "0s".into(),
                expected: "a positive duration (an open transaction is aborted when its lease ends)",
            });
        }
        if self.retry.attempts == 0 {
            return Err(Error::InvalidArgument {
                field: "retry.attempts",
                value: "0".into(),
                expected: "at least 1 (the first attempt counts)",
            });
        }
        if self.retry.max_backoff < self.retry.initial_backoff {
            return Err(Error::InvalidArgument {
                field: "retry.max_backoff",
                value: format!("{:?} (initial_backoff {:?})", self.retry.max_backoff, self.retry.initial_backoff),
                expected: "a cap at least the initial backoff",
            });
        }
        self.cfg.trace = self.trace.is_some();
        let level = self.cfg.level;
        let (handle, own) = match tokio::runtime::Handle::try_current() {
            Ok(h) => (h, None),
            Err(_) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("tidegate-bg")
                    .enable_time()
                    .build()
                    .map_err(|e| Error::Store(StoreError::Io { op: "start the background runtime", source: e }))?;
                (rt.handle().clone(), Some(OwnedRuntime(Some(rt))))
            }
        };
        let clock = self.clock.unwrap_or_else(|| {
            let _guard = handle.enter();
            Arc::new(TokioClock::new())
        });
        // Only a store the caller gave is checkpointed; `never()` still allows `checkpoint_now`.
        let checkpointing = self.store.is_some();
        let automatic = self.checkpoints != CheckpointPolicy::never();
        let store: Arc<dyn LedgerStore> = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        // Rebuild the projections from whatever the ledger already holds: its checkpoint,
        // then the events after it (streamed, never all in memory at once).
        let tenant = self.tenant.unwrap_or_else(|| "default".to_owned());
        let crate::checkpoint::Opened { replay, plans: boot, report: open, stored } =
            crate::checkpoint::replay(&*store, &self.cfg, &self.scopes, &tenant)?;
        let checkpointer = if checkpointing {
            // The shadow starts from the replayed state; a tail the stored checkpoint does not
            // cover (or a plan fold it lacks) is checkpointed at once, so the next open does
            // not redo it. Without automatic checkpoints the shadow starts empty and replays
            // on demand.
            let lsn = if automatic { replay.lsn() } else { 0 };
            let store_now = automatic
                && (lsn > open.checkpoint_lsn.unwrap_or(0)
                    || (lsn > 0 && boot.is_some() && !open.plans_from_checkpoint));
            let encode_failed = |e: String| {
                Error::Store(StoreError::Io { op: "encode a checkpoint", source: std::io::Error::other(e) })
            };
            let bytes = match (lsn, stored) {
                (0, _) => None,
                (_, Some(b)) if !store_now => Some(b),
                _ => {
                    let section =
                        boot.as_ref().map(|p| p.encode()).transpose().map_err(|e| encode_failed(e.to_string()))?;
                    let sections: Vec<(&str, &[u8])> =
                        section.as_deref().map(|b| (crate::plan::SECTION, b)).into_iter().collect();
                    Some(replay.checkpoint_with(&sections).map_err(|e| encode_failed(e.to_string()))?)
                }
            };
            let seed = crate::checkpoint::Seed { lsn, bytes, store_now, tenant: tenant.clone() };
            Some(Checkpointer::start(store.clone(), self.cfg.clone(), self.scopes.clone(), self.checkpoints, seed)?)
        } else {
            None
        };
        let replay_lsn = replay.lsn();
        let (core, recovery) = if store.last_lsn() == 0 {
            (Core::with_scopes(self.cfg, self.scopes.clone()), None)
        } else {
            let (core, rec) = replay.finish(clock.now());
            (core, Some(rec))
        };
        Ok(Tidegate {
            inner: Arc::new(Inner {
                shared: Mutex::new(Shared {
                    core,
                    waiters: HashMap::default(),
                    endings: Endings::default(),
                    ctxs: HashMap::default(),
                }),
                recovery: Mutex::new(recovery),
                scopes: self.scopes,
                store,
                clock,
                retry: self.retry,
                hooks: RwLock::new(Vec::new()),
                tx_hooks: Mutex::new(HashMap::default()),
                tools: RwLock::new(HashMap::default()),
                poisoned: AtomicBool::new(false),
                fence: tokio::sync::watch::Sender::new(None),
                stop: Notify::new(),
                trace: self.trace,
                task_scope: self.task_scope,
                turnstile: Notify::new(),
                turnstile_used: AtomicBool::new(false),
                level,
                waits: Default::default(),
                wait_ns: Default::default(),
                handle,
                checkpointer,
                open,
                plans: crate::plan::PlanState::new(tenant, boot.map(|b| (replay_lsn, b))),
                observers: self.observers,
                _own: own,
            }),
        })
    }
}

impl Inner {
    /// See [`Tidegate::stopped_error`].
    pub(crate) fn stopped_error(&self) -> Error {
        match &*self.fence.borrow() {
            Some(f) => Error::Fenced(f.clone()),
            None => Error::Store(StoreError::Closed),
        }
    }
}

struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) waiters: HashMap<TxId, Arc<Notify>>,
    /// How recently decided transactions ended, so that an error about one says how.
    pub(crate) endings: Endings,
    /// The contexts of calls whose tool takes one or that carry a handle, until their
    /// transaction settles (`crate::tool::CallCtx`).
    pub(crate) ctxs: HashMap<TxId, SmallVec<[CallCtx; 2]>>,
}

/// How a transaction ended, as its ledger events said.
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    committed: bool,
    reason: Option<tidegate_core::AbortReason>,
    settled: bool,
}

/// The endings of the last [`Endings::CAPACITY`] decided transactions (the engine itself
/// forgets a finished transaction; this bounded memory only serves error messages).
#[derive(Debug, Default)]
pub(crate) struct Endings {
    map: HashMap<TxId, Ending>,
    order: std::collections::VecDeque<TxId>,
}

impl Endings {
    const CAPACITY: usize = 4096;

    /// Notes a decision or a settlement, as it goes to the ledger.
    fn note(&mut self, event: &tidegate_core::Event) {
        use tidegate_core::Event;
        match event {
            Event::Decided { tx, commit, reason, .. } => {
                let ending = Ending { committed: *commit, reason: reason.clone(), settled: false };
                if self.map.insert(*tx, ending).is_none() {
                    self.order.push_back(*tx);
                    if self.order.len() > Self::CAPACITY
                        && let Some(old) = self.order.pop_front()
                    {
                        self.map.remove(&old);
                    }
                }
            }
            Event::Settled { tx, committed, .. } => {
                if let Some(e) = self.map.get_mut(tx) {
                    e.committed = *committed;
                    e.settled = true;
                }
            }
            _ => {}
        }
    }

    /// Why `tx` aborted, if it was decided recently and aborted.
    pub(crate) fn abort_reason(&self, tx: TxId) -> Option<tidegate_core::AbortReason> {
        self.map.get(&tx).filter(|e| !e.committed).and_then(|e| e.reason.clone())
    }

    /// `err` about `tx`, saying how the transaction ended when it is known.
    pub(crate) fn explain(&self, err: tidegate_core::EngineError) -> Error {
        use tidegate_core::{EngineError, TxState};
        let tx = match &err {
            EngineError::Settled { tx } => *tx,
            EngineError::WrongState { tx, state: TxState::Aborting | TxState::Committing, .. } => *tx,
            _ => return Error::Engine(err),
        };
        match self.map.get(&tx) {
            Some(e) => Error::Finished { tx, committed: e.committed, reason: e.reason.clone(), settled: e.settled },
            None => Error::Engine(err),
        }
    }
}

pub(crate) struct Inner {
    pub(crate) shared: Mutex<Shared>,
    /// Work the last process left unfinished, until [`Tidegate::recover`] finishes it.
    pub(crate) recovery: Mutex<Option<tidegate_core::engine::Recovery>>,
    pub(crate) scopes: ScopeRegistry,
    pub(crate) store: Arc<dyn LedgerStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retry: RetryPolicy,
    pub(crate) hooks: RwLock<Vec<Arc<dyn PreCommitHook>>>,
    pub(crate) tx_hooks: Mutex<HashMap<TxId, Vec<Arc<dyn PreCommitHook>>>>,
    pub(crate) tools: RwLock<HashMap<Arc<str>, Tool>>,
    /// Set when the store failed or [`Tidegate::stop`] was called: no more work is accepted.
    pub(crate) poisoned: AtomicBool,
    /// Set (before `poisoned`) when the store fenced this engine out: every refusal names it.
    pub(crate) fence: tokio::sync::watch::Sender<Option<Fence>>,
    /// Cancels the engine's own settlement tasks on [`Tidegate::stop`].
    pub(crate) stop: Notify,
    /// Where operation records go, when tracing.
    pub(crate) trace: Option<Arc<dyn TraceSink>>,
    /// Carries the caller's task-local context into settlement tasks.
    pub(crate) task_scope: Option<TaskScope>,
    /// Woken whenever an eager call returns, for L3's issuance-order turnstile.
    pub(crate) turnstile: Notify,
    /// Set once a call has waited at the turnstile, so that engines that never need it skip
    /// the wake-ups.
    pub(crate) turnstile_used: AtomicBool,
    /// The level (fixed at build), read on the call path without the engine lock.
    pub(crate) level: Level,
    /// Commits that had to wait, and their total wait in clock nanoseconds.
    pub(crate) waits: std::sync::atomic::AtomicU64,
    pub(crate) wait_ns: std::sync::atomic::AtomicU64,
    pub(crate) handle: tokio::runtime::Handle,
    /// Stores checkpoints of the projections (None: disabled, or an in-memory default store).
    pub(crate) checkpointer: Option<Checkpointer>,
    /// How the projections were rebuilt at build.
    pub(crate) open: ReplayReport,
    /// Plans: the feed of engine facts, the capabilities and the executor (plan.rs).
    pub(crate) plans: crate::plan::PlanState,
    /// The embedder's observers of appended batches.
    pub(crate) observers: Vec<Arc<dyn crate::observer::AppendObserver>>,
    _own: Option<OwnedRuntime>,
}

/// The Tidegate engine: begin transactions, register tools and hooks. Cheap to clone; every
/// clone is the same engine. Safe to use from many tasks and threads at once.
#[derive(Clone)]
pub struct Tidegate {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Tidegate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tidegate").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Tidegate {
    /// A builder with every default.
    pub fn builder() -> Builder {
        Builder {
            cfg: CoreConfig::default(),
            scopes: ScopeRegistry::default(),
            store: None,
            clock: None,
            retry: RetryPolicy::default(),
            trace: None,
            checkpoints: CheckpointPolicy::default(),
            task_scope: None,
            tenant: None,
            observers: Vec::new(),
        }
    }

    /// An in-memory engine with every default.
    pub fn in_memory() -> Result<Tidegate> {
        Tidegate::builder().build()
    }

    /// The engine's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The ledger store.
    pub fn store(&self) -> &Arc<dyn LedgerStore> {
        &self.inner.store
    }

    /// Canonicalises a scope with this engine's registry.
    pub fn scope(&self, text: &str) -> Result<Scope> {
        self.parse_scope(text, "scope")
    }

    pub(crate) fn parse_scope(&self, text: &str, field: &str) -> Result<Scope> {
        self.inner
            .scopes
            .parse(text)
            .map_err(|source| Error::Engine(tidegate_core::EngineError::Scope { field: field.to_owned(), source }))
    }

    /// Begins a transaction for `agent` with no may-touch declaration.
    pub fn begin(&self, agent: &str) -> Result<Transaction> {
        self.begin_with(TxOptions::agent(agent))
    }

    /// Begins a transaction.
    pub fn begin_with(&self, opts: TxOptions) -> Result<Transaction> {
        let may_touch = match opts.may_touch {
            None => None,
            Some(list) => {
                let mut scopes = Vec::with_capacity(list.len());
                for (i, s) in list.iter().enumerate() {
                    scopes.push(self.parse_scope(s, &format!("may_touch[{i}]"))?);
                }
                Some(scopes)
            }
        };
        if opts.lease.is_some_and(|l| l.is_zero()) {
            return Err(Error::InvalidArgument {
                field: "lease",
                value: "0s".into(),
                expected: "a positive duration (the transaction would expire at once)",
            });
        }
        let agent: Arc<str> = opts.agent.as_deref().unwrap_or("agent").into();
        let now = self.inner.clock.now();
        let req = BeginRequest { agent, may_touch, lease: opts.lease };
        let (begun, _) = self.with_core(|c| c.begin(req, now))?;
        Ok(Transaction::new(self.clone(), begun.tx, begun.epoch))
    }

    /// A handle on the unfinished transaction `id` of this engine, e.g. one that
    /// `recover_keeping_open` kept open across a restart, so that its agent (or a server
    /// acting for it) can go on with it. A transaction that has finished is an error saying
    /// how it ended ([`Error::Finished`]); an id never issued is `EngineError::UnknownTx`.
    ///
    /// How a transaction ended is kept in memory for the last few thousand decisions of this
    /// process; for an older one, or one a previous process finished, it is read from the
    /// ledger (a scan, stopping at its settlement), so memory stays bounded.
    pub fn transaction(&self, id: TxId) -> Result<Transaction> {
        self.refuse_if_fenced()?;
        let g = self.inner.shared.lock();
        let err = match g.core.epoch(id) {
            Ok(epoch) => {
                drop(g);
                return Ok(Transaction::new(self.clone(), id, epoch));
            }
            Err(e) => g.endings.explain(e),
        };
        drop(g);
        match err {
            Error::Engine(tidegate_core::EngineError::Settled { tx }) => Err(self.ending_in_ledger(tx).unwrap_or(err)),
            other => Err(other),
        }
    }

    /// How the finished transaction `tx` ended, from the ledger's `decided` and `settled`
    /// events (`None` if the ledger has no decision for it or cannot be read).
    fn ending_in_ledger(&self, tx: TxId) -> Option<Error> {
        use tidegate_core::Event;
        let mut found: Option<(bool, Option<tidegate_core::AbortReason>, bool)> = None;
        let scanned = self.inner.store.scan(1, &mut |_, event| {
            match event {
                Event::Decided { tx: t, commit, reason, .. } if *t == tx => {
                    found = Some((*commit, reason.clone(), false));
                }
                Event::Settled { tx: t, committed, .. } if *t == tx => {
                    let reason = found.take().and_then(|(_, r, _)| r);
                    found = Some((*committed, reason, true));
                    return false;
                }
                _ => {}
            }
            true
        });
        let (committed, reason, settled) = found.filter(|_| scanned.is_ok())?;
        Some(Error::Finished { tx, committed, reason, settled })
    }

    /// Registers a tool so that the engine can release and compensate its effects (tools
    /// are also registered on first use). A tool is identified by its name and declaration
    /// (class, which handlers it has, [`crate::ToolBuilder::version`]): registering another
    /// build of the same declaration is a no-op that keeps the first build's handlers; a
    /// different declaration under a taken name is refused, saying what differs (use
    /// [`Tidegate::redefine_tool`] to change one). A tool's first registration is a change
    /// of the versioned registry (docs/levels.md, L4).
    pub fn register(&self, tool: &Tool) -> Result<()> {
        if let Some(t) = self.inner.tools.read().get(tool.name()) {
            return if t.same(tool) { Ok(()) } else { Err(name_taken(t, tool)) };
        }
        let mut tools = self.inner.tools.write();
        match tools.get(tool.name()) {
            Some(t) if !t.same(tool) => Err(name_taken(t, tool)),
            Some(_) => Ok(()),
            None => {
                tools.insert(tool.name_arc().clone(), tool.clone());
                let name = tool.name_arc().clone();
                // After a restart the registry already knows the tool from the ledger.
                self.with_core(|c| {
                    if c.tool_version(&name).is_none() {
                        c.define_tool(&name)?;
                    }
                    Ok(())
                })?;
                Ok(())
            }
        }
    }

    /// Replaces the definition registered under `tool`'s name (or adds it): a new version of
    /// the tool registry. Under L4, transactions that read before the change and use the tool
    /// abort at commit (`phantom_tool`); below L4 they commit with the new definition.
    pub fn redefine_tool(&self, tool: &Tool) -> Result<()> {
        let mut tools = self.inner.tools.write();
        tools.insert(tool.name_arc().clone(), tool.clone());
        let name = tool.name_arc().clone();
        self.with_core(|c| c.define_tool(&name))?;
        Ok(())
    }

    /// Removes `name` from the tool registry. Effects already recorded still settle (the
    /// engine keeps the implementation to release or compensate them); under L4 their
    /// transactions abort at commit. Returns whether the tool was registered.
    pub fn remove_tool(&self, name: &str) -> Result<bool> {
        let name: Arc<str> = Arc::from(name);
        Ok(self.with_core(|c| c.remove_tool(&name))?.0)
    }

    /// The current registry signature of `name` (the registry version that defined it), or
    /// `None` if it is not registered.
    pub fn tool_signature(&self, name: &str) -> Option<u64> {
        self.inner.shared.lock().core.tool_version(name).map(|v| v.signature)
    }

    /// The level the engine runs at.
    pub fn level(&self) -> Level {
        self.inner.level
    }

    /// Flushes the trace sink, if tracing.
    pub fn flush_trace(&self) -> Result<()> {
        if let Some(sink) = &self.inner.trace {
            sink.flush().map_err(|source| Error::Trace { path: "(trace sink)".into(), source })?;
        }
        Ok(())
    }

    pub(crate) fn tool(&self, name: &str) -> Result<Tool> {
        self.inner.tools.read().get(name).cloned().ok_or_else(|| Error::UnknownTool {
            name: name.to_owned(),
            detail: "; register it before recovering or settling its effects".to_owned(),
        })
    }

    /// Adds a pre-commit hook run on every transaction's sealed footprint.
    pub fn add_hook(&self, hook: Arc<dyn PreCommitHook>) {
        self.inner.hooks.write().push(hook);
    }

    /// Monitoring counters.
    pub fn stats(&self) -> Stats {
        self.inner.shared.lock().core.stats()
    }

    /// `(commits that waited, total wait)`: how often and how long commits waited for
    /// earlier transactions on their scopes (clock time from the first refusal to the
    /// decision).
    pub fn wait_stats(&self) -> (u64, Duration) {
        (
            self.inner.waits.load(AtomicOrdering::Relaxed),
            Duration::from_nanos(self.inner.wait_ns.load(AtomicOrdering::Relaxed)),
        )
    }

    /// What the commit of `tx` waits for now, oldest first (see [`Core::waits_for`]): the
    /// earlier transactions, why, and the overlapping scopes. Empty when it would decide at
    /// once or is past deciding; an error for an unknown or settled transaction.
    pub fn waits_for(&self, tx: TxId) -> Result<Vec<tidegate_core::engine::WaitsFor>> {
        self.refuse_if_fenced()?;
        Ok(self.inner.shared.lock().core.waits_for(tx)?)
    }

    /// The engine's full integrity check (see [`Core::check_integrity`]).
    pub fn check_integrity(&self) -> std::result::Result<(), String> {
        self.inner.shared.lock().core.check_integrity()
    }

    /// The committed version of a scope.
    pub fn version(&self, scope: &str) -> Result<tidegate_core::Version> {
        self.refuse_if_fenced()?;
        let s = self.parse_scope(scope, "scope")?;
        Ok(self.inner.shared.lock().core.version(&s))
    }

    /// Aborts every transaction whose lease has ended and runs their compensations.
    /// Returns how many expired. Waiting committers call this on their own; call it (or
    /// [`Tidegate::spawn_reaper`]) when nothing else may notice.
    pub async fn reap(&self) -> Result<usize> {
        let now = self.inner.clock.now();
        let (n, _) = self.with_core(|c| Ok(c.expire_leases(now)))?;
        Ok(n)
    }

    /// Starts a background task that reaps expired leases as their deadlines pass.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        self.inner.handle.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let tg = Tidegate { inner };
                let now = tg.inner.clock.now();
                let next = tg.inner.shared.lock().core.next_lease_deadline();
                let wake = next.unwrap_or(now.after(Duration::from_millis(250))).min(now.after(Duration::from_secs(1)));
                let clock = tg.inner.clock.clone();
                drop(tg);
                clock.sleep_until(wake).await;
                let Some(inner) = weak.upgrade() else { return };
                let tg = Tidegate { inner };
                let _ = tg.reap().await;
            }
        })
    }

    /// Runs `f` on the state machine under the lock, appends the events it produced to the
    /// ledger (in decision order), and dispatches its actions. Returns `f`'s result and the
    /// LSN to wait on for durability.
    pub(crate) fn with_core<R>(
        &self,
        f: impl FnOnce(&mut Core) -> std::result::Result<R, tidegate_core::EngineError>,
    ) -> Result<(R, Lsn)> {
        if self.inner.poisoned.load(AtomicOrdering::Relaxed) {
            return Err(self.stopped_error());
        }
        let mut background: SmallVec<[Action; 2]> = SmallVec::new();
        let mut g = self.inner.shared.lock();
        let r = f(&mut g.core);
        let mut lsn = 0;
        // Contexts of settled transactions, dropped after the lock (a handle may be a language
        // binding's object whose drop must not run under the engine's lock).
        let mut finished_ctxs: SmallVec<[SmallVec<[CallCtx; 2]>; 1]> = SmallVec::new();
        if g.core.has_events() {
            let Shared { core, endings, ctxs, .. } = &mut *g;
            for e in core.events() {
                endings.note(e);
                if let tidegate_core::Event::Settled { tx, .. } = e
                    && !ctxs.is_empty()
                    && let Some(c) = ctxs.remove(tx)
                {
                    finished_ctxs.push(c);
                }
            }
            // One shared batch (observer.rs): the store, the plan executor's feed, the
            // checkpoint shadow and the embedder's observers all get the same `Arc`, in ledger
            // order, under the lock.
            let batch: Arc<[tidegate_core::Event]> = g.core.take_events().collect();
            match self.inner.store.append(&batch) {
                Ok(l) => {
                    lsn = l;
                    if self.plans_listening() {
                        self.feed_plans(&batch);
                    }
                    if let Some(ck) = &self.inner.checkpointer {
                        ck.appended(l, &batch);
                    }
                    for o in &self.inner.observers {
                        o.appended(l, &batch);
                    }
                }
                Err(e) => {
                    // The state machine moved on but its facts are not in the ledger: stop
                    // accepting work rather than acknowledge something unrecorded. A fence is
                    // recorded first, so that every refusal from now on names it.
                    let fence = Fence::from_store(self.plan_tenant(), &e);
                    if let Some(f) = &fence {
                        self.record_fence(f);
                    }
                    self.inner.poisoned.store(true, AtomicOrdering::SeqCst);
                    drop(g);
                    drop(finished_ctxs);
                    return Err(match fence {
                        Some(f) => {
                            self.halt();
                            Error::Fenced(f)
                        }
                        None => Error::Store(e),
                    });
                }
            }
        }
        let traces: SmallVec<[tidegate_core::TraceRecord; 1]> =
            if g.core.has_traces() { g.core.take_traces().collect() } else { SmallVec::new() };
        if g.core.has_actions() {
            let actions: SmallVec<[Action; 4]> = g.core.take_actions().collect();
            for a in actions {
                match a {
                    Action::Wake(tx) => {
                        if let Some(n) = g.waiters.get(&tx) {
                            n.notify_one();
                        }
                    }
                    other => background.push(other),
                }
            }
        }
        drop(g);
        drop(finished_ctxs);
        if let Some(sink) = &self.inner.trace {
            for r in &traces {
                sink.record(r);
            }
        }
        for a in background {
            let tg = self.clone();
            match a {
                Action::RunAbort(plan) => {
                    self.spawn_owned(async move { tg.run_abort(plan).await });
                }
                Action::LateCompensate(task) => {
                    self.spawn_owned(async move {
                        tg.late_compensate(task).await;
                        Ok(())
                    });
                }
                _ => {}
            }
        }
        match r {
            Ok(r) => Ok((r, lsn)),
            Err(e) => Err(self.inner.shared.lock().endings.explain(e)),
        }
    }

    /// Wakes L3 turnstile waiters after an eager call returned (only when one ever waited).
    pub(crate) fn notify_turnstile(&self) {
        if self.inner.turnstile_used.load(AtomicOrdering::SeqCst) {
            self.inner.turnstile.notify_waiters();
        }
    }

    /// Keeps `ctx` for the handlers of its effect until its transaction settles.
    pub(crate) fn keep_ctx(&self, ctx: CallCtx) {
        self.inner.shared.lock().ctxs.entry(ctx.tx).or_default().push(ctx);
    }

    /// The context for a handler of `tool` serving effect `effect` of `tx`: the one kept
    /// from the call, else one rebuilt from the ledger's record (nothing kept: the call ran
    /// in an earlier process, or the tool takes no context).
    pub(crate) fn call_ctx(&self, tool: &Tool, tx: TxId, effect: tidegate_core::EffectId) -> CallCtx {
        let shared = self.inner.shared.lock();
        if tool.wants_ctx()
            && let Some(c) = shared.ctxs.get(&tx).and_then(|v| v.iter().find(|c| c.effect == effect))
        {
            return c.clone();
        }
        CallCtx { key: shared.core.adapter_key(tx, effect), ..CallCtx::bare(tx, effect) }
    }

    /// The context recovery gives a handler of effect `effect` of `tx`: what the ledger
    /// recorded of the call (its adapter key), no handle.
    pub(crate) fn recovered_ctx(&self, tx: TxId, effect: tidegate_core::EffectId) -> CallCtx {
        CallCtx { key: self.inner.shared.lock().core.adapter_key(tx, effect), ..CallCtx::bare(tx, effect) }
    }

    /// Waits until everything the engine has appended so far is durable: after a settlement
    /// seen through an [`crate::AppendObserver`] (which sees batches when they are appended,
    /// before the store made them durable), this is the wait that makes it safe to report.
    pub async fn appended_durable(&self) -> Result<()> {
        self.durable(self.inner.store.last_lsn()).await
    }

    /// Waits until the ledger holds everything up to `lsn` durably.
    pub(crate) async fn durable(&self, lsn: Lsn) -> Result<()> {
        if lsn == 0 || self.inner.store.is_durable(lsn) {
            return Ok(());
        }
        // Resolved by the store's group-commit writer; no thread is parked per waiter.
        tidegate_storage::durable(&*self.inner.store, lsn).await.map_err(|e| self.store_failed(e))
    }

    /// The runtime error for a store failure met outside the engine lock (a durability wait):
    /// a fence stops the engine (its queued events will never be durable, so its state is
    /// ahead of the ledger); any other failure is returned as it is.
    pub(crate) fn store_failed(&self, e: StoreError) -> Error {
        let Some(fence) = Fence::from_store(self.plan_tenant(), &e) else { return Error::Store(e) };
        self.record_fence(&fence);
        self.inner.poisoned.store(true, AtomicOrdering::SeqCst);
        self.halt();
        Error::Fenced(self.fenced().unwrap_or(fence))
    }

    /// Keeps the first fence met (later ones say the same thing).
    fn record_fence(&self, fence: &Fence) {
        self.inner.fence.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            *f = Some(fence.clone());
            true
        });
    }

    /// After a fence: cancels the settlement tasks (the new owner's recovery finishes what
    /// they left, from the ledger), stops the plan executor, and wakes every commit and
    /// turnstile waiter, who find the engine stopped. Called without the engine lock.
    fn halt(&self) {
        self.inner.stop.notify_waiters();
        self.inner.turnstile.notify_waiters();
        let waiters: SmallVec<[Arc<Notify>; 4]> = self.inner.shared.lock().waiters.values().cloned().collect();
        for w in waiters {
            w.notify_one();
        }
        self.inner.plans.stop();
    }

    /// The error every operation gets once the engine has stopped: [`Error::Fenced`] after a
    /// fence, else `StoreError::Closed`.
    pub(crate) fn stopped_error(&self) -> Error {
        self.inner.stopped_error()
    }

    /// Refuses a read of the engine's state once it was fenced out: its state may be ahead of
    /// the ledger (a decision whose append was refused), and nothing unrecorded is shown.
    pub(crate) fn refuse_if_fenced(&self) -> Result<()> {
        match &*self.inner.fence.borrow() {
            Some(f) => Err(Error::Fenced(f.clone())),
            None => Ok(()),
        }
    }

    /// The fence, if this engine's store refused it as an old owner of its ledger stream (see
    /// [`Error::Fenced`]): the engine has stopped, and its owner should stop serving it.
    pub fn fenced(&self) -> Option<Fence> {
        self.inner.fence.borrow().clone()
    }

    /// Resolves with the fence once this engine is fenced out (at once if it already is), or
    /// with `None` if the engine is dropped first. Holds no reference to the engine, so an
    /// owner can watch from a task of its own without keeping the engine alive.
    pub fn when_fenced(&self) -> impl std::future::Future<Output = Option<Fence>> + Send + 'static {
        let mut rx = self.inner.fence.subscribe();
        async move { rx.wait_for(Option::is_some).await.ok().and_then(|f| f.clone()) }
    }
}

fn name_taken(registered: &Tool, tool: &Tool) -> Error {
    Error::InvalidArgument {
        field: "tool name",
        value: format!(
            "{:?}, already registered with another declaration ({}: registered vs this one)",
            tool.name(),
            registered.differences(tool)
        ),
        expected: "a name not registered to a different declaration on this engine (building the same \
                   declaration again is fine; use `redefine_tool` to replace one)",
    }
}
