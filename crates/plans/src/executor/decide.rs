//! The step function: [`Executor::decide`] advances the deadline wheel to `now` (deadlines,
//! `no_commit` times) and, for every plan on the agenda, picks its next move (fail it, unwind
//! its top registration, probe, skip, route it to its owner, end it) until it must wait for a
//! dispatch or for the engine. Deterministic: the same projection and `now` give the same
//! decision. Also [`resolve_args`], which fills a descriptor's references.

use serde_json::Value;

use super::{
    Action, Decision, DispatchKey, DispatchRequest, Executor, Forward, Operation, RegState, Status, Timer, value,
};
use crate::fact::{Cause, Descriptor, Outcome, PlanFact, PlanId, Seq, SkipReason, StuckReason, Touch, Verdict};
use crate::predicate::Tri;

/// One plan's next move.
enum Next {
    Fact(PlanFact, Option<Action>),
    Action(Action),
    Wait,
}

impl Executor {
    /// Advances the clock to `now` and decides what to do next. The returned facts are
    /// already applied; append them (durably) before running the actions.
    pub fn decide(&mut self, now: u64) -> Decision {
        let mut fired = Vec::new();
        self.wheel.advance(now, |_, t| fired.push(t));
        for t in fired {
            match t {
                Timer::Deadline { plan, opening } => {
                    if let Some(p) = self.plans.get_mut(&plan)
                        && p.status == Status::Open
                        && p.opening == opening
                        && p.deadline_ms.is_some()
                        && p.pending_fail.is_none()
                    {
                        p.pending_fail = Some((Cause::Deadline, 0));
                        self.agenda.insert(plan);
                    }
                }
                Timer::Atom(id) => match self.pending_commit_before(id) {
                    Some(tx) => self.blocked.entry(tx).or_default().push(id),
                    None => self.set_atom(id, Tri::True, 0),
                },
            }
        }
        let mut out = Decision::default();
        while let Some(plan) = self.agenda.pop_first() {
            loop {
                match self.next(plan, now) {
                    Next::Wait => break,
                    Next::Action(a) => {
                        out.actions.push(a);
                        break;
                    }
                    Next::Fact(f, a) => {
                        if let Err(e) = self.apply_fact(&f) {
                            debug_assert!(false, "a decided fact must apply: {e}");
                            break;
                        }
                        out.facts.push(f);
                        if let Some(a) = a {
                            out.actions.push(a);
                            break;
                        }
                    }
                }
            }
            self.agenda.remove(&plan);
        }
        out
    }

