//! What the operator console (docs/console.md) adds to the API: a tenant-wide stream of
//! transaction changes, an operator's resolution of an attention entry (recorded in the
//! ledger), the per-minute figures of the last hour, the ledger's JSON Lines export; and the
//! console page itself (`/console`), whose assets are compiled in.
//!
//! ```text
//!  GET /v1/transactions/stream ─► `snapshot` (unfinished transactions) ─► `changes` batches
//!        (LedgerIndex::changes broadcast, coalesced 50 ms; sealed/waiting ones re-sent when
//!         what they wait for changed)                        ─► `resync` + snapshot if lagged
//!  POST /v1/ledger/attention/{tx}/{effect}/resolve ─► Tidegate::append_extension("operator")
//!        ─► LedgerIndex (Resolutions) ─► GET /v1/ledger/attention shows `resolution`
//! ```

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::routing::get;
use futures::Stream;
use tidegate_core::TxId;
use tokio::sync::broadcast;

use super::extract::{ApiJson, ApiPath, ApiQuery, Caller};
use super::ledger::{attention_out, filtered_events};
use super::problem::{ApiError, ApiResult, Problem};
use super::wait::{self, begin_wait};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{AttentionResolve, LedgerRead, TxRead};
use tidegate_service::index::{ListFilter, Phase};
use tidegate_service::tenant::Tenant;

/// Most transactions one `snapshot` event carries.
pub const MAX_SNAPSHOT: usize = 10_000;
/// Most events one export returns.
pub const MAX_EXPORT: usize = 100_000;

fn snapshot_event(t: &Tenant, sent: &mut HashMap<TxId, String>) -> SseEvent {
    let (txs, truncated) = t.index.list(0, MAX_SNAPSHOT, ListFilter::Unfinished);
    sent.clear();
    let data: Vec<TransactionOut> = txs
        .into_iter()
        .filter_map(|tx| t.view(tx).ok().flatten())
        .map(|v| {
            let out = tx_out(t, &v);
            if v.phase == Phase::Sealed {
                sent.insert(v.tx, serde_json::to_string(&out.waits_for).unwrap_or_default());
            }
            out
        })
        .collect();
    let body = serde_json::json!({ "data": data, "truncated": truncated });
    SseEvent::default().event("snapshot").data(body.to_string())
}

