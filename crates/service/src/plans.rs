//! Plans (docs/plans.md) as typed operations of one tenant: open, list, the owner-intervention
//! queue, read, commit, fail or signal, verdict, arm a trigger, resolve a stuck plan, and
//! begin a step. The plan executor's refusals (`PlanError`) become [`ServiceError`]s here,
//! in one place; ids are the public `plan_<tag>_<n>`, and another tenant's plan is answered
//! as one never issued.
//!
//! ```text
//!  open_plan(PlanRequest) ─ predicates parsed ─► engine.plan ─┐
//!  commit / fail / verdict / arm / resolve(id, ..) ─ plan_by_id ─► Plan::.. ─┤─► plan_view: PlanView
//!  plans() / plan(id) / stuck_plans() ─ engine.plan_detail ──────────────────┘
//! ```

use std::time::Duration;

use serde_json::{Value, json};
use tidegate_runtime::plans::{Cause, Forward, PlanDetail, Status, Tri, Verdict};
use tidegate_runtime::{Choice, EffectId, PlanError, PlanOptions, Predicate, Transaction, TxId, TxOptions};

use crate::error::{Result, ServiceError};
use crate::ids;
use crate::tenant::Tenant;

/// Longest deadline a plan may set (365 days).
pub const MAX_DEADLINE_MS: u64 = 365 * 86_400_000;

/// Longest failure reason a caller may give.
pub const MAX_REASON_BYTES: usize = 1024;

/// A plan as a caller opens it.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    /// Who answers for the plan.
    pub owner: String,
    /// The plan fails unless it commits within this many milliseconds (1 to
    /// [`MAX_DEADLINE_MS`]).
    pub deadline_in_ms: Option<u64>,
    /// How deep a cascade may unwind it.
    pub cascade_limit: Option<u32>,
    /// Predicate triggers armed at opening, as JSON (docs/plans.md, "Predicates").
    pub triggers: Vec<Value>,
}

/// Who fails a plan: its owner, or a failure signal from elsewhere (the default reason
/// differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedBy {
    /// The plan's owner (`fail`).
    Owner,
    /// A policy system or another agent (`signal`).
    Signal,
}

/// One held compensation (or a non-compensable effect) of a plan.
#[derive(Debug, Clone)]
pub struct RegistrationView {
    /// Position within the plan; the unwind goes from the highest down.
    pub seq: u32,
    /// The step transaction's public id.
    pub transaction: String,
    /// The effect's number within it.
    pub effect: u32,
    /// The forward effect's tool.
    pub tool: String,
    /// The forward effect's idempotency key.
    pub key: String,
    /// The compensation descriptor (absent: non-compensable).
    pub compensation: Option<Value>,
    /// `pending`, `externalised`, `not_applied` or `in_doubt`.
    pub forward: &'static str,
    /// The registration's state (`held`, `in_flight`, ...).
    pub state: String,
    /// A verdict posted about it (`block` / `allow`).
    pub verdict: Option<String>,
    /// Compensation attempts so far.
    pub attempts: u32,
}

/// A trigger and its current value.
#[derive(Debug, Clone)]
pub struct TriggerView {
    /// `deadline`, `signal` or `predicate`.
    pub kind: String,
    /// `true`, `unknown` or `false`.
    pub value: &'static str,
    /// The deadline, the signal's reason, or the predicate.
    pub detail: Value,
}

/// A plan with its steps, registrations in unwind order and triggers.
#[derive(Debug, Clone)]
pub struct PlanView {
    /// `plan_<tag>_<n>`.
    pub id: String,
    /// Its owner.
    pub owner: String,
    /// `open`, `failing`, `stuck`, `committed`, `unwound` or `accepted`.
    pub state: String,
    /// Why it is stuck (for `stuck`), tagged by `kind`.
    pub stuck: Option<Value>,
    /// Why it failed, once it did: `{cause, depth}`.
    pub failure: Option<Value>,
    /// Its step transactions' public ids, in order.
    pub steps: Vec<String>,
    /// Compensations still held.
    pub held: usize,
    /// The deadline (engine clock milliseconds since the Unix epoch).
    pub deadline_ms: Option<u64>,
    /// Its cascade limit.
    pub cascade_limit: u32,
    /// Every registration, in unwind order (highest `seq` first).
    pub registrations: Vec<RegistrationView>,
    /// The deadline, signal and predicate triggers with their current values.
    pub triggers: Vec<TriggerView>,
}

