//! The engine handle: the state machine behind a lock, the store, the clock, and the tasks
//! that execute what the state machine decides.
//!
//! ```text
//!  mod.rs          Tidegate, its shared state (Inner, Shared), reads of the engine's state
//!  builder.rs      Builder, RetryPolicy, TaskScope
//!  open.rs         Builder::build: replay from the checkpoint, the checkpoint thread's seed
//!  transactions.rs TxOptions, begin, a handle by id, lease reaping
//!  endings.rs      how finished transactions ended (memory, then the ledger)
//!  tools.rs        the tool registry, call contexts, the L3 turnstile's wake-up
//!  transition.rs   with_core: lock, append, observers, actions; durability waits
//!  fence.rs        fencing: record, halt, refuse, watch
//! ```

use rustc_hash::FxHashMap as HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use tidegate_core::engine::Stats;
use tidegate_core::{Core, Level, Scope, ScopeRegistry, TxId};
use tidegate_storage::LedgerStore;
use tokio::sync::Notify;

use crate::checkpoint::{Checkpointer, ReplayReport};
use crate::clock::Clock;
use crate::hooks::PreCommitHook;
use crate::tool::{CallCtx, Tool};
use crate::trace::TraceSink;
use crate::{Error, Fence, Result};

mod builder;
mod endings;
mod fence;
mod open;
mod tools;
mod transactions;
mod transition;

pub use builder::{Builder, RetryPolicy, TaskScope};
use endings::Endings;
pub use transactions::TxOptions;

pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) waiters: HashMap<TxId, Arc<Notify>>,
    /// How recently decided transactions ended, so that an error about one says how.
    pub(crate) endings: Endings,
    /// The contexts of calls whose tool takes one or that carry a handle, until their
    /// transaction settles (`crate::tool::CallCtx`).
    pub(crate) ctxs: HashMap<TxId, SmallVec<[CallCtx; 2]>>,
    /// The last appended batch, whose allocation the next one reuses when no listener kept it
    /// (`Core::take_batch`).
    pub(crate) spare: Option<tidegate_core::Batch>,
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
    _own: Option<open::OwnedRuntime>,
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
}
