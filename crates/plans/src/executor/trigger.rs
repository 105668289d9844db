//! Predicate triggers: arming one (its atoms, their indexes by tagged effect, compensated
//! plan and written scope, and the timers of `no_commit` atoms), setting an atom's value once,
//! evaluating a trigger three-valued and marking its plan to fail when it reads true, and the
//! pending commits that keep a `no_commit` atom unknown past its time (docs/plans.md,
//! "Predicates" and "Key operations").

use super::{AtomSlot, Executor, RegState, Status, Timer, Trigger};
use crate::error::PlanError;
use crate::fact::{Cause, PlanId, TxId};
use crate::predicate::{Atom, Predicate, Tri};

impl Executor {
    /// Arms trigger `predicate` of `plan` (the fold of `trigger_armed`): compiles it, registers
    /// its atoms (an atom about a compensation already done, or a plan already ended, starts
    /// known) and evaluates it once.
    pub(super) fn arm_trigger(&mut self, plan: PlanId, predicate: &Predicate) -> Result<(), PlanError> {
        let (atoms, node) = predicate.compile(&self.tenant)?;
        let trigger = self.plan_mut(plan)?.triggers.len() as u32;
        let mut ids = Vec::with_capacity(atoms.len());
        for atom in atoms {
            let id = self.atoms.len();
            ids.push(id);
            let mut value = Tri::Unknown;
            let mut witness = 0;
            match &atom {
                Atom::Tagged { tx, effect, .. } => self.by_tagged.entry((*tx, *effect)).or_default().push(id),
                Atom::Compensated { plan: other, seq } => {
                    self.by_comp.entry(*other).or_default().push(id);
                    if let Some(o) = self.plans.get(other) {
                        let done = match seq {
                            Some(s) => o.regs.get(*s as usize).is_some_and(|r| r.state == RegState::Done),
                            None => o.any_done,
                        };
                        if done {
                            value = Tri::True;
                            witness = 1;
                        } else if matches!(o.status, Status::Ended(_)) {
                            value = Tri::False;
                        }
                    }
                }
                Atom::NoCommit { scope, before_ms } => {
                    self.by_scope.entry(scope.clone()).or_default().push(id);
                    self.wheel.insert(*before_ms, Timer::Atom(id));
                }
            }
            self.atoms.push(AtomSlot { plan, trigger, atom, value, witness });
        }
        self.plan_mut(plan)?.triggers.push(Trigger { predicate: predicate.clone(), node, atoms: ids, fired: false });
        self.eval_trigger(plan, trigger);
        Ok(())
    }

    /// For a `no_commit` atom still unknown: the lowest pending commit (decided, not yet
    /// settled) that wrote its scope before its time, which keeps it unknown until it settles.
    pub(super) fn pending_commit_before(&self, id: usize) -> Option<TxId> {
        let a = &self.atoms[id];
        let Atom::NoCommit { scope, before_ms } = &a.atom else { return None };
        if a.value != Tri::Unknown {
            return None;
        }
        self.committing
            .iter()
            .filter(|(_, (at, scopes))| at < before_ms && scopes.iter().any(|s| s == scope))
            .map(|(tx, _)| *tx)
            .min()
    }

    /// Sets atom `id` to `value` (with the cascade depth that witnessed it), once: an atom
    /// already known keeps its value. Re-evaluates its trigger.
    pub(super) fn set_atom(&mut self, id: usize, value: Tri, witness: u32) {
        let a = &mut self.atoms[id];
        if a.value != Tri::Unknown {
            return;
        }
        a.value = value;
        a.witness = witness;
        let (plan, trigger) = (a.plan, a.trigger);
        self.eval_trigger(plan, trigger);
    }

    /// Evaluates trigger `trigger` of an open `plan`; when it reads true, it fires once and the
    /// plan is marked to fail (caused by the trigger, at the deepest witness's depth).
    fn eval_trigger(&mut self, plan: PlanId, trigger: u32) {
        let Some(p) = self.plans.get(&plan) else { return };
        let Some(t) = p.triggers.get(trigger as usize) else { return };
        if t.fired || p.status != Status::Open {
            return;
        }
        let values: Vec<Tri> = t.atoms.iter().map(|&i| self.atoms[i].value).collect();
        if t.node.eval(&values) != Tri::True {
            return;
        }
        let witness =
            t.atoms.iter().filter(|&&i| self.atoms[i].value == Tri::True).map(|&i| self.atoms[i].witness).max();
        let p = self.plans.get_mut(&plan).expect("checked above");
        p.triggers[trigger as usize].fired = true;
        if p.pending_fail.is_none() {
            p.pending_fail = Some((Cause::Predicate { trigger }, witness.unwrap_or(0)));
            self.agenda.insert(plan);
        }
    }
}
