//! The tenant state that must outlive a process or move to another node (issue 28 item 5):
//! `Idempotency-Key` records, the pull-worker task queue and the dispatch attempt log, each
//! behind a trait about operations (never about SQL), with two implementations:
//!
//! | implementation | where | chosen for |
//! | --- | --- | --- |
//! | [`MemoryState`] | this process's memory | a `memory:` store (tests, `--memory`) |
//! | [`SqliteState`] | `<tenant dir>/state.db` (SQLite, WAL), one thread of its own | a durable (SQLite directory) store |
//! | [`PgState`] | tables with a `tenant` column in PostgreSQL, one thread of its own | a `postgres://` store: every node that may serve the tenant sees it |
//!
//! Every implementation runs through the same conformance suite (`state::conformance`, tests
//! only), the durable ones also through the restart test.
//!
//! ```text
//!   HTTP middleware ──begin/finish──────────► IdempotencyStore ─┐
//!   dispatch::TaskQueue ─enqueue/lease/heartbeat/report/expire─► TaskStore ─┼─► MemoryState | SqliteState
//!   dispatch (webhooks, workers) ─record/list─► AttemptStore ───┘
//! ```
//!
//! Contract (every implementation, every trait):
//! * Every operation is **submitted when the method is called**: it takes effect whether or
//!   not the returned future is polled; the future only reports the result. (So a `Drop` can
//!   withdraw a task or free a key without awaiting anything.) Operations submitted from one
//!   thread take effect in the order they were submitted.
//! * Each operation is atomic: it takes effect whole or not at all (one write transaction).
//! * An implementation never reads a clock: the caller passes `now_ms` (Unix milliseconds)
//!   where time matters, so tests decide what time it is.
//! * A failure is a [`StateError`]: typed, with `retryable()`, never a panic, and never a
//!   silent loss of a record that was acknowledged (a finished idempotency record, a lease
//!   given to a worker, a report accepted from one).
//! * Bounds: idempotency records at most [`Limits::idempotency_max`] and no older than
//!   [`Limits::idempotency_ttl_ms`] (completed ones are dropped, oldest first; a running one
//!   is kept until it finishes); attempts of the newest [`Limits::attempts_retained`] effect
//!   keys, at most [`ATTEMPTS_PER_KEY`] per key; settled tasks remembered for late reports,
//!   the newest [`SETTLED_TASKS_KEPT`].
//!
//! What a durable implementation keeps across a restart (docs/server.md, invariant 7 and
//! "Worker tasks"):
//! * A **completed** idempotency record replays the same recorded response (status, content
//!   type, location, body) after the restart. A record that was still **running** when the
//!   process stopped is dropped when the state is opened again: its request was never answered
//!   with a 2xx, so nothing was acknowledged, and the client's retry runs the request again,
//!   exactly as a retry of a request that failed. Keeping it would refuse the key
//!   `409 idempotency_key_in_progress` until the TTL ran out for a request no one runs.
//! * Tasks are **carried over**: a task the store held when it was opened, and that no
//!   dispatch of this opening waits for yet. A carried-over task keeps its id, attempt and
//!   lease: its worker's heartbeat and report are accepted as before (a report settles it
//!   and its result is kept). It is not offered to workers until a dispatch **adopts** it:
//!   [`TaskStore::enqueue`] of the same capability, operation and key (the engine's recovery
//!   dispatching a pending compensation or probe again, or the abort of a transaction whose
//!   abort the crash cut off) takes the carried-over task instead of creating one, and gets
//!   its result at once if a worker reported it. Once the tenant's recovery has ended,
//!   [`TaskStore::drop_carried_over`] settles (for good) the carried-over tasks no dispatch
//!   adopted whose lease has ended, or that were never leased: a started release or eager
//!   call is asked about by a probe, never sent again, so its old task must not be offered
//!   again. A worker's late report of a dropped task is refused as settled.
//! * Attempts are kept as recorded.

mod memory;
mod postgres;
mod sqlite;

#[cfg(test)]
mod conformance;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

pub use memory::MemoryState;
pub use postgres::{PG_STATE_SCHEMA_VERSION, PgState};
pub use sqlite::{STATE_FILE, SqliteState};

use crate::dispatch::queue::{TaskRefusal, TaskResult};
use crate::dispatch::{Attempt, Operation};
use crate::idempotency::{Begin, Fingerprint, Recorded};

/// What a state operation's future yields.
pub type StateFuture<T> = Pin<Box<dyn Future<Output = Result<T, StateError>> + Send + 'static>>;

/// Attempts kept per effect key (the oldest dropped beyond).
pub const ATTEMPTS_PER_KEY: usize = 64;

