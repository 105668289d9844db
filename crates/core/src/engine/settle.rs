//! Settlement: eager-call results, the commit decision, releases, aborts and compensations,
//! lease expiry, and waking the transactions a finished one was blocking.

use std::sync::Arc;

use serde_json::Value;

use super::apply::{Given, RELEASE_IN_DOUBT};
use super::{Action, Core, EffStatus, Level, Ordering, Tx, disposition_for_discard};
use crate::effect::{AbortReason, CallOutcome, Disposition, EffectClass, EffectOutcome, Outcome, PartialCommit, Tag};
use crate::error::{EngineError, TxState};
use crate::ids::{EffectId, Epoch, Timestamp, TxId};
use crate::ledger::Event;
use crate::scope::Scope;

/// One compensation to run.
#[derive(Debug, Clone)]
pub struct CompensationTask {
    /// The transaction.
    pub tx: TxId,
    /// The forward effect.
    pub effect: EffectId,
    /// The tool whose compensation handler runs.
    pub tool: Arc<str>,
    /// The forward call's arguments.
    pub args: Arc<Value>,
    /// The forward call's output (null when `blind`).
    pub output: Arc<Value>,
    /// The forward call's outcome is unknown: the compensation runs without knowing whether
    /// it took effect, and the effect stays `unresolved` whatever the compensation reports.
    pub blind: bool,
}

/// The compensations of a decided abort, in the order to run them (reverse issuance).
#[derive(Debug, Clone)]
pub struct AbortPlan {
    /// The transaction.
    pub tx: TxId,
    /// Why it aborted.
    pub reason: AbortReason,
    /// Compensations, last-issued first.
    pub compensations: Vec<CompensationTask>,
}

/// One held effect to release at commit.
#[derive(Debug, Clone)]
pub struct ReleaseTask {
    /// The effect.
    pub effect: EffectId,
    /// Its tool.
    pub tool: Arc<str>,
    /// Bufferable (apply) or gated (fire).
    pub class: EffectClass,
    /// Its arguments.
    pub args: Arc<Value>,
}

/// The held effects of a decided commit, in issuance order.
#[derive(Debug, Clone)]
pub struct ReleasePlan {
    /// The transaction.
    pub tx: TxId,
    /// Releases in issuance order.
    pub releases: Vec<ReleaseTask>,
}

/// The result of [`Core::try_commit`].
#[derive(Debug)]
pub enum Decision {
    /// Earlier work may still touch the footprint; wait for a [`Action::Wake`] and retry.
    Wait,
    /// Committed: release these, report each with [`Core::release_done`], then
    /// [`Core::finish_commit`].
    Commit(ReleasePlan),
    /// Aborted (stale read): run the plan, then [`Core::finish_abort`].
    Abort(AbortPlan),
}

/// The result of [`Core::finish_commit`].
#[derive(Debug)]
pub enum Settlement {
    /// Committed (possibly partially: see [`Outcome::partial`]).
    Committed(Outcome),
    /// The first release failed before anything left: the transaction aborts instead.
    Abort(AbortPlan),
}

/// The result of [`Core::executed`].
#[derive(Debug)]
pub enum ExecResult {
    /// Recorded; give the output to the agent.
    Done,
    /// The call failed and the transaction aborted: run the plan, then finish the abort.
    Aborted(AbortPlan),
    /// The transaction aborted while the call ran: compensate it now.
    Late(CompensationTask),
}