/// A stuck plan in the owner-intervention queue.
#[derive(Debug, Clone)]
pub struct StuckView {
    /// The plan's public id.
    pub id: String,
    /// Its owner.
    pub owner: String,
    /// Why it is stuck.
    pub reason: Value,
    /// What the owner may choose.
    pub choices: Vec<String>,
}

/// A predicate given as JSON in `field`.
pub fn parse_predicate(field: &str, v: Value) -> Result<Predicate> {
    let text = v.to_string();
    serde_json::from_value(v).map_err(|e| {
        ServiceError::invalid(field, text, format!("a predicate (tagged, compensated, no_commit, all, any, not): {e}"))
    })
}

fn tri(v: Tri) -> &'static str {
    match v {
        Tri::True => "true",
        Tri::Unknown => "unknown",
        Tri::False => "false",
    }
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

impl Tenant {
    /// A plan's public id.
    pub fn plan_id(&self, plan: u64) -> String {
        ids::format(ids::Kind::Plan, &self.tag, plan)
    }

    /// The plan named by the public id `id` (another tenant's is one never issued).
    pub fn parse_plan(&self, id: &str) -> Result<u64> {
        ids::parse(ids::Kind::Plan, &self.tag, id).ok_or_else(|| not_found(id))
    }

    /// A refusal of the plan executor, in the service's terms.
    pub fn plan_error(&self, e: PlanError) -> ServiceError {
        let detail = e.to_string();
        match e {
            PlanError::Invalid { field, value, expected } => ServiceError::Invalid { field, value, expected },
            PlanError::CrossTenant { field, found, .. } => ServiceError::CrossTenant { field, found, detail },
            PlanError::UnknownPlan { plan } => not_found(&self.plan_id(plan)),
            PlanError::WrongState { .. } | PlanError::StepUnsettled { .. } => {
                ServiceError::conflict("wrong_state", detail)
            }
            PlanError::Log { .. } | PlanError::Stopped { .. } => {
                ServiceError::Unavailable { code: "store_unavailable", detail, retry_after: None }
            }
            PlanError::NewerFormat { .. } | PlanError::Snapshot { .. } => ServiceError::Internal(detail),
            // PlanError is non-exhaustive: a refusal a later version adds.
            _ => ServiceError::Internal(detail),
        }
    }

    /// A runtime error of a plan operation: the plan's refusals as [`Tenant::plan_error`].
    fn plan_runtime(&self, e: tidegate_runtime::Error) -> ServiceError {
        match e {
            tidegate_runtime::Error::Plan(p) => self.plan_error(p),
            e => ServiceError::engine(e),
        }
    }

    async fn plan_handle(&self, id: &str) -> Result<tidegate_runtime::Plan> {
        let n = self.parse_plan(id)?;
        self.engine.plan_by_id(n).await.map_err(|_| not_found(id))
    }