    fn next(&mut self, plan: PlanId, now: u64) -> Next {
        let Some(p) = self.plans.get(&plan) else { return Next::Wait };
        match &p.status {
            Status::Open => {
                if let Some((cause, depth)) = p.pending_fail.clone() {
                    return Next::Fact(PlanFact::PlanFailed { plan, cause, depth, at_ms: now }, None);
                }
                if p.regs.iter().any(|r| matches!(r.state, RegState::InFlight(i) if i == self.incarnation)) {
                    return Next::Wait;
                }
                let due = p.regs.iter().position(|r| {
                    r.verdict == Some(Verdict::Block)
                        && r.descriptor.is_some()
                        && !matches!(r.state, RegState::Done | RegState::Skipped)
                        && self.txs.get(&r.tx).is_some_and(|i| i.settled.is_some())
                });
                match due {
                    Some(seq) => self.handle(plan, seq as Seq, 0, now),
                    None => Next::Wait,
                }
            }
            Status::Failing { depth } => {
                let depth = *depth;
                if !p.force && depth > p.cascade_limit {
                    let reason = StuckReason::CascadeLimit { depth, limit: p.cascade_limit };
                    return Next::Fact(PlanFact::PlanStuck { plan, reason, at_ms: now }, None);
                }
                if !p.force {
                    let seqs: Vec<Seq> = p
                        .regs
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| {
                            r.descriptor.is_none()
                                && r.state == RegState::Held
                                && matches!(r.forward, Forward::Externalised | Forward::InDoubt)
                                && self.txs.get(&r.tx).is_some_and(|i| i.settled == Some(true))
                        })
                        .map(|(i, _)| i as Seq)
                        .collect();
                    if !seqs.is_empty() {
                        let reason = StuckReason::Irreversible { seqs };
                        return Next::Fact(PlanFact::PlanStuck { plan, reason, at_ms: now }, None);
                    }
                }
                // A step still running may register more effects above the current top: the
                // unwind starts once every step has settled (an orphaned step's lease ends it).
                if p.steps.iter().any(|tx| self.txs.get(tx).is_some_and(|i| i.settled.is_none())) {
                    return Next::Wait;
                }
                match p.regs.iter().rposition(|r| !matches!(r.state, RegState::Done | RegState::Skipped)) {
                    Some(seq) => self.handle(plan, seq as Seq, depth, now),
                    None => Next::Fact(PlanFact::PlanEnded { plan, outcome: Outcome::Unwound, at_ms: now }, None),
                }
            }
            Status::Stuck { .. } | Status::Ended(_) => Next::Wait,
        }
    }

    /// The next move for registration `seq` (its plan's current one).
    fn handle(&mut self, plan: PlanId, seq: Seq, depth: u32, now: u64) -> Next {
        let incarnation = self.incarnation;
        let Some(p) = self.plans.get(&plan) else { return Next::Wait };
        let force = p.force;
        let r = &p.regs[seq as usize];
        // The descriptor and the forward effect's arguments and output are kept as JSON text.
        let parsed: Option<Result<Descriptor, String>> = r
            .descriptor
            .as_deref()
            .map(|t| serde_json::from_str(t).map_err(|e| format!("the held descriptor does not parse: {e}")));
        let output = r.output.as_deref().map(value);
        let stuck = |reason| Next::Fact(PlanFact::PlanStuck { plan, reason, at_ms: now }, None);
        let skip = |reason| Next::Fact(PlanFact::CompSkipped { plan, seq, reason }, None);
        let probe = |capability: &str, key: DispatchKey| DispatchRequest {
            capability: capability.into(),
            operation: Operation::Probe,
            tool: r.tool.to_string(),
            key,
            args: std::sync::Arc::new(value(&r.args)),
            output: output.clone().map(std::sync::Arc::new),
        };
        match &r.state {
            RegState::Done | RegState::Skipped => Next::Wait,
            RegState::InFlight(i) if *i == incarnation => Next::Wait,
            RegState::Failed(error) => stuck(StuckReason::CompensationFailed { seq, error: error.clone() }),
            RegState::InFlight(_) | RegState::InDoubt { .. } => {
                let unknown = matches!(r.state, RegState::InDoubt { probe_unknown: true });
                let d = parsed.as_ref().and_then(|d| d.as_ref().ok());
                match d.and_then(|d| d.probe.as_deref()) {
                    Some(cap) if !unknown => {
                        if !self.probing.insert((plan, seq)) {
                            return Next::Wait;
                        }
                        let key = match d {
                            Some(d) => d.key_for(&r.key),
                            None => DispatchKey::compensation(&*r.key),
                        };
                        Next::Action(Action::ProbeCompensation { plan, seq, request: probe(cap, key) })
                    }
                    _ => stuck(StuckReason::CompensationInDoubt { seq }),
                }
            }
            RegState::Held => {
                match self.txs.get(&r.tx).and_then(|i| i.settled) {
                    None => return Next::Wait,
                    Some(false) => return skip(SkipReason::StepAborted),
                    Some(true) => {}
                }
                let d = match parsed {
                    Some(Ok(d)) => d,
                    Some(Err(error)) => return stuck(StuckReason::CompensationFailed { seq, error }),
                    None => {
                        return match r.forward {
                            Forward::NotApplied => skip(SkipReason::NeverExternalised),
                            _ if force => skip(SkipReason::NonCompensable),
                            _ => stuck(StuckReason::Irreversible { seqs: vec![seq] }),
                        };
                    }
                };
                match r.forward {
                    Forward::NotApplied => skip(SkipReason::NeverExternalised),
                    Forward::Externalised => match resolve_args(&d.args, &value(&r.args), output.as_ref()) {
                        Err(error) => stuck(StuckReason::CompensationFailed { seq, error }),
                        Ok(args) => {
                            let request = DispatchRequest {
                                capability: d.capability.clone(),
                                operation: Operation::Compensate,
                                tool: r.tool.to_string(),
                                key: d.key_for(&r.key),
                                args: std::sync::Arc::new(args),
                                output: output.clone().map(std::sync::Arc::new),
                            };
                            let fact = PlanFact::CompStarted { plan, seq, incarnation, attempt: r.attempts + 1 };
                            let touch = Touch {
                                tx: r.tx,
                                effect: r.effect,
                                scopes: r.scopes.iter().map(|s| s.to_string()).collect(),
                                done: false,
                            };
                            Next::Fact(fact, Some(Action::Compensate { plan, seq, depth: depth + 1, request, touch }))
                        }
                    },
                    Forward::InDoubt | Forward::Pending => match (r.fwd_probe, d.forward_probe.as_deref()) {
                        (None, Some(cap)) => {
                            if !self.probing.insert((plan, seq)) {
                                return Next::Wait;
                            }
                            Next::Action(Action::ProbeForward {
                                plan,
                                seq,
                                request: probe(cap, DispatchKey::effect(&*r.key)),
                            })
                        }
                        _ => stuck(StuckReason::ForwardInDoubt { seq }),
                    },
                }
            }
        }
    }
}

/// Resolves a descriptor's `$output`, `$args` and `$literal` references.
pub fn resolve_args(template: &Value, args: &Value, output: Option<&Value>) -> Result<Value, String> {
    match template {
        Value::Object(m) if m.len() == 1 => {
            let (k, v) = m.iter().next().expect("one member");
            let source = match k.as_str() {
                "$literal" => return Ok(v.clone()),
                "$output" => output.unwrap_or(&Value::Null),
                "$args" => args,
                _ => return Ok(Value::Object(std::iter::once((k.clone(), resolve_args(v, args, output)?)).collect())),
            };
            let ptr = v.as_str().ok_or_else(|| format!("`{k}` must be a JSON pointer string, got {v}"))?;
            source
                .pointer(ptr)
                .cloned()
                .ok_or_else(|| format!("`{k}` pointer {ptr:?} names nothing in the forward effect's {}", &k[1..]))
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| Ok((k.clone(), resolve_args(v, args, output)?)))
            .collect::<Result<_, String>>()
            .map(Value::Object),
        Value::Array(a) => a.iter().map(|v| resolve_args(v, args, output)).collect::<Result<_, _>>().map(Value::Array),
        v => Ok(v.clone()),
    }
}
