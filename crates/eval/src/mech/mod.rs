//! Mechanisms: Tidegate and the baselines it is compared with, behind one trait.
//!
//! A workload describes what an agent does as a [`Body`]: reads, plan pauses, tool calls,
//! written once against [`Attempt`]. A [`Mechanism`] decides what those operations *mean*:
//! whether a read takes a lock or records a version, whether a call runs now, is reserved,
//! buffered or queued, what commit and abort do, and whether a failed attempt is re-planned.
//! The same body runs under every mechanism; the sinks' own records decide the outcome.
//!
//! ```text
//!   workload ──Body──▶ run_task ──begin/read/call/commit/abort──▶ Mechanism ──▶ World ──▶ sinks
//!                         ▲                                                     (faults)
//!                         └── replan? (stale read, rejection, replay from checkpoint)
//! ```
//!
//! | mode | mechanism (file) |
//! | --- | --- |
//! | No-Tx | [`eager`]: calls straight to the provider, naive retry, nothing undone |
//! | Saga-Compensation | [`eager`]: calls straight to the provider, compensations in reverse on abort |
//! | Workflow-Lock | [`eager`]: one global lock held for the whole task, saga undo |
//! | Per-Call-Lock | [`eager`]: a per-scope lock held only during each read or call, saga undo |
//! | Checkpoint-Replay | [`checkpoint`]: restore the agent's checkpoint and replay the body |
//! | OCC-Revalidate-and-Retry | [`occ`]: versions recorded on read, DB writes validated and applied at commit, re-plan on conflict |
//! | TCC-Confirm | [`tcc`]: try at call, confirm at commit, cancel at abort, per wired tool |
//! | Mutex+WAL+Rollback | [`mutex_wal`]: strict per-scope locks, write-ahead log, gated irreversibles, rollback |
//! | Tidegate (Tx-…) | [`tidegate`]: the real engine, at each setting and ablation |

pub mod checkpoint;
pub mod eager;
pub mod mutex_wal;
pub mod occ;
pub mod tcc;
pub mod tidegate;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;

use crate::world::{CallError, Observed, ToolSpec, World};

/// Why an attempt ended without committing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Abort {
    /// A tool call failed (after the mechanism's retries).
    ToolFailed(String),
    /// A read was overtaken by a commit.
    StaleRead(String),
    /// The pre-commit validator vetoed.
    Veto(String),
    /// The task's deadline passed.
    Timeout,
    /// Another speculative branch won.
    LostBranch,
    /// The mechanism refused the commit (OCC conflict, lock timeout, wait timeout).
    Rejected(String),
    /// Anything else (a protocol error, a body error).
    Other(String),
}

impl Abort {
    /// A short name.
    pub fn kind(&self) -> &'static str {
        match self {
            Abort::ToolFailed(_) => "tool_failed",
            Abort::StaleRead(_) => "stale_read",
            Abort::Veto(_) => "veto",
            Abort::Timeout => "timeout",
            Abort::LostBranch => "lost_branch",
            Abort::Rejected(_) => "rejected",
            Abort::Other(_) => "other",
        }
    }
}

impl From<CallError> for Abort {
    fn from(e: CallError) -> Abort {
        Abort::ToolFailed(e.to_string())
    }
}

/// A pre-commit validator over the arguments of the task's calls: `Some(reason)` vetoes.
pub type Validator = Arc<dyn Fn(&[Value]) -> Option<String> + Send + Sync>;

/// What a task declares up front.
#[derive(Clone, Default)]
pub struct TaskSpec {
    /// The agent.
    pub agent: String,
    /// Scopes the task may touch (Tidegate's may-touch declaration; lock baselines ignore it).
    pub may_touch: Vec<String>,
    /// The task's deadline (the timeout abort source).
    pub deadline: Option<Duration>,
    /// The pre-commit validator (the veto abort source).
    pub validator: Option<Validator>,
}