/// Settled task ids remembered, so that a late report is told `task_settled` rather than
/// `not_found`.
pub const SETTLED_TASKS_KEPT: usize = 10_000;

/// The bounds every implementation keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a completed idempotency record is kept after its request began, ms.
    pub idempotency_ttl_ms: u64,
    /// Idempotency records kept (at least 1).
    pub idempotency_max: usize,
    /// Effect keys whose attempts are kept, newest first (at least 1).
    pub attempts_retained: usize,
}

/// Why a state operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The state file is damaged or is not a state file: the tenant does not open. Moving
    /// the file aside opens the tenant with empty state (what a server of an earlier version
    /// had after every restart); nothing else is lost (the ledger is the truth).
    #[error(
        "state file {path} is unreadable: {detail}; move it aside to start with empty idempotency records, tasks and attempts"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The state file was written by a newer version.
    #[error("state file {path} has schema version {found}; this build reads up to {supported}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: i64,
        /// The newest this build reads.
        supported: i64,
    },
    /// The database failed.
    #[error("state file {path}: {op}: {source}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// SQLite's error.
        #[source]
        source: Arc<rusqlite::Error>,
    },
    /// The PostgreSQL database failed.
    #[error("tenant state in {path}: {op}: {source}")]
    Postgres {
        /// The database (without its password) and the tenant.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Whether the database said the condition is transient (a lost connection, a
        /// serialization failure, the server shutting down).
        retryable: bool,
        /// The client's error.
        #[source]
        source: Arc<::postgres::Error>,
    },
    /// I/O outside the database (creating the directory, starting the state's thread).
    #[error("state {path}: {op}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The state was closed (the tenant is closing); the operation was not done.
    #[error("the tenant's state is closed")]
    Closed,
}

impl StateError {
    /// Whether the same operation may succeed later (a busy or locked database, a full disk,
    /// an I/O hiccup). A damaged file, a newer version or a closed state are not.
    pub fn retryable(&self) -> bool {
        match self {
            StateError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(
                    rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                        | rusqlite::ErrorCode::DiskFull
                        | rusqlite::ErrorCode::SystemIoFailure
                )
            ),
            StateError::Postgres { retryable, .. } => *retryable,
            StateError::Io { .. } => true,
            StateError::Corrupt { .. } | StateError::Version { .. } | StateError::Closed => false,
        }
    }
}

/// `Idempotency-Key` records of one tenant (docs/server.md, invariant 7).
///
/// Contract:
/// * `begin(key, fp)` on a key not held: records it **running** with `fp` and answers
///   [`Begin::Proceed`]; the caller MUST end it with `finish`.
/// * On a key held: [`Begin::Mismatch`] naming the first difference if `fp` differs from the
///   first use's (method, path, body: [`crate::idempotency::difference`]); else
///   [`Begin::InProgress`] while running, [`Begin::Replay`] with the recorded response once
///   completed.
/// * `finish(key, Some(response))` completes a running record: from then on, `begin` with the
///   same fingerprint replays `response` byte for byte. `finish(key, None)` forgets a running
///   record (the request did not take effect: the key may be used again). `finish` of a key
///   not running does nothing.
/// * Before recording a new key, `begin` drops completed records begun more than
///   `idempotency_ttl_ms` before `now_ms`, then the oldest completed ones while more than
///   `idempotency_max` would be kept. Running records are never dropped by the bounds.
pub trait IdempotencyStore: Send + Sync + fmt::Debug {
    /// Checks `key` for a request with `fp`, marking it running if it is new.
    fn begin(&self, key: &str, fp: Fingerprint, now_ms: u64) -> StateFuture<Begin>;
    /// Ends the first use of `key` (see the contract).
    fn finish(&self, key: &str, response: Option<Recorded>) -> StateFuture<()>;
}

/// What a worker task runs: its dispatch, in the text the worker sees.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// The capability.
    pub capability: String,
    /// The operation.
    pub operation: Operation,
    /// The forward effect's tool.
    pub tool: String,
    /// The dispatch key, rendered (the worker runs the operation at most once per key).
    pub key: String,
    /// The forward effect's key (attempts are filed under it).
    pub effect_key: String,
    /// The arguments.
    pub args: Value,
    /// For a compensation, the forward call's output.
    pub output: Option<Value>,
}

/// A worker's lease of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLease {
    /// The worker.
    pub worker: String,
    /// When it ends, Unix ms.
    pub until_ms: u64,
}