impl Core {
    /// Reports how an eager call ended, once the retry-and-probe policy is done with it. A
    /// failure aborts the transaction: [`CallOutcome::NotApplied`] leaves nothing to undo
    /// (`retry: true` aborts retryably, [`AbortReason::ToolUnavailable`]);
    /// [`CallOutcome::Unknown`] may have taken effect, so the abort compensates it when the
    /// tool has a compensation (blind: the effect is then tagged `unresolved`, never `clean`)
    /// and otherwise tags it `unresolved`. The call is never re-executed.
    pub fn executed(&mut self, tx: TxId, effect: EffectId, result: CallOutcome) -> Result<ExecResult, EngineError> {
        let Some(t) = self.txs.get(&tx) else {
            if let Some(task) = self.late.remove(&(tx, effect)) {
                return Ok(match result {
                    CallOutcome::Done { output, .. } => {
                        self.emit(Event::EffectExecuted { tx, effect, output: output.clone() }, Given::Nothing);
                        self.touch_late(tx, effect, false);
                        ExecResult::Late(CompensationTask { output, ..task })
                    }
                    CallOutcome::NotApplied { message, .. } => {
                        self.emit(Event::EffectFailed { tx, effect, error: message, unknown: false }, Given::Nothing);
                        self.late_scopes.remove(&(tx, effect));
                        ExecResult::Done
                    }
                    CallOutcome::Unknown { message } => {
                        // It may have taken effect after its transaction settled: undo it blind.
                        self.emit(Event::EffectFailed { tx, effect, error: message, unknown: true }, Given::Nothing);
                        self.touch_late(tx, effect, false);
                        ExecResult::Late(CompensationTask { output: Arc::default(), blind: true, ..task })
                    }
                });
            }
            return Err(self.missing(tx));
        };
        if !t.effects.get(effect.0 as usize).is_some_and(|e| e.status == EffStatus::InFlight) {
            return Err(EngineError::InvalidArgument {
                field: "effect",
                value: format!("{tx}{effect}"),
                expected: "an effect whose call is in flight",
            });
        }
        let (message, unknown, retry) = match result {
            CallOutcome::Done { output, .. } => {
                self.emit(Event::EffectExecuted { tx, effect, output }, Given::Nothing);
                // Aborted while the call ran: compensate it now. Until that compensation is
                // reported the effect's fate is open, so a settlement meanwhile tags it
                // unresolved and keeps its key from being replayed.
                return Ok(match self.start_late_compensation(tx, effect, false) {
                    Some(task) => ExecResult::Late(task),
                    None => ExecResult::Done,
                });
            }
            CallOutcome::NotApplied { message, retry } => (message, false, retry),
            CallOutcome::Unknown { message } => (message, true, false),
        };
        self.emit(Event::EffectFailed { tx, effect, error: message.clone(), unknown }, Given::Nothing);
        if self.txs.get(&tx).is_some_and(|t| t.state == TxState::Aborting) {
            // Aborted while the call ran, and its outcome came back unknown: compensate it
            // blind now, as the abort would have.
            return Ok(match self.start_late_compensation(tx, effect, true) {
                Some(task) => ExecResult::Late(task),
                None => ExecResult::Done,
            });
        }
        let tool = self
            .txs
            .get(&tx)
            .and_then(|t| t.effects.get(effect.0 as usize))
            .map_or(String::new(), |e| e.tool.to_string());
        let reason = if retry {
            AbortReason::ToolUnavailable { tool, message }
        } else {
            AbortReason::ToolFailed { tool, message }
        };
        Ok(ExecResult::Aborted(self.abort(tx, reason)?))
    }

    /// A late call of the settled transaction `tx` landed (before its compensation is run) or
    /// its compensation finished (`done`): its scopes get a fresh version
    /// ([`Event::Touched`]), since the world changed there after the settlement's own.
    fn touch_late(&mut self, tx: TxId, effect: EffectId, done: bool) {
        let scopes =
            if done { self.late_scopes.remove(&(tx, effect)) } else { self.late_scopes.get(&(tx, effect)).cloned() };
        if let Some(scopes) = scopes.filter(|s| !s.is_empty()) {
            self.mark_undoing(tx, effect, &scopes, done);
            let ev = Event::Touched { scopes: scopes.iter().map(Scope::as_arc).collect(), undoes: tx, effect, done };
            self.emit(ev, Given::Effect(scopes));
        }
    }

