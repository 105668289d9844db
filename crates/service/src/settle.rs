//! Settling transactions: seal, commit and abort as typed operations, run on tasks the node
//! owns (a caller that goes away does not cancel them), and the wait for a settlement.
//!
//! ```text
//!  commit(id, CommitRequest) ─ live handle ─ [seal] ─ start_commit ─┐
//!  abort(id, reason)         ─ live handle ─────────── start_abort ─┤ start_settle: one SettleOp per
//!  group commit / abort (groups.rs) ─────────────────────────────────┘ transaction or group, joined by a
//!                                                                      repeated request, cleared if it fails
//!  wait_settled(tx, op?, timeout, slots) ─► true: settled (durably) · false: timeout or shutdown · Err: the op's refusal
//! ```
//!
//! A wait that has to block takes a slot from the front door's [`WaitSlots`] first (the HTTP
//! layer counts long-polls against `limits.max_waiters` and refuses with
//! [`ServiceError::Busy`]); a wait answered at once takes none.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidegate_runtime::{CommitOptions, TxId};
use tokio::sync::watch;

use crate::error::{Result, ServiceError};
use crate::ids;
use crate::index::{Phase, TxView};
use crate::metrics::ResultLabel;
use crate::node::Service;
use crate::tenant::{LiveTx, OpResult, SettleOp, Tenant};

/// Longest lease (and commit timeout) a caller may ask for: 7 days.
pub const MAX_LEASE_MS: u64 = 7 * 86_400_000;

/// Longest abort reason a caller may give.
pub const MAX_REASON_BYTES: usize = 1024;

/// How a front door accounts for waits that block (long-polls, streams): a wait takes a slot
/// just before it first blocks and holds it until it ends; a wait answered at once takes
/// none.
pub trait WaitSlots: Sync {
    /// Holds one slot; dropping it gives the slot back.
    type Guard: Send;
    /// Takes a slot, or refuses the wait (conventionally [`ServiceError::Busy`]).
    fn begin(&self) -> Result<Self::Guard>;
}

/// No accounting: every wait may block.
impl WaitSlots for () {
    type Guard = ();
    fn begin(&self) -> Result<()> {
        Ok(())
    }
}

/// A commit as a caller asks for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitRequest {
    /// Seal an open transaction first.
    pub seal: bool,
    /// How long the commit may wait for earlier transactions (at most [`MAX_LEASE_MS`];
    /// `None`: the engine's default).
    pub timeout_ms: Option<u64>,
}

/// Starts a settlement (`kind`: `commit` or `abort`) of a transaction or group on a node task
/// and records it in its owner's `slot`, or joins the operation already there: any that has
/// not failed when `join_any` (a commit asked while an abort runs gets the abort's answer),
/// else one of the same kind. `on_start` runs (synchronously) only when this call starts the
/// operation. A failed operation is cleared from the slot so that a retry starts again. The
/// one helper behind transaction and group commits and aborts.
pub(crate) fn start_settle<O: Send + Sync + 'static>(
    node: &Service,
    owner: &Arc<O>,
    slot: fn(&O) -> &Mutex<Option<SettleOp>>,
    (kind, join_any): (&'static str, bool),
    on_start: impl FnOnce(),
    work: impl Future<Output = Result<()>> + Send + 'static,
) -> SettleOp {
    let mut cur = slot(owner).lock();
    if let Some(op) = cur.as_ref()
        && (join_any || op.kind == kind)
        && !matches!(&*op.done.borrow(), Some(Err(_)))
    {
        return op.clone();
    }
    let (done_tx, done_rx) = watch::channel(None);
    let op = SettleOp { kind, done: done_rx };
    *cur = Some(op.clone());
    drop(cur);
    on_start();
    let owner = owner.clone();
    node.spawn(async move {
        let result = work.await;
        if result.is_err() {
            let mut cur = slot(&owner).lock();
            if cur.as_ref().is_some_and(|o| o.kind == kind) {
                *cur = None;
            }
        }
        let _ = done_tx.send(Some(result));
    });
    op
}

impl Tenant {
    /// Seals the live transaction `id`: its footprint is frozen. Returns it as the ledger
    /// shows it now.
    pub fn seal(&self, id: &str) -> Result<TxView> {
        let (lt, _) = self.live_of(id)?;
        lt.handle.seal()?;
        self.view(lt.handle.id())?.ok_or_else(|| ServiceError::Internal("transaction vanished".into()))
    }

    /// Starts (or joins) the commit of a live transaction on a node task; the commit latency
    /// is observed by outcome. A commit refused by the engine clears the transaction's
    /// `waiting` mark.
    pub fn start_commit(self: &Arc<Self>, node: &Service, lt: &Arc<LiveTx>, timeout: Option<Duration>) -> SettleOp {
        let tx = lt.handle.id();
        let (handle, tenant, metrics) = (lt.handle.clone(), self.clone(), node.metrics().clone());
        let work = async move {
            let started = Instant::now();
            let observe = |result: &str| {
                metrics
                    .commit_latency
                    .get_or_create(&ResultLabel { result: result.into() })
                    .observe(started.elapsed().as_secs_f64());
            };
            match handle.commit_with(CommitOptions { wait_timeout: timeout }).await {
                Ok(_) => {
                    observe("committed");
                    Ok(())
                }
                Err(tidegate_runtime::Error::Aborted(_)) => {
                    observe("aborted");
                    Ok(())
                }
                Err(e) => {
                    tenant.index.mark_waiting(tx, false);
                    Err(ServiceError::engine(e))
                }
            }
        };
        let on_start = || self.index.mark_waiting(tx, true);
        start_settle(node, lt, |lt: &LiveTx| &lt.settle, ("commit", true), on_start, work)
    }

