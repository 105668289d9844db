//! The pull-worker queue of one tenant: the process's side of it (the dispatches waiting for
//! their tasks, the long polls waiting for work) over the tenant's [`TaskStore`], which holds
//! the tasks themselves (in memory, or durable in the tenant's state file: a task leased
//! before a restart is still known after it; `state` module docs, "carried over").
//!
//! A task exists while a dispatch waits for it; after a crash, recovery dispatches the
//! pending compensations and probes again, which adopt their carried-over tasks (same id,
//! attempt and lease), and the carried-over tasks nobody adopted are dropped once recovery
//! has ended and their lease has ended ([`TaskQueue::end_carry_over`]).
//!
//! ```text
//!   dispatch ─► queued ──poll──► leased(worker, until) ──report──► settled (dispatch resumes)
//!                 ▲                     │ lease expired (sweep)
//!                 └──── attempt + 1 ◄───┘      deadline passed ──► settled failed/unknown
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::attempts::{Attempt, AttemptLog, now_ms};
use super::{CallOutcome, DispatchRequest, Operation};
use crate::error::{Result, ServiceError};
use crate::ids;
use crate::registry::WorkerSpec;
use crate::settings::DispatchSection;
use crate::state::{Depth, Enqueued, StateError, TaskRecord, TaskSpec, TaskStore, Withdrawn, detach};

/// What a worker reported.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskResult {
    /// Done (for a probe: the call happened), with its output.
    Done {
        /// Output.
        output: Value,
        /// Residue (compensations).
        residue: Option<String>,
    },
    /// Certainly not done (for a probe: the call did not happen).
    Failed(String),
    /// Certainly not done, and trying again may succeed (a refused connection, a 503 before
    /// processing): queued again under the same key within the capability's attempts (for a
    /// probe: the call did not happen).
    Transient(String),
    /// The worker cannot tell.
    Unknown(String),
}

/// A task as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskView {
    /// `task_<tag>_<n>`.
    pub id: String,
    /// The capability.
    pub capability: String,
    /// The operation.
    pub operation: Operation,
    /// The tool.
    pub tool: String,
    /// The idempotency key: run the operation at most once per key.
    pub key: String,
    /// The arguments.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub args: Value,
    /// For a compensation, the forward call's output.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub output: Option<Value>,
    /// 1 for the first lease; +1 each time a lease expired.
    pub attempt: u32,
    /// `queued` or `leased`.
    pub state: String,
    /// The worker holding the lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// When the lease ends, Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at_ms: Option<u64>,
}

/// A worker's poll.
#[derive(Debug, Clone)]
pub struct Poll {
    /// The worker's name.
    pub worker: String,
    /// The capabilities it serves.
    pub capabilities: Vec<String>,
    /// Most tasks to lease.
    pub max: usize,
    /// How long to wait for one.
    pub wait: Duration,
    /// Lease override.
    pub lease: Option<Duration>,
}

/// Why a worker's call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRefusal {
    /// No such task (or another tenant's).
    NotFound,
    /// The task has already settled.
    Settled,
    /// The worker does not hold (and never held) the task's lease.
    NotLeased,
}

/// How often a waiting dispatch reads its task's outcome even if no report woke it (a report
/// settled by another process, a wake-up lost).
const RECHECK: Duration = Duration::from_secs(2);

/// Dispatches waiting for their tasks: a wake-up per task number, stored as a permit when the
/// report comes first.
type Waiters = Arc<Mutex<HashMap<u64, Arc<Notify>>>>;

/// The queue.
pub struct TaskQueue {
    tag: String,
    store: Arc<dyn TaskStore>,
    log: AttemptLog,
    waiters: Waiters,
    /// Wakes long polls when a task is queued or returned to the queue.
    notify: Notify,
    /// Set when the tenant closes: a dispatch dropped then leaves its task in the store
    /// (carried over to the next opening) instead of withdrawing it.
    closing: Arc<AtomicBool>,
    /// `(queued, leased)` as of the last sweep.
    depth: Mutex<Depth>,
    /// Set once the tenant's recovery has ended: from then on each sweep drops the
    /// carried-over tasks nobody adopted whose lease has ended.
    recovered: AtomicBool,
}

impl std::fmt::Debug for TaskQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskQueue").field("tag", &self.tag).finish_non_exhaustive()
    }
}

/// A dispatch waiting for task `n`: forgets its wake-up and, if the dispatch was dropped,
/// withdraws the task (unless the tenant is closing).
struct Waiting<'a> {
    queue: &'a TaskQueue,
    n: u64,
    settled: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.queue.waiters.lock().remove(&self.n);
        if !self.settled && !self.queue.closing.load(Ordering::Relaxed) {
            detach("withdrawing a task", self.queue.store.withdraw(self.n));
        }
    }
}

