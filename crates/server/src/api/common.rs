//! What several handlers share, below all of them: resolving a transaction id for a request,
//! attaching the transaction to an abort's problem, request checks, page sizes and the wire
//! form of an effect's answer. Handlers import this module, never each other's helpers (the
//! layering test checks that the server's modules form no cycle).

use std::sync::Arc;
use std::time::Duration;

use tidegate_runtime::TxId;
use tidegate_service::index::TxView;
use tidegate_service::tenant::{LiveTx, Tenant};
use tidegate_service::transactions::{self as svc, EffectAnswer};

use super::problem::{ApiError, ApiResult};
use super::wire::*;
use crate::AppState;

pub(super) fn view_of(t: &Tenant, id: &str) -> ApiResult<(TxId, TxView)> {
    Ok(t.view_of(id)?)
}

/// The live handle of an unsettled transaction (resumed if it was kept open across a
/// restart).
pub(super) fn live_of(t: &Tenant, id: &str) -> ApiResult<(Arc<LiveTx>, TxView)> {
    t.live_of(id).map_err(|e| in_tx(t, id, e))
}

pub(super) fn check_agent(agent: &Option<String>) -> ApiResult<()> {
    Ok(tidegate_service::transactions::check_agent(agent)?)
}

pub(super) fn check_scopes(field: &str, scopes: &Option<Vec<String>>) -> ApiResult<()> {
    Ok(tidegate_service::transactions::check_scopes(field, scopes)?)
}

pub(super) fn check_lease(lease_ms: Option<u64>) -> ApiResult<Option<Duration>> {
    Ok(tidegate_service::transactions::check_lease(lease_ms)?)
}

/// A refusal of an operation on the transaction `id`, with the transaction attached when it
/// aborted.
pub(super) fn in_tx(t: &Tenant, id: &str, e: tidegate_service::ServiceError) -> ApiError {
    match t.parse_tx(id) {
        Ok(tx) => with_tx(t, tx, e.into()),
        Err(_) => e.into(),
    }
}

/// Attaches the transaction to an abort error.
pub(super) fn with_tx(t: &Tenant, tx: TxId, mut e: ApiError) -> ApiError {
    if e.code == "transaction_aborted"
        && let Ok(Some(v)) = t.view(tx)
    {
        e.transaction = serde_json::to_value(tx_out(t, &v)).ok();
    }
    e
}

pub(super) fn page_limit(state: &AppState, limit: Option<usize>) -> ApiResult<usize> {
    let max = state.config().limits.max_page_size;
    match limit {
        None => Ok(50.min(max)),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid("limit", n.to_string(), format!("1 to {max} (limits.max_page_size)"))),
    }
}

pub(super) fn result_url(id: &str, n: u32) -> String {
    format!("/v1/transactions/{id}/effects/{n}/result")
}

/// The wire form of an acknowledgement kind.
pub(super) fn ack_kind(a: svc::AckKind) -> AckKind {
    match a {
        svc::AckKind::Executed => AckKind::Executed,
        svc::AckKind::Replayed => AckKind::Replayed,
        svc::AckKind::Staged => AckKind::Staged,
        svc::AckKind::Queued => AckKind::Queued,
        svc::AckKind::Execute => AckKind::Execute,
    }
}

/// The answer to an effect call or a report on the wire: the acknowledgement, and the effect
/// as the ledger recorded it (one record from the index, which the engine's append observer
/// keeps current: the call that recorded it has returned).
pub(super) fn answer_out(t: &Tenant, id: &str, a: EffectAnswer) -> ApiResult<EffectAckOut> {
    let rec = t
        .index
        .effect(&*t.store, a.tx, a.effect)
        .ok_or_else(|| ApiError::internal("the effect is not in the ledger"))?;
    let result_url = (a.ack == svc::AckKind::Execute).then(|| result_url(id, a.effect.0));
    Ok(EffectAckOut {
        transaction: id.to_owned(),
        ack: ack_kind(a.ack),
        output: a.output,
        effect: effect_out(&rec),
        result_url,
    })
}
