//! Transactions: begin, read, effect, seal, commit, abort, outcome long-poll, SSE, timeline,
//! and the single-request form.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde_json::Value;
use tidegate_runtime::{Ack, CallOptions, CommitOptions, Tool, TxId, TxOptions};
use tokio::sync::watch;

use super::extract::{ApiJson, ApiPath, ApiQuery, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use super::wait::{self, begin_wait, wait_duration};
use super::wire::*;
use crate::AppState;
use crate::auth::{TxAbort, TxRead, TxWrite};
use crate::ids;
use crate::index::{ListFilter, Phase, TxView};
use crate::metrics::ResultLabel;
use crate::tenant::{LiveTx, SettleOp, Tenant};
use crate::tools::{ServerTool, legacy_envelope};

/// Most scopes in a may-touch set or a scope override.
pub(super) const MAX_SCOPES: usize = 1024;
/// Longest lease a client may ask for (7 days).
pub(super) const MAX_LEASE_MS: u64 = 7 * 86_400_000;

pub(super) fn parse_tx(t: &Tenant, id: &str) -> ApiResult<TxId> {
    ids::parse(ids::Kind::Tx, &t.tag, id).map(TxId).ok_or_else(|| ApiError::not_found("transaction", id))
}

pub(super) fn view_of(t: &Tenant, id: &str) -> ApiResult<(TxId, TxView)> {
    let tx = parse_tx(t, id)?;
    let v = t.index.view(&*t.store, tx).ok_or_else(|| ApiError::not_found("transaction", id))?;
    Ok((tx, v))
}

/// The live handle of an unsettled transaction this process began.
pub(super) fn live_of(t: &Tenant, id: &str) -> ApiResult<(Arc<LiveTx>, TxView)> {
    let (tx, v) = view_of(t, id)?;
    if v.phase.settled() {
        return Err(ApiError::conflict("wrong_state", format!("transaction {id} has already settled ({})", v.state())));
    }
    if let Some(lt) = t.live(tx) {
        return Ok((lt, v));
    }
    // Kept open across a restart (`recover_keeping_open`): resume it through the engine.
    match t.engine.transaction(tx) {
        Ok(handle) => Ok((t.resume_live(handle, v.group.map(|g| g.0)), v)),
        Err(e) => Err(with_tx(t, tx, from_runtime(e))),
    }
}

pub(super) fn check_agent(agent: &Option<String>) -> ApiResult<()> {
    if let Some(a) = agent
        && (a.is_empty() || a.len() > 256)
    {
        return Err(ApiError::invalid("agent", a, "1 to 256 bytes"));
    }
    Ok(())
}

pub(super) fn check_scopes(field: &str, scopes: &Option<Vec<String>>) -> ApiResult<()> {
    if let Some(s) = scopes {
        if s.len() > MAX_SCOPES {
            return Err(ApiError::invalid(
                field,
                format!("{} scopes", s.len()),
                format!("at most {MAX_SCOPES} scopes"),
            ));
        }
        if let Some((i, big)) = s.iter().enumerate().find(|(_, x)| x.len() > 1024) {
            return Err(ApiError::invalid(format!("{field}[{i}]"), big, "a scope of at most 1024 bytes"));
        }
    }
    Ok(())
}

pub(super) fn check_lease(lease_ms: Option<u64>) -> ApiResult<Option<Duration>> {
    match lease_ms {
        None => Ok(None),
        Some(ms) if (1..=MAX_LEASE_MS).contains(&ms) => Ok(Some(Duration::from_millis(ms))),
        Some(ms) => Err(ApiError::invalid("lease_ms", ms.to_string(), format!("1 to {MAX_LEASE_MS} milliseconds"))),
    }
}

fn respond(t: &Tenant, tx: TxId, settled: bool) -> ApiResult<(StatusCode, Json<TransactionOut>)> {
    let v = t.index.view(&*t.store, tx).ok_or_else(|| ApiError::internal("transaction vanished from the ledger"))?;
    let code = if settled || v.phase.settled() { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((code, Json(tx_out(t, &v))))
}

/// Attaches the transaction to an abort error.
pub(super) fn with_tx(t: &Tenant, tx: TxId, mut e: ApiError) -> ApiError {
    if e.code == "transaction_aborted"
        && let Some(v) = t.index.view(&*t.store, tx)
    {
        e.transaction = serde_json::to_value(tx_out(t, &v)).ok();
    }
    e
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
    check_agent(&body.agent)?;
    check_scopes("may_touch", &body.may_touch)?;
    let lease = check_lease(body.lease_ms)?;
    let opts = TxOptions { agent: body.agent, may_touch: body.may_touch, lease };
    let handle = match body.plan {
        // A step of a plan: bound to it (`step_begun`) before its first effect.
        Some(p) => {
            let n = super::plans::parse_plan(t, &p)?;
            let plan = t.engine.plan_by_id(n).await.map_err(|_| ApiError::not_found("plan", &p))?;
            plan.begin(opts).await.map_err(|e| match e {
                tidegate_runtime::Error::Plan(pe) => super::plans::from_plan(pe, t),
                e => from_runtime(e),
            })?
        }
        None => t.engine.begin_with(opts).map_err(from_runtime)?,
    };
    let tx = handle.id();
    t.add_live(handle, None);
    let v = t.index.view(&*t.store, tx).ok_or_else(|| ApiError::internal("the begin is not in the ledger"))?;
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
    let data = txs.into_iter().filter_map(|tx| t.index.view(&*t.store, tx)).map(|v| tx_out(t, &v)).collect();
    Ok(Json(TransactionList { data, has_more, next_cursor }))
}

pub(super) fn page_limit(state: &AppState, limit: Option<usize>) -> ApiResult<usize> {
    let max = state.config().limits.max_page_size;
    match limit {
        None => Ok(50.min(max)),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid("limit", n.to_string(), format!("1 to {max} (limits.max_page_size)"))),
    }
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

/// What an effect call resolved to, before it runs.
pub(crate) struct Planned {
    tool: Arc<ServerTool>,
    scopes: Vec<String>,
    args: Value,
    key: Option<String>,
    /// A plan step's compensation descriptor.
    compensate: Option<tidegate_runtime::Descriptor>,
}

pub(super) fn plan_effect(
    t: &Tenant,
    tool: &str,
    args: Value,
    key: Option<String>,
    scopes: Option<Vec<String>>,
) -> ApiResult<Planned> {
    let tool = t
        .tool(tool)
        .ok_or_else(|| ApiError::invalid("tool", tool, "the name of a tool registered with this tenant"))?;
    check_scopes("scopes", &scopes)?;
    let scopes = match scopes {
        Some(s) if !s.is_empty() => s,
        Some(_) => {
            return Err(ApiError::invalid("scopes", "[]", "at least one scope, or no `scopes` to use the tool's"));
        }
        None => {
            tool.scopes(&args).map_err(|(f, m)| ApiError::invalid(f, m, "arguments that fill every scope template"))?
        }
    };
    let key = match key {
        Some(k) if k.is_empty() || k.len() > 512 => return Err(ApiError::invalid("key", k, "1 to 512 bytes")),
        Some(k) => Some(k),
        None => match tool.key(&args) {
            Some(Ok(k)) if !k.is_empty() && k.len() <= 512 => Some(k),
            Some(Ok(k)) => return Err(ApiError::invalid("key", k, "a key template value of 1 to 512 bytes")),
            Some(Err((f, m))) => return Err(ApiError::invalid(f, m, "arguments that fill the key template")),
            None => None,
        },
    };
    Ok(Planned { tool, scopes, args, key, compensate: None })
}

/// The client's arguments of a staged effect of `tx` as a read sees them: as recorded, or
/// unwrapped from the envelope a server of an earlier version recorded (its key names `tx`).
fn staged_args(t: &Tenant, tx: TxId, staged: &Value) -> Value {
    let prefix = format!("{}:", ids::tx(&t.tag, tx));
    let key = staged.get("key").and_then(Value::as_str).filter(|k| k.starts_with(&prefix));
    legacy_envelope(staged, key).unwrap_or(staged).clone()
}

/// The runtime tool, recorded arguments (the client's) and options of a planned effect. A
/// call without a key of its own gets the engine's, derived from its effect number, so the key
/// its dispatches carry is the same before and after a restart (`tools::effect_key`).
pub(super) fn call_parts(p: Planned) -> (Tool, Value, CallOptions) {
    let opts = CallOptions { key: p.key, scopes: Some(p.scopes), compensate: p.compensate, ..CallOptions::default() };
    (p.tool.tool.clone(), p.args, opts)
}

/// Runs a planned effect on a server task. Returns the ack.
pub(super) async fn run_effect(state: &AppState, t: &Tenant, lt: &Arc<LiveTx>, p: Planned) -> ApiResult<Ack> {
    let tx = lt.handle.id();
    let (tool, env, opts) = call_parts(p);
    let handle = lt.handle.clone();
    let r = state
        .spawn(async move { handle.call_with(&tool, env, opts).await })
        .await
        .map_err(|_| ApiError::internal("the call's task failed"))?
        .ok_or_else(ApiError::shutting_down)?;
    r.map_err(|e| with_tx(t, tx, from_runtime(e)))
}

fn ack_parts(ack: &Ack) -> (AckKind, Option<Value>) {
    match ack {
        Ack::Executed { output, .. } => (AckKind::Executed, Some((**output).clone())),
        Ack::Replayed { output, .. } => (AckKind::Replayed, Some((**output).clone())),
        Ack::Staged { .. } => (AckKind::Staged, None),
        Ack::Queued { .. } => (AckKind::Queued, None),
    }
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
    let (lt, _) = live_of(t, &id)?;
    let mut planned = plan_effect(t, &body.tool, body.args, body.key, body.scopes)?;
    planned.compensate = body.compensate.map(CompensateIn::into_descriptor);
    if body.execute == Some(ExecuteMode::Client) {
        return super::effects::record(&state, t, &lt, &id, planned).await.map(Json);
    }
    let ack = run_effect(&state, t, &lt, planned).await?;
    let (kind, output) = ack_parts(&ack);
    let v = t.index.view(&*t.store, lt.handle.id()).ok_or_else(|| ApiError::internal("transaction vanished"))?;
    let rec = v
        .effects
        .iter()
        .find(|e| e.id == ack.effect())
        .ok_or_else(|| ApiError::internal("the effect is not in the ledger"))?;
    Ok(Json(EffectAckOut { transaction: id, ack: kind, output, effect: effect_out(rec), result_url: None }))
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
    let (lt, _) = live_of(t, &id)?;
    lt.handle.seal().map_err(|e| with_tx(t, lt.handle.id(), from_runtime(e)))?;
    let v = t.index.view(&*t.store, lt.handle.id()).ok_or_else(|| ApiError::internal("transaction vanished"))?;
    Ok(Json(tx_out(t, &v)))
}

/// Starts (or joins) the commit of a live transaction on a server task.
pub(super) fn start_commit(state: &AppState, t: &Arc<Tenant>, lt: &Arc<LiveTx>, timeout: Option<Duration>) -> SettleOp {
    let tx = lt.handle.id();
    let (handle, tenant, metrics) = (lt.handle.clone(), t.clone(), state.metrics().clone());
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
                Err(from_runtime(e))
            }
        }
    };
    let on_start = || t.index.mark_waiting(tx, true);
    super::wait::start_settle(state, lt, |lt: &LiveTx| &lt.settle, ("commit", true), on_start, work)
}

