//! Client-executed effects: the HTTP form of the runtime's two-step effect protocol
//! (docs/server.md, "Client-executed effects").
//!
//! ```text
//!  POST /effects {tool, args, execute: "client"} ── Transaction::record ──► Ticket (durable)
//!     eager: parked in the LiveTx under its effect number ──► 200 {ack: execute, effect.key, result_url}
//!            (not reported within the lease: dropped, i.e. outcome unknown; the transaction aborts)
//!     held / replayed: answered like the server form (nothing to park)
//!  POST /effects/{n}/result {status: done|not_applied|unknown} ── Ticket::report (on a server task)
//!     the answer is kept with the result: the same result again gets the same answer,
//!     another result 409 result_conflict
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use parking_lot::Mutex;
use serde_json::Value;
use tidegate_runtime::{CallOutcome, Step, Ticket, TicketAction};

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use super::transactions::{Planned, call_parts, view_of, with_tx};
use super::wire::*;
use crate::AppState;
use crate::auth::TxWrite;
use crate::index::EffectStatus;
use crate::metrics::ResultLabel;
use crate::tenant::{LiveTx, Tenant};

/// Longest error text of a reported result.
const MAX_ERROR_BYTES: usize = 4096;

/// Where a client-executed effect's ticket is.
#[derive(Debug)]
pub enum TicketSlot {
    /// Waiting for the client's result (dropping it reports the outcome unknown).
    Open(Ticket),
    /// This result is being reported.
    Reporting(EffectResultIn),
    /// Reported: the result and the answer it got.
    Reported(Box<(EffectResultIn, Result<EffectAckOut, ApiError>)>),
    /// No result came within the lease: the ticket was dropped (outcome unknown).
    Expired,
}

/// A live transaction's tickets, by effect number.
pub type Tickets = Mutex<HashMap<u32, TicketSlot>>;

fn result_url(id: &str, n: u32) -> String {
    format!("/v1/transactions/{id}/effects/{n}/result")
}

/// The answer for effect `n` of `tx` as the ledger now shows it.
fn ack_out(t: &Tenant, id: &str, n: u32, ack: AckKind, output: Option<Value>) -> ApiResult<EffectAckOut> {
    let tx = super::transactions::parse_tx(t, id)?;
    let v = t.index.view(&*t.store, tx).ok_or_else(|| ApiError::internal("transaction vanished"))?;
    let rec =
        v.effects.iter().find(|e| e.id.0 == n).ok_or_else(|| ApiError::internal("the effect is not in the ledger"))?;
    let result_url = (ack == AckKind::Execute).then(|| result_url(id, n));
    Ok(EffectAckOut { transaction: id.to_owned(), ack, output, effect: effect_out(rec), result_url })
}

/// Records a client-executed effect and answers its ticket.
pub(super) async fn record(
    state: &AppState,
    t: &Arc<Tenant>,
    lt: &Arc<LiveTx>,
    id: &str,
    planned: Planned,
) -> ApiResult<EffectAckOut> {
    let tx = lt.handle.id();
    let (tool, env, opts) = call_parts(planned);
    let handle = lt.handle.clone();
    // On a server task: a disconnect does not cut the record short (a ticket dropped
    // before it was handed out is reported as not applied, so nothing would be stuck).
    let ticket = state
        .spawn(async move { handle.record(&tool, env, opts).await })
        .await
        .map_err(|_| ApiError::internal("the record's task failed"))?
        .ok_or_else(ApiError::shutting_down)?
        .map_err(|e| with_tx(t, tx, from_runtime(e)))?;
    let n = ticket.effect().0;
    let (kind, output) = match ticket.action() {
        TicketAction::ExecuteNow { .. } => (AckKind::Execute, None),
        TicketAction::Staged { .. } => (AckKind::Staged, None),
        TicketAction::Queued { .. } => (AckKind::Queued, None),
        TicketAction::Replayed { output, .. } => (AckKind::Replayed, Some((**output).clone())),
        _ => return Err(ApiError::internal("the engine answered a ticket this server does not know")),
    };
    if ticket.pending() {
        state.metrics().client_tickets.inc();
        lt.tickets.lock().insert(n, TicketSlot::Open(ticket));
        expire_later(state, t, lt, n);
    }
    ack_out(t, id, n, kind, output)
}

