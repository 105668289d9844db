//! Plans (docs/plans.md): open, list, get (steps, held compensations in unwind order,
//! triggers with their values), commit, fail / signal, verdict, arm a trigger, resolve a stuck
//! plan, and the owner-intervention queue. A step is a transaction begun with `plan` set
//! (`POST /v1/transactions`); its effects carry `compensate: {capability, args}`.

use axum::Json;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_runtime::Choice;
use tidegate_runtime::plans::Verdict;
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiResult, Problem};
use tidegate_service::auth::{PlanResolve, TxRead, TxWrite};
use tidegate_service::plans::{FailedBy, PlanRequest, PlanView};

/// Open a plan.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"owner": "trip-planner", "deadline_in_ms": 3600000, "cascade_limit": 3})
))]
pub struct PlanIn {
    /// Who answers for the plan (1 to 256 characters).
    pub owner: String,
    /// The plan fails unless it commits within this many milliseconds (1 to 31536000000).
    #[serde(default)]
    pub deadline_in_ms: Option<u64>,
    /// How deep a cascade may unwind it (default 3, at most 64).
    #[serde(default)]
    pub cascade_limit: Option<u32>,
    /// Predicate triggers (docs/plans.md, "Predicates"), armed at opening.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub triggers: Option<Vec<Value>>,
}

/// A failure signal.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"reason": "the hotel refused the booking"})
))]
pub struct SignalIn {
    /// Why the plan fails (at most 1024 bytes).
    #[serde(default)]
    pub reason: Option<String>,
}

/// A compliance verdict about one effect of a plan.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"transaction": "tx_0a1b2c3d_7", "effect": 0, "verdict": "block"})
))]
pub struct VerdictIn {
    /// The step transaction's id.
    pub transaction: String,
    /// The effect's number within it.
    pub effect: u32,
    /// `block` (compensate it) or `allow` (it stands).
    pub verdict: VerdictKind,
}

/// A verdict.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Compensate the effect.
    Block,
    /// Let it stand.
    Allow,
}

/// An owner's choice for a stuck plan.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"choice": "unwind"})
))]
pub struct PlanResolveIn {
    /// `retry`, `accept` or `unwind`.
    pub choice: ChoiceKind,
}

/// An owner's choice.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChoiceKind {
    /// Reopen the plan, or try the stopped compensation again.
    Retry,
    /// Keep the partial outcome.
    Accept,
    /// Unwind what can be compensated.
    Unwind,
}

/// Arm a predicate trigger.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"predicate": {"tagged": {"tx": 7, "effect": 0, "tag": "leaked"}}})
))]
pub struct TriggerIn {
    /// The predicate (docs/plans.md, "Predicates").
    #[schema(value_type = Object)]
    pub predicate: Value,
}

/// One held compensation (or a non-compensable effect) of a plan.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RegistrationOut {
    /// Position within the plan; the unwind goes from the highest down.
    pub seq: u32,
    /// The step transaction.
    pub transaction: String,
    /// The effect's number within it.
    pub effect: u32,
    /// The forward effect's tool.
    pub tool: String,
    /// The forward effect's idempotency key.
    pub key: String,
    /// The compensation descriptor (absent: non-compensable).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub compensation: Option<Value>,
    /// `pending`, `externalised`, `not_applied` or `in_doubt`.
    pub forward: String,
    /// `held`, `in_flight`, `in_doubt`, `failed`, `done`, `skipped` or `step_aborted` (its step
    /// aborted: the engine undid it; not counted as held).
    pub state: String,
    /// A verdict posted about it (`block` / `allow`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Compensation attempts so far.
    pub attempts: u32,
}

/// A trigger and its current value.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TriggerOut {
    /// `deadline`, `signal` or `predicate`.
    pub kind: String,
    /// `true`, `unknown` or `false`.
    pub value: String,
    /// The deadline (engine clock milliseconds), the signal's reason, or the predicate.
    #[schema(value_type = Value)]
    pub detail: Value,
}

