//! Transactions: begin, read, effect, seal, commit, abort, outcome long-poll, SSE, timeline,
//! and the single-request forms (one call, a batch).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde_json::Value;
use tidegate_runtime::TxId;
use tokio::sync::watch;

use super::common::{in_tx, live_of, page_limit, view_of, with_tx};
use super::extract::{ApiJson, ApiPath, ApiQuery, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use super::wait::{self, begin_wait, wait_duration};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{TxAbort, TxRead, TxWrite};
use tidegate_service::ids;
use tidegate_service::index::{ListFilter, Phase};
use tidegate_service::settle::CommitRequest;
use tidegate_service::tenant::Tenant;
use tidegate_service::tools::legacy_envelope;
use tidegate_service::transactions::{Batch, BatchFailure, BatchRequest, BatchStep, BeginRequest, EffectCall, OneCall};

fn respond(t: &Tenant, tx: TxId, settled: bool) -> ApiResult<(StatusCode, Json<TransactionOut>)> {
    let v = t.view(tx)?.ok_or_else(|| ApiError::internal("transaction vanished from the ledger"))?;
    let code = if settled || v.phase.settled() { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((code, Json(tx_out(t, &v))))
}

/// Begin a transaction.
#[utoipa::path(
    post, path = "/v1/transactions", tag = "transactions", operation_id = "begin_transaction",
    request_body = BeginIn,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    responses(
        (status = 201, description = "Begun", body = TransactionOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
        (status = "5XX", description = "Server fault", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn begin(
    caller: Caller<TxWrite>,
    ApiJson(body): ApiJson<BeginIn>,
) -> ApiResult<(StatusCode, Json<TransactionOut>)> {
    let t = &caller.tenant;
    let (_, v) = t
        .begin(BeginRequest { agent: body.agent, may_touch: body.may_touch, lease_ms: body.lease_ms, plan: body.plan })
        .await?;
    Ok((StatusCode::CREATED, Json(tx_out(t, &v))))
}

/// List transactions, oldest first.
#[utoipa::path(
    get, path = "/v1/transactions", tag = "transactions", operation_id = "list_transactions",
    params(ListTxQuery),
    responses(
        (status = 200, description = "A page", body = TransactionList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller<TxRead>,
    ApiQuery(q): ApiQuery<ListTxQuery>,
) -> ApiResult<Json<TransactionList>> {
    let t = &caller.tenant;
    let limit = page_limit(&state, q.limit)?;
    let after = match &q.cursor {
        None => 0,
        Some(c) => {
            c.parse::<u64>().map_err(|_| ApiError::invalid("cursor", c, "a `next_cursor` from a previous page"))?
        }
    };
    let filter = match q.state.as_deref() {
        None => ListFilter::All,
        Some("unfinished") => ListFilter::Unfinished,
        Some("settled") => ListFilter::Settled,
        Some("open") => ListFilter::Phase(Phase::Open),
        Some("sealed") => ListFilter::Phase(Phase::Sealed),
        Some("waiting") => ListFilter::Waiting,
        Some("committing") => ListFilter::Phase(Phase::Committing),
        Some("aborting") => ListFilter::Phase(Phase::Aborting),
        Some("committed") => ListFilter::Phase(Phase::Committed),
        Some("aborted") => ListFilter::Phase(Phase::Aborted),
        Some(other) => {
            return Err(ApiError::invalid(
                "state",
                other,
                "unfinished, settled, open, sealed, waiting, committing, aborting, committed or aborted",
            ));
        }
    };
    let (txs, has_more) = t.index.list(after, limit, filter);
    let next_cursor = if has_more { txs.last().map(|tx| tx.0.to_string()) } else { None };
    let data = txs
        .into_iter()
        .filter_map(|tx| t.view(tx).transpose())
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(|v| tx_out(t, &v))
        .collect();
    Ok(Json(TransactionList { data, has_more, next_cursor }))
}

/// A transaction.
#[utoipa::path(
    get, path = "/v1/transactions/{tx}", tag = "transactions", operation_id = "get_transaction",
    params(("tx" = String, Path, description = "Transaction id")),
    responses(
        (status = 200, description = "The transaction", body = TransactionOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get(caller: Caller<TxRead>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<TransactionOut>> {
    let (_, v) = view_of(&caller.tenant, &id)?;
    Ok(Json(tx_out(&caller.tenant, &v)))
}

/// Record a read of a scope at its committed version.
#[utoipa::path(
    post, path = "/v1/transactions/{tx}/reads", tag = "transactions", operation_id = "read_scope",
    params(("tx" = String, Path, description = "Transaction id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = ReadIn,
    responses(
        (status = 200, description = "The version read", body = ReadResultOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn read(
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReadIn>,
) -> ApiResult<Json<ReadResultOut>> {
    let t = &caller.tenant;
    let (lt, _) = live_of(t, &id)?;
    if body.scope.len() > 1024 {
        return Err(ApiError::invalid("scope", &body.scope, "a scope of at most 1024 bytes"));
    }
    let scope = t.engine.scope(&body.scope).map_err(from_runtime)?;
    let r = lt.handle.read(&body.scope).map_err(|e| with_tx(t, lt.handle.id(), from_runtime(e)))?;
    Ok(Json(ReadResultOut {
        scope: scope.to_string(),
        version: r.version.0,
        staged: r.staged.map(|s| staged_args(t, lt.handle.id(), &s)),
    }))
}

/// The service's form of an effect call.
fn effect_call(body: EffectIn) -> EffectCall {
    EffectCall {
        tool: body.tool,
        args: body.args,
        key: body.key,
        scopes: body.scopes,
        compensate: body.compensate.map(CompensateIn::into_descriptor),
        by_client: body.execute == Some(ExecuteMode::Client),
    }
}

/// The client's arguments of a staged effect of `tx` as a read sees them: as recorded, or
/// unwrapped from the envelope a server of an earlier version recorded (its key names `tx`).
fn staged_args(t: &Tenant, tx: TxId, staged: &Value) -> Value {
    let prefix = format!("{}:", ids::tx(&t.tag, tx));
    let key = staged.get("key").and_then(Value::as_str).filter(|k| k.starts_with(&prefix));
    legacy_envelope(staged, key).unwrap_or(staged).clone()
}

/// Call a server tool in the transaction: an eager class is executed now through its
/// `call` capability, or, with `execute: client`, answered with a ticket the client runs and
/// reports to `result_url`; a held one is staged or queued and released through the `call`
/// capability at commit.
#[utoipa::path(
    post, path = "/v1/transactions/{tx}/effects", tag = "transactions", operation_id = "call_effect",
    params(("tx" = String, Path, description = "Transaction id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = EffectIn,
    responses(
        (status = 200, description = "The acknowledgement, or a client-executed effect's ticket (`ack: execute`)", body = EffectAckOut),
        (status = 409, description = "The call failed and the transaction aborted (`transaction_aborted`, with the transaction), or a protocol violation", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
        (status = "5XX", description = "Server fault", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn effect(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<EffectIn>,
) -> ApiResult<Json<EffectAckOut>> {
    let t = &caller.tenant;
    match t.call(state.service(), &id, effect_call(body)).await {
        Ok(a) => super::common::answer_out(t, &id, a).map(Json),
        Err(e) => Err(match t.parse_tx(&id) {
            Ok(tx) => with_tx(t, tx, e.into()),
            Err(_) => e.into(),
        }),
    }
}

/// Seal: freeze the footprint.
#[utoipa::path(
    post, path = "/v1/transactions/{tx}/seal", tag = "transactions", operation_id = "seal_transaction",
    params(("tx" = String, Path, description = "Transaction id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    responses(
        (status = 200, description = "Sealed", body = TransactionOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn seal(caller: Caller<TxWrite>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<TransactionOut>> {
    let t = &caller.tenant;
    let v = t.seal(&id).map_err(|e| in_tx(t, &id, e))?;
    Ok(Json(tx_out(t, &v)))
}

/// Commit: runs on a server task (a disconnect does not cancel it); answers when it settled
/// (200) or when `wait_ms` passed (202). Asking again joins the running commit.
#[utoipa::path(
    post, path = "/v1/transactions/{tx}/commit", tag = "transactions", operation_id = "commit_transaction",
    params(("tx" = String, Path, description = "Transaction id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = CommitIn,
    responses(
        (status = 200, description = "Settled: committed, or aborted with the reason in `outcome`", body = TransactionOut),
        (status = 202, description = "Still settling", body = TransactionOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn commit(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CommitIn>,
) -> ApiResult<(StatusCode, Json<TransactionOut>)> {
    let t = &caller.tenant;
    let (tx, v) = view_of(t, &id)?;
    if v.phase.settled() {
        return respond(t, tx, true);
    }
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let req = CommitRequest { seal: body.seal == Some(true), timeout_ms: body.commit_timeout_ms };
    let op = t.commit(state.service(), &id, req).map_err(|e| in_tx(t, &id, e))?;
    let settled = wait::settle(&state, t, tx, Some(op.done), wait_for, &caller.slot).await?;
    respond(t, tx, settled)
}

/// Abort: drops held effects, compensates executed ones in reverse (on a server task);
/// answers when settled (200) or when `wait_ms` passed (202).
#[utoipa::path(
    post, path = "/v1/transactions/{tx}/abort", tag = "transactions", operation_id = "abort_transaction",
    params(("tx" = String, Path, description = "Transaction id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = AbortIn,
    responses(
        (status = 200, description = "Settled", body = TransactionOut),
        (status = 202, description = "Compensations still running", body = TransactionOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn abort(
    State(state): State<AppState>,
    caller: Caller<TxAbort>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<AbortIn>,
) -> ApiResult<(StatusCode, Json<TransactionOut>)> {
    let t = &caller.tenant;
    let (tx, v) = view_of(t, &id)?;
    if v.phase.settled() {
        return respond(t, tx, true);
    }
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let reason = body.reason.unwrap_or_else(|| format!("aborted over the API by key {}", caller.key_id));
    let op = t.abort(state.service(), &id, reason).map_err(|e| in_tx(t, &id, e))?;
    let settled = wait::settle(&state, t, tx, Some(op.done), wait_for, &caller.slot).await?;
    respond(t, tx, settled)
}

/// Long-poll for the settlement.
#[utoipa::path(
    get, path = "/v1/transactions/{tx}/outcome", tag = "transactions", operation_id = "wait_outcome",
    params(("tx" = String, Path, description = "Transaction id"), WaitQuery),
    responses(
        (status = 200, description = "Settled", body = TransactionOut),
        (status = 202, description = "Not settled when the time was up", body = TransactionOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn outcome(
    State(state): State<AppState>,
    caller: Caller<TxRead>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> ApiResult<(StatusCode, Json<TransactionOut>)> {
    let t = &caller.tenant;
    let (tx, _) = view_of(t, &id)?;
    let timeout = wait_duration(&state, "timeout_ms", q.timeout_ms)?;
    let settled = wait::settle(&state, t, tx, None, timeout, &caller.slot).await?;
    respond(t, tx, settled)
}

/// Server-sent events: one `state` event (the transaction) at once and at every change;
/// the stream ends after the settlement.
#[utoipa::path(
    get, path = "/v1/transactions/{tx}/events", tag = "transactions", operation_id = "stream_transaction",
    params(("tx" = String, Path, description = "Transaction id")),
    responses(
        (status = 200, description = "`text/event-stream` of `state` events whose data is a Transaction", content_type = "text/event-stream", body = SseEventOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn events(
    State(state): State<AppState>,
    caller: Caller<TxRead>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let t = caller.tenant.clone();
    let (tx, _) = view_of(&t, &id)?;
    let guard = begin_wait(&state, &caller.slot)?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(state.config().limits.max_sse_ms);
    struct S {
        t: Arc<Tenant>,
        tx: TxId,
        last: Option<String>,
        done: bool,
        sub: Option<watch::Receiver<u64>>,
        state: AppState,
        deadline: tokio::time::Instant,
        _guard: wait::WaitGuard,
    }
    let sub = t.index.subscribe(tx);
    let init = S { t, tx, last: None, done: false, sub, state, deadline, _guard: guard };
    let stream = futures::stream::unfold(init, |mut s| async move {
        loop {
            if s.done || tokio::time::Instant::now() >= s.deadline || s.state.shutdown_token().is_cancelled() {
                return None;
            }
            let v = s.t.view(s.tx).ok()??;
            let body = serde_json::to_string(&tx_out(&s.t, &v)).unwrap_or_default();
            if v.phase.settled() {
                s.done = true;
            }
            if s.last.as_deref() != Some(body.as_str()) {
                s.last = Some(body.clone());
                return Some((Ok(SseEvent::default().event("state").data(body)), s));
            }
            if s.done {
                return None;
            }
            let changed = async {
                match &mut s.sub {
                    Some(r) => {
                        let _ = r.changed().await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(s.deadline) => {}
                _ = s.state.shutdown_token().cancelled() => {}
            }
            if s.sub.as_ref().is_some_and(|r| r.has_changed().is_err()) {
                s.sub = s.t.index.subscribe(s.tx);
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The transaction's ledger events and the dispatch attempts of its effects.
#[utoipa::path(
    get, path = "/v1/transactions/{tx}/timeline", tag = "transactions", operation_id = "transaction_timeline",
    params(("tx" = String, Path, description = "Transaction id"), LedgerQuery),
    responses(
        (status = 200, description = "The timeline", body = TimelineOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn timeline(
    State(state): State<AppState>,
    caller: Caller<TxRead>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<LedgerQuery>,
) -> ApiResult<Json<TimelineOut>> {
    let t = &caller.tenant;
    let (tx, v) = view_of(t, &id)?;
    let limit = page_limit(&state, q.limit)?;
    let (first, _) = t.index.range(tx).ok_or_else(|| ApiError::not_found("transaction", &id))?;
    let from = first.max(q.from_lsn()?);
    let mut events = Vec::new();
    let mut has_more = false;
    let settled = v.phase.settled();
    let last = v.lsns.1;
    t.store
        .scan(from, &mut |lsn, e| {
            if settled && lsn > last {
                return false;
            }
            if e.tx() != tx {
                return true;
            }
            if events.len() == limit {
                has_more = true;
                return false;
            }
            events.push(super::ledger::event_out(&t.tag, lsn, e));
            true
        })
        .map_err(|e| from_runtime(e.into()))?;
    let mut attempts = Vec::new();
    for e in &v.effects {
        attempts.extend(t.dispatcher.attempts().get(&e.key).await?);
    }
    attempts.sort_by_key(|a| a.started_at_ms);
    let next_cursor = if has_more { events.last().map(|e| e.lsn.to_string()) } else { None };
    Ok(Json(TimelineOut { transaction: id, events, attempts, has_more, next_cursor }))
}

/// A one-call transaction: begin, call, seal, commit.
#[utoipa::path(
    post, path = "/v1/calls", tag = "transactions", operation_id = "one_call_transaction",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = CallIn,
    responses(
        (status = 200, description = "Settled", body = CallOut),
        (status = 202, description = "Still settling", body = CallOut),
        (status = 409, description = "The call failed and the transaction aborted", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn call(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiJson(body): ApiJson<CallIn>,
) -> ApiResult<(StatusCode, Json<CallOut>)> {
    let t = &caller.tenant;
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let call = EffectCall {
        tool: body.tool,
        args: body.args,
        key: body.key,
        scopes: body.scopes,
        compensate: None,
        by_client: false,
    };
    let begin = BeginRequest { agent: body.agent, may_touch: body.may_touch, lease_ms: body.lease_ms, plan: None };
    let (tx, started) = t.one_call(state.service(), begin, call).await?;
    let OneCall { answer, commit } = started.map_err(|e| with_tx(t, tx, e.into()))?;
    let kind = super::common::ack_kind(answer.ack);
    let settled = wait::settle(&state, t, tx, Some(commit.done), wait_for, &caller.slot).await?;
    if !settled {
        // Answered before the settlement: only once the begin is durable (as `batch`).
        t.engine.appended_durable().await.map_err(from_runtime)?;
    }
    let (code, Json(transaction)) = respond(t, tx, settled)?;
    Ok((code, Json(CallOut { transaction, ack: kind, output: answer.output })))
}

/// A short transaction in one request: begin, reads, effects in order, seal, commit.
#[utoipa::path(
    post, path = "/v1/batches", tag = "transactions", operation_id = "batch_transaction",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = BatchIn,
    responses(
        (status = 200, description = "Settled: committed, or aborted at commit with the reason in `transaction.outcome`", body = BatchOut),
        (status = 202, description = "Still settling", body = BatchOut),
        (status = 409, description = "A step failed and the transaction aborted (`transaction_aborted`, with the transaction; `field` names the step, e.g. `effects[1]`)", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused before anything began (`field` names the step's field, e.g. `effects[1].tool`)", body = Problem, content_type = "application/problem+json"),
        (status = "5XX", description = "Server fault", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn batch(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiJson(body): ApiJson<BatchIn>,
) -> ApiResult<(StatusCode, Json<BatchOut>)> {
    let t = &caller.tenant;
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let effects = body
        .effects
        .into_iter()
        .map(|e| EffectCall {
            tool: e.tool,
            args: e.args,
            key: e.key,
            scopes: e.scopes,
            compensate: None,
            by_client: false,
        })
        .collect();
    let req = BatchRequest {
        begin: BeginRequest { agent: body.agent, may_touch: body.may_touch, lease_ms: body.lease_ms, plan: None },
        reads: body.reads,
        effects,
    };
    let (tx, ran) = t.batch(state.service(), req).await?;
    let Batch { reads, answers, commit } = match ran {
        Ok(b) => b,
        Err(BatchFailure { step, error }) => {
            // The failed step aborted the transaction: the answer waits (up to `wait_ms`) for
            // the abort to settle, so that it carries the outcome and why.
            let settled = wait::settle(&state, t, tx, None, wait_for, &caller.slot).await?;
            let mut e: ApiError = error.into();
            if settled {
                let mut aborted = ApiError::conflict("transaction_aborted", e.detail.clone());
                aborted.field = e.field.take();
                e = aborted;
            }
            // The field names the step, whatever layer named the field inside it.
            let prefix = match step {
                BatchStep::Read(i) => format!("reads[{i}]"),
                BatchStep::Effect(i) => format!("effects[{i}]"),
                BatchStep::Seal => "effects".into(),
            };
            e.field = Some(match e.field.take() {
                Some(f) if f.starts_with(&prefix) => f,
                Some(f) => format!("{prefix}.{f}"),
                None => prefix,
            });
            // The problem names the transaction: only once its begin is durable (as a 202).
            if t.engine.appended_durable().await.is_ok()
                && let Ok(Some(v)) = t.view(tx)
            {
                e.transaction = serde_json::to_value(tx_out(t, &v)).ok();
            }
            return Err(e);
        }
    };
    let id = ids::tx(&t.tag, tx);
    let effects = answers.into_iter().map(|a| super::common::answer_out(t, &id, a)).collect::<ApiResult<Vec<_>>>()?;
    let settled = wait::settle(&state, t, tx, Some(commit.done), wait_for, &caller.slot).await?;
    if !settled {
        // The id is answered before the settlement: only once its begin is durable, so that
        // a crash cannot hand it to another transaction.
        t.engine.appended_durable().await.map_err(from_runtime)?;
    }
    let (code, Json(transaction)) = respond(t, tx, settled)?;
    let reads = reads.into_iter().map(|r| BatchReadOut { scope: r.scope, version: r.version }).collect();
    Ok((code, Json(BatchOut { transaction, reads, effects })))
}
