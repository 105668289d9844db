//! Speculation groups: branches sharing one epoch, of which one commits.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tidegate_runtime::TxOptions;

use super::common::{check_agent, check_lease, check_scopes};
use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem};
use super::wait::{self, wait_duration};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{TxAbort, TxRead, TxWrite};
use tidegate_service::groups::GroupView;
use tidegate_service::ids;
use tidegate_service::tenant::Tenant;

fn group_out(t: &Tenant, g: &GroupView) -> GroupOut {
    GroupOut {
        id: ids::format(ids::Kind::Group, &t.tag, g.group),
        state: if g.settled { "settled".into() } else { "open".into() },
        winner: g.winner.map(|w| ids::tx(&t.tag, w)),
        resumable: g.resumable,
        branches: g.branches.iter().map(|v| tx_out(t, v)).collect(),
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
    let opts = TxOptions { agent: body.agent, may_touch: body.may_touch, lease };
    let (g, branches) = t.begin_group(opts, body.branches).map_err(ApiError::from)?;
    // The ids are answered once their begins are durable (never issued again after a crash).
    t.engine.appended_durable().await.map_err(|e| ApiError::from(tidegate_service::ServiceError::engine(e)))?;
    Ok((StatusCode::CREATED, Json(group_out(t, &t.group_view(g, &branches)))))
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
    Ok(Json(group_out(t, &t.group_of(&id)?)))
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
    let s = t.commit_group(state.service(), &id, &body.winner)?;
    let settled = wait::settle_group(&state, t, &s, wait_for, &caller.slot).await?;
    let code = if settled { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((code, Json(group_out(t, &t.group_view(s.group, &s.branches)))))
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
    let s = t.abort_group(state.service(), &id, reason)?;
    let settled = wait::settle_group(&state, t, &s, wait_for, &caller.slot).await?;
    let code = if settled { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((code, Json(group_out(t, &t.group_view(s.group, &s.branches)))))
}