/// A plan.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PlanOut {
    /// `plan_<tag>_<n>`.
    pub id: String,
    /// Its owner.
    pub owner: String,
    /// `open`, `failing`, `stuck`, `committed`, `unwound` or `accepted`.
    pub state: String,
    /// Why it is stuck (for `stuck`): an object tagged by `kind` (`irreversible`,
    /// `compensation_failed`, `compensation_in_doubt`, `forward_in_doubt`, `cascade_limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub stuck: Option<Value>,
    /// Why it failed, once it did: `{cause: {kind: deadline|signal|predicate, ..}, depth}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub failure: Option<Value>,
    /// Its step transactions, in order.
    pub steps: Vec<String>,
    /// Compensations still held.
    pub held: usize,
    /// The deadline (engine clock milliseconds since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Its cascade limit.
    pub cascade_limit: u32,
    /// Every registration, in unwind order (highest `seq` first).
    pub registrations: Vec<RegistrationOut>,
    /// The deadline, signal and predicate triggers with their current values.
    pub triggers: Vec<TriggerOut>,
}

/// Every plan of the tenant.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PlanListOut {
    /// The plans, oldest first.
    pub plans: Vec<PlanOut>,
}

/// A stuck plan in the owner-intervention queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StuckOut {
    /// The plan.
    pub id: String,
    /// Its owner.
    pub owner: String,
    /// Why it is stuck.
    #[schema(value_type = Object)]
    pub reason: Value,
    /// What the owner may choose.
    pub choices: Vec<String>,
}

/// The owner-intervention queue.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StuckListOut {
    /// Stuck plans, by id.
    pub stuck: Vec<StuckOut>,
}

fn plan_out(v: PlanView) -> PlanOut {
    PlanOut {
        id: v.id,
        owner: v.owner,
        state: v.state,
        stuck: v.stuck,
        failure: v.failure,
        steps: v.steps,
        held: v.held,
        deadline_ms: v.deadline_ms,
        cascade_limit: v.cascade_limit,
        registrations: v
            .registrations
            .into_iter()
            .map(|r| RegistrationOut {
                seq: r.seq,
                transaction: r.transaction,
                effect: r.effect,
                tool: r.tool,
                key: r.key,
                compensation: r.compensation,
                forward: r.forward.into(),
                state: r.state,
                verdict: r.verdict,
                attempts: r.attempts,
            })
            .collect(),
        triggers: v
            .triggers
            .into_iter()
            .map(|t| TriggerOut { kind: t.kind, value: t.value.into(), detail: t.detail })
            .collect(),
    }
}

