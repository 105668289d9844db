//! Plans (docs/plans.md): open, list, get (steps, held compensations in unwind order,
//! triggers with their values), commit, fail / signal, verdict, arm a trigger, resolve a stuck
//! plan, and the owner-intervention queue. A step is a transaction begun with `plan` set
//! (`POST /v1/transactions`); its effects carry `compensate: {capability, args}`.

use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tidegate_runtime::plans::{Cause, Forward, PlanDetail, Status, StuckReason, Tri};
use tidegate_runtime::{Choice, PlanError, PlanOptions, Predicate, TxId};
use utoipa::ToSchema;

use super::extract::{ApiJson, ApiPath, Caller};
use super::problem::{ApiError, ApiResult, Problem, from_runtime};
use tidegate_service::auth::{PlanResolve, TxRead, TxWrite};
use tidegate_service::ids;
use tidegate_service::tenant::Tenant;

/// Longest deadline a plan may set (365 days).
const MAX_DEADLINE_MS: u64 = 365 * 86_400_000;

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

/// A plan refusal as a problem document.
pub fn from_plan(e: PlanError, t: &Tenant) -> ApiError {
    let detail = e.to_string();
    match e {
        PlanError::Invalid { field, value, expected } => ApiError::invalid(field, value, expected),
        PlanError::CrossTenant { field, found, .. } => {
            let mut e = ApiError::new(StatusCode::BAD_REQUEST, "cross_tenant", detail);
            e.field = Some(field);
            e.value = Some(found);
            e.expected = Some("this tenant (or no `tenant`)".into());
            e
        }
        PlanError::UnknownPlan { plan } => ApiError::not_found("plan", &plan_id(t, plan)),
        PlanError::WrongState { .. } | PlanError::StepUnsettled { .. } => ApiError::conflict("wrong_state", detail),
        PlanError::Log { .. } | PlanError::Stopped { .. } => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", detail)
        }
        PlanError::NewerFormat { .. } | PlanError::Snapshot { .. } => ApiError::internal(detail),
        // PlanError is non-exhaustive: a refusal a later version adds.
        _ => ApiError::internal(detail),
    }
}

fn runtime(e: tidegate_runtime::Error, t: &Tenant) -> ApiError {
    match e {
        tidegate_runtime::Error::Plan(p) => from_plan(p, t),
        e => from_runtime(e),
    }
}

/// A plan's public id.
pub fn plan_id(t: &Tenant, plan: u64) -> String {
    ids::format(ids::Kind::Plan, &t.tag, plan)
}

/// Parses a plan id of this tenant (another tenant's is one never issued: 404).
pub fn parse_plan(t: &Tenant, id: &str) -> ApiResult<u64> {
    ids::parse(ids::Kind::Plan, &t.tag, id).ok_or_else(|| ApiError::not_found("plan", id))
}

async fn plan_of(t: &Tenant, id: &str) -> ApiResult<tidegate_runtime::Plan> {
    let n = parse_plan(t, id)?;
    t.engine.plan_by_id(n).await.map_err(|_| ApiError::not_found("plan", id))
}

fn tri(v: Tri) -> String {
    match v {
        Tri::True => "true",
        Tri::Unknown => "unknown",
        Tri::False => "false",
    }
    .into()
}

fn state_name(s: &Status) -> String {
    match s {
        Status::Open => "open".into(),
        Status::Failing { .. } => "failing".into(),
        Status::Stuck { .. } => "stuck".into(),
        Status::Ended(o) => {
            serde_json::to_value(o).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
        }
    }
}

