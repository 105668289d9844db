//! The pull-worker queue of one tenant: in memory, derived from the engine's pending work
//! (a task exists exactly while a dispatch waits for it; after a crash, recovery dispatches
//! the pending releases and compensations again and so re-creates their tasks).
//!
//! ```text
//!   dispatch ─► queued ──poll──► leased(worker, until) ──report──► settled (dispatch resumes)
//!                 ▲                     │ lease expired (sweep)
//!                 └──── attempt + 1 ◄───┘      deadline passed ──► settled failed/unknown
//! ```

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::attempts::{Attempt, AttemptLog, now_ms};
use super::{CallOutcome, DispatchRequest, Operation};
use crate::ids;
use crate::registry::WorkerSpec;
use crate::settings::DispatchSection;

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

struct Entry {
    n: u64,
    req: DispatchRequest,
    attempt: u32,
    lease: Duration,
    leased: Option<(String, Instant)>,
    holders: Vec<String>,
    ever_leased: bool,
    done: Option<oneshot::Sender<(TaskResult, u32)>>,
    lease_started_ms: u64,
}

#[derive(Default)]
struct State {
    next: u64,
    tasks: HashMap<u64, Entry>,
    ready: HashMap<String, VecDeque<u64>>,
    /// Recently settled tasks (newest [`RECENT`]), so a late report is told `Settled`.
    recent: VecDeque<u64>,
}

/// Settled task ids remembered for late reports.
const RECENT: usize = 10_000;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskRefusal {
    /// No such task (or another tenant's).
    NotFound,
    /// The task has already settled.
    Settled,
    /// The worker does not hold (and never held) the task's lease.
    NotLeased,
}

/// The queue.
pub struct TaskQueue {
    tag: String,
    state: Mutex<State>,
    notify: Notify,
}

impl std::fmt::Debug for TaskQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskQueue").field("tag", &self.tag).finish_non_exhaustive()
    }
}

/// Removes a task whose dispatch was dropped.
struct Withdraw<'a> {
    queue: &'a TaskQueue,
    n: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let mut s = self.queue.state.lock();
        if let Some(e) = s.tasks.remove(&self.n) {
            if let Some(q) = s.ready.get_mut(&e.req.capability) {
                q.retain(|x| *x != self.n);
            }
            if s.recent.len() == RECENT {
                s.recent.pop_front();
            }
            s.recent.push_back(self.n);
        }
    }
}

