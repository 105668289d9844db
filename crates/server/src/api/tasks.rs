//! Pull-worker tasks: long-poll and lease, heartbeat, report, list.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem};
use super::wait::{begin_wait, wait_duration};
use super::wire::*;
use crate::AppState;
use tidegate_service::auth::{TasksRead, TasksWork};
use tidegate_service::dispatch::TaskResult;
use tidegate_service::dispatch::queue::TaskRefusal;
use tidegate_service::registry::valid_name;

fn check_worker(worker: &str) -> ApiResult<()> {
    if worker.is_empty() || worker.len() > 128 {
        return Err(ApiError::invalid("worker", worker, "1 to 128 bytes"));
    }
    Ok(())
}

fn lease(ms: Option<u64>) -> ApiResult<Option<Duration>> {
    match ms {
        None => Ok(None),
        Some(m) if (1..=86_400_000).contains(&m) => Ok(Some(Duration::from_millis(m))),
        Some(m) => Err(ApiError::invalid("lease_ms", m.to_string(), "1 to 86400000 milliseconds")),
    }
}

fn refusal(id: &str, r: TaskRefusal) -> ApiError {
    match r {
        TaskRefusal::NotFound => ApiError::not_found("task", id),
        TaskRefusal::Settled => ApiError::conflict("task_settled", format!("task {id} has already been settled")),
        TaskRefusal::NotLeased => {
            ApiError::conflict("task_not_leased", format!("this worker does not hold the lease of task {id}"))
        }
    }
}

/// Long-poll for tasks of the given capabilities and lease them.
#[utoipa::path(
    post, path = "/v1/tasks/poll", tag = "tasks", operation_id = "poll_tasks",
    request_body = PollIn,
    responses(
        (status = 200, description = "Leased tasks (none when the wait ended)", body = PollOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn poll(
    State(state): State<AppState>,
    caller: Caller<TasksWork>,
    ApiJson(body): ApiJson<PollIn>,
) -> ApiResult<Json<PollOut>> {
    check_worker(&body.worker)?;
    if body.capabilities.is_empty() || body.capabilities.len() > 64 {
        return Err(ApiError::invalid(
            "capabilities",
            format!("{} names", body.capabilities.len()),
            "1 to 64 capability names",
        ));
    }
    if let Some((i, bad)) = body.capabilities.iter().enumerate().find(|(_, c)| !valid_name(c)) {
        return Err(ApiError::invalid(format!("capabilities[{i}]"), bad, "a capability name"));
    }
    let max = body.max_tasks.unwrap_or(1);
    if !(1..=100).contains(&max) {
        return Err(ApiError::invalid("max_tasks", max.to_string(), "1 to 100"));
    }
    let wait = wait_duration(&state, "wait_ms", body.wait_ms)?;
    let lease = lease(body.lease_ms)?;
    let _guard = if wait.is_zero() { None } else { Some(begin_wait(&state, &caller.slot)?) };
    let d = &caller.tenant.dispatcher;
    let stop = state.shutdown_token().clone();
    let p = tidegate_service::dispatch::queue::Poll {
        worker: body.worker,
        capabilities: body.capabilities,
        max,
        wait,
        lease,
    };
    let tasks = d.queue().poll(&p, async move { stop.cancelled().await }).await?;
    Ok(Json(PollOut { tasks }))
}

/// Extend a task's lease.
#[utoipa::path(
    post, path = "/v1/tasks/{task}/heartbeat", tag = "tasks", operation_id = "heartbeat_task",
    params(("task" = String, Path, description = "Task id")),
    request_body = HeartbeatIn,
    responses(
        (status = 200, description = "The task with its new lease", body = tidegate_service::dispatch::queue::TaskView),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn heartbeat(
    caller: Caller<TasksWork>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<HeartbeatIn>,
) -> ApiResult<Json<tidegate_service::dispatch::queue::TaskView>> {
    check_worker(&body.worker)?;
    let lease = lease(body.lease_ms)?;
    let v = caller.tenant.dispatcher.queue().heartbeat(&id, &body.worker, lease).await?.map_err(|r| refusal(&id, r))?;
    Ok(Json(v))
}

/// Report a task's result (the first report settles it).
#[utoipa::path(
    post, path = "/v1/tasks/{task}/report", tag = "tasks", operation_id = "report_task",
    params(("task" = String, Path, description = "Task id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = ReportIn,
    responses(
        (status = 200, description = "Settled", body = ReportOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn report(
    caller: Caller<TasksWork>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReportIn>,
) -> ApiResult<(StatusCode, Json<ReportOut>)> {
    check_worker(&body.worker)?;
    let result = match body.result {
        TaskResultIn::Done { output, residue } => {
            TaskResult::Done { output: output.unwrap_or(serde_json::Value::Null), residue }
        }
        TaskResultIn::Failed { error } | TaskResultIn::NotApplied { error, retry: false } => TaskResult::Failed(error),
        TaskResultIn::NotApplied { error, retry: true } => TaskResult::Transient(error),
        TaskResultIn::Unknown { error } => TaskResult::Unknown(error),
    };
    let d = &caller.tenant.dispatcher;
    d.queue().report(&id, &body.worker, result).await?.map_err(|r| refusal(&id, r))?;
    Ok((StatusCode::OK, Json(ReportOut { task: id, state: "settled".into() })))
}

/// The worker queue: queued and leased tasks.
#[utoipa::path(
    get, path = "/v1/tasks", tag = "tasks", operation_id = "list_tasks",
    responses(
        (status = 200, description = "Unsettled tasks", body = TaskList),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list(caller: Caller<TasksRead>) -> ApiResult<Json<TaskList>> {
    Ok(Json(TaskList { data: caller.tenant.dispatcher.queue().list().await?, has_more: false, next_cursor: None }))
}