/// Drops the ticket of effect `n` if no result came within the transaction's lease (at
/// least `engine.lease_ms`): its outcome is then unknown, and the transaction aborts.
fn expire_later(state: &AppState, t: &Arc<Tenant>, lt: &Arc<LiveTx>, n: u32) {
    let configured = Duration::from_millis(state.config().engine.lease_ms);
    let now = t.engine.clock().now();
    let lease =
        t.index.view(&*t.store, lt.handle.id()).map_or(configured, |v| v.lease_until.since(now).max(configured));
    let (lt, stop, metrics) = (Arc::downgrade(lt), state.shutdown_token().clone(), state.metrics().clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(lease) => {}
            // At shutdown the ticket stays where it is; the tenant's close drops it.
            _ = stop.cancelled() => return,
        }
        let Some(lt) = lt.upgrade() else { return };
        let expired = {
            let mut slots = lt.tickets.lock();
            match slots.get_mut(&n) {
                Some(slot @ TicketSlot::Open(_)) => Some(std::mem::replace(slot, TicketSlot::Expired)),
                _ => None,
            }
        };
        if expired.is_some() {
            metrics.client_tickets_expired.inc();
        }
        // Outside the lock: the drop reports the outcome unknown to the engine.
        drop(expired);
    });
}

fn outcome_of(r: &EffectResultIn) -> CallOutcome {
    match r {
        EffectResultIn::Done { output } => CallOutcome::done(output.clone().unwrap_or(Value::Null)),
        EffectResultIn::NotApplied { error, retry } => CallOutcome::not_applied(error.clone(), *retry),
        EffectResultIn::Unknown { error } => CallOutcome::unknown(error.clone()),
    }
}

fn result_kind(r: &EffectResultIn) -> &'static str {
    match r {
        EffectResultIn::Done { .. } => "done",
        EffectResultIn::NotApplied { .. } => "not_applied",
        EffectResultIn::Unknown { .. } => "unknown",
    }
}

fn conflict(n: u32, first: &EffectResultIn) -> ApiError {
    let kind = result_kind(first);
    ApiError::conflict(
        "result_conflict",
        format!("effect {n} already has another result (`{kind}`); a result is reported once"),
    )
}

