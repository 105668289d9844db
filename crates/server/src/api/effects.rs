//! Client-executed effects: the HTTP form of the runtime's two-step effect protocol
//! (docs/server.md, "Client-executed effects").
//!
//! ```text
//!  POST /effects {tool, args, execute: "client"} ── Tenant::call (service) ──► Ticket (durable)
//!     eager: parked in the LiveTx under its effect number ──► 200 {ack: execute, effect.key, result_url}
//!            (not reported within the lease: dropped, i.e. outcome unknown; the transaction aborts)
//!     held / replayed: answered like the server form (nothing to park)
//!  POST /effects/{n}/result {status: done|not_applied|unknown} ── Tenant::report (service, on a node task)
//!     the answer is kept with the result: the same result again gets the same answer,
//!     another result 409 result_conflict
//! ```
//!
//! The protocol lives in the service (`tidegate_service::transactions`); this module turns
//! its requests and answers into JSON and problem documents.

use axum::Json;
use axum::extract::State;
use tidegate_service::tickets::TicketResult;

use super::common::{answer_out, with_tx};
use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::TxWrite;

fn ticket_result(r: EffectResultIn) -> TicketResult {
    match r {
        EffectResultIn::Done { output } => TicketResult::Done { output },
        EffectResultIn::NotApplied { error, retry } => TicketResult::NotApplied { error, retry },
        EffectResultIn::Unknown { error } => TicketResult::Unknown { error },
    }
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
    match t.report(state.service(), &id, &effect, ticket_result(body)).await {
        Ok(a) => answer_out(t, &id, a).map(Json),
        Err(e) => {
            let tx = t.parse_tx(&id).ok();
            let e = ApiError::from(e);
            Err(match tx {
                Some(tx) => with_tx(t, tx, e),
                None => e,
            })
        }
    }
}