fn wake(waiters: &Waiters, n: u64) {
    waiters.lock().entry(n).or_default().notify_one();
}

fn state_unknown(what: &str, e: &StateError) -> CallOutcome {
    CallOutcome::unknown(format!("{what}: {e}"))
}

impl TaskQueue {
    /// The queue of the tenant tagged `tag`, over `store`, recording attempts in `log`.
    pub fn new(tag: impl Into<String>, store: Arc<dyn TaskStore>, log: AttemptLog) -> TaskQueue {
        TaskQueue {
            tag: tag.into(),
            store,
            log,
            waiters: Arc::default(),
            notify: Notify::new(),
            closing: Arc::default(),
            depth: Mutex::new((0, 0)),
            recovered: AtomicBool::new(false),
        }
    }

    /// Queues `req` and waits for a worker's report (or the deadline). A report that the
    /// operation certainly did not take effect but may succeed if tried again
    /// ([`TaskResult::Transient`]) queues it again under the same key after a backoff, up to
    /// the capability's `attempts`; after the last it is [`CallOutcome::NotApplied`] with `retry: true`.
    pub(super) async fn run(
        &self,
        req: &DispatchRequest,
        spec: &WorkerSpec,
        defaults: &DispatchSection,
    ) -> CallOutcome {
        let attempts = spec.attempts.unwrap_or(defaults.webhook_attempts).max(1);
        let backoff = Duration::from_millis(spec.backoff_ms.unwrap_or(defaults.webhook_backoff_ms));
        let (mut round, mut attempt) = (1u32, 1u32);
        loop {
            let (result, last) = match self.run_once(req, spec, defaults, attempt).await {
                Ok(r) => r,
                Err(outcome) => return outcome,
            };
            match result {
                TaskResult::Done { output, residue } => return CallOutcome::done_with_residue(output, residue),
                TaskResult::Failed(m) => return CallOutcome::not_applied(m, false),
                TaskResult::Unknown(m) => return CallOutcome::unknown(m),
                // For a probe, "not applied" is the answer "the call did not happen".
                TaskResult::Transient(m) if req.operation == Operation::Probe => {
                    return CallOutcome::not_applied(m, false);
                }
                TaskResult::Transient(m) if round >= attempts => {
                    return CallOutcome::not_applied(format!("{m} (after {round} of {attempts} attempts)"), true);
                }
                TaskResult::Transient(_) => {
                    let factor = 1u32.checked_shl(round - 1).unwrap_or(u32::MAX);
                    tokio::time::sleep(backoff.saturating_mul(factor).min(Duration::from_secs(30))).await;
                    round += 1;
                    attempt = last.saturating_add(1);
                }
            }
        }
    }

