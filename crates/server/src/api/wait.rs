//! Waiting for a transaction to settle: long-polls hold a waiter slot (not a request slot),
//! end at their timeout, at the settlement, or at shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use tidegate_runtime::TxId;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;

use super::extract::RequestSlot;
use super::problem::ApiError;
use crate::AppState;
use tidegate_service::tenant::{OpResult, SettleOp, Tenant};

/// Starts a settlement (`kind`: `commit` or `abort`) of a transaction or group on a server
/// task and records it in its owner's `slot`, or joins the operation already there: any that
/// has not failed when `join_any` (a commit asked while an abort runs gets the abort's
/// answer), else one of the same kind. `on_start` runs (synchronously) only when this call
/// starts the operation. A failed operation is cleared from the slot so that a retry starts
/// again. The one helper behind transaction and group commits and aborts.
pub(super) fn start_settle<O: Send + Sync + 'static>(
    state: &AppState,
    owner: &Arc<O>,
    slot: fn(&O) -> &parking_lot::Mutex<Option<SettleOp>>,
    (kind, join_any): (&'static str, bool),
    on_start: impl FnOnce(),
    work: impl std::future::Future<Output = Result<(), tidegate_service::ServiceError>> + Send + 'static,
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
    state.spawn(async move {
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

/// Default wait when a request does not say.
pub const DEFAULT_WAIT_MS: u64 = 30_000;

/// A waiter slot and the active-waits gauge, released on drop.
#[derive(Debug)]
pub struct WaitGuard {
    _permit: OwnedSemaphorePermit,
    state: AppState,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.state.metrics().waits_active.dec();
    }
}

/// Takes a waiter slot (429 if none) and gives back the request slot.
pub fn begin_wait(state: &AppState, slot: &RequestSlot) -> Result<WaitGuard, ApiError> {
    let permit = state.0.waiters.clone().try_acquire_owned().map_err(|_| {
        state.metrics().refused("waiters");
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_waiters",
            format!(
                "the server has {} long-polls and streams open (limits.max_waiters)",
                state.config().limits.max_waiters
            ),
        )
        .retry_after(1)
    })?;
    slot.release();
    state.metrics().waits_active.inc();
    Ok(WaitGuard { _permit: permit, state: state.clone() })
}

/// Checks a requested wait against `limits.max_wait_ms`.
pub fn wait_duration(state: &AppState, field: &str, ms: Option<u64>) -> Result<Duration, ApiError> {
    let max = state.config().limits.max_wait_ms;
    let ms = ms.unwrap_or(DEFAULT_WAIT_MS.min(max));
    if ms > max {
        return Err(ApiError::invalid(
            field,
            ms.to_string(),
            format!("at most {max} milliseconds (limits.max_wait_ms)"),
        ));
    }
    Ok(Duration::from_millis(ms))
}

/// Waits until `tx` settles durably (`Ok(true)`), `timeout` passes or shutdown begins
/// (`Ok(false)`), or `op` ends with a refusal (`Err`). With `op` (the request's own commit or
/// abort), the settlement is the operation's end, never the index's first sight of it.
pub async fn settle(
    state: &AppState,
    tenant: &Arc<Tenant>,
    tx: TxId,
    mut op: Option<watch::Receiver<OpResult>>,
    timeout: Duration,
    slot: &RequestSlot,
) -> Result<bool, ApiError> {
    let deadline = Instant::now() + timeout;
    let mut guard: Option<WaitGuard> = None;
    let mut sub = tenant.index.subscribe(tx);
    loop {
        if let Some(o) = &op {
            let done = o.borrow().clone();
            match done {
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(())) => return Ok(true),
                None => {}
            }
        }
        // The index sees a settlement when it is appended, before it is durable: a request
        // that runs the settlement answers from the operation (which returns once the decision
        // is durable), and a plain wait waits for the ledger's durability before answering.
        if op.is_none() && tenant.index.phase(tx).is_none_or(|p| p.settled()) {
            tenant.engine.appended_durable().await.map_err(tidegate_service::ServiceError::engine)?;
            return Ok(true);
        }
        if Instant::now() >= deadline || state.shutdown_token().is_cancelled() {
            return Ok(false);
        }
        if guard.is_none() {
            guard = Some(begin_wait(state, slot)?);
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
            _ = state.shutdown_token().cancelled() => {}
        }
        if sub.as_ref().is_some_and(|s| s.has_changed().is_err()) {
            sub = tenant.index.subscribe(tx);
        }
        if let Some(o) = &op
            && o.has_changed().is_err()
            && o.borrow().is_none()
        {
            return Err(if state.shutdown_token().is_cancelled() {
                ApiError::shutting_down()
            } else {
                ApiError::internal("the settlement task ended without a result")
            });
        }
    }
}
