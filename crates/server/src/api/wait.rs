//! The HTTP side of waiting for a settlement: the wait itself is the service's
//! (`Tenant::wait_settled`, `Tenant::wait_group`); this module checks a requested wait against
//! `limits.max_wait_ms` and gives the service its `WaitSlots`: a long-poll that blocks holds a
//! waiter slot (not a request slot; 429 `too_many_waiters` when none is left).

use std::sync::Arc;
use std::time::Duration;

use tidegate_runtime::TxId;
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::extract::RequestSlot;
use super::problem::ApiError;
use crate::AppState;
use tidegate_service::ServiceError;
use tidegate_service::groups::GroupSettle;
use tidegate_service::settle::WaitSlots;
use tidegate_service::tenant::{OpResult, Tenant};

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
    Ok(take_waiter(state, slot)?)
}

fn take_waiter(state: &AppState, slot: &RequestSlot) -> Result<WaitGuard, ServiceError> {
    let permit = state.0.waiters.clone().try_acquire_owned().map_err(|_| {
        state.metrics().refused("waiters");
        ServiceError::Busy {
            code: "too_many_waiters",
            detail: format!(
                "the server has {} long-polls and streams open (limits.max_waiters)",
                state.config().limits.max_waiters
            ),
            retry_after: Some(1),
        }
    })?;
    slot.release();
    state.metrics().waits_active.inc();
    Ok(WaitGuard { _permit: permit, state: state.clone() })
}

/// The HTTP layer's accounting of a service wait: a waiter slot taken when the wait first
/// blocks, the request slot given back.
struct Waiters<'a> {
    state: &'a AppState,
    slot: &'a RequestSlot,
}

impl WaitSlots for Waiters<'_> {
    type Guard = WaitGuard;
    fn begin(&self) -> Result<WaitGuard, ServiceError> {
        take_waiter(self.state, self.slot)
    }
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
/// (`Ok(false)`), or `op` ends with a refusal (`Err`): the service's
/// [`Tenant::wait_settled`], holding a waiter slot while it blocks.
pub async fn settle(
    state: &AppState,
    tenant: &Arc<Tenant>,
    tx: TxId,
    op: Option<watch::Receiver<OpResult>>,
    timeout: Duration,
    slot: &RequestSlot,
) -> Result<bool, ApiError> {
    let waiters = Waiters { state, slot };
    Ok(tenant.wait_settled(state.service(), tx, op, timeout, &waiters).await?)
}

/// Waits, within `total`, for a group's settlement (the service's [`Tenant::wait_group`]),
/// holding a waiter slot while it blocks.
pub async fn settle_group(
    state: &AppState,
    tenant: &Arc<Tenant>,
    s: &GroupSettle,
    total: Duration,
    slot: &RequestSlot,
) -> Result<bool, ApiError> {
    let waiters = Waiters { state, slot };
    Ok(tenant.wait_group(state.service(), s, total, &waiters).await?)
}
