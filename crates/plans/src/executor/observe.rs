//! Engine facts ([`Observation`]) folded into the projection: a step's effects become
//! registrations, their forward outcomes (executed, failed, released) are recorded, and a
//! settlement settles the step, resolves what stayed pending and sets the atoms it decides
//! (`tagged`, `no_commit`). Engine facts are never refused: one about a transaction no plan
//! knows is ignored.

use super::{Executor, FORWARD_PROBE, Forward, PROBE, Reg, RegState, Status, text};
use crate::fact::{EffectId, Observation, Seq, TxId};
use crate::predicate::{Atom, Tri};

impl Executor {
    /// Folds one engine fact.
    pub fn observe(&mut self, o: &Observation) {
        match o {
            Observation::EffectRecorded { tx, effect, tool, held, key, args, descriptor, scopes } => {
                let Some(info) = self.txs.get(tx).copied() else { return };
                let Some(p) = self.plans.get_mut(&info.plan) else { return };
                if matches!(p.status, Status::Ended(_)) {
                    return;
                }
                let seq = p.regs.len() as Seq;
                p.regs.push(Reg {
                    tx: *tx,
                    effect: *effect,
                    tool: tool.as_str().into(),
                    key: key.as_str().into(),
                    args: text(args),
                    output: None,
                    descriptor: descriptor
                        .as_ref()
                        .and_then(|d| serde_json::to_string(d).ok())
                        .map(String::into_boxed_str),
                    scopes: scopes.iter().map(|s| s.as_str().into()).collect(),
                    probes: descriptor.as_ref().map_or(0, |d| {
                        u8::from(d.probe.is_some()) * PROBE + u8::from(d.forward_probe.is_some()) * FORWARD_PROBE
                    }),
                    held: *held,
                    forward: Forward::Pending,
                    fwd_probe: None,
                    verdict: None,
                    state: RegState::Held,
                    attempts: 0,
                });
                self.by_effect.insert((*tx, *effect), seq);
                self.held += 1;
                self.agenda.insert(info.plan);
            }
            Observation::EffectExecuted { tx, effect, output } => {
                if let Some(r) = self.reg_of(*tx, *effect) {
                    r.forward = Forward::Externalised;
                    r.output = Some(text(output));
                }
            }
            Observation::EffectFailed { tx, effect, unknown } => {
                if let Some(r) = self.reg_of(*tx, *effect) {
                    r.forward = if *unknown { Forward::InDoubt } else { Forward::NotApplied };
                }
            }
            Observation::Released { tx, effect, ok, unknown, output } => {
                if let Some(r) = self.reg_of(*tx, *effect) {
                    if output.is_some() {
                        r.output = output.as_ref().map(text);
                    }
                    r.forward = match (ok, unknown) {
                        (true, _) => Forward::Externalised,
                        (false, true) => Forward::InDoubt,
                        (false, false) => Forward::NotApplied,
                    };
                }
            }
            Observation::Committing { tx, scopes, at_ms } => {
                self.committing.insert(*tx, (*at_ms, scopes.clone()));
            }
            Observation::Settled { tx, committed, tags, scopes, at_ms } => {
                // A commit is compared by its decision time when it was seen decided.
                let at_ms = &self.committing.remove(tx).map_or(*at_ms, |(at, _)| at);
                if let Some(info) = self.txs.get_mut(tx) {
                    info.settled = Some(*committed);
                    let plan = info.plan;
                    if let Some(p) = self.plans.get_mut(&plan) {
                        // Still pending at the settlement: an eager call whose outcome never
                        // came back may have happened; a held effect of a commit was never
                        // released, unless the commit tagged it unresolved (its release started
                        // and its outcome was lost: it may have fired).
                        for r in p.regs.iter_mut().filter(|r| r.tx == *tx && r.forward == Forward::Pending) {
                            let unresolved = tags.iter().any(|(e, t)| *e == r.effect && t == "unresolved");
                            r.forward = if !*committed || (r.held && !unresolved) {
                                Forward::NotApplied
                            } else {
                                Forward::InDoubt
                            };
                        }
                    }
                    self.agenda.insert(plan);
                }
                for (effect, tag) in tags {
                    for id in self.by_tagged.get(&(*tx, *effect)).cloned().unwrap_or_default() {
                        if let Atom::Tagged { tag: want, .. } = &self.atoms[id].atom {
                            let v = if want == tag { Tri::True } else { Tri::False };
                            self.set_atom(id, v, 0);
                        }
                    }
                }
                if *committed {
                    for s in scopes {
                        for id in self.by_scope.get(s).cloned().unwrap_or_default() {
                            if let Atom::NoCommit { before_ms, .. } = self.atoms[id].atom
                                && *at_ms < before_ms
                            {
                                self.set_atom(id, Tri::False, 0);
                            }
                        }
                    }
                }
                // Atoms whose time passed while this commit was pending: still unknown (it was
                // retracted, or did not write their scope), they read true unless another
                // pending commit holds them.
                for id in self.blocked.remove(tx).unwrap_or_default() {
                    match self.pending_commit_before(id) {
                        Some(other) => self.blocked.entry(other).or_default().push(id),
                        None => self.set_atom(id, Tri::True, 0),
                    }
                }
            }
        }
    }

    fn reg_of(&mut self, tx: TxId, effect: EffectId) -> Option<&mut Reg> {
        let info = self.txs.get(&tx)?;
        let plan = info.plan;
        self.agenda.insert(plan);
        let seq = *self.by_effect.get(&(tx, effect))?;
        self.plans.get_mut(&plan)?.regs.get_mut(seq as usize)
    }
}
