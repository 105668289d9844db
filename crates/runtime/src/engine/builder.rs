//! Configuring an engine: [`Builder`] and its options, the retry policy every call uses, and
//! the task scope settlement tasks run in. [`Builder::build`] is in `open.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tidegate_core::{Ablation, CoreConfig, Isolation, Level, Ordering, ScopeRegistry};
use tidegate_storage::LedgerStore;

use super::Tidegate;
use crate::Result;
use crate::checkpoint::CheckpointPolicy;
use crate::clock::Clock;
use crate::trace::{FileTrace, TraceSink};

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

/// Builds a [`Tidegate`].
pub struct Builder {
    pub(super) cfg: CoreConfig,
    pub(super) scopes: ScopeRegistry,
    pub(super) store: Option<Arc<dyn LedgerStore>>,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) retry: RetryPolicy,
    pub(super) trace: Option<Arc<dyn TraceSink>>,
    pub(super) checkpoints: CheckpointPolicy,
    pub(super) task_scope: Option<TaskScope>,
    pub(super) tenant: Option<String>,
    pub(super) observers: Vec<Arc<dyn crate::observer::AppendObserver>>,
    pub(super) tools: Vec<crate::Tool>,
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
    /// Tools registered as the engine opens, before anything it recovered can run: the
    /// transactions whose leases ran out while no process held the ledger abort as soon as
    /// the engine makes its first change, and their compensations need their tools. An
    /// embedder that knows its tools up front (a server reading them from its catalog) passes
    /// them here; [`Tidegate::register`] after the build is the same for a fresh ledger.
    pub fn tools(mut self, tools: impl IntoIterator<Item = crate::Tool>) -> Self {
        self.tools.extend(tools);
        self
    }

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

    /// The ledger store (default: a new [`MemoryStore`](crate::MemoryStore)).
    pub fn store(mut self, store: Arc<dyn LedgerStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The clock (default: [`TokioClock`](crate::TokioClock)).
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
            tools: Vec::new(),
        }
    }

    /// An in-memory engine with every default.
    pub fn in_memory() -> Result<Tidegate> {
        Tidegate::builder().build()
    }
}