fn plan_out(t: &Tenant, d: PlanDetail) -> PlanOut {
    let stuck = match &d.view.status {
        Status::Stuck { reason, .. } => serde_json::to_value(reason).ok(),
        _ => None,
    };
    let failure = d.failure.as_ref().map(|(cause, depth): &(Cause, u32)| {
        serde_json::json!({"cause": serde_json::to_value(cause).unwrap_or(Value::Null), "depth": depth})
    });
    PlanOut {
        id: plan_id(t, d.view.plan),
        owner: d.view.owner.clone(),
        state: state_name(&d.view.status),
        stuck,
        failure,
        steps: d.view.steps.iter().map(|tx| ids::tx(&t.tag, TxId(*tx))).collect(),
        held: d.view.held,
        deadline_ms: d.deadline_ms,
        cascade_limit: d.cascade_limit,
        registrations: d
            .registrations
            .into_iter()
            .map(|r| RegistrationOut {
                seq: r.seq,
                transaction: ids::tx(&t.tag, TxId(r.tx)),
                effect: r.effect,
                tool: r.tool,
                key: r.key,
                compensation: r.descriptor,
                forward: match r.forward {
                    Forward::Pending => "pending",
                    Forward::Externalised => "externalised",
                    Forward::NotApplied => "not_applied",
                    Forward::InDoubt => "in_doubt",
                }
                .into(),
                state: r.state.into(),
                verdict: r
                    .verdict
                    .and_then(|v| serde_json::to_value(v).ok())
                    .and_then(|v| v.as_str().map(str::to_owned)),
                attempts: r.attempts,
            })
            .collect(),
        triggers: d
            .triggers
            .into_iter()
            .map(|tr| TriggerOut { kind: tr.kind.into(), value: tri(tr.value), detail: tr.detail })
            .collect(),
    }
}

async fn detail_out(t: &Tenant, plan: u64, id: &str) -> ApiResult<PlanOut> {
    let d = t.engine.plan_detail(plan).await.map_err(|e| runtime(e, t))?;
    d.map(|d| plan_out(t, d)).ok_or_else(|| ApiError::not_found("plan", id))
}

fn predicate(field: &str, v: Value) -> ApiResult<Predicate> {
    let text = v.to_string();
    serde_json::from_value(v).map_err(|e| {
        ApiError::invalid(field, text, format!("a predicate (tagged, compensated, no_commit, all, any, not): {e}"))
    })
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
    let t = &caller.tenant;
    let deadline = match body.deadline_in_ms {
        None => None,
        Some(ms) if (1..=MAX_DEADLINE_MS).contains(&ms) => Some(Duration::from_millis(ms)),
        Some(ms) => {
            return Err(ApiError::invalid("deadline_in_ms", ms.to_string(), format!("1 to {MAX_DEADLINE_MS}")));
        }
    };
    let mut triggers = Vec::new();
    for (i, p) in body.triggers.unwrap_or_default().into_iter().enumerate() {
        triggers.push(predicate(&format!("triggers[{i}]"), p)?);
    }
    let opts = PlanOptions { owner: body.owner, deadline, cascade_limit: body.cascade_limit, triggers };
    let plan = t.engine.plan(opts).await.map_err(|e| runtime(e, t))?;
    let id = plan_id(t, plan.id());
    Ok((StatusCode::CREATED, Json(detail_out(t, plan.id(), &id).await?)))
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
    let t = &caller.tenant;
    let views = t.engine.plan_list().await.map_err(|e| runtime(e, t))?;
    let mut plans = Vec::with_capacity(views.len());
    for v in views {
        let id = plan_id(t, v.plan);
        plans.push(detail_out(t, v.plan, &id).await?);
    }
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
    let t = &caller.tenant;
    let list = t.engine.stuck_plans().await.map_err(|e| runtime(e, t))?;
    let mut stuck = Vec::with_capacity(list.len());
    for (plan, reason) in list {
        let owner = t.engine.plan_detail(plan).await.ok().flatten().map(|d| d.view.owner).unwrap_or_default();
        stuck.push(StuckOut {
            id: plan_id(t, plan),
            owner,
            reason: serde_json::to_value(&reason).unwrap_or(Value::Null),
            choices: choices(&reason),
        });
    }
    Ok(Json(StuckListOut { stuck }))
}