/// A task as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// Its number (`task_<tag>_<n>`); never reused by a store.
    pub n: u64,
    /// What it runs.
    pub spec: Arc<TaskSpec>,
    /// 1 for the first lease; +1 each time a lease expired.
    pub attempt: u32,
    /// The lease a poll gives unless it asks for another, ms.
    pub lease_ms: u64,
    /// The current lease.
    pub lease: Option<TaskLease>,
    /// When the current (or last) lease began, Unix ms (0: never leased).
    pub lease_started_ms: u64,
    /// Whether any worker ever leased it (a deadline then makes its outcome unknown, not
    /// "not applied").
    pub ever_leased: bool,
}

/// What [`TaskStore::enqueue`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// A new task, queued.
    New(TaskRecord),
    /// A carried-over task of the same capability, operation and key, not settled: this
    /// dispatch waits for it now (it is offered to workers again once unleased).
    Adopted(TaskRecord),
    /// A carried-over task of the same capability, operation and key that a worker settled
    /// while no dispatch waited: its result and attempt.
    Settled(TaskRecord, TaskResult),
}

/// What [`TaskStore::report`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Reported {
    /// The task as it was when reported (its lease, attempt and start, for the attempt log).
    pub record: TaskRecord,
    /// Whether a dispatch of this opening waits for it (else it was carried over: the result
    /// is kept for a dispatch that adopts it).
    pub waited: bool,
}

/// What [`TaskStore::withdraw`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Withdrawn {
    /// It was unsettled and is settled now, without a result.
    Open(TaskRecord),
    /// It had settled already (a report won the race; [`TaskStore::outcome`] has the result).
    Settled,
    /// No such task.
    Unknown,
}

/// `(queued, leased)` counts of the tasks dispatches wait for.
pub type Depth = (u64, u64);

