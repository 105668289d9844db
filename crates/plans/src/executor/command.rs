//! The commands: each validates against the projection (naming the field, the value and what
//! was expected), applies its fact through the fold and returns it for the caller to append.
//! Every check comes before the fact is applied, so a refused command changes nothing.

use super::{Executor, Plan, RegState, Status};
use crate::error::PlanError;
use crate::fact::{Choice, DEFAULT_CASCADE_LIMIT, EffectId, MAX_CASCADE_LIMIT, PlanFact, PlanId, TxId, Verdict};
use crate::predicate::{Atom, Predicate};

impl Executor {
    /// The fact a new executor appends once it has folded the log.
    pub fn start(&mut self) -> Result<PlanFact, PlanError> {
        let fact = PlanFact::ExecutorStarted { incarnation: self.incarnation + 1 };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// Opens a plan.
    pub fn open(
        &mut self,
        tenant: &str,
        owner: &str,
        deadline_ms: Option<u64>,
        cascade_limit: Option<u32>,
        now: u64,
    ) -> Result<PlanFact, PlanError> {
        if tenant != self.tenant {
            return Err(PlanError::CrossTenant {
                field: "tenant".into(),
                found: tenant.into(),
                tenant: self.tenant.clone(),
            });
        }
        if owner.is_empty() || owner.len() > 256 {
            return Err(PlanError::invalid("owner", format!("{owner:?}"), "1 to 256 characters"));
        }
        let limit = cascade_limit.unwrap_or(DEFAULT_CASCADE_LIMIT);
        if limit > MAX_CASCADE_LIMIT {
            return Err(PlanError::invalid("cascade_limit", limit, format!("0 to {MAX_CASCADE_LIMIT}")));
        }
        let fact = PlanFact::PlanOpened {
            plan: self.next_plan,
            tenant: tenant.into(),
            owner: owner.into(),
            deadline_ms,
            cascade_limit: limit,
            at_ms: now,
        };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    fn plan_in(
        &self,
        plan: PlanId,
        op: &'static str,
        ok: fn(&Status) -> bool,
        expected: &'static str,
    ) -> Result<&Plan, PlanError> {
        let p = self.plans.get(&plan).ok_or(PlanError::UnknownPlan { plan })?;
        if !ok(&p.status) {
            return Err(PlanError::WrongState { plan, operation: op, state: p.status.name(), expected });
        }
        Ok(p)
    }

    /// Binds transaction `tx` to `plan` as its next step.
    pub fn begin_step(&mut self, plan: PlanId, tx: TxId) -> Result<PlanFact, PlanError> {
        let p = self.plan_in(plan, "begin_step", |s| matches!(s, Status::Open), "open")?;
        if self.txs.contains_key(&tx) {
            return Err(PlanError::invalid("tx", tx, "a transaction not already a step of a plan"));
        }
        let fact = PlanFact::StepBegun { plan, step: p.steps.len() as u32, tx };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// Arms a predicate trigger on an open plan.
    pub fn arm(&mut self, plan: PlanId, predicate: Predicate) -> Result<PlanFact, PlanError> {
        let p = self.plan_in(plan, "arm", |s| matches!(s, Status::Open), "open")?;
        let (atoms, _) = predicate.compile(&self.tenant)?;
        for a in &atoms {
            if let Atom::Compensated { plan: other, .. } = a
                && !self.plans.contains_key(other)
            {
                return Err(PlanError::UnknownPlan { plan: *other });
            }
        }
        let fact = PlanFact::TriggerArmed { plan, trigger: p.triggers.len() as u32, predicate };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// Commits a plan: retires every held registration.
    pub fn commit(&mut self, plan: PlanId, now: u64) -> Result<PlanFact, PlanError> {
        let p = self.plan_in(plan, "commit", |s| matches!(s, Status::Open), "open")?;
        if let Some(tx) = p.steps.iter().find(|tx| self.txs.get(tx).is_some_and(|i| i.settled.is_none())) {
            return Err(PlanError::StepUnsettled { plan, tx: *tx });
        }
        if p.pending_fail.is_some() {
            return Err(PlanError::WrongState {
                plan,
                operation: "commit",
                state: "failed (a trigger fired)".into(),
                expected: "open",
            });
        }
        if p.regs.iter().any(|r| matches!(r.state, RegState::InFlight(_) | RegState::InDoubt { .. })) {
            return Err(PlanError::WrongState {
                plan,
                operation: "commit",
                state: "compensating a blocked effect".into(),
                expected: "open with no compensation running",
            });
        }
        let fact = PlanFact::PlanCommitted { plan, at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// An explicit failure signal.
    pub fn signal(&mut self, plan: PlanId, reason: &str, now: u64) -> Result<PlanFact, PlanError> {
        self.plan_in(plan, "signal", |s| matches!(s, Status::Open), "open")?;
        let fact = PlanFact::PlanSignalled { plan, reason: reason.into(), at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// A compliance verdict about effect `(tx, effect)` of `plan`.
    pub fn verdict(
        &mut self,
        plan: PlanId,
        tx: TxId,
        effect: EffectId,
        verdict: Verdict,
        now: u64,
    ) -> Result<PlanFact, PlanError> {
        let p =
            self.plan_in(plan, "verdict", |s| matches!(s, Status::Open | Status::Failing { .. }), "open or failing")?;
        let mine = self.txs.get(&tx).is_some_and(|i| i.plan == plan);
        let Some(seq) = self.by_effect.get(&(tx, effect)).filter(|_| mine) else {
            return Err(PlanError::invalid(
                "effect",
                format!("{tx}/{effect}"),
                format!("an effect registered in plan {plan}"),
            ));
        };
        if let Some(v) = p.regs[*seq as usize].verdict {
            return Err(PlanError::invalid(
                "verdict",
                format!("{verdict:?}"),
                format!("one verdict per effect (already {v:?})"),
            ));
        }
        let fact = PlanFact::Verdict { plan, tx, effect, verdict, at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// An owner's choice for a stuck plan.
    pub fn resolve(&mut self, plan: PlanId, choice: Choice, now: u64) -> Result<PlanFact, PlanError> {
        self.plan_in(plan, "resolve", |s| matches!(s, Status::Stuck { .. }), "stuck")?;
        let fact = PlanFact::PlanResolved { plan, choice, at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }
}