    /// An effect of an aborting transaction returned from its call (`blind`: with an unknown
    /// outcome): if the abort would compensate it, mark its compensation running (a live
    /// executor's state, not a ledger fact) and return the task.
    fn start_late_compensation(&mut self, tx: TxId, effect: EffectId, blind: bool) -> Option<CompensationTask> {
        let t = self.txs.get_mut(&tx).filter(|t| t.state == TxState::Aborting)?;
        let e = t.effects.get_mut(effect.0 as usize).filter(|e| needs_compensation(e))?;
        e.status = EffStatus::Compensating;
        Some(CompensationTask {
            tx,
            effect,
            tool: e.tool.clone(),
            args: e.args.clone(),
            output: if blind { Arc::default() } else { e.output.clone().unwrap_or_default() },
            blind,
        })
    }

    /// Renews the lease of an open or sealed transaction from `now` (a no-op in other states).
    /// The runtime calls it when an eager call returns, so that a long call does not cost its
    /// transaction the lease (see [`Core::expire_leases`] for calls still running).
    pub fn renew_lease(&mut self, tx: TxId, now: Timestamp) {
        if let Some(t) = self.txs.get_mut(&tx)
            && matches!(t.state, TxState::Open | TxState::Sealed)
        {
            t.lease_until = t.lease_until.max(now.after(t.lease));
        }
    }

    /// Asks to commit a sealed transaction: it stops holding a lease and starts waiting.
    pub fn request_commit(&mut self, tx: TxId) -> Result<(), EngineError> {
        let groups = &self.groups;
        let t = self.txs.get(&tx).ok_or_else(|| self.missing(tx))?;
        if let Some(g) = t.group
            && groups.get(&g).and_then(|g| g.winner) != Some(tx)
        {
            return Err(EngineError::BranchOfGroup { tx, group: g });
        }
        match t.state {
            TxState::Sealed => {}
            TxState::Open => {
                return Err(EngineError::WrongState {
                    tx,
                    op: "commit",
                    state: TxState::Open,
                    hint: "; seal it first",
                });
            }
            state => {
                return Err(EngineError::WrongState {
                    tx,
                    op: "commit",
                    state,
                    hint: "; commit was already requested or decided",
                });
            }
        }
        let lease = (t.lease_until, tx);
        self.leases.remove(&lease);
        self.txs.get_mut(&tx).expect("present").state = TxState::Waiting;
        Ok(())
    }