/// Server-sent events of every transaction of the caller's tenant: a `snapshot` event at once
/// (`{data: [Transaction], truncated}`: the unfinished transactions, oldest first, at most
/// 10000), then `changes` events (`{data: [Transaction]}`) with every transaction that
/// changed (begun, a read or effect, sealed, waiting, decided, settled; a sealed or waiting one
/// also when what it waits for changed), coalesced over 50 ms. A client that falls behind
/// gets `resync` followed by a new `snapshot`. The stream ends at `limits.max_sse_ms` (an
/// `EventSource` reconnects and gets a new snapshot).
#[utoipa::path(
    get, path = "/v1/transactions/stream", tag = "transactions", operation_id = "stream_transactions",
    responses(
        (status = 200, description = "`text/event-stream` of `snapshot`, `changes` and `resync` events", content_type = "text/event-stream", body = SseEventOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn stream(
    State(state): State<AppState>,
    caller: Caller<TxRead>,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let t = caller.tenant.clone();
    let guard = begin_wait(&state, &caller.slot)?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(state.config().limits.max_sse_ms);
    struct S {
        t: Arc<Tenant>,
        rx: broadcast::Receiver<TxId>,
        /// Sealed or waiting transactions sent, with their `waits_for` as sent.
        sealed: HashMap<TxId, String>,
        first: bool,
        state: AppState,
        deadline: tokio::time::Instant,
        _guard: wait::WaitGuard,
    }
    // Subscribe before the snapshot so that no change falls between them.
    let rx = t.index.changes();
    let init = S { t, rx, sealed: HashMap::new(), first: true, state, deadline, _guard: guard };
    let stream = futures::stream::unfold(init, |mut s| async move {
        if s.first {
            s.first = false;
            let ev = snapshot_event(&s.t, &mut s.sealed);
            return Some((Ok(ev), s));
        }
        loop {
            let first = tokio::select! {
                r = s.rx.recv() => r,
                _ = tokio::time::sleep_until(s.deadline) => return None,
                _ = s.state.shutdown_token().cancelled() => return None,
            };
            let mut changed: HashSet<TxId> = HashSet::new();
            match first {
                Ok(tx) => {
                    changed.insert(tx);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    s.rx = s.t.index.changes();
                    // The client drops what it has on `resync`; the snapshot follows.
                    s.first = true;
                    return Some((Ok(SseEvent::default().event("resync").data("{}")), s));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            loop {
                match s.rx.try_recv() {
                    Ok(tx) => {
                        changed.insert(tx);
                    }
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {
                        s.rx = s.t.index.changes();
                        s.first = true;
                        return Some((Ok(SseEvent::default().event("resync").data("{}")), s));
                    }
                    Err(_) => break,
                }
            }
            let mut ids: Vec<TxId> = changed.iter().copied().collect();
            // Sealed and waiting ones whose answer to "what does it wait for" may have moved.
            ids.extend(s.sealed.keys().copied());
            ids.sort_unstable();
            ids.dedup();
            let mut data = Vec::new();
            for tx in ids {
                let Ok(Some(v)) = s.t.view(tx) else { continue };
                let out = tx_out(&s.t, &v);
                let waits = serde_json::to_string(&out.waits_for).unwrap_or_default();
                let was =
                    if v.phase == Phase::Sealed { s.sealed.insert(tx, waits.clone()) } else { s.sealed.remove(&tx) };
                // One re-checked only for what it waits for is sent when that moved.
                if changed.contains(&tx) || was.as_deref() != Some(waits.as_str()) {
                    data.push(out);
                }
            }
            if data.is_empty() {
                continue;
            }
            let body = serde_json::json!({ "data": data });
            return Some((Ok(SseEvent::default().event("changes").data(body.to_string())), s));
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// Who did an operator action, as the ledger's `operator` stream records it.
pub(crate) fn operator_label<P: tidegate_service::auth::Needs>(caller: &Caller<P>) -> String {
    format!("key_{} ({})", caller.key_id, caller.role)
}

/// Resolve (or accept) an effect of the attention list: recorded in the ledger as an extension
/// record on the stream `operator` with the note and who did it; the attention list then shows
/// it with its `resolution`. A later resolution of the same effect replaces the earlier one.
#[utoipa::path(
    post, path = "/v1/ledger/attention/{tx}/{effect}/resolve", tag = "ledger", operation_id = "resolve_attention",
    params(("tx" = String, Path, description = "Transaction id"),
           ("effect" = u32, Path, description = "The effect's issuance position"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = AttentionResolveIn,
    responses(
        (status = 200, description = "Recorded; the entry with its resolution", body = AttentionOut),
        (status = 409, description = "The effect is not in the attention list (`not_in_attention`)", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn resolve(
    caller: Caller<AttentionResolve>,
    ApiPath((id, effect)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AttentionResolveIn>,
) -> ApiResult<Json<AttentionOut>> {
    let t = &caller.tenant;
    let by = operator_label(&caller);
    let entry = t.resolve_attention(&id, &effect, body.action, &body.note, by).await?;
    Ok(Json(attention_out(t, &entry)))
}

/// Retry an effect of the attention list through its tool's capability, with the same
/// idempotency key as before (a receiver that deduplicates by key applies it at most once): for
/// a committed transaction the forward operation (the release of a held effect, the call of an
/// eager one), for an aborted one the compensation (`409 no_compensation` when the tool has
/// none). Every retry is recorded in the ledger (stream `operator`, kind `retry_effect`, with
/// its outcome and who); a retry confirmed `done` resolves the entry (`resolution.action`
/// `retried`).
#[utoipa::path(
    post, path = "/v1/ledger/attention/{tx}/{effect}/retry", tag = "ledger", operation_id = "retry_attention",
    params(("tx" = String, Path, description = "Transaction id"),
           ("effect" = u32, Path, description = "The effect's issuance position")),
    request_body = RetryIn,
    responses(
        (status = 200, description = "Retried (see `outcome`) and recorded", body = RetryOut),
        (status = 409, description = "Not in the attention list, or nothing to retry it with", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn retry(
    caller: Caller<AttentionResolve>,
    ApiPath((id, effect)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<RetryIn>,
) -> ApiResult<Json<RetryOut>> {
    let t = &caller.tenant;
    let by = operator_label(&caller);
    let r = t.retry_attention(&id, &effect, body.note.as_deref(), by).await?;
    Ok(Json(RetryOut {
        operation: r.operation.as_str().to_owned(),
        outcome: r.outcome.to_owned(),
        detail: r.detail,
        entry: attention_out(t, &r.entry),
    }))
}

/// The tenant's commits, aborts by reason and commit waits per minute over the last hour
/// (the same increments as the `/metrics` counters, kept since this process started).
#[utoipa::path(
    get, path = "/v1/console/series", tag = "meta", operation_id = "console_series",
    responses(
        (status = 200, description = "60 minutes, oldest first", body = SeriesOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn series(caller: Caller<TxRead>) -> ApiResult<Json<SeriesOut>> {
    let minutes = caller
        .tenant
        .index
        .last_hour()
        .into_iter()
        .map(|m| MinuteOut {
            start_ms: m.start_ms,
            commits: m.commits,
            aborts: m.aborts,
            waits: m.waits,
            waiting_max: m.waiting_max,
        })
        .collect();
    Ok(Json(SeriesOut { minutes }))
}

/// The ledger's events as JSON Lines (one event per line, the shape of `/v1/ledger/events`'s
/// items), with the same filters; at most `limit` (default and most: 100000) events.
#[utoipa::path(
    get, path = "/v1/ledger/export", tag = "ledger", operation_id = "ledger_export",
    params(LedgerEventsQuery),
    responses(
        (status = 200, description = "`application/x-ndjson`: one LedgerEvent per line", content_type = "application/x-ndjson", body = String),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn export(
    caller: Caller<LedgerRead>,
    ApiQuery(q): ApiQuery<LedgerEventsQuery>,
) -> ApiResult<impl IntoResponse> {
    let limit = match q.limit {
        None => MAX_EXPORT,
        Some(n) if (1..=MAX_EXPORT).contains(&n) => n,
        Some(n) => return Err(ApiError::invalid("limit", n.to_string(), format!("1 to {MAX_EXPORT}"))),
    };
    let t = caller.tenant.clone();
    let (events, _) = tokio::task::spawn_blocking(move || filtered_events(&t, &q, limit))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    let mut body = String::new();
    for e in &events {
        body.push_str(&serde_json::to_string(e).unwrap_or_default());
        body.push('\n');
    }
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CONTENT_DISPOSITION, "attachment; filename=\"ledger.jsonl\""),
        ],
        body,
    ))
}

const PAGE_HTML: &str = include_str!("console_page/index.html");
const PAGE_JS: &str = include_str!("console_page/console.js");
const PAGE_CSS: &str = include_str!("console_page/console.css");

fn asset(content_type: &'static str, body: &'static str) -> axum::response::Response {
    let mut r = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    r
}

/// The console page and its assets (no authentication: the page asks for an API key and sends
/// it with every API call), and the server's root, which sends a browser to the console with
/// `303 See Other` (not a permanent redirect: a later version may serve something there).
pub fn page_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/console") }))
        .route("/console", get(|| async { asset("text/html; charset=utf-8", PAGE_HTML) }))
        .route("/console/", get(|| async { asset("text/html; charset=utf-8", PAGE_HTML) }))
        .route("/console/console.js", get(|| async { asset("text/javascript; charset=utf-8", PAGE_JS) }))
        .route("/console/console.css", get(|| async { asset("text/css; charset=utf-8", PAGE_CSS) }))
}