    fn plan_view(&self, d: PlanDetail) -> PlanView {
        let stuck = match &d.view.status {
            Status::Stuck { reason, .. } => serde_json::to_value(reason).ok(),
            _ => None,
        };
        let failure = d.failure.as_ref().map(|(cause, depth): &(Cause, u32)| {
            json!({"cause": serde_json::to_value(cause).unwrap_or(Value::Null), "depth": depth})
        });
        PlanView {
            id: self.plan_id(d.view.plan),
            owner: d.view.owner.clone(),
            state: state_name(&d.view.status),
            stuck,
            failure,
            steps: d.view.steps.iter().map(|tx| ids::tx(&self.tag, TxId(*tx))).collect(),
            held: d.view.held,
            deadline_ms: d.deadline_ms,
            cascade_limit: d.cascade_limit,
            registrations: d
                .registrations
                .into_iter()
                .map(|r| RegistrationView {
                    seq: r.seq,
                    transaction: ids::tx(&self.tag, TxId(r.tx)),
                    effect: r.effect,
                    tool: r.tool,
                    key: r.key,
                    compensation: r.descriptor,
                    forward: match r.forward {
                        Forward::Pending => "pending",
                        Forward::Externalised => "externalised",
                        Forward::NotApplied => "not_applied",
                        Forward::InDoubt => "in_doubt",
                    },
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
                .map(|tr| TriggerView { kind: tr.kind.into(), value: tri(tr.value), detail: tr.detail })
                .collect(),
        }
    }

    async fn plan_detail(&self, plan: u64, id: &str) -> Result<PlanView> {
        let d = self.engine.plan_detail(plan).await.map_err(|e| self.plan_runtime(e))?;
        d.map(|d| self.plan_view(d)).ok_or_else(|| not_found(id))
    }

    /// Opens a plan (its deadline, cascade limit and predicate triggers checked first).
    pub async fn open_plan(&self, req: PlanRequest) -> Result<PlanView> {
        let deadline = match req.deadline_in_ms {
            None => None,
            Some(ms) if (1..=MAX_DEADLINE_MS).contains(&ms) => Some(Duration::from_millis(ms)),
            Some(ms) => {
                return Err(ServiceError::invalid("deadline_in_ms", ms.to_string(), format!("1 to {MAX_DEADLINE_MS}")));
            }
        };
        let mut triggers = Vec::new();
        for (i, p) in req.triggers.into_iter().enumerate() {
            triggers.push(parse_predicate(&format!("triggers[{i}]"), p)?);
        }
        let opts = PlanOptions { owner: req.owner, deadline, cascade_limit: req.cascade_limit, triggers };
        let plan = self.engine.plan(opts).await.map_err(|e| self.plan_runtime(e))?;
        let id = self.plan_id(plan.id());
        self.plan_detail(plan.id(), &id).await
    }

    /// Every plan of the tenant, oldest first.
    pub async fn plans(&self) -> Result<Vec<PlanView>> {
        let views = self.engine.plan_list().await.map_err(|e| self.plan_runtime(e))?;
        let mut plans = Vec::with_capacity(views.len());
        for v in views {
            let id = self.plan_id(v.plan);
            plans.push(self.plan_detail(v.plan, &id).await?);
        }
        Ok(plans)
    }

    /// The owner-intervention queue: stuck plans, by id, with what the owner may choose.
    pub async fn stuck_plans(&self) -> Result<Vec<StuckView>> {
        let list = self.engine.stuck_plans().await.map_err(|e| self.plan_runtime(e))?;
        let mut stuck = Vec::with_capacity(list.len());
        for (plan, reason) in list {
            let owner = self.engine.plan_detail(plan).await.ok().flatten().map(|d| d.view.owner).unwrap_or_default();
            stuck.push(StuckView {
                id: self.plan_id(plan),
                owner,
                reason: serde_json::to_value(&reason).unwrap_or(Value::Null),
                // Every stuck reason admits every choice (docs/plans.md, "Stuck plans").
                choices: ["retry", "accept", "unwind"].into_iter().map(String::from).collect(),
            });
        }
        Ok(stuck)
    }

    /// The plan `id`.
    pub async fn plan(&self, id: &str) -> Result<PlanView> {
        let n = self.parse_plan(id)?;
        self.plan_detail(n, id).await
    }

    /// Commits the plan `id`: every held compensation is retired.
    pub async fn commit_plan(&self, id: &str) -> Result<PlanView> {
        let plan = self.plan_handle(id).await?;
        plan.commit().await.map_err(|e| self.plan_runtime(e))?;
        self.plan_detail(plan.id(), id).await
    }

    /// Fails the plan `id` (at most [`MAX_REASON_BYTES`] of reason): the executor unwinds its
    /// compensations last-in-first-out.
    pub async fn fail_plan(&self, id: &str, reason: Option<String>, by: FailedBy) -> Result<PlanView> {
        let default = match by {
            FailedBy::Owner => "failed by its owner",
            FailedBy::Signal => "failure signal",
        };
        let reason = reason.unwrap_or_else(|| default.to_owned());
        if reason.len() > MAX_REASON_BYTES {
            return Err(ServiceError::invalid("reason", reason, format!("at most {MAX_REASON_BYTES} bytes")));
        }
        let plan = self.plan_handle(id).await?;
        plan.fail(&reason).await.map_err(|e| self.plan_runtime(e))?;
        self.plan_detail(plan.id(), id).await
    }

    /// Posts a compliance verdict about effect `effect` of the step transaction `transaction`
    /// (a public id) of plan `id`.
    pub async fn plan_verdict(&self, id: &str, transaction: &str, effect: u32, verdict: Verdict) -> Result<PlanView> {
        let plan = self.plan_handle(id).await?;
        let tx = match ids::resolve(ids::Kind::Tx, &self.tag, transaction) {
            ids::Named::Own(n) => TxId(n),
            // Another tenant's transaction is no step of this plan, exactly as one of this tenant
            // never issued (issue 26): `TxId(0)` is never allocated, so the executor refuses it
            // at the same point and in the same words.
            ids::Named::Elsewhere => TxId(0),
            ids::Named::Malformed => {
                return Err(ServiceError::invalid("transaction", transaction, "a transaction id (tx_<tag>_<n>)"));
            }
        };
        plan.verdict(tx, EffectId(effect), verdict).await.map_err(|e| match e {
            // The executor names the effect by its internal numbers; the caller named it by ids.
            tidegate_runtime::Error::Plan(PlanError::Invalid { field, .. }) if field == "effect" => {
                ServiceError::invalid(
                    "effect",
                    format!("{transaction}/{effect}"),
                    format!("an effect registered in plan {id} (a step transaction of it and its effect's number)"),
                )
            }
            e => self.plan_runtime(e),
        })?;
        self.plan_detail(plan.id(), id).await
    }

    /// Arms a predicate trigger (JSON, named `predicate`) on the open plan `id`.
    pub async fn arm_plan(&self, id: &str, predicate: Value) -> Result<PlanView> {
        let plan = self.plan_handle(id).await?;
        plan.arm(parse_predicate("predicate", predicate)?).await.map_err(|e| self.plan_runtime(e))?;
        self.plan_detail(plan.id(), id).await
    }

    /// Resolves the stuck plan `id` with `choice`, and records who chose (`by`) on the
    /// operator stream beside the effect resolutions (the plan's own record says what was
    /// chosen; this one says who chose it).
    pub async fn resolve_plan(&self, id: &str, choice: Choice, by: String) -> Result<PlanView> {
        let plan = self.plan_handle(id).await?;
        plan.resolve(choice).await.map_err(|e| self.plan_runtime(e))?;
        let record = json!({
            "kind": "resolve_plan",
            "plan": id,
            "choice": choice,
            "by": by,
            "at_ms": crate::console::now_ms(),
        });
        self.engine
            .append_extension(crate::console::OPERATOR_STREAM, record)
            .await
            .map_err(|e| self.plan_runtime(e))?;
        self.plan_detail(plan.id(), id).await
    }

    /// Begins a transaction as a step of the plan `id` (bound to it before its first effect).
    pub async fn begin_step(&self, id: &str, opts: TxOptions) -> Result<Transaction> {
        let plan = self.plan_handle(id).await?;
        plan.begin(opts).await.map_err(|e| self.plan_runtime(e))
    }
}

fn not_found(id: &str) -> ServiceError {
    ServiceError::NotFound { what: "plan", name: id.to_owned() }
}