    /// Decides a waiting transaction if it can be decided now.
    pub fn try_commit(&mut self, tx: TxId, now: Timestamp) -> Result<Decision, EngineError> {
        let t = self.tx(tx)?;
        if t.state != TxState::Waiting {
            let state = t.state;
            return Err(EngineError::WrongState { tx, op: "decide", state, hint: "; request the commit first" });
        }
        let epoch = t.epoch;
        if !self.read_only_bypass(t) {
            // Every reason `validate` finds only persists (versions and signatures only grow,
            // a doomed reader stays doomed): abort now rather than after waiting.
            if let Some(reason) = self.validate(t) {
                self.waiting.remove(&(epoch, tx));
                return Ok(Decision::Abort(self.abort(tx, reason)?));
            }
            if !self.admissible(t) {
                self.waiting.insert((epoch, tx));
                return Ok(Decision::Wait);
            }
        }
        let stamp = self.next_stamp()?;
        self.emit(Event::Decided { tx, commit: true, stamp: Some(stamp), reason: None, at: Some(now) }, Given::Nothing);
        let t = self.tx(tx)?;
        let releases = t
            .effects
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.status, EffStatus::Held(_)))
            .map(|(i, e)| ReleaseTask {
                effect: EffectId(i as u32),
                tool: e.tool.clone(),
                class: e.class,
                args: e.args.clone(),
            })
            .collect();
        Ok(Decision::Commit(ReleasePlan { tx, releases }))
    }

    /// The commit predicate: no unfinished transaction with a smaller epoch may touch any
    /// scope of the sealed footprint.
    fn admissible(&self, t: &Tx) -> bool {
        if self.awaits_predecessor(t) || self.awaits_losers(t) {
            return false;
        }
        if self.cfg.level == Level::L0 || self.cfg.ablation.no_frontier {
            return true;
        }
        if self.cfg.ablation.global_frontier {
            return !self.any_earlier(t.epoch);
        }
        if self.cfg.ordering == Ordering::FirstCommitterWins {
            // Never wait for unfinished work, only for commits already decided and still
            // releasing on an overlapping scope, so that the world sees overlapping commits'
            // effects in commit order.
            return !self.txs.values().any(|o| {
                o.state == TxState::Committing
                    && !std::ptr::eq(o, t)
                    && o.claims.iter().any(|a| t.claims.iter().any(|b| a.overlaps(b)))
            });
        }
        if self.undeclared.first_key_value().is_some_and(|(e, _)| *e < t.epoch) {
            return false;
        }
        !t.claims.iter().any(|s| self.index.blocked_before(s, t.epoch))
    }

    /// Whether `t` is a speculation group's winner with another branch still unfinished: a
    /// loser's compensations settle before the winner's commit is decided, so no loser's
    /// undo can land after the winner's effects are released or accepted (docs/engine.md,
    /// "Speculation and eager effects"). The losers were aborted when the winner was chosen,
    /// so this waits only for their compensations; the last one to finish wakes the winner.
    fn awaits_losers(&self, t: &Tx) -> bool {
        t.group
            .and_then(|g| self.groups.get(&g))
            .is_some_and(|g| g.branches.iter().any(|b| self.txs.get(b).is_some_and(|o| !std::ptr::eq(o, t))))
    }

    /// Records that the release of a held effect is about to be attempted. Call it, and wait
    /// for its durability, before calling the tool.
    pub fn release_started(&mut self, tx: TxId, effect: EffectId) -> Result<(), EngineError> {
        let t = self.tx(tx)?;
        if t.state != TxState::Committing
            || !t.effects.get(effect.0 as usize).is_some_and(|e| matches!(e.status, EffStatus::Held(_)))
        {
            return Err(EngineError::InvalidArgument {
                field: "effect",
                value: format!("{tx}{effect}"),
                expected: "a held effect of a committing transaction",
            });
        }
        self.emit(Event::ReleaseStarted { tx, effect }, Given::Nothing);
        Ok(())
    }

    /// Reports the release of one held effect at commit (started with
    /// [`Core::release_started`], or not).
    pub fn release_done(&mut self, tx: TxId, effect: EffectId, result: CallOutcome) -> Result<(), EngineError> {
        let t = self.tx(tx)?;
        if t.state != TxState::Committing {
            let state = t.state;
            return Err(EngineError::WrongState { tx, op: "release an effect of", state, hint: "" });
        }
        if !t.effects.get(effect.0 as usize).is_some_and(|e| match &e.status {
            EffStatus::Held(_) => true,
            EffStatus::ReleaseFailed { error, unknown: true } => error == RELEASE_IN_DOUBT,
            _ => false,
        }) {
            return Err(EngineError::InvalidArgument {
                field: "effect",
                value: format!("{tx}{effect}"),
                expected: "a held effect not yet released",
            });
        }
        self.emit(released(tx, effect, result), Given::Nothing);
        Ok(())
    }

    /// Finishes a commit after its releases were reported (stopping at the first failure).
    pub fn finish_commit(&mut self, tx: TxId) -> Result<Settlement, EngineError> {
        let t = self.tx(tx)?;
        if t.state != TxState::Committing {
            let state = t.state;
            return Err(EngineError::WrongState { tx, op: "finish the commit of", state, hint: "" });
        }
        let failed = t.effects.iter().position(|e| matches!(e.status, EffStatus::ReleaseFailed { .. }));
        let released: Vec<EffectId> = t
            .effects
            .iter()
            .enumerate()
            .filter(|(_, e)| e.status == EffStatus::Released)
            .map(|(i, _)| EffectId(i as u32))
            .collect();
        // A first release known not to have happened leaves nothing externalised: abort. One
        // whose outcome is unknown may have left: the commit stands, partially.
        if let Some(f) = failed
            && released.is_empty()
            && let EffStatus::ReleaseFailed { error, unknown: false } = &t.effects[f].status
        {
            let (tool, message) = (t.effects[f].tool.to_string(), error.to_string());
            // Retracted: the abort's apply takes back the commit's writes.
            return Ok(Settlement::Abort(self.decide_abort(tx, AbortReason::ReleaseFailed { tool, message })));
        }
        let mut partial = None;
        if let Some(f) = failed {
            let error = match &t.effects[f].status {
                EffStatus::ReleaseFailed { error, .. } => error.to_string(),
                _ => String::new(),
            };
            let not_attempted = t
                .effects
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e.status, EffStatus::Held(_)))
                .map(|(i, _)| EffectId(i as u32))
                .collect();
            partial = Some(PartialCommit { released, failed: EffectId(f as u32), error, not_attempted });
        }
        let effects = t
            .effects
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (disposition, tag, detail) = match &e.status {
                    EffStatus::Released if e.class == EffectClass::Bufferable => {
                        (Disposition::Applied, Tag::Clean, None)
                    }
                    EffStatus::Released => (Disposition::Fired, Tag::Clean, None),
                    EffStatus::ReleaseFailed { error, unknown: false } => {
                        (Disposition::ReleaseFailed, Tag::PartialCommit, Some(error.to_string()))
                    }
                    EffStatus::ReleaseFailed { error, unknown: true } => {
                        (Disposition::Unknown, Tag::Unresolved, Some(error.to_string()))
                    }
                    EffStatus::Held(_) => (Disposition::NotReleased, Tag::PartialCommit, None),
                    EffStatus::Replayed => (Disposition::Replayed, Tag::Clean, None),
                    _ => (Disposition::Accepted, Tag::Clean, None),
                };
                EffectOutcome {
                    id: EffectId(i as u32),
                    tool: e.tool.clone(),
                    class: e.class,
                    key: e.key.clone(),
                    disposition,
                    tag,
                    detail,
                }
            })
            .collect();
        let outcome =
            Outcome { tx, epoch: t.epoch, agent: t.agent.clone(), committed: true, reason: None, effects, partial };
        self.emit(settled(&outcome), Given::Nothing);
        Ok(Settlement::Committed(outcome))
    }

    /// Decides to abort `tx`. Held effects are dropped (never released); the plan lists the
    /// executed effects to compensate, last-issued first.
    pub fn abort(&mut self, tx: TxId, reason: AbortReason) -> Result<AbortPlan, EngineError> {
        match self.tx(tx)?.state {
            TxState::Open | TxState::Sealed | TxState::Waiting => {}
            state => {
                return Err(EngineError::WrongState {
                    tx,
                    op: "abort",
                    state,
                    hint: "; its settlement is already decided",
                });
            }
        }
        Ok(self.decide_abort(tx, reason))
    }

    /// Records the abort of `tx` (unfinished, not aborting, and not committing unless its
    /// first release failed before anything left) and returns its plan.
    fn decide_abort(&mut self, tx: TxId, reason: AbortReason) -> AbortPlan {
        self.emit(
            Event::Decided { tx, commit: false, stamp: None, reason: Some(reason.clone()), at: None },
            Given::Nothing,
        );
        let compensations = match self.txs.get(&tx) {
            Some(t) => t
                .effects
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, e)| needs_compensation(e))
                .map(|(i, e)| CompensationTask {
                    tx,
                    effect: EffectId(i as u32),
                    tool: e.tool.clone(),
                    args: e.args.clone(),
                    output: e.output.clone().unwrap_or_default(),
                    blind: e.status != EffStatus::Executed,
                })
                .collect(),
            None => Vec::new(),
        };
        AbortPlan { tx, reason, compensations }
    }

    /// Reports a compensation's result (`Ok(residue)` or the error after retries).
    pub fn compensated(
        &mut self,
        tx: TxId,
        effect: EffectId,
        result: Result<Option<String>, String>,
    ) -> Result<(), EngineError> {
        let t = self.tx(tx)?;
        let Some(e) = t.effects.get(effect.0 as usize).filter(|e| needs_compensation(e)) else {
            return Err(EngineError::InvalidArgument {
                field: "effect",
                value: format!("{tx}{effect}"),
                expected: "an executed effect awaiting compensation",
            });
        };
        // A call whose outcome stayed unknown was compensated without knowing whether it took
        // effect: the world is probably right, but nothing proves it, so the residue note
        // keeps it `unresolved` (live and on replay alike: the note is in the record).
        let result = match (result, &e.status) {
            (Ok(residue), EffStatus::Failed { unknown: true }) => Ok(Some(match residue {
                Some(r) => format!("{BLIND_COMPENSATION}; residue: {r}"),
                None => BLIND_COMPENSATION.to_owned(),
            })),
            (r, _) => r,
        };
        let (residue, error) = match result {
            Ok(residue) => (residue, None),
            Err(error) => (None, Some(error)),
        };
        self.emit(Event::Compensated { tx, effect, residue, error }, Given::Nothing);
        Ok(())
    }

    /// Records the compensation of an effect that completed after its transaction settled
    /// (`blind`: its outcome came back unknown, see [`CompensationTask::blind`]).
    pub fn late_compensated(
        &mut self,
        tx: TxId,
        effect: EffectId,
        result: Result<Option<String>, String>,
        blind: bool,
    ) {
        if let Some(e) = self.txs.get_mut(&tx).and_then(|t| t.effects.get_mut(effect.0 as usize))
            && e.status == EffStatus::Compensating
        {
            // Still aborting: record it as any other compensation.
            e.status = if blind { EffStatus::Failed { unknown: true } } else { EffStatus::Executed };
            if self.compensated(tx, effect, result).is_err() {
                debug_assert!(false, "late compensation of {tx}{effect} refused");
            }
            return;
        }
        let (residue, error) = match result {
            Ok(Some(r)) if blind => (Some(format!("{BLIND_COMPENSATION}; residue: {r}")), None),
            Ok(None) if blind => (Some(BLIND_COMPENSATION.to_owned()), None),
            Ok(r) => (r, None),
            Err(e) => (None, Some(e)),
        };
        // Settled meanwhile (tagged unresolved, key held): a clean undo (no residue, no error)
        // frees the key.
        self.emit(Event::Compensated { tx, effect, residue, error }, Given::Nothing);
        self.touch_late(tx, effect, true);
    }

    /// Finishes an abort after its compensations were reported.
    pub fn finish_abort(&mut self, tx: TxId) -> Result<Outcome, EngineError> {
        let Some(t) = self.txs.get(&tx) else { return Err(self.missing(tx)) };
        if t.state != TxState::Aborting {
            let state = t.state;
            return Err(EngineError::WrongState { tx, op: "finish the abort of", state, hint: "; abort it first" });
        }
        let effects = t
            .effects
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (disposition, mut tag) = disposition_for_discard(&e.status);
                let mut detail = match &e.status {
                    EffStatus::Compensated { residue } => residue.as_ref().map(|r| format!("residue: {r}")),
                    EffStatus::CompensationFailed(m) => Some(format!("compensation failed: {m}")),
                    EffStatus::Executed if !e.compensable => Some("no compensation handler; the effect stands".into()),
                    EffStatus::Executed => Some("compensation never reported".into()),
                    EffStatus::InFlight => Some("call still running at abort; compensated when it returns".into()),
                    EffStatus::Compensating => {
                        Some("returned during the abort; its compensation was still running".into())
                    }
                    EffStatus::Failed { unknown: true } => Some("call outcome unknown".into()),
                    _ => None,
                };
                if e.status == EffStatus::Executed && e.class == EffectClass::Gated {
                    tag = Tag::Leaked;
                    detail = Some("irreversible effect left before the abort".into());
                }
                if e.status == EffStatus::InFlight {
                    self.late_scopes.insert((tx, EffectId(i as u32)), e.scopes.clone());
                    self.late.insert(
                        (tx, EffectId(i as u32)),
                        CompensationTask {
                            tx,
                            effect: EffectId(i as u32),
                            tool: e.tool.clone(),
                            args: e.args.clone(),
                            output: Arc::default(),
                            blind: false,
                        },
                    );
                }
                EffectOutcome {
                    id: EffectId(i as u32),
                    tool: e.tool.clone(),
                    class: e.class,
                    key: e.key.clone(),
                    disposition,
                    tag,
                    detail,
                }
            })
            .collect();
        let outcome = Outcome {
            tx,
            epoch: t.epoch,
            agent: t.agent.clone(),
            committed: false,
            reason: t.reason.clone(),
            effects,
            partial: None,
        };
        self.emit(settled(&outcome), Given::Nothing);
        Ok(outcome)
    }

    /// Aborts every open or sealed transaction whose lease ended at or before `now`, queueing
    /// their plans as [`Action::RunAbort`]. Returns how many expired.
    pub fn expire_leases(&mut self, now: Timestamp) -> usize {
        let mut n = 0;
        while let Some(&(deadline, tx)) = self.leases.first() {
            if deadline > now {
                break;
            }
            self.leases.pop_first();
            let Some(t) = self.txs.get(&tx) else { continue };
            if !matches!(t.state, TxState::Open | TxState::Sealed) {
                continue;
            }
            if t.lease_until > now {
                // Renewed since this entry was made.
                self.leases.insert((t.lease_until, tx));
                continue;
            }
            if t.in_flight > 0 {
                // A call is running: its caller still holds the transaction, and the lease
                // runs on while it does (the runtime reports a call whose future was dropped
                // as an unknown outcome, so a running call always ends).
                let until = now.after(t.lease);
                self.txs.get_mut(&tx).expect("present").lease_until = until;
                self.leases.insert((until, tx));
                continue;
            }
            // The entry is gone from `leases` already; abort() tolerates that.
            if let Ok(plan) = self.abort(tx, AbortReason::LeaseExpired) {
                self.actions.push(Action::RunAbort(plan));
                n += 1;
            }
        }
        n
    }

    /// Wakes the waiting transactions at or after `epoch` that can now decide (admissible, or
    /// stale and therefore bound to abort).
    pub(super) fn wake_after(&mut self, epoch: Epoch) {
        if self.waiting.is_empty() {
            return;
        }
        let mut woken = Vec::new();
        // Under first-committer-wins, and without a frontier, a waiter may be older than the
        // transaction it waited for.
        // A group's winner shares its losers' epoch and waits for them (`awaits_losers`).
        let from = if self.cfg.ordering == Ordering::FirstCommitterWins || self.cfg.ablation.no_frontier {
            Epoch(0)
        } else {
            epoch
        };
        for &(e, w) in self.waiting.range((from, TxId(0))..) {
            let Some(t) = self.txs.get(&w) else { continue };
            if self.validate(t).is_some() || self.admissible(t) {
                woken.push((e, w));
            }
        }
        for (e, w) in woken {
            self.waiting.remove(&(e, w));
            self.actions.push(Action::Wake(w));
        }
    }
}