    /// One task for `req`, numbered `attempt` (or the carried-over task it adopts): the
    /// worker's result and the task's attempt number when it was reported, or the outcome
    /// the deadline decided.
    async fn run_once(
        &self,
        req: &DispatchRequest,
        spec: &WorkerSpec,
        defaults: &DispatchSection,
        attempt: u32,
    ) -> std::result::Result<(TaskResult, u32), CallOutcome> {
        let lease_ms = spec.task_lease_ms.unwrap_or(defaults.task_lease_ms).max(1);
        let task = TaskSpec {
            capability: req.capability.clone(),
            operation: req.operation,
            tool: req.tool.clone(),
            key: req.key.to_string(),
            effect_key: req.key.forward().to_owned(),
            args: (*req.args).clone(),
            output: req.output.as_ref().map(|o| (**o).clone()),
        };
        // Whether a failed write took effect is not known here: the outcome is unknown (the
        // engine's probe decides), never "not applied".
        let rec = match self.enqueue(task, attempt, lease_ms).await {
            Ok(Enqueued::Settled(rec, result)) => return Ok((result, rec.attempt)),
            Ok(Enqueued::New(rec) | Enqueued::Adopted(rec)) => rec,
            Err(e) => return Err(state_unknown("the task could not be queued", &e)),
        };
        let n = rec.n;
        let wakeup = self.waiters.lock().entry(n).or_default().clone();
        let mut guard = Waiting { queue: self, n, settled: false };
        self.notify.notify_waiters();
        let Some(ms) = spec.deadline_ms else {
            let r = self.wait_for(n, &wakeup).await;
            // A result settled the task; a failure to read it withdraws it (the guard).
            guard.settled = r.is_ok();
            return r;
        };
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(ms), self.wait_for(n, &wakeup)).await {
            guard.settled = r.is_ok();
            return r;
        }
        guard.settled = true;
        match self.store.withdraw(n).await {
            Ok(Withdrawn::Open(rec)) => {
                let outcome = if rec.ever_leased {
                    CallOutcome::unknown(format!("no worker reported within the deadline of {ms} ms"))
                } else {
                    CallOutcome::not_applied(format!("no worker took the task within the deadline of {ms} ms"), false)
                };
                let now = now_ms();
                self.log.record(
                    &rec.spec.effect_key,
                    attempt_record(&rec.spec, 0, "expired", "deadline passed".into(), now, Some(now)),
                );
                Err(outcome)
            }
            // A report won the race with the deadline: it counts.
            Ok(Withdrawn::Settled) => match self.store.outcome(n).await {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err(CallOutcome::unknown("the task was withdrawn without a report")),
                Err(e) => Err(state_unknown("reading the task's result", &e)),
            },
            Ok(Withdrawn::Unknown) => Err(CallOutcome::unknown("the task was forgotten without a report")),
            Err(e) => Err(state_unknown("withdrawing the task at its deadline", &e)),
        }
    }

    /// Submits the task now; if the dispatch is dropped before the store answers, the task
    /// is withdrawn once it is there (unless the tenant is closing).
    async fn enqueue(&self, task: TaskSpec, attempt: u32, lease_ms: u64) -> std::result::Result<Enqueued, StateError> {
        let fut = self.store.enqueue(task, attempt, lease_ms);
        let (tx, rx) = oneshot::channel();
        let (store, closing) = (self.store.clone(), self.closing.clone());
        tokio::spawn(async move {
            if let Err(Ok(Enqueued::New(rec) | Enqueued::Adopted(rec))) = tx.send(fut.await)
                && !closing.load(Ordering::Relaxed)
            {
                detach("withdrawing a task nobody waits for", store.withdraw(rec.n));
            }
        });
        rx.await.unwrap_or(Err(StateError::Closed))
    }

    /// Waits until task `n` has a reported result.
    async fn wait_for(&self, n: u64, wakeup: &Notify) -> std::result::Result<(TaskResult, u32), CallOutcome> {
        loop {
            tokio::select! {
                _ = wakeup.notified() => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
            match self.store.outcome(n).await {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) if e.retryable() => tracing::warn!("reading task {n}'s result: {e}"),
                Err(e) => return Err(state_unknown("reading the task's result", &e)),
            }
        }
    }

    fn view(&self, r: &TaskRecord) -> TaskView {
        TaskView {
            id: ids::format(ids::Kind::Task, &self.tag, r.n),
            capability: r.spec.capability.clone(),
            operation: r.spec.operation,
            tool: r.spec.tool.clone(),
            key: r.spec.key.clone(),
            args: r.spec.args.clone(),
            output: r.spec.output.clone(),
            attempt: r.attempt,
            state: if r.lease.is_some() { "leased".into() } else { "queued".into() },
            worker: r.lease.as_ref().map(|l| l.worker.clone()),
            lease_expires_at_ms: r.lease.as_ref().map(|l| l.until_ms),
        }
    }

    /// Leases up to `p.max` queued tasks of `p.capabilities` to `p.worker`, waiting up to
    /// `p.wait` for one to appear (or `stop` to resolve).
    pub async fn poll(&self, p: &Poll, stop: impl std::future::Future<Output = ()>) -> Result<Vec<TaskView>> {
        let Poll { worker, capabilities, max, wait, lease } = p;
        let lease_ms = lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1));
        let deadline = Instant::now() + *wait;
        tokio::pin!(stop);
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.store.lease(worker, capabilities, *max, lease_ms, now_ms()).await?;
            for r in &got {
                self.log
                    .record_and_wait(
                        &r.spec.effect_key,
                        attempt_record(
                            &r.spec,
                            r.attempt,
                            "leased",
                            format!("leased by `{worker}`"),
                            r.lease_started_ms,
                            None,
                        ),
                    )
                    .await;
            }
            if !got.is_empty() || Instant::now() >= deadline {
                return Ok(got.iter().map(|r| self.view(r)).collect());
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = &mut stop => return Ok(Vec::new()),
            }
        }
    }

    /// Extends `worker`'s lease of task `id`.
    pub async fn heartbeat(
        &self,
        id: &str,
        worker: &str,
        lease: Option<Duration>,
    ) -> Result<std::result::Result<TaskView, TaskRefusal>> {
        let Some(n) = ids::parse(ids::Kind::Task, &self.tag, id) else { return Ok(Err(TaskRefusal::NotFound)) };
        let lease_ms = lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1));
        Ok(self.store.heartbeat(n, worker, lease_ms, now_ms()).await?.map(|r| self.view(&r)))
    }

    /// Settles task `id` with `worker`'s result. The first report wins; the worker must hold
    /// or have held the task's lease. The settlement and the wake-up of the dispatch waiting
    /// for it happen on a task of their own: a caller that goes away does not split them.
    pub async fn report(
        &self,
        id: &str,
        worker: &str,
        result: TaskResult,
    ) -> Result<std::result::Result<(), TaskRefusal>> {
        let Some(n) = ids::parse(ids::Kind::Task, &self.tag, id) else { return Ok(Err(TaskRefusal::NotFound)) };
        let label = match &result {
            TaskResult::Done { .. } => "done",
            TaskResult::Failed(_) => "failed",
            TaskResult::Transient(_) => "not_applied_retry",
            TaskResult::Unknown(_) => "unknown",
        };
        let fut = self.store.report(n, worker, result);
        let (log, waiters, worker) = (self.log.clone(), self.waiters.clone(), worker.to_owned());
        let settle = tokio::spawn(async move {
            let r = fut.await;
            if let Ok(Ok(rep)) = &r {
                let rec = &rep.record;
                log.record_and_wait(
                    &rec.spec.effect_key,
                    attempt_record(
                        &rec.spec,
                        rec.attempt,
                        label,
                        format!("reported by `{worker}`"),
                        rec.lease_started_ms,
                        Some(now_ms()),
                    ),
                )
                .await;
                if rep.waited {
                    wake(&waiters, n);
                }
            }
            r
        });
        let r = settle.await.map_err(|e| ServiceError::Internal(format!("settling task {id}: {e}")))??;
        Ok(r.map(|_| ()))
    }

    /// Returns tasks whose lease expired to the queue (same key, attempt + 1), drops the
    /// carried-over tasks nobody adopted once recovery has ended, and refreshes the counts
    /// [`TaskQueue::depth`] reports. Returns how many expired.
    pub async fn sweep(&self) -> Result<usize> {
        let now = now_ms();
        if self.recovered.load(Ordering::Relaxed) {
            self.store.drop_carried_over(now).await?;
        }
        let expired = self.store.expire(now).await?;
        for r in &expired {
            let worker = r.lease.as_ref().map_or("", |l| l.worker.as_str());
            self.log
                .record_and_wait(
                    &r.spec.effect_key,
                    attempt_record(
                        &r.spec,
                        r.attempt,
                        "expired",
                        format!("lease of `{worker}` expired"),
                        r.lease_started_ms,
                        Some(now),
                    ),
                )
                .await;
        }
        if !expired.is_empty() {
            self.notify.notify_waiters();
        }
        *self.depth.lock() = self.store.depth().await?;
        Ok(expired.len())
    }

    /// The earliest lease deadline, for the sweeper's sleep.
    pub async fn next_expiry(&self) -> Result<Option<Instant>> {
        let until = self.store.next_expiry().await?;
        Ok(until.map(|u| Instant::now() + Duration::from_millis(u.saturating_sub(now_ms()))))
    }

    /// Every unsettled task, oldest first.
    pub async fn list(&self) -> Result<Vec<TaskView>> {
        Ok(self.store.list().await?.iter().map(|r| self.view(r)).collect())
    }

    /// `(queued, leased)` counts as of the last sweep (at most a quarter of a second old while
    /// the tenant runs).
    pub fn depth(&self) -> Depth {
        *self.depth.lock()
    }

    /// The tenant's recovery has ended (it dispatched again whatever it resumes): the
    /// carried-over tasks no dispatch adopted are dropped, now and by every later sweep, once
    /// their lease has ended (a worker holding one may still heartbeat and report until then;
    /// a later dispatch of the same operation and key still adopts it, and its result).
    /// Returns how many were dropped now.
    pub async fn end_carry_over(&self) -> Result<usize> {
        self.recovered.store(true, Ordering::Relaxed);
        Ok(self.store.drop_carried_over(now_ms()).await?)
    }

    /// The tenant is closing: dispatches dropped from now on leave their tasks in the store
    /// for the next opening.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.notify.notify_waiters();
    }

    /// Wakes every poller (shutdown).
    pub fn wake_all(&self) {
        self.notify.notify_waiters();
    }
}

fn attempt_record(
    spec: &TaskSpec,
    n: u32,
    result: &str,
    detail: String,
    started: u64,
    finished: Option<u64>,
) -> Attempt {
    Attempt {
        operation: spec.operation,
        capability: spec.capability.clone(),
        kind: "worker".into(),
        attempt: n,
        key: spec.key.clone(),
        started_at_ms: started,
        finished_at_ms: finished,
        result: result.into(),
        detail,
    }
}