/// Report how a client-executed effect's call ended (the second step of a ticket).
#[utoipa::path(
    post, path = "/v1/transactions/{tx}/effects/{effect}/result", tag = "transactions", operation_id = "report_effect_result",
    params(("tx" = String, Path, description = "Transaction id"),
           ("effect" = u32, Path, description = "The effect's issuance position (`effect.effect` of the ticket)"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = EffectResultIn,
    responses(
        (status = 200, description = "Executed: the output is recorded and the compensation registered", body = EffectAckOut),
        (status = 409, description = "The call failed and the transaction aborted (`transaction_aborted`, with the transaction); another result was reported before (`result_conflict`); the ticket expired (`ticket_expired`); the effect is not a ticket (`not_client_executed`)", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
        (status = "5XX", description = "Server fault", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn result(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiPath((id, effect)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<EffectResultIn>,
) -> ApiResult<Json<EffectAckOut>> {
    let t = &caller.tenant;
    let (tx, v) = view_of(t, &id)?;
    let n: u32 = effect.parse().map_err(|_| ApiError::not_found("effect", &effect))?;
    if let EffectResultIn::NotApplied { error, .. } | EffectResultIn::Unknown { error } = &body
        && error.len() > MAX_ERROR_BYTES
    {
        return Err(ApiError::invalid("error", error, format!("at most {MAX_ERROR_BYTES} bytes")));
    }
    let Some(rec) = v.effects.iter().find(|e| e.id.0 == n) else {
        return Err(ApiError::not_found("effect", &format!("{id}/effects/{n}")));
    };
    let Some(lt) = t.live(tx) else {
        // Settled (or begun before a restart): the ledger answers a repeated result.
        return settled_answer(t, &id, n, rec.status, rec.output.as_deref(), &body);
    };
    let ticket = {
        let mut slots = lt.tickets.lock();
        match slots.get_mut(&n) {
            None => {
                drop(slots);
                if v.phase.settled() {
                    return settled_answer(t, &id, n, rec.status, rec.output.as_deref(), &body);
                }
                return Err(ApiError::conflict(
                    "not_client_executed",
                    format!("effect {n} of {id} is not a client-executed ticket: the server runs or releases it"),
                ));
            }
            Some(TicketSlot::Expired) => {
                return Err(ApiError::conflict(
                    "ticket_expired",
                    format!(
                        "no result for effect {n} came within the transaction's lease: its outcome was taken as \
                         unknown and the transaction aborted"
                    ),
                ));
            }
            Some(TicketSlot::Reporting(first)) if *first == body => {
                return Err(ApiError::conflict("result_in_progress", "this result is being reported").retry_after(1));
            }
            Some(TicketSlot::Reporting(first)) => return Err(conflict(n, first)),
            Some(TicketSlot::Reported(kept)) if kept.0 == body => return kept.1.clone().map(Json),
            Some(TicketSlot::Reported(kept)) => return Err(conflict(n, &kept.0)),
            Some(slot @ TicketSlot::Open(_)) => match std::mem::replace(slot, TicketSlot::Reporting(body.clone())) {
                TicketSlot::Open(ticket) => ticket,
                _ => return Err(ApiError::internal("the ticket changed under its lock")),
            },
        }
    };
    state.metrics().client_results.get_or_create(&ResultLabel { result: result_kind(&body).to_owned() }).inc();
    let (t2, lt2, id2) = (t.clone(), lt.clone(), id.clone());
    // On a server task: the report (a probe, an abort's compensations) finishes and its
    // answer is kept even if this request goes away.
    let answer = state
        .spawn(async move {
            let mut ticket = ticket;
            let outcome = outcome_of(&body);
            let answer = match ticket.report(outcome).await {
                Ok(Step::Acked(ack)) => {
                    let output = ack.output().cloned();
                    ack_out(&t2, &id2, n, AckKind::Executed, output)
                }
                Ok(Step::Retry { backoff, .. }) => {
                    // Only with an engine retry policy of several attempts (the server's has one).
                    lt2.tickets.lock().insert(n, TicketSlot::Open(ticket));
                    let secs = backoff.as_secs().max(1);
                    return Err(ApiError::conflict(
                        "call_again",
                        "the call did not take effect: run it again under the same key, then report",
                    )
                    .retry_after(secs));
                }
                Ok(_) => Err(ApiError::internal("the engine answered a report this server does not know")),
                Err(e) => Err(with_tx(&t2, tx, from_runtime(e))),
            };
            lt2.tickets.lock().insert(n, TicketSlot::Reported(Box::new((body, answer.clone()))));
            answer
        })
        .await
        .map_err(|_| ApiError::internal("the report's task failed"))?
        .ok_or_else(ApiError::shutting_down)?;
    answer.map(Json)
}

/// The answer to a result for an effect whose transaction this process no longer holds:
/// the same answer a first `done` got if the ledger shows it executed with that output,
/// the aborted transaction for a failure the ledger recorded, else a conflict.
fn settled_answer(
    t: &Tenant,
    id: &str,
    n: u32,
    status: EffectStatus,
    output: Option<&Value>,
    body: &EffectResultIn,
) -> ApiResult<Json<EffectAckOut>> {
    let executed =
        matches!(status, EffectStatus::Executed | EffectStatus::Compensated | EffectStatus::CompensationFailed);
    match body {
        EffectResultIn::Done { output: given }
            if executed && output == Some(given.as_ref().unwrap_or(&Value::Null)) =>
        {
            ack_out(t, id, n, AckKind::Executed, output.cloned()).map(Json)
        }
        EffectResultIn::NotApplied { .. } | EffectResultIn::Unknown { .. } if status == EffectStatus::Failed => {
            let tx = super::transactions::parse_tx(t, id)?;
            Err(with_tx(
                t,
                tx,
                ApiError::conflict("transaction_aborted", format!("the call of effect {n} failed and {id} aborted")),
            ))
        }
        _ => Err(ApiError::conflict(
            "wrong_state",
            format!(
                "{id} is settled or was begun before the server restarted, and effect {n} is {}; the result \
                 cannot be reported",
                status_name(status)
            ),
        )),
    }
}
