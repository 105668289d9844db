//! Speculation groups: branches sharing one epoch, of which one commits.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tidegate_runtime::{GroupId, TxId, TxOptions};

use super::common::{check_agent, check_lease, check_scopes, parse_tx};
use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use super::wait::{self, wait_duration};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{TxAbort, TxRead, TxWrite};
use tidegate_service::ids;
use tidegate_service::index::Phase;
use tidegate_service::tenant::{LiveGroup, SettleOp, Tenant};

fn parse_group(t: &Tenant, id: &str) -> ApiResult<u64> {
    ids::parse(ids::Kind::Group, &t.tag, id).ok_or_else(|| ApiError::not_found("speculation group", id))
}

fn branches_of(t: &Tenant, g: u64) -> Option<Vec<TxId>> {
    t.group(g).map(|lg| lg.spec.branches().iter().map(|b| b.id()).collect()).or_else(|| t.index.group(g))
}

fn group_out(t: &Tenant, g: u64, branches: &[TxId]) -> GroupOut {
    let views: Vec<_> = branches.iter().filter_map(|b| t.view(*b).ok().flatten()).collect();
    let settled = views.iter().all(|v| v.phase.settled());
    let winner = views.iter().find(|v| v.phase == Phase::Committed).map(|v| ids::tx(&t.tag, v.tx));
    GroupOut {
        id: ids::format(ids::Kind::Group, &t.tag, g),
        state: if settled { "settled".into() } else { "open".into() },
        winner,
        resumable: !settled && (t.group(g).is_some() || t.engine.speculation(GroupId(g)).is_ok()),
        branches: views.iter().map(|v| tx_out(t, v)).collect(),
    }
}