/// Starts (or joins) the abort of a live transaction on a server task.
pub(super) fn start_abort(state: &AppState, lt: &Arc<LiveTx>, reason: String) -> SettleOp {
    let handle = lt.handle.clone();
    let work = async move {
        match handle.abort(reason).await {
            Ok(_) | Err(tidegate_runtime::Error::Aborted(_)) => Ok(()),
            Err(e) => Err(from_runtime(e)),
        }
    };
    super::wait::start_settle(state, lt, |lt: &LiveTx| &lt.settle, ("abort", false), || {}, work)
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
    let timeout = match body.commit_timeout_ms {
        None => None,
        Some(ms) if ms <= MAX_LEASE_MS => Some(Duration::from_millis(ms)),
        Some(ms) => {
            return Err(ApiError::invalid(
                "commit_timeout_ms",
                ms.to_string(),
                format!("at most {MAX_LEASE_MS} milliseconds"),
            ));
        }
    };
    let (lt, v) = live_of(t, &id)?;
    if let Some(g) = lt.group {
        return Err(ApiError::conflict(
            "branch_of_group",
            format!("{id} is a branch of {}: commit the group", ids::format(ids::Kind::Group, &t.tag, g)),
        ));
    }
    if body.seal == Some(true) && v.phase == Phase::Open {
        lt.handle.seal().map_err(|e| with_tx(t, tx, from_runtime(e)))?;
    }
    let op = start_commit(&state, t, &lt, timeout);
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
    if reason.len() > 1024 {
        return Err(ApiError::invalid("reason", &reason, "at most 1024 bytes"));
    }
    let (lt, _) = live_of(t, &id)?;
    let op = start_abort(&state, &lt, reason);
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
            let v = s.t.index.view(&*s.t.store, s.tx)?;
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
        attempts.extend(t.dispatcher.attempts().get(&e.key));
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
    check_agent(&body.agent)?;
    check_scopes("may_touch", &body.may_touch)?;
    let lease = check_lease(body.lease_ms)?;
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let planned = plan_effect(t, &body.tool, body.args, body.key, body.scopes)?;
    let may_touch = body.may_touch.unwrap_or_else(|| planned.scopes.clone());
    let handle = t
        .engine
        .begin_with(TxOptions { agent: body.agent, may_touch: Some(may_touch), lease })
        .map_err(from_runtime)?;
    let tx = handle.id();
    let lt = t.add_live(handle, None);
    let ack = match run_effect(&state, t, &lt, planned).await {
        Ok(a) => a,
        Err(e) => {
            if e.code != "transaction_aborted" {
                // The call was refused before it ran: give the transaction back.
                let _ = start_abort(&state, &lt, format!("the one-call transaction's call was refused: {}", e.detail));
            }
            return Err(e);
        }
    };
    let (kind, output) = ack_parts(&ack);
    lt.handle.seal().map_err(|e| with_tx(t, tx, from_runtime(e)))?;
    let op = start_commit(&state, t, &lt, None);
    let settled = wait::settle(&state, t, tx, Some(op.done), wait_for, &caller.slot).await?;
    let (code, Json(transaction)) = respond(t, tx, settled)?;
    Ok((code, Json(CallOut { transaction, ack: kind, output })))
}