/// Open a plan.
#[utoipa::path(
    post, path = "/v1/plans", tag = "plans", operation_id = "open_plan",
    request_body = PlanIn,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    responses(
        (status = 201, description = "Opened", body = PlanOut),
        (status = "4XX", description = "Refused (a trigger naming another tenant: `cross_tenant`)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn open(caller: Caller<TxWrite>, ApiJson(body): ApiJson<PlanIn>) -> ApiResult<(StatusCode, Json<PlanOut>)> {
    let req = PlanRequest {
        owner: body.owner,
        deadline_in_ms: body.deadline_in_ms,
        cascade_limit: body.cascade_limit,
        triggers: body.triggers.unwrap_or_default(),
    };
    Ok((StatusCode::CREATED, Json(plan_out(caller.tenant.open_plan(req).await?))))
}

/// List the tenant's plans.
#[utoipa::path(
    get, path = "/v1/plans", tag = "plans", operation_id = "list_plans",
    responses(
        (status = 200, description = "Every plan, oldest first", body = PlanListOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list(caller: Caller<TxRead>) -> ApiResult<Json<PlanListOut>> {
    let plans = caller.tenant.plans().await?.into_iter().map(plan_out).collect();
    Ok(Json(PlanListOut { plans }))
}

/// The owner-intervention queue: stuck plans and their choices.
#[utoipa::path(
    get, path = "/v1/plans/stuck", tag = "plans", operation_id = "list_stuck_plans",
    responses(
        (status = 200, description = "Stuck plans, by id", body = StuckListOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn stuck(caller: Caller<TxRead>) -> ApiResult<Json<StuckListOut>> {
    let stuck = caller
        .tenant
        .stuck_plans()
        .await?
        .into_iter()
        .map(|s| StuckOut { id: s.id, owner: s.owner, reason: s.reason, choices: s.choices })
        .collect();
    Ok(Json(StuckListOut { stuck }))
}

/// A plan with its steps, held compensations in unwind order and triggers.
#[utoipa::path(
    get, path = "/v1/plans/{plan}", tag = "plans", operation_id = "get_plan",
    params(("plan" = String, Path, description = "Plan id")),
    responses(
        (status = 200, description = "The plan", body = PlanOut),
        (status = 404, description = "No such plan in this tenant", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get(caller: Caller<TxRead>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<PlanOut>> {
    Ok(Json(plan_out(caller.tenant.plan(&id).await?)))
}

/// Commit a plan: every held compensation is retired.
#[utoipa::path(
    post, path = "/v1/plans/{plan}/commit", tag = "plans", operation_id = "commit_plan",
    params(("plan" = String, Path, description = "Plan id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    responses(
        (status = 200, description = "Committed", body = PlanOut),
        (status = 409, description = "A step is unsettled, or the plan is not open", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn commit(caller: Caller<TxWrite>, ApiPath(id): ApiPath<String>) -> ApiResult<Json<PlanOut>> {
    Ok(Json(plan_out(caller.tenant.commit_plan(&id).await?)))
}

/// Fail a plan: the executor unwinds its compensations last-in-first-out.
#[utoipa::path(
    post, path = "/v1/plans/{plan}/fail", tag = "plans", operation_id = "fail_plan",
    params(("plan" = String, Path, description = "Plan id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = SignalIn,
    responses(
        (status = 200, description = "Failed (the unwind runs in the executor)", body = PlanOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn fail(
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SignalIn>,
) -> ApiResult<Json<PlanOut>> {
    Ok(Json(plan_out(caller.tenant.fail_plan(&id, body.reason, FailedBy::Owner).await?)))
}

/// Post an explicit failure signal (a policy system's or another agent's): same as `fail`.
#[utoipa::path(
    post, path = "/v1/plans/{plan}/signal", tag = "plans", operation_id = "signal_plan",
    params(("plan" = String, Path, description = "Plan id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = SignalIn,
    responses(
        (status = 200, description = "Signalled", body = PlanOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn signal(
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SignalIn>,
) -> ApiResult<Json<PlanOut>> {
    Ok(Json(plan_out(caller.tenant.fail_plan(&id, body.reason, FailedBy::Signal).await?)))
}

/// Post a compliance verdict about one effect of the plan.
#[utoipa::path(
    post, path = "/v1/plans/{plan}/verdict", tag = "plans", operation_id = "plan_verdict",
    params(("plan" = String, Path, description = "Plan id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = VerdictIn,
    responses(
        (status = 200, description = "Recorded", body = PlanOut),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn verdict(
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<VerdictIn>,
) -> ApiResult<Json<PlanOut>> {
    let v = match body.verdict {
        VerdictKind::Block => Verdict::Block,
        VerdictKind::Allow => Verdict::Allow,
    };
    Ok(Json(plan_out(caller.tenant.plan_verdict(&id, &body.transaction, body.effect, v).await?)))
}

/// Arm a predicate trigger on an open plan.
#[utoipa::path(
    post, path = "/v1/plans/{plan}/triggers", tag = "plans", operation_id = "arm_plan_trigger",
    params(("plan" = String, Path, description = "Plan id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = TriggerIn,
    responses(
        (status = 200, description = "Armed", body = PlanOut),
        (status = "4XX", description = "Refused (another tenant named: `cross_tenant`)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn arm(
    caller: Caller<TxWrite>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<TriggerIn>,
) -> ApiResult<Json<PlanOut>> {
    Ok(Json(plan_out(caller.tenant.arm_plan(&id, body.predicate).await?)))
}

/// Resolve a stuck plan: `retry`, `accept` or `unwind`.
#[utoipa::path(
    post, path = "/v1/plans/{plan}/resolve", tag = "plans", operation_id = "resolve_plan",
    params(("plan" = String, Path, description = "Plan id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry of this request return the first response")),
    request_body = PlanResolveIn,
    responses(
        (status = 200, description = "Resolved", body = PlanOut),
        (status = 409, description = "The plan is not stuck", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Refused", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn resolve(
    caller: Caller<PlanResolve>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<PlanResolveIn>,
) -> ApiResult<Json<PlanOut>> {
    let choice = match body.choice {
        ChoiceKind::Retry => Choice::Retry,
        ChoiceKind::Accept => Choice::Accept,
        ChoiceKind::Unwind => Choice::Unwind,
    };
    let by = super::console::operator_label(&caller);
    Ok(Json(plan_out(caller.tenant.resolve_plan(&id, choice, by).await?)))
}