/// Begin a speculation group.
#[utoipa::path(
    post, path = "/v1/groups", tag = "groups", operation_id = "begin_group",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = GroupIn,
    responses(
        (status = 201, description = "Begun", body = GroupOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn begin(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiJson(body): ApiJson<GroupIn>,
) -> ApiResult<(StatusCode, Json<GroupOut>)> {
    let t = &caller.tenant;
    let max = state.config().limits.max_branches;
    if body.branches < 2 || body.branches > max {
        return Err(ApiError::invalid(
            "branches",
            body.branches.to_string(),
            format!("2 to {max} (limits.max_branches)"),
        ));
    }
    check_agent(&body.agent)?;
    check_scopes("may_touch", &body.may_touch)?;
    let lease = check_lease(body.lease_ms)?;
    let spec = t
        .engine
        .speculate(TxOptions { agent: body.agent, may_touch: body.may_touch, lease }, body.branches)
        .map_err(from_runtime)?;
    let g = spec.id().0;
    for b in spec.branches() {
        t.add_live(b.clone(), Some(g));
    }
    let branches: Vec<TxId> = spec.branches().iter().map(|b| b.id()).collect();
    t.add_group(spec);
    Ok((StatusCode::CREATED, Json(group_out(t, g, &branches))))
}

/// A speculation group.
#[utoipa::path(
    get, path = "/v1/groups/{group}", tag = "groups", operation_id = "get_group",
    params(("group" = String, Path, description = "Group id")),
    responses(
        (status = 200, description = "The group", body = GroupOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get(caller: Caller<TxRead>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<GroupOut>> {
    let t = &caller.tenant;
    let g = parse_group(t, &id)?;
    let branches = branches_of(t, g).ok_or_else(|| ApiError::not_found("speculation group", &id))?;
    Ok(Json(group_out(t, g, &branches)))
}

/// The live handle of a group: one this process began, or one kept open across a restart
/// (`recover_keeping_open`), resumed through the engine with its unsettled branches.
fn live_group(t: &Tenant, id: &str) -> ApiResult<(u64, Arc<LiveGroup>)> {
    let g = parse_group(t, id)?;
    if let Some(lg) = t.group(g) {
        return Ok((g, lg));
    }
    let Some(branches) = t.index.group(g) else { return Err(ApiError::not_found("speculation group", id)) };
    let settled = |b: &TxId| t.index.phase(*b).is_none_or(|p| p.settled());
    let spec = match t.engine.speculation(GroupId(g)) {
        Ok(spec) if !branches.iter().all(settled) => spec,
        _ => return Err(ApiError::conflict("not_resumable", format!("group {id} has settled"))),
    };
    for b in spec.branches().iter().filter(|b| !settled(&b.id())) {
        t.resume_live(b.clone(), Some(g));
    }
    Ok((g, t.resume_group(spec)))
}

fn start(state: &AppState, lg: &Arc<LiveGroup>, kind: &'static str, run: GroupRun) -> SettleOp {
    let lg2 = lg.clone();
    let work = async move {
        let r = match run {
            GroupRun::Commit(winner) => lg2.spec.commit_winner(winner).await.map(|_| ()),
            GroupRun::Abort(reason) => lg2.spec.abort(reason).await.map(|_| ()),
        };
        match r {
            Ok(()) | Err(tidegate_runtime::Error::Aborted(_)) => Ok(()),
            // The group was looked up before: the engine no longer knowing it means it settled
            // (every branch finished), not that it never existed.
            Err(tidegate_runtime::Error::Engine(tidegate_runtime::EngineError::UnknownGroup { .. })) => Err(
                tidegate_service::ServiceError::conflict("wrong_state", "the speculation group has already settled"),
            ),
            Err(e) => Err(tidegate_service::ServiceError::engine(e)),
        }
    };
    super::wait::start_settle(state, lg, |lg: &LiveGroup| &lg.settle, (kind, false), || {}, work)
}

enum GroupRun {
    Commit(TxId),
    Abort(String),
}

async fn wait_all(
    state: &AppState,
    t: &Arc<Tenant>,
    branches: &[TxId],
    op: SettleOp,
    total: Duration,
    slot: &super::extract::RequestSlot,
) -> ApiResult<bool> {
    let deadline = tokio::time::Instant::now() + total;
    // The operation first (its refusal is the answer), then every branch.
    let first = branches.first().copied().unwrap_or(TxId(0));
    let mut settled = wait::settle(state, t, first, Some(op.done.clone()), total, slot).await?;
    // The first branch's record can show it settled a moment before the group operation
    // reports its end: wait for that report too (within the same deadline), or a group that
    // has settled would be answered 202.
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let mut done_rx = op.done.clone();
    let done = match tokio::time::timeout(left, done_rx.wait_for(Option::is_some)).await {
        Ok(Ok(result)) => {
            if let Some(Err(e)) = &*result {
                return Err(e.clone().into());
            }
            true
        }
        // Timed out, or the operation's task is gone without a report.
        _ => op.done.borrow().is_some(),
    };
    if done {
        for b in branches {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            settled &= wait::settle(state, t, *b, None, left, slot).await?;
        }
    } else {
        settled = false;
    }
    Ok(settled)
}

/// Commit the winner: aborts the other branches, then commits it (on a server task).
#[utoipa::path(
    post, path = "/v1/groups/{group}/commit", tag = "groups", operation_id = "commit_group",
    params(("group" = String, Path, description = "Group id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = GroupCommitIn,
    responses(
        (status = 200, description = "Settled", body = GroupOut),
        (status = 202, description = "Still settling", body = GroupOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn commit(
    State(state): State<AppState>,
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<GroupCommitIn>,
) -> ApiResult<(StatusCode, Json<GroupOut>)> {
    let t = &caller.tenant;
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let (g, lg) = live_group(t, &id)?;
    let winner = parse_tx(t, &body.winner)
        .map_err(|_| ApiError::invalid("winner", &body.winner, "the id of one of the group's branches"))?;
    let branches: Vec<TxId> = lg.spec.branches().iter().map(|b| b.id()).collect();
    if !branches.contains(&winner) {
        return Err(ApiError::invalid("winner", &body.winner, "the id of one of the group's branches"));
    }
    let op = start(&state, &lg, "commit", GroupRun::Commit(winner));
    let mut order = vec![winner];
    order.extend(branches.iter().copied().filter(|b| *b != winner));
    let settled = wait_all(&state, t, &order, op, wait_for, &caller.slot).await?;
    let code = if settled { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((code, Json(group_out(t, g, &branches))))
}

/// Abort every branch.
#[utoipa::path(
    post, path = "/v1/groups/{group}/abort", tag = "groups", operation_id = "abort_group",
    params(("group" = String, Path, description = "Group id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = AbortIn,
    responses(
        (status = 200, description = "Settled", body = GroupOut),
        (status = 202, description = "Still settling", body = GroupOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn abort(
    State(state): State<AppState>,
    caller: Caller<TxAbort>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<AbortIn>,
) -> ApiResult<(StatusCode, Json<GroupOut>)> {
    let t = &caller.tenant;
    let wait_for = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let reason = body.reason.unwrap_or_else(|| format!("aborted over the API by key {}", caller.key_id));
    if reason.len() > 1024 {
        return Err(ApiError::invalid("reason", &reason, "at most 1024 bytes"));
    }
    let (g, lg) = live_group(t, &id)?;
    let branches: Vec<TxId> = lg.spec.branches().iter().map(|b| b.id()).collect();
    let op = start(&state, &lg, "abort", GroupRun::Abort(reason));
    let settled = wait_all(&state, t, &branches, op, wait_for, &caller.slot).await?;
    let code = if settled { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((code, Json(group_out(t, g, &branches))))
}
