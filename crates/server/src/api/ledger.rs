//! Ledger queries: the tenant's events, and the effects needing attention.

use axum::Json;
use axum::extract::State;
use serde_json::Value;
use tidegate_core::{Event, Tag};
use tidegate_storage::Lsn;

use super::extract::{ApiQuery, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use super::transactions::page_limit;
use super::wire::*;
use crate::AppState;
use crate::auth::LedgerRead;
use crate::ids;

/// A ledger event on the wire.
pub fn event_out(tag: &str, lsn: Lsn, e: &Event) -> LedgerEventOut {
    let mut v = tidegate_storage::wire::to_value(e).unwrap_or(Value::Null);
    let kind = v.get("event").and_then(Value::as_str).unwrap_or("unknown").to_owned();
    if let Some(o) = v.as_object_mut() {
        o.remove("event");
        o.remove("tx");
    }
    let tx = e.tx();
    LedgerEventOut { lsn, event: kind, transaction: (tx.0 != 0).then(|| ids::tx(tag, tx)), data: v }
}

/// The tenant's ledger, in order.
#[utoipa::path(
    get, path = "/v1/ledger/events", tag = "ledger", operation_id = "ledger_events",
    params(LedgerQuery),
    responses(
        (status = 200, description = "A page of events", body = LedgerEventList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn events(
    State(state): State<AppState>,
    caller: Caller<LedgerRead>,
    ApiQuery(q): ApiQuery<LedgerQuery>,
) -> ApiResult<Json<LedgerEventList>> {
    let t = &caller.tenant;
    let limit = page_limit(&state, q.limit)?;
    let from = q.from_lsn()?;
    let mut data = Vec::new();
    let mut has_more = false;
    t.store
        .scan(from, &mut |lsn, e| {
            if data.len() == limit {
                has_more = true;
                return false;
            }
            data.push(event_out(&t.tag, lsn, e));
            true
        })
        .map_err(|e| from_runtime(e.into()))?;
    let next_cursor = if has_more { data.last().map(|e: &LedgerEventOut| e.lsn.to_string()) } else { None };
    Ok(Json(LedgerEventList { data, has_more, next_cursor }))
}

/// Effects settled `unresolved`, `leaked` or `partial-commit`, oldest first.
#[utoipa::path(
    get, path = "/v1/ledger/attention", tag = "ledger", operation_id = "ledger_attention",
    params(AttentionQuery),
    responses(
        (status = 200, description = "A page", body = AttentionList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn attention(
    State(state): State<AppState>,
    caller: Caller<LedgerRead>,
    ApiQuery(q): ApiQuery<AttentionQuery>,
) -> ApiResult<Json<AttentionList>> {
    let t = &caller.tenant;
    let limit = page_limit(&state, q.limit)?;
    let tag = match q.tag.as_deref() {
        None => None,
        Some("unresolved") => Some(Tag::Unresolved),
        Some("leaked") => Some(Tag::Leaked),
        Some("partial-commit") => Some(Tag::PartialCommit),
        Some(other) => return Err(ApiError::invalid("tag", other, "unresolved, leaked or partial-commit")),
    };
    let after = match &q.cursor {
        None => 0,
        Some(c) => {
            c.parse::<usize>().map_err(|_| ApiError::invalid("cursor", c, "a `next_cursor` from a previous page"))?
        }
    };
    let (entries, pos, has_more) = t.index.attention(after, limit, tag);
    let data = entries
        .iter()
        .map(|a| AttentionOut {
            transaction: ids::tx(&t.tag, a.tx),
            committed: a.committed,
            lsn: a.lsn,
            tag: a.tag.to_string(),
            disposition: serde_json::to_value(&a.disposition)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            effect: effect_out(&a.effect),
        })
        .collect();
    Ok(Json(AttentionList { data, has_more, next_cursor: has_more.then(|| pos.to_string()) }))
}