fn choices(_reason: &StuckReason) -> Vec<String> {
    ["retry", "accept", "unwind"].into_iter().map(String::from).collect()
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
    let t = &caller.tenant;
    let n = parse_plan(t, &id)?;
    Ok(Json(detail_out(t, n, &id).await?))
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
    let t = &caller.tenant;
    let plan = plan_of(t, &id).await?;
    plan.commit().await.map_err(|e| runtime(e, t))?;
    Ok(Json(detail_out(t, plan.id(), &id).await?))
}

async fn signal_plan(t: &Tenant, id: &str, reason: Option<String>, default: &str) -> ApiResult<PlanOut> {
    let reason = reason.unwrap_or_else(|| default.to_owned());
    if reason.len() > 1024 {
        return Err(ApiError::invalid("reason", &reason, "at most 1024 bytes"));
    }
    let plan = plan_of(t, id).await?;
    plan.fail(&reason).await.map_err(|e| runtime(e, t))?;
    detail_out(t, plan.id(), id).await
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
    Ok(Json(signal_plan(&caller.tenant, &id, body.reason, "failed by its owner").await?))
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
    Ok(Json(signal_plan(&caller.tenant, &id, body.reason, "failure signal").await?))
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
    let t = &caller.tenant;
    let plan = plan_of(t, &id).await?;
    let tx = match ids::resolve(ids::Kind::Tx, &t.tag, &body.transaction) {
        ids::Named::Own(n) => TxId(n),
        // Another tenant's transaction is no step of this plan, exactly as one of this tenant
        // never issued (issue 26): `TxId(0)` is never allocated, so the executor refuses it
        // at the same point and in the same words.
        ids::Named::Elsewhere => TxId(0),
        ids::Named::Malformed => {
            return Err(ApiError::invalid("transaction", &body.transaction, "a transaction id (tx_<tag>_<n>)"));
        }
    };
    let v = match body.verdict {
        VerdictKind::Block => tidegate_runtime::plans::Verdict::Block,
        VerdictKind::Allow => tidegate_runtime::plans::Verdict::Allow,
    };
    plan.verdict(tx, tidegate_runtime::EffectId(body.effect), v).await.map_err(|e| match e {
        // The executor names the effect by its internal numbers; the caller named it by ids.
        tidegate_runtime::Error::Plan(PlanError::Invalid { field, .. }) if field == "effect" => ApiError::invalid(
            "effect",
            format!("{}/{}", body.transaction, body.effect),
            format!("an effect registered in plan {id} (a step transaction of it and its effect's number)"),
        ),
        e => runtime(e, t),
    })?;
    Ok(Json(detail_out(t, plan.id(), &id).await?))
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
    let t = &caller.tenant;
    let plan = plan_of(t, &id).await?;
    plan.arm(predicate("predicate", body.predicate)?).await.map_err(|e| runtime(e, t))?;
    Ok(Json(detail_out(t, plan.id(), &id).await?))
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
    let t = &caller.tenant;
    let plan = plan_of(t, &id).await?;
    let choice = match body.choice {
        ChoiceKind::Retry => Choice::Retry,
        ChoiceKind::Accept => Choice::Accept,
        ChoiceKind::Unwind => Choice::Unwind,
    };
    plan.resolve(choice).await.map_err(|e| runtime(e, t))?;
    // Who resolved it, on the operator stream beside the effect resolutions (the plan's own
    // record says what was chosen; this one says who chose it).
    let by = json!({
        "kind": "resolve_plan",
        "plan": id,
        "choice": body.choice,
        "by": super::console::operator_label(&caller),
        "at_ms": tidegate_service::console::now_ms(),
    });
    t.engine.append_extension(tidegate_service::console::OPERATOR_STREAM, by).await.map_err(|e| runtime(e, t))?;
    Ok(Json(detail_out(t, plan.id(), &id).await?))
}