impl std::fmt::Debug for TaskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSpec")
            .field("agent", &self.agent)
            .field("may_touch", &self.may_touch)
            .field("deadline", &self.deadline)
            .field("validator", &self.validator.is_some())
            .finish()
    }
}

/// How one attempt settled.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Settled {
    /// Committed.
    pub committed: bool,
    /// Why not.
    pub abort: Option<Abort>,
    /// Time spent waiting for locks or earlier transactions.
    pub wait: Duration,
    /// Commits the mechanism refused (OCC conflicts, stale-read aborts, lock timeouts).
    pub rejections: u32,
    /// Effects the mechanism itself reports as unresolved (its residue classification).
    pub reported_unresolved: u32,
}

impl Settled {
    /// An abort with nothing else to say.
    pub fn aborted(why: Abort) -> Settled {
        Settled { abort: Some(why), ..Settled::default() }
    }
}

/// One attempt at a task under a mechanism. Methods take `&self`; an attempt is shared
/// between the body and the driver.
pub trait Attempt: Send + Sync {
    /// Reads a scope (an order's status and version).
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>>;
    /// Issues a tool call.
    fn call<'a>(&'a self, tool: &'a ToolSpec, args: Value) -> BoxFuture<'a, Result<(), Abort>>;
    /// Commits (runs the validator first).
    fn commit(&self) -> BoxFuture<'_, Settled>;
    /// Aborts.
    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled>;
}

/// A task body: what the agent does in one attempt (`attempt` counts from 1).
pub type Body = Arc<dyn Fn(Arc<dyn Attempt>, u32) -> BoxFuture<'static, Result<(), Abort>> + Send + Sync>;

/// A mechanism instance for one trial (its locks, engine and logs are the trial's).
pub trait Mechanism: Send + Sync {
    /// Starts an attempt.
    fn begin<'a>(&'a self, spec: &'a TaskSpec, attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>>;

    /// Starts `k` speculative branches of one decision. Default: `k` independent attempts.
    fn begin_group<'a>(&'a self, spec: &'a TaskSpec, k: usize) -> BoxFuture<'a, Result<Vec<Arc<dyn Attempt>>, Abort>> {
        Box::pin(async move {
            let mut v = Vec::with_capacity(k);
            for _ in 0..k {
                v.push(self.begin(spec, 1).await?);
            }
            Ok(v)
        })
    }

    /// Settles a group: aborts every loser as a lost branch, then commits the winner.
    fn settle_group<'a>(&'a self, branches: &'a [Arc<dyn Attempt>], winner: usize) -> BoxFuture<'a, Vec<Settled>> {
        Box::pin(async move {
            let mut out = vec![Settled::default(); branches.len()];
            for (i, b) in branches.iter().enumerate() {
                if i != winner {
                    out[i] = b.abort(Abort::LostBranch).await;
                }
            }
            if let Some(w) = branches.get(winner) {
                out[winner] = w.commit().await;
            }
            out
        })
    }

    /// Whether an attempt that ended with `abort` is run again (re-planned from fresh reads,
    /// or replayed). Default: never.
    fn replan(&self, _abort: &Abort, _attempt: u32) -> bool {
        false
    }

    /// Whether the mechanism enforces the task deadline itself (Tidegate's lease); otherwise
    /// the orchestrator cancels the body at the deadline and aborts the attempt.
    fn enforces_deadline(&self) -> bool {
        false
    }

    /// Engine-measured wait, when the mechanism measures it itself.
    fn engine_wait(&self) -> Option<(u64, Duration)> {
        None
    }
}

/// The settlement of a task across its attempts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskReport {
    /// Committed in the end.
    pub committed: bool,
    /// The last abort, when it did not commit.
    pub abort: Option<Abort>,
    /// Attempts run.
    pub attempts: u32,
    /// Total wait.
    pub wait: Duration,
    /// Refused commits.
    pub rejections: u32,
    /// Unresolved effects the mechanism reported.
    pub reported_unresolved: u32,
}