/// The residue note of a compensation run for a call whose outcome was unknown.
pub(super) const BLIND_COMPENSATION: &str =
    "the call's outcome was unknown; compensated without knowing whether it took effect";

/// Whether an abort compensates this effect: it executed, or its outcome stayed unknown (it
/// may have executed), and the tool has a compensation handler.
pub(super) fn needs_compensation(e: &super::Eff) -> bool {
    e.compensable && matches!(e.status, EffStatus::Executed | EffStatus::Failed { unknown: true })
}

/// The `released` record of a release's outcome.
pub(super) fn released(tx: TxId, effect: EffectId, result: CallOutcome) -> Event {
    match result {
        CallOutcome::Done { output, .. } => {
            Event::Released { tx, effect, output: Some(output), error: None, unknown: false }
        }
        CallOutcome::NotApplied { message, .. } => {
            Event::Released { tx, effect, output: None, error: Some(message), unknown: false }
        }
        CallOutcome::Unknown { message } => {
            Event::Released { tx, effect, output: None, error: Some(message), unknown: true }
        }
    }
}

/// The `settled` record of an outcome.
fn settled(outcome: &Outcome) -> Event {
    Event::Settled {
        tx: outcome.tx,
        committed: outcome.committed,
        effects: outcome.effects.iter().map(|e| (e.id, e.disposition.clone(), e.tag)).collect(),
    }
}