    /// Starts (or joins) the abort of a live transaction on a node task.
    pub fn start_abort(&self, node: &Service, lt: &Arc<LiveTx>, reason: String) -> SettleOp {
        let handle = lt.handle.clone();
        let work = async move {
            match handle.abort(reason).await {
                Ok(_) | Err(tidegate_runtime::Error::Aborted(_)) => Ok(()),
                Err(e) => Err(ServiceError::engine(e)),
            }
        };
        start_settle(node, lt, |lt: &LiveTx| &lt.settle, ("abort", false), || {}, work)
    }

    /// Commits the live transaction `id` (sealing it first if asked and still open): starts
    /// the commit on a node task, or joins the one running. A branch of a speculation group
    /// is refused (`branch_of_group`: commit the group).
    pub fn commit(self: &Arc<Self>, node: &Service, id: &str, req: CommitRequest) -> Result<SettleOp> {
        let timeout = match req.timeout_ms {
            None => None,
            Some(ms) if ms <= MAX_LEASE_MS => Some(Duration::from_millis(ms)),
            Some(ms) => {
                return Err(ServiceError::invalid(
                    "commit_timeout_ms",
                    ms.to_string(),
                    format!("at most {MAX_LEASE_MS} milliseconds"),
                ));
            }
        };
        let (lt, v) = self.live_of(id)?;
        if let Some(g) = lt.group {
            return Err(ServiceError::conflict(
                "branch_of_group",
                format!("{id} is a branch of {}: commit the group", ids::format(ids::Kind::Group, &self.tag, g)),
            ));
        }
        if req.seal && v.phase == Phase::Open {
            lt.handle.seal()?;
        }
        Ok(self.start_commit(node, &lt, timeout))
    }

    /// Aborts the live transaction `id` for `reason` (at most [`MAX_REASON_BYTES`]): held
    /// effects are dropped and executed ones compensated in reverse, on a node task.
    pub fn abort(&self, node: &Service, id: &str, reason: String) -> Result<SettleOp> {
        if reason.len() > MAX_REASON_BYTES {
            return Err(ServiceError::invalid("reason", reason, format!("at most {MAX_REASON_BYTES} bytes")));
        }
        let (lt, _) = self.live_of(id)?;
        Ok(self.start_abort(node, &lt, reason))
    }

    /// Waits until `tx` settles durably (`Ok(true)`), `timeout` passes or the node begins to
    /// close (`Ok(false)`), or `op` ends with a refusal (`Err`). With `op` (the caller's own
    /// commit or abort), the settlement is the operation's end, never the index's first sight
    /// of it; a plain wait waits for the ledger's durability of what the index shows. A wait
    /// that blocks holds a slot of `slots` while it does.
    pub async fn wait_settled<W: WaitSlots + ?Sized>(
        &self,
        node: &Service,
        tx: TxId,
        mut op: Option<watch::Receiver<OpResult>>,
        timeout: Duration,
        slots: &W,
    ) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut guard: Option<W::Guard> = None;
        let mut sub = self.index.subscribe(tx);
        let shutdown = node.shutdown_token();
        loop {
            if let Some(o) = &op {
                let done = o.borrow().clone();
                match done {
                    Some(Err(e)) => return Err(e),
                    Some(Ok(())) => return Ok(true),
                    None => {}
                }
            }
            // The index sees a settlement when it is appended, before it is durable: a request
            // that runs the settlement answers from the operation (which returns once the
            // decision is durable), and a plain wait waits for the ledger's durability before
            // answering.
            if op.is_none() && self.index.phase(tx).is_none_or(|p| p.settled()) {
                self.engine.appended_durable().await.map_err(ServiceError::engine)?;
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline || shutdown.is_cancelled() {
                return Ok(false);
            }
            if guard.is_none() {
                guard = Some(slots.begin()?);
            }
            let index_changed = async {
                match &mut sub {
                    // An error means the record left memory (settled and evicted): re-check.
                    Some(s) => {
                        let _ = s.changed().await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            let op_changed = async {
                match &mut op {
                    Some(o) => {
                        if o.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = index_changed => {}
                _ = op_changed => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = shutdown.cancelled() => {}
            }
            if sub.as_ref().is_some_and(|s| s.has_changed().is_err()) {
                sub = self.index.subscribe(tx);
            }
            if let Some(o) = &op
                && o.has_changed().is_err()
                && o.borrow().is_none()
            {
                return Err(if shutdown.is_cancelled() {
                    ServiceError::ShuttingDown
                } else {
                    ServiceError::Internal("the settlement task ended without a result".into())
                });
            }
        }
    }
}
