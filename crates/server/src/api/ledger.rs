//! Ledger queries: the tenant's events, and the effects needing attention.

use axum::Json;
use axum::extract::State;
use serde_json::Value;
use std::collections::HashMap;

use tidegate_core::{Event, Scope, Tag, TxId};
use tidegate_storage::Lsn;

use super::common::page_limit;
use super::extract::{ApiQuery, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::LedgerRead;
use tidegate_service::ids;
use tidegate_service::index::{AttentionEntry, Phase};
use tidegate_service::tenant::Tenant;

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
    params(LedgerEventsQuery),
    responses(
        (status = 200, description = "A page of events", body = LedgerEventList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn events(
    State(state): State<AppState>,
    caller: Caller<LedgerRead>,
    ApiQuery(q): ApiQuery<LedgerEventsQuery>,
) -> ApiResult<Json<LedgerEventList>> {
    let t = &caller.tenant;
    let limit = page_limit(&state, q.limit)?;
    let (data, has_more) = filtered_events(t, &q, limit)?;
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
    let (entries, pos, has_more) = t.index.attention(after, limit, tag, q.resolved);
    let data = entries.iter().map(|a| attention_out(t, a)).collect();
    Ok(Json(AttentionList { data, has_more, next_cursor: has_more.then(|| pos.to_string()) }))
}

/// An attention entry on the wire, with its resolution.
pub(super) fn attention_out(t: &Tenant, a: &AttentionEntry) -> AttentionOut {
    AttentionOut {
        transaction: ids::tx(&t.tag, a.tx),
        committed: a.committed,
        lsn: a.lsn,
        tag: a.tag.to_string(),
        disposition: serde_json::to_value(&a.disposition)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        effect: effect_out(&a.effect),
        resolution: t.index.resolution(a.tx, a.effect.id).map(ResolutionOut::from),
    }
}

/// The transaction filters of [`LedgerEventsQuery`], checked.
struct TxFilter {
    transaction: Option<TxId>,
    agent: Option<String>,
    scope: Option<Scope>,
    outcome: Option<Phase>,
    unfinished: bool,
    from_ms: Option<u64>,
    to_ms: Option<u64>,
}

impl TxFilter {
    fn of(t: &Tenant, q: &LedgerEventsQuery) -> ApiResult<TxFilter> {
        let transaction = match &q.transaction {
            None => None,
            Some(id) => match ids::resolve(ids::Kind::Tx, &t.tag, id) {
                ids::Named::Own(n) => Some(TxId(n)),
                // Another tenant's id passes nothing, exactly as one of this tenant never
                // issued (issue 26): `TxId(0)` is never allocated and `admits` refuses it.
                ids::Named::Elsewhere => Some(TxId(0)),
                ids::Named::Malformed => {
                    return Err(ApiError::invalid("transaction", id, "a transaction id (tx_<tag>_<n>)"));
                }
            },
        };
        let scope = match &q.scope {
            None => None,
            Some(s) => Some(t.engine.scope(s).map_err(|e| ApiError::invalid("scope", s, format!("a scope ({e})")))?),
        };
        let (outcome, unfinished) = match q.outcome.as_deref() {
            None => (None, false),
            Some("committed") => (Some(Phase::Committed), false),
            Some("aborted") => (Some(Phase::Aborted), false),
            Some("unfinished") => (None, true),
            Some(other) => return Err(ApiError::invalid("outcome", other, "committed, aborted or unfinished")),
        };
        // Times are Unix milliseconds in an int64 (the OpenAPI document says so).
        for (field, v) in [("from_ms", q.from_ms), ("to_ms", q.to_ms)] {
            if let Some(v) = v
                && v > i64::MAX as u64
            {
                return Err(ApiError::invalid(field, v.to_string(), "Unix milliseconds, at most 9223372036854775807"));
            }
        }
        if let (Some(a), Some(b)) = (q.from_ms, q.to_ms)
            && a > b
        {
            return Err(ApiError::invalid("to_ms", b.to_string(), format!("at least from_ms ({a})")));
        }
        if let Some(a) = &q.agent
            && (a.is_empty() || a.len() > 256)
        {
            return Err(ApiError::invalid("agent", a, "1 to 256 bytes"));
        }
        Ok(TxFilter {
            transaction,
            agent: q.agent.clone(),
            scope,
            outcome,
            unfinished,
            from_ms: q.from_ms,
            to_ms: q.to_ms,
        })
    }

    fn is_empty(&self) -> bool {
        self.transaction.is_none() && self.outcome.is_none() && !self.unfinished && !self.needs_view()
    }

    fn needs_view(&self) -> bool {
        self.agent.is_some() || self.scope.is_some() || self.from_ms.is_some() || self.to_ms.is_some()
    }

    /// Whether transaction `tx` passes (asked once per transaction per request, never inside
    /// a scan of the ledger).
    fn admits(&self, t: &Tenant, tx: TxId) -> bool {
        // Engine-wide events (`TxId(0)`, never a transaction's id) pass no transaction filter,
        // also not `transaction=tx_<tag>_0`.
        if tx.0 == 0 || self.transaction.is_some_and(|x| x != tx) {
            return false;
        }
        let phase = t.index.phase(tx);
        if self.outcome.is_some_and(|o| phase != Some(o)) || (self.unfinished && phase.is_none_or(|p| p.settled())) {
            return false;
        }
        if !self.needs_view() {
            return true;
        }
        let Ok(Some(v)) = t.view(tx) else { return false };
        if self.agent.as_deref().is_some_and(|a| a != &*v.agent) {
            return false;
        }
        let at = v.lease_until.0 / 1_000_000;
        if self.from_ms.is_some_and(|f| at < f) || self.to_ms.is_some_and(|x| at > x) {
            return false;
        }
        if let Some(want) = &self.scope {
            let overlaps = |s: &str| t.engine.scope(s).is_ok_and(|s| s.overlaps(want));
            let hit = v.may_touch.iter().flatten().any(|s| overlaps(s))
                || v.reads.iter().any(|(s, _)| overlaps(s))
                || v.effects.iter().flat_map(|e| e.scopes.iter()).any(|s| overlaps(s));
            if !hit {
                return false;
            }
        }
        true
    }
}

/// Up to `limit` events after `q.after_lsn` that pass `q`'s filters, and whether more follow.
pub(super) fn filtered_events(
    t: &Tenant,
    q: &LedgerEventsQuery,
    limit: usize,
) -> ApiResult<(Vec<LedgerEventOut>, bool)> {
    let from = q.from_lsn()?;
    let filter = TxFilter::of(t, q)?;
    let kind = q.event.as_deref();
    // Which transactions pass, decided before the scan that returns events: a view of an
    // evicted transaction reads the ledger, and a scan must not run inside another.
    let mut admitted: HashMap<TxId, bool> = HashMap::new();
    if !filter.is_empty() {
        if let Some(tx) = filter.transaction {
            admitted.insert(tx, false);
        } else {
            t.store
                .scan(from, &mut |_, e| {
                    if e.tx().0 != 0 {
                        admitted.entry(e.tx()).or_insert(false);
                    }
                    true
                })
                .map_err(|e| from_runtime(e.into()))?;
        }
        for (tx, ok) in admitted.iter_mut() {
            *ok = filter.admits(t, *tx);
        }
    }
    let mut data = Vec::new();
    let mut has_more = false;
    t.store
        .scan(from, &mut |lsn, e| {
            if !filter.is_empty() && !admitted.get(&e.tx()).copied().unwrap_or(false) {
                return true;
            }
            let out = event_out(&t.tag, lsn, e);
            if kind.is_some_and(|k| k != out.event) {
                return true;
            }
            if data.len() == limit {
                has_more = true;
                return false;
            }
            data.push(out);
            true
        })
        .map_err(|e| from_runtime(e.into()))?;
    Ok((data, has_more))
}