impl TaskQueue {
    /// An empty queue for the tenant tagged `tag`.
    pub fn new(tag: impl Into<String>) -> TaskQueue {
        TaskQueue { tag: tag.into(), state: Mutex::new(State::default()), notify: Notify::new() }
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
        log: &AttemptLog,
    ) -> CallOutcome {
        let attempts = spec.attempts.unwrap_or(defaults.webhook_attempts).max(1);
        let backoff = Duration::from_millis(spec.backoff_ms.unwrap_or(defaults.webhook_backoff_ms));
        let (mut round, mut attempt) = (1u32, 1u32);
        loop {
            let (result, last) = match self.run_once(req, spec, defaults, log, attempt).await {
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

    /// One task for `req`, numbered `attempt`: the worker's result and the task's attempt
    /// number when it was reported, or the outcome the deadline decided.
    async fn run_once(
        &self,
        req: &DispatchRequest,
        spec: &WorkerSpec,
        defaults: &DispatchSection,
        log: &AttemptLog,
        attempt: u32,
    ) -> Result<(TaskResult, u32), CallOutcome> {
        let (tx, rx) = oneshot::channel();
        let lease = Duration::from_millis(spec.task_lease_ms.unwrap_or(defaults.task_lease_ms).max(1));
        let n = {
            let mut s = self.state.lock();
            s.next += 1;
            let n = s.next;
            s.tasks.insert(
                n,
                Entry {
                    n,
                    req: req.clone(),
                    attempt,
                    lease,
                    leased: None,
                    holders: Vec::new(),
                    ever_leased: false,
                    done: Some(tx),
                    lease_started_ms: 0,
                },
            );
            s.ready.entry(req.capability.clone()).or_default().push_back(n);
            n
        };
        let guard = Withdraw { queue: self, n };
        self.notify.notify_waiters();
        let result = match spec.deadline_ms {
            Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), rx).await {
                Ok(r) => r.ok(),
                Err(_) => {
                    let ever = self.state.lock().tasks.get(&n).is_some_and(|e| e.ever_leased);
                    let outcome = if ever {
                        CallOutcome::unknown(format!("no worker reported within the deadline of {ms} ms"))
                    } else {
                        CallOutcome::not_applied(
                            format!("no worker took the task within the deadline of {ms} ms"),
                            false,
                        )
                    };
                    log.record(
                        req.key.forward(),
                        attempt_record(req, 0, "expired", "deadline passed".into(), now_ms(), Some(now_ms())),
                    );
                    drop(guard);
                    return Err(outcome);
                }
            },
            None => rx.await.ok(),
        };
        drop(guard);
        // The sender was dropped without a report: cannot happen while the task exists.
        result.ok_or_else(|| CallOutcome::unknown("the task was withdrawn without a report"))
    }

    fn view(&self, e: &Entry) -> TaskView {
        let now = Instant::now();
        TaskView {
            id: ids::format(ids::Kind::Task, &self.tag, e.n),
            capability: e.req.capability.clone(),
            operation: e.req.operation,
            tool: e.req.tool.clone(),
            key: e.req.key.to_string(),
            args: (*e.req.args).clone(),
            output: e.req.output.as_ref().map(|o| (**o).clone()),
            attempt: e.attempt,
            state: if e.leased.is_some() { "leased".into() } else { "queued".into() },
            worker: e.leased.as_ref().map(|(w, _)| w.clone()),
            lease_expires_at_ms: e
                .leased
                .as_ref()
                .map(|(_, until)| now_ms().saturating_add(until.saturating_duration_since(now).as_millis() as u64)),
        }
    }

    /// Leases up to `p.max` queued tasks of `p.capabilities` to `p.worker`, waiting up to
    /// `p.wait` for one to appear (or `stop` to resolve).
    pub async fn poll(&self, p: &Poll, log: &AttemptLog, stop: impl std::future::Future<Output = ()>) -> Vec<TaskView> {
        let Poll { worker, capabilities, max, wait, lease } = p;
        let (max, lease) = (*max, *lease);
        let deadline = Instant::now() + *wait;
        tokio::pin!(stop);
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.take(worker, capabilities, max, lease, log);
            if !got.is_empty() || Instant::now() >= deadline {
                return got;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = &mut stop => return Vec::new(),
            }
        }
    }

    fn take(
        &self,
        worker: &str,
        capabilities: &[String],
        max: usize,
        lease: Option<Duration>,
        log: &AttemptLog,
    ) -> Vec<TaskView> {
        let mut s = self.state.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        for cap in capabilities {
            while out.len() < max {
                let Some(n) = s.ready.get_mut(cap).and_then(VecDeque::pop_front) else { break };
                let Some(e) = s.tasks.get_mut(&n) else { continue };
                if e.leased.is_some() || e.done.is_none() {
                    continue;
                }
                let l = lease.unwrap_or(e.lease);
                e.leased = Some((worker.to_owned(), now + l));
                e.ever_leased = true;
                e.lease_started_ms = now_ms();
                if !e.holders.iter().any(|h| h == worker) {
                    e.holders.push(worker.to_owned());
                }
                log.record(
                    e.req.key.forward(),
                    attempt_record(
                        &e.req,
                        e.attempt,
                        "leased",
                        format!("leased by `{worker}`"),
                        e.lease_started_ms,
                        None,
                    ),
                );
                let v = self.view(e);
                out.push(v);
            }
        }
        out
    }

    /// Extends `worker`'s lease of task `id`.
    pub fn heartbeat(&self, id: &str, worker: &str, lease: Option<Duration>) -> Result<TaskView, TaskRefusal> {
        let n = ids::parse(ids::Kind::Task, &self.tag, id).ok_or(TaskRefusal::NotFound)?;
        let mut s = self.state.lock();
        if s.recent.contains(&n) {
            return Err(TaskRefusal::Settled);
        }
        let e = s.tasks.get_mut(&n).ok_or(TaskRefusal::NotFound)?;
        if e.done.is_none() {
            return Err(TaskRefusal::Settled);
        }
        match &mut e.leased {
            Some((w, until)) if w == worker => {
                *until = Instant::now() + lease.unwrap_or(e.lease);
            }
            _ => return Err(TaskRefusal::NotLeased),
        }
        Ok(self.view(e))
    }