impl TaskReport {
    fn absorb(&mut self, s: &Settled) {
        self.committed = s.committed;
        self.abort = s.abort.clone();
        self.wait += s.wait;
        self.rejections += s.rejections;
        self.reported_unresolved += s.reported_unresolved;
    }
}

/// Runs a task to its end under `mech`: begin, body (under the orchestrator's deadline unless
/// the mechanism enforces it), commit or abort, and again, after [`backoff`], while the
/// mechanism re-plans.
pub async fn run_task(mech: &dyn Mechanism, spec: &TaskSpec, body: &Body) -> TaskReport {
    let mut report = TaskReport::default();
    let mut attempt = 1;
    loop {
        report.attempts = attempt;
        let settled = match mech.begin(spec, attempt).await {
            Err(why) => Settled { rejections: u32::from(matches!(why, Abort::Rejected(_))), ..Settled::aborted(why) },
            Ok(a) => {
                let run = body(a.clone(), attempt);
                let result = match spec.deadline {
                    Some(d) if !mech.enforces_deadline() => {
                        tokio::time::timeout(d, run).await.unwrap_or(Err(Abort::Timeout))
                    }
                    _ => run.await,
                };
                match result {
                    Ok(()) => a.commit().await,
                    Err(why) => a.abort(why).await,
                }
            }
        };
        report.absorb(&settled);
        match &settled.abort {
            Some(why) if !settled.committed && mech.replan(why, attempt) => {
                // Re-plan after the same backoff a faulted call waits (virtual time).
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            _ => return report,
        }
    }
}

/// The retry budget of a faulted call in every baseline (the paper's: 3 attempts, 50 ms
/// initial backoff, ×1.5, capped at 1 s).
pub const CALL_ATTEMPTS: u32 = 3;

/// Backoff before retry `n` (1-based) of a call.
pub fn backoff(n: u32) -> Duration {
    let ms = 50.0 * 1.5f64.powi(n.saturating_sub(1) as i32);
    Duration::from_millis(ms.min(1000.0) as u64)
}

/// Calls `f` until it succeeds or `CALL_ATTEMPTS` are spent, sleeping the backoff (virtual
/// time) between attempts. Retries transient *and* unknown-outcome errors: without an
/// idempotency key that is the naive retry that can duplicate an effect.
pub async fn retry<T>(mut f: impl FnMut() -> Result<T, CallError>) -> Result<T, CallError> {
    let mut n = 1;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(CallError::Failed(m)) => return Err(CallError::Failed(m)),
            Err(e) if n >= CALL_ATTEMPTS => return Err(e),
            Err(_) => {
                tokio::time::sleep(backoff(n)).await;
                n += 1;
            }
        }
    }
}

/// Undoes `executed` in reverse order, each undo retried; returns how many could not be
/// undone (irreversible effects, or compensations that kept failing).
pub async fn undo_reverse(world: &World, executed: Vec<(ToolSpec, Value)>) -> u32 {
    let mut failed = 0;
    for (tool, args) in executed.into_iter().rev() {
        if retry(|| world.undo(&tool, &args)).await.is_err() {
            failed += 1;
        }
    }
    failed
}

/// Per-scope async locks with measured wait.
#[derive(Debug, Default)]
pub struct LockTable {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl LockTable {
    /// Locks `scope`; returns the guard and how long it waited (virtual time). With a
    /// `timeout`, gives up with `None` after it.
    pub async fn lock(
        &self,
        scope: &str,
        timeout: Option<Duration>,
    ) -> Option<(tokio::sync::OwnedMutexGuard<()>, Duration)> {
        let m = self.locks.lock().entry(scope.to_owned()).or_default().clone();
        let start = tokio::time::Instant::now();
        let guard = match timeout {
            Some(t) => tokio::time::timeout(t, m.lock_owned()).await.ok()?,
            None => m.lock_owned().await,
        };
        Some((guard, start.elapsed()))
    }
}
