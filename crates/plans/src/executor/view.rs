//! What the API shows of the projection: [`PlanView`], [`PlanDetail`] (registrations in unwind
//! order, triggers with their values at a given time), the stuck queue and the read-only
//! queries the driver and the binding use. Nothing here changes the executor.

use serde_json::Value;

use super::{Executor, Forward, RegState, Status};
use crate::fact::{Cause, EffectId, Outcome, PlanId, Seq, StuckReason, TxId, Verdict};
use crate::predicate::Tri;

/// What the API shows of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanView {
    /// Id.
    pub plan: PlanId,
    /// Owner.
    pub owner: String,
    /// State.
    pub status: Status,
    /// Its steps' transactions.
    pub steps: Vec<TxId>,
    /// Registrations still held (not compensated, skipped or retired).
    pub held: usize,
}

/// One held registration as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrationView {
    /// Position within the plan (unwind order is highest first).
    pub seq: Seq,
    /// The step's transaction.
    pub tx: TxId,
    /// The effect within it.
    pub effect: EffectId,
    /// The forward effect's tool.
    pub tool: String,
    /// The forward effect's idempotency key.
    pub key: String,
    /// The compensation descriptor (`None`: non-compensable).
    pub descriptor: Option<Value>,
    /// The forward effect's state.
    pub forward: Forward,
    /// `held`, `in_flight`, `in_doubt`, `failed`, `done`, `skipped` or `step_aborted` (its
    /// step aborted, so the engine's abort undid it; not counted as held, passed over by an
    /// unwind).
    pub state: &'static str,
    /// A verdict posted about the effect.
    pub verdict: Option<Verdict>,
    /// Compensation attempts so far.
    pub attempts: u32,
}

/// One trigger of a plan and its current value.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerView {
    /// `deadline`, `signal` or `predicate`.
    pub kind: &'static str,
    /// The predicate (for `predicate`), the deadline in engine milliseconds (for `deadline`).
    pub detail: Value,
    /// The trigger's value now.
    pub value: Tri,
}

/// Everything the API shows of one plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanDetail {
    /// The summary.
    pub view: PlanView,
    /// The deadline, engine clock milliseconds.
    pub deadline_ms: Option<u64>,
    /// The plan's cascade limit.
    pub cascade_limit: u32,
    /// Why it failed, once a trigger fired (cause and cascade depth).
    pub failure: Option<(Cause, u32)>,
    /// Every registration, in unwind order (highest `seq` first).
    pub registrations: Vec<RegistrationView>,
    /// The deadline, signal and predicate triggers with their values.
    pub triggers: Vec<TriggerView>,
}

impl Executor {
    /// The owner-intervention queue, by plan id.
    pub fn stuck(&self) -> Vec<(PlanId, StuckReason)> {
        self.stuck.iter().map(|(p, r)| (*p, r.clone())).collect()
    }

    /// Every plan, by id.
    pub fn plans(&self) -> Vec<PlanView> {
        let mut ids: Vec<_> = self.plans.keys().collect();
        ids.sort_unstable();
        ids.into_iter().filter_map(|p| self.plan(p)).collect()
    }

    /// One plan.
    pub fn plan(&self, plan: PlanId) -> Option<PlanView> {
        let p = self.plans.get(&plan)?;
        Some(PlanView {
            plan,
            owner: p.owner.to_string(),
            status: p.status.clone(),
            steps: p.steps.clone(),
            held: p
                .regs
                .iter()
                .filter(|r| !matches!(r.state, RegState::Done | RegState::Skipped) && !self.step_aborted(r.tx))
                .count(),
        })
    }

    /// Whether `tx` is a step that settled aborted (its effects were undone by the engine's
    /// abort; an unwind passes over its registrations).
    fn step_aborted(&self, tx: TxId) -> bool {
        self.txs.get(&tx).and_then(|i| i.settled) == Some(false)
    }

    /// One plan in full: registrations in unwind order, triggers with their values at `now`.
    pub fn detail(&self, plan: PlanId, now: u64) -> Option<PlanDetail> {
        let view = self.plan(plan)?;
        let p = self.plans.get(&plan)?;
        let registrations = p
            .regs
            .iter()
            .enumerate()
            .rev()
            .map(|(seq, r)| RegistrationView {
                seq: seq as Seq,
                tx: r.tx,
                effect: r.effect,
                tool: r.tool.to_string(),
                key: r.key.to_string(),
                descriptor: r.descriptor.as_deref().and_then(|d| serde_json::from_str(d).ok()),
                forward: r.forward,
                state: match r.state {
                    RegState::Held if self.step_aborted(r.tx) => "step_aborted",
                    RegState::Held => "held",
                    RegState::InFlight(_) => "in_flight",
                    RegState::InDoubt { .. } => "in_doubt",
                    RegState::Failed(_) => "failed",
                    RegState::Done => "done",
                    RegState::Skipped => "skipped",
                },
                verdict: r.verdict,
                attempts: r.attempts,
            })
            .collect();
        let committed = matches!(p.status, Status::Ended(Outcome::Committed));
        let failure = p.pending_fail.clone().or_else(|| p.failure.clone());
        let mut triggers = Vec::new();
        if let Some(d) = p.deadline_ms {
            let value = match &failure {
                Some((Cause::Deadline, _)) => Tri::True,
                _ if committed => Tri::False,
                _ if now >= d && matches!(p.status, Status::Open) => Tri::True,
                _ if !matches!(p.status, Status::Open) => Tri::False,
                _ => Tri::Unknown,
            };
            triggers.push(TriggerView { kind: "deadline", detail: Value::from(d), value });
        }
        if let Some((Cause::Signal { reason }, _)) = &failure {
            triggers.push(TriggerView { kind: "signal", detail: Value::from(reason.clone()), value: Tri::True });
        }
        for t in &p.triggers {
            let values: Vec<Tri> =
                t.atoms.iter().map(|id| self.atoms.get(*id).map_or(Tri::Unknown, |a| a.value)).collect();
            let value = if t.fired { Tri::True } else { t.node.eval(&values) };
            let detail = serde_json::to_value(&t.predicate).unwrap_or(Value::Null);
            triggers.push(TriggerView { kind: "predicate", detail, value });
        }
        Some(PlanDetail {
            view,
            deadline_ms: p.deadline_ms,
            cascade_limit: p.cascade_limit,
            failure,
            registrations,
            triggers,
        })
    }

    /// The forward state of registration `seq` of `plan`.
    pub fn forward(&self, plan: PlanId, seq: Seq) -> Option<Forward> {
        self.plans.get(&plan)?.regs.get(seq as usize).map(|r| r.forward)
    }

    /// The registration of effect `(tx, effect)`, if it belongs to a plan.
    pub fn registration(&self, tx: TxId, effect: EffectId) -> Option<(PlanId, Seq)> {
        let info = self.txs.get(&tx)?;
        let seq = *self.by_effect.get(&(tx, effect))?;
        Some((info.plan, seq))
    }
}