    /// Settles task `id` with `worker`'s result. The first report wins; the worker must hold
    /// or have held the task's lease.
    pub fn report(&self, id: &str, worker: &str, result: TaskResult, log: &AttemptLog) -> Result<(), TaskRefusal> {
        let n = ids::parse(ids::Kind::Task, &self.tag, id).ok_or(TaskRefusal::NotFound)?;
        let mut s = self.state.lock();
        if s.recent.contains(&n) {
            return Err(TaskRefusal::Settled);
        }
        let e = s.tasks.get_mut(&n).ok_or(TaskRefusal::NotFound)?;
        if !e.holders.iter().any(|h| h == worker) {
            return Err(if e.done.is_none() { TaskRefusal::Settled } else { TaskRefusal::NotLeased });
        }
        let Some(done) = e.done.take() else { return Err(TaskRefusal::Settled) };
        let label = match &result {
            TaskResult::Done { .. } => "done",
            TaskResult::Failed(_) => "failed",
            TaskResult::Transient(_) => "not_applied_retry",
            TaskResult::Unknown(_) => "unknown",
        };
        log.record(
            e.req.key.forward(),
            attempt_record(
                &e.req,
                e.attempt,
                label,
                format!("reported by `{worker}`"),
                e.lease_started_ms,
                Some(now_ms()),
            ),
        );
        e.leased = None;
        let _ = done.send((result, e.attempt));
        Ok(())
    }

    /// Returns tasks whose lease expired to the queue (same key, attempt + 1). Returns how
    /// many.
    pub fn sweep(&self, log: &AttemptLog) -> usize {
        let mut s = self.state.lock();
        let now = Instant::now();
        let mut expired = Vec::new();
        for e in s.tasks.values_mut() {
            if e.done.is_some()
                && let Some((w, until)) = &e.leased
                && *until <= now
            {
                log.record(
                    e.req.key.forward(),
                    attempt_record(
                        &e.req,
                        e.attempt,
                        "expired",
                        format!("lease of `{w}` expired"),
                        e.lease_started_ms,
                        Some(now_ms()),
                    ),
                );
                e.leased = None;
                e.attempt += 1;
                expired.push((e.req.capability.clone(), e.n));
            }
        }
        let k = expired.len();
        expired.sort_by_key(|(_, n)| *n);
        for (cap, n) in expired.into_iter().rev() {
            s.ready.entry(cap).or_default().push_front(n);
        }
        drop(s);
        if k > 0 {
            self.notify.notify_waiters();
        }
        k
    }

    /// The earliest lease deadline, for the sweeper's sleep.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.state.lock().tasks.values().filter_map(|e| e.leased.as_ref().map(|(_, u)| *u)).min()
    }

    /// Every unsettled task, oldest first.
    pub fn list(&self) -> Vec<TaskView> {
        let s = self.state.lock();
        let mut v: Vec<&Entry> = s.tasks.values().filter(|e| e.done.is_some()).collect();
        v.sort_by_key(|e| e.n);
        v.into_iter().map(|e| self.view(e)).collect()
    }

    /// `(queued, leased)` counts.
    pub fn depth(&self) -> (u64, u64) {
        let s = self.state.lock();
        let leased = s.tasks.values().filter(|e| e.done.is_some() && e.leased.is_some()).count() as u64;
        let queued = s.tasks.values().filter(|e| e.done.is_some() && e.leased.is_none()).count() as u64;
        (queued, leased)
    }

    /// Wakes every poller (shutdown).
    pub fn wake_all(&self) {
        self.notify.notify_waiters();
    }
}

fn attempt_record(
    req: &DispatchRequest,
    n: u32,
    result: &str,
    detail: String,
    started: u64,
    finished: Option<u64>,
) -> Attempt {
    Attempt {
        operation: req.operation,
        capability: req.capability.clone(),
        kind: "worker".into(),
        attempt: n,
        key: req.key.to_string(),
        started_at_ms: started,
        finished_at_ms: finished,
        result: result.into(),
        detail,
    }
}
