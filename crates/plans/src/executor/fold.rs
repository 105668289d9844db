//! The fold: one plan fact (or log entry) applied to the projection. Live commands, the
//! facts [`Executor::decide`] decides and a rebuild from the log all go through
//! [`Executor::apply_fact`], so replay and live runs cannot drift apart.

use super::{Executor, FORWARD_PROBE, Forward, PROBE, Plan, Reg, RegState, Status, Timer, TxInfo, text};
use crate::error::PlanError;
use crate::fact::{Cause, Choice, CompResult, Entry, Outcome, PlanFact, PlanId, Seq, StuckReason, Verdict};
use crate::predicate::{Atom, Tri};

impl Executor {
    /// Folds one log entry.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), PlanError> {
        match entry {
            Entry::Plan(f) => self.apply_fact(f),
            Entry::Engine(o) => {
                self.observe(o);
                Ok(())
            }
            Entry::Touch(_) => Ok(()),
        }
    }

    pub(super) fn plan_mut(&mut self, plan: PlanId) -> Result<&mut Plan, PlanError> {
        self.agenda.insert(plan);
        self.plans.get_mut(&plan).ok_or(PlanError::UnknownPlan { plan })
    }

    fn reg_mut(&mut self, plan: PlanId, seq: Seq) -> Result<&mut Reg, PlanError> {
        self.plan_mut(plan)?
            .regs
            .get_mut(seq as usize)
            .ok_or_else(|| PlanError::invalid("seq", seq, format!("a registration of plan {plan}")))
    }

    fn set_reg_state(&mut self, plan: PlanId, seq: Seq, state: RegState) -> Result<(), PlanError> {
        let r = self.reg_mut(plan, seq)?;
        let was_held = !matches!(r.state, RegState::Done | RegState::Skipped);
        let now_held = !matches!(state, RegState::Done | RegState::Skipped);
        r.state = state;
        match (was_held, now_held) {
            (true, false) => self.held = self.held.saturating_sub(1),
            (false, true) => self.held += 1,
            _ => {}
        }
        Ok(())
    }

    /// Folds one plan fact.
    pub fn apply_fact(&mut self, fact: &PlanFact) -> Result<(), PlanError> {
        match fact {
            PlanFact::ExecutorStarted { incarnation } => {
                self.incarnation = *incarnation;
                self.probing.clear();
                let inc = *incarnation;
                let mut touched = Vec::new();
                for (id, p) in self.plans.iter_mut() {
                    let id = &id;
                    for r in p.regs.iter_mut() {
                        if matches!(r.state, RegState::InFlight(i) if i < inc) {
                            r.state = RegState::InDoubt { probe_unknown: false };
                            touched.push(*id);
                        }
                    }
                }
                self.agenda.extend(touched);
            }
            PlanFact::PlanOpened { plan, tenant, owner, deadline_ms, cascade_limit, .. } => {
                if *tenant != self.tenant {
                    return Err(PlanError::CrossTenant {
                        field: "plan_opened.tenant".into(),
                        found: tenant.clone(),
                        tenant: self.tenant.clone(),
                    });
                }
                if *plan != self.next_plan {
                    return Err(PlanError::invalid(
                        "plan_opened.plan",
                        plan,
                        format!("the next plan id {}", self.next_plan),
                    ));
                }
                self.next_plan += 1;
                self.plans.insert(
                    *plan,
                    Plan {
                        owner: owner.as_str().into(),
                        deadline_ms: *deadline_ms,
                        cascade_limit: *cascade_limit,
                        opening: 0,
                        status: Status::Open,
                        steps: Vec::new(),
                        regs: Vec::new(),
                        triggers: Vec::new(),
                        pending_fail: None,
                        failure: None,
                        force: false,
                        any_done: false,
                    },
                );
                if let Some(d) = deadline_ms {
                    self.wheel.insert(*d, Timer::Deadline { plan: *plan, opening: 0 });
                }
            }
            PlanFact::StepBegun { plan, tx, .. } => {
                self.plan_mut(*plan)?.steps.push(*tx);
                self.txs.insert(*tx, TxInfo { plan: *plan, settled: None });
            }
            PlanFact::TriggerArmed { plan, predicate, .. } => self.arm_trigger(*plan, predicate)?,
            PlanFact::PlanCommitted { plan, .. } => self.end_plan(*plan, Outcome::Committed)?,
            PlanFact::PlanSignalled { plan, reason, .. } => {
                let p = self.plan_mut(*plan)?;
                if p.status == Status::Open && p.pending_fail.is_none() {
                    p.pending_fail = Some((Cause::Signal { reason: reason.clone() }, 0));
                }
            }
            PlanFact::Verdict { plan, tx, effect, verdict, .. } => {
                let mine = self.txs.get(tx).is_some_and(|i| i.plan == *plan);
                let seq = *self.by_effect.get(&(*tx, *effect)).filter(|_| mine).ok_or_else(|| {
                    PlanError::invalid("verdict.effect", format!("{tx}/{effect}"), "a registered effect")
                })?;
                let p = self.plan_mut(*plan)?;
                let r = &mut p.regs[seq as usize];
                r.verdict = Some(*verdict);
                if *verdict == Verdict::Block
                    && r.descriptor.is_none()
                    && p.status == Status::Open
                    && p.pending_fail.is_none()
                {
                    p.pending_fail = Some((
                        Cause::Signal { reason: format!("verdict blocks `{}`, which has no compensation", r.tool) },
                        0,
                    ));
                }
            }
            PlanFact::PlanResolved { plan, choice, at_ms } => {
                let p = self.plan_mut(*plan)?;
                let Status::Stuck { reason, depth, was_open } = p.status.clone() else {
                    return Err(PlanError::invalid("plan_resolved.plan", plan, "a stuck plan"));
                };
                self.stuck.remove(plan);
                match choice {
                    Choice::Accept => self.end_plan(*plan, Outcome::Accepted)?,
                    Choice::Retry => match reason {
                        StuckReason::Irreversible { .. } | StuckReason::CascadeLimit { .. } => {
                            let p = self.plan_mut(*plan)?;
                            p.status = Status::Open;
                            p.opening += 1;
                            p.pending_fail = None;
                            let opening = p.opening;
                            if p.deadline_ms.is_some_and(|d| d <= *at_ms) {
                                p.deadline_ms = None;
                            }
                            if let Some(d) = p.deadline_ms {
                                self.wheel.insert(d, Timer::Deadline { plan: *plan, opening });
                            }
                        }
                        StuckReason::CompensationFailed { seq, .. } => {
                            self.set_reg_state(*plan, seq, RegState::Held)?;
                            self.plan_mut(*plan)?.status = restore(depth, was_open);
                        }
                        StuckReason::CompensationInDoubt { seq } => {
                            let r = self.reg_mut(*plan, seq)?;
                            let has_probe = r.probes & PROBE != 0;
                            r.state =
                                if has_probe { RegState::InDoubt { probe_unknown: false } } else { RegState::Held };
                            self.plan_mut(*plan)?.status = restore(depth, was_open);
                        }
                        StuckReason::ForwardInDoubt { seq } => {
                            let r = self.reg_mut(*plan, seq)?;
                            if r.probes & FORWARD_PROBE != 0 {
                                r.fwd_probe = None;
                            } else {
                                r.forward = Forward::Externalised;
                            }
                            self.plan_mut(*plan)?.status = restore(depth, was_open);
                        }
                    },
                    Choice::Unwind => {
                        match reason {
                            StuckReason::CompensationFailed { seq, .. }
                            | StuckReason::CompensationInDoubt { seq }
                            | StuckReason::ForwardInDoubt { seq } => {
                                self.set_reg_state(*plan, seq, RegState::Skipped)?
                            }
                            _ => {}
                        }
                        let p = self.plan_mut(*plan)?;
                        p.force = true;
                        p.status = Status::Failing { depth };
                    }
                }
            }
            PlanFact::PlanFailed { plan, cause, depth, .. } => {
                let p = self.plan_mut(*plan)?;
                p.failure = Some((cause.clone(), *depth));
                p.status = Status::Failing { depth: *depth };
                p.pending_fail = None;
            }
            PlanFact::PlanStuck { plan, reason, .. } => {
                let p = self.plan_mut(*plan)?;
                let (depth, was_open) = match p.status {
                    Status::Failing { depth } => (depth, false),
                    _ => (0, true),
                };
                p.status = Status::Stuck { reason: reason.clone(), depth, was_open };
                self.stuck.insert(*plan, reason.clone());
            }
            PlanFact::CompStarted { plan, seq, incarnation, attempt } => {
                self.set_reg_state(*plan, *seq, RegState::InFlight(*incarnation))?;
                self.reg_mut(*plan, *seq)?.attempts = *attempt;
            }
            PlanFact::CompDone { plan, seq, result, error, depth, .. } => match result {
                CompResult::Done => self.comp_done(*plan, *seq, *depth)?,
                CompResult::NotApplied => {
                    self.set_reg_state(*plan, *seq, RegState::Failed(error.clone().unwrap_or_default()))?
                }
                CompResult::Unknown => self.set_reg_state(*plan, *seq, RegState::InDoubt { probe_unknown: false })?,
            },
            PlanFact::CompSkipped { plan, seq, .. } => self.set_reg_state(*plan, *seq, RegState::Skipped)?,
            PlanFact::ForwardProbed { plan, seq, happened, output } => {
                self.probing.remove(&(*plan, *seq));
                let r = self.reg_mut(*plan, *seq)?;
                r.fwd_probe = Some(*happened);
                if let Some(o) = output
                    && r.output.is_none()
                {
                    r.output = Some(text(o));
                }
                match happened {
                    Some(true) => r.forward = Forward::Externalised,
                    Some(false) => r.forward = Forward::NotApplied,
                    None => {}
                }
            }
            PlanFact::CompProbed { plan, seq, happened } => {
                self.probing.remove(&(*plan, *seq));
                match happened {
                    Some(true) => {
                        let depth = match self.plans.get(plan).map(|p| &p.status) {
                            Some(Status::Failing { depth } | Status::Stuck { depth, .. }) => depth + 1,
                            _ => 1,
                        };
                        self.comp_done(*plan, *seq, depth)?
                    }
                    Some(false) => self.set_reg_state(*plan, *seq, RegState::Held)?,
                    None => self.set_reg_state(*plan, *seq, RegState::InDoubt { probe_unknown: true })?,
                }
            }
            PlanFact::PlanEnded { plan, outcome, .. } => self.end_plan(*plan, *outcome)?,
        }
        Ok(())
    }

    fn comp_done(&mut self, plan: PlanId, seq: Seq, depth: u32) -> Result<(), PlanError> {
        self.set_reg_state(plan, seq, RegState::Done)?;
        self.plan_mut(plan)?.any_done = true;
        let ids = self.by_comp.get(&plan).cloned().unwrap_or_default();
        for id in ids {
            if let Atom::Compensated { seq: want, .. } = self.atoms[id].atom
                && want.is_none_or(|w| w == seq)
            {
                self.set_atom(id, Tri::True, depth);
            }
        }
        Ok(())
    }

    fn end_plan(&mut self, plan: PlanId, outcome: Outcome) -> Result<(), PlanError> {
        let p = self.plan_mut(plan)?;
        p.status = Status::Ended(outcome);
        p.pending_fail = None;
        let regs = std::mem::take(&mut p.regs);
        let steps = p.steps.clone();
        for r in &regs {
            self.by_effect.remove(&(r.tx, r.effect));
        }
        let left = regs.iter().filter(|r| !matches!(r.state, RegState::Done | RegState::Skipped)).count();
        self.held = self.held.saturating_sub(left);
        for tx in steps {
            self.txs.remove(&tx);
        }
        self.stuck.remove(&plan);
        let ids = self.by_comp.get(&plan).cloned().unwrap_or_default();
        for id in ids {
            self.set_atom(id, Tri::False, 0);
        }
        Ok(())
    }
}

fn restore(depth: u32, was_open: bool) -> Status {
    if was_open { Status::Open } else { Status::Failing { depth } }
}