/// The pull-worker queue of one tenant (docs/server.md, "Worker tasks").
///
/// ```text
///   enqueue ─► queued ──lease──► leased(worker, until) ──report──► settled(result)
///                ▲                  │ expire (until ≤ now)              ▲
///                └── attempt + 1 ◄──┘                  withdraw ────────┘ (no result)
/// ```
///
/// Contract:
/// * `enqueue` returns a task this opening's dispatch waits for: a new one, or a carried-over
///   one it adopts (module docs). Task numbers grow and are never reused, across restarts
///   too.
/// * `lease` leases up to `max` queued, not carried-over tasks of `capabilities` (in the order
///   given; in each, the lowest number first) to `worker` until `now_ms + lease` (the
///   override, else the task's own `lease_ms`), and returns them leased.
/// * `heartbeat` extends the lease of the worker holding it (from `now_ms`); refused
///   [`TaskRefusal::NotLeased`] for another worker or an unleased task, `Settled` for a
///   settled one, `NotFound` for one never issued (or forgotten).
/// * `report` settles an unsettled task with `result` if `worker` holds or ever held its
///   lease (the work was done under the same key), even after the lease expired: the first
///   report wins; then `Settled`. Else `NotLeased`.
/// * `expire` returns every unsettled task whose lease ended (`until_ms ≤ now_ms`) to the
///   queue with `attempt + 1`, and returns them as they were (lease included).
/// * `withdraw` settles a task without a result (its dispatch ended).
/// * `outcome` is the result of a settled task with a report, and the attempt it was
///   reported at.
/// * `list` is every unsettled, not carried-over task, by number; `depth` counts them;
///   `next_expiry` is the earliest lease end of an unsettled task.
/// * `drop_carried_over(now_ms)` ends the carry-over of every carried-over task whose lease
///   ended (`until_ms ≤ now_ms`) or that has none: an unsettled one is settled without a
///   result; a reported one is no longer adopted. A reported task's lease end is the one it
///   had when it was reported.
pub trait TaskStore: Send + Sync + fmt::Debug {
    /// Queues a task (or adopts a carried-over one) numbered `attempt` if new.
    fn enqueue(&self, spec: TaskSpec, attempt: u32, lease_ms: u64) -> StateFuture<Enqueued>;
    /// Leases queued tasks to `worker`.
    fn lease(
        &self,
        worker: &str,
        capabilities: &[String],
        max: usize,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> StateFuture<Vec<TaskRecord>>;
    /// Extends `worker`'s lease of task `n`.
    fn heartbeat(
        &self,
        n: u64,
        worker: &str,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> StateFuture<Result<TaskRecord, TaskRefusal>>;
    /// Settles task `n` with `worker`'s result.
    fn report(&self, n: u64, worker: &str, result: TaskResult) -> StateFuture<Result<Reported, TaskRefusal>>;
    /// Returns tasks whose lease ended to the queue.
    fn expire(&self, now_ms: u64) -> StateFuture<Vec<TaskRecord>>;
    /// Settles task `n` without a result.
    fn withdraw(&self, n: u64) -> StateFuture<Withdrawn>;
    /// The reported result of task `n`, if it settled with one.
    fn outcome(&self, n: u64) -> StateFuture<Option<(TaskResult, u32)>>;
    /// Unsettled tasks, by number.
    fn list(&self) -> StateFuture<Vec<TaskRecord>>;
    /// `(queued, leased)`.
    fn depth(&self) -> StateFuture<Depth>;
    /// The earliest lease end, Unix ms.
    fn next_expiry(&self) -> StateFuture<Option<u64>>;
    /// Ends the carry-over of tasks no dispatch adopted whose lease ended; returns how many.
    fn drop_carried_over(&self, now_ms: u64) -> StateFuture<usize>;
}

/// The attempt log of one tenant: every webhook request and worker lease of a dispatch,
/// filed under the forward effect's key.
///
/// Contract: `list(key)` returns the attempts recorded under `key`, oldest first, at most
/// [`ATTEMPTS_PER_KEY`] (the oldest dropped); only the newest `attempts_retained` keys (by
/// their first attempt) are kept.
pub trait AttemptStore: Send + Sync + fmt::Debug {
    /// Records `attempt` under `effect_key`.
    fn record(&self, effect_key: &str, attempt: Attempt) -> StateFuture<()>;
    /// Records `attempt` under `effect_key` with nobody waiting: submitted now (a later
    /// `list` sees it), a failure logged. Stores may gather such records into one write.
    fn record_unwaited(&self, effect_key: &str, attempt: Attempt) {
        detach("recording a dispatch attempt", self.record(effect_key, attempt));
    }
    /// The attempts filed under `effect_key`.
    fn list(&self, effect_key: &str) -> StateFuture<Vec<Attempt>>;
}

/// One tenant's state: the three parts, from one implementation.
#[derive(Debug, Clone)]
pub struct TenantState {
    /// Idempotency records.
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// The worker queue.
    pub tasks: Arc<dyn TaskStore>,
    /// The attempt log.
    pub attempts: Arc<dyn AttemptStore>,
    sqlite: Option<Arc<SqliteState>>,
    postgres: Option<Arc<PgState>>,
}

impl TenantState {
    /// State in this process's memory: gone with it.
    pub fn memory(limits: Limits) -> TenantState {
        let m = Arc::new(MemoryState::new(limits));
        TenantState { idempotency: m.clone(), tasks: m.clone(), attempts: m, sqlite: None, postgres: None }
    }

    /// Durable state in `dir/`[`STATE_FILE`] (created if absent). Blocking.
    pub fn open_sqlite(dir: &std::path::Path, limits: Limits, name: &str) -> Result<TenantState, StateError> {
        let s = Arc::new(SqliteState::open(dir, limits, name)?);
        Ok(TenantState {
            idempotency: s.clone(),
            tasks: s.clone(),
            attempts: s.clone(),
            sqlite: Some(s),
            postgres: None,
        })
    }

    /// Durable state of tenant `name` in the PostgreSQL database at `url`, shared by every node
    /// that may serve the tenant. Blocking.
    pub fn open_postgres(url: &str, limits: Limits, name: &str) -> Result<TenantState, StateError> {
        let s = Arc::new(PgState::open(url, name, limits)?);
        Ok(TenantState {
            idempotency: s.clone(),
            tasks: s.clone(),
            attempts: s.clone(),
            sqlite: None,
            postgres: Some(s),
        })
    }

    /// Whether it survives the process.
    pub fn is_durable(&self) -> bool {
        self.sqlite.is_some() || self.postgres.is_some()
    }

    /// Finishes every operation submitted so far and lets go of the state file. Blocking.
    /// Later operations fail [`StateError::Closed`].
    pub fn close(&self) {
        if let Some(s) = &self.sqlite {
            s.close();
        }
        if let Some(s) = &self.postgres {
            s.close();
        }
    }
}

/// Runs a submitted operation whose result nobody waits for (a withdrawal from a `Drop`, an
/// attempt record), logging a failure. Inside a tokio runtime; outside one the operation
/// still takes effect (it was submitted) and only its failure goes unlogged.
pub(crate) fn detach<T: Send + 'static>(what: &'static str, fut: StateFuture<T>) {
    use futures::FutureExt;
    let mut fut = fut;
    match (&mut fut).now_or_never() {
        Some(Ok(_)) => {}
        Some(Err(e)) => tracing::warn!("{what}: {e}"),
        None => {
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                h.spawn(async move {
                    if let Err(e) = fut.await {
                        tracing::warn!("{what}: {e}");
                    }
                });
            }
        }
    }
}
