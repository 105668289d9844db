//! Rebuilding the engine's projections from the ledger after a restart.
//!
//! Every projection (unfinished transactions, claims, scope versions, idempotency keys,
//! groups, id allocators) is a function of the event sequence. Replaying applies each event's
//! effect on the state directly (it does not re-run decisions), then classifies the work the
//! crash interrupted:
//!
//! | what the ledger shows for an effect                    | recovery                              |
//! |--------------------------------------------------------|---------------------------------------|
//! | eager effect recorded, no executed/failed record       | in doubt: ask the probe, else `unresolved`; the transaction aborts |
//! | committing, held effect with no `ReleaseStarted`       | release it now (it never left)        |
//! | committing, `ReleaseStarted` but no `Released`         | outcome unknown: never fired again; `unresolved` |
//! | aborting, executed compensable effect not compensated  | compensate it (compensations may run twice; handlers must be idempotent) |
//! | open or sealed, lease ended while the process was down | abort `lease_expired`                 |

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Core, CoreConfig, Eff, EffStatus, Group, KeyEntry, KeyState, Tx};
use crate::effect::{AbortReason, EffectClass, HeldAck};
use crate::error::TxState;
use crate::ids::{EffectId, Timestamp, TxId};
use crate::ledger::Event;
use crate::scope::{Scope, ScopeRegistry};

/// An eager call whose outcome the ledger does not know.
#[derive(Debug, Clone)]
pub struct InDoubt {
    /// Transaction.
    pub tx: TxId,
    /// Effect.
    pub effect: EffectId,
    /// Tool (its probe, if any, decides).
    pub tool: Arc<str>,
    /// Arguments.
    pub args: Arc<serde_json::Value>,
}

/// What recovery found and what the runtime must finish.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Events replayed.
    pub events: u64,
    /// Transactions still unfinished after replay.
    pub unfinished: usize,
    /// Eager calls in doubt: resolve each with [`Core::executed`] (probe result) and the
    /// transaction aborts; without a probe report `Err((msg, true))`.
    pub in_doubt: Vec<InDoubt>,
    /// Commits to continue: call [`Core::resume_commit`] and release what it returns.
    pub committing: Vec<TxId>,
    /// Aborts to continue: call [`Core::resume_abort`] and run the plan.
    pub aborting: Vec<TxId>,
    /// Open transactions whose leases ended while the process was down (aborted; their
    /// plans are queued as actions).
    pub expired: Vec<TxId>,
    /// Open or sealed transactions whose leases still run (their agents may come back
    /// through a server; an embedded engine's agents died with the process).
    pub open: Vec<TxId>,
}

/// A ledger that cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ledger replay failed at event {index} ({event}): {detail}")]
pub struct RecoverError {
    /// 0-based position in the replayed sequence.
    pub index: u64,
    /// The event kind.
    pub event: String,
    /// What is inconsistent.
    pub detail: String,
}

impl Core {
    /// Rebuilds an engine from its ledger. `now` decides which leases have expired.
    pub fn recover(
        cfg: CoreConfig,
        scopes: ScopeRegistry,
        events: impl IntoIterator<Item = Event>,
        now: Timestamp,
    ) -> Result<(Core, Recovery), RecoverError> {
        let mut replay = super::Replay::new(cfg, scopes);
        for ev in events {
            replay.apply(&ev)?;
        }
        Ok(replay.finish(now))
    }

    /// Classifies the work a replayed engine's ledger left unfinished (see the module docs)
    /// and aborts the transactions whose leases ended by `now`. `core` holds exactly the
    /// replayed state (checkpoint plus tail, or the whole ledger) with empty outboxes.
    pub(super) fn classify(mut core: Core, events: u64, now: Timestamp) -> (Core, Recovery) {
        let mut rec = Recovery { events, ..Recovery::default() };
        // Nothing replayed is a new fact.
        core.events.clear();
        core.actions.clear();
        core.traces.clear();
        let mut ids: Vec<TxId> = core.txs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let t = &core.txs[&id];
            match t.state {
                TxState::Committing => rec.committing.push(id),
                TxState::Aborting => rec.aborting.push(id),
                _ => {
                    for (i, e) in t.effects.iter().enumerate() {
                        if e.status == EffStatus::InFlight {
                            rec.in_doubt.push(InDoubt {
                                tx: id,
                                effect: EffectId(i as u32),
                                tool: e.tool.clone(),
                                args: e.args.clone(),
                            });
                        }
                    }
                }
            }
        }
        let before = core.actions.len();
        core.expire_leases(now);
        rec.expired = core.actions[before..]
            .iter()
            .filter_map(|a| match a {
                super::Action::RunAbort(p) => Some(p.tx),
                _ => None,
            })
            .collect();
        rec.open = core
            .txs
            .iter()
            .filter(|(_, t)| matches!(t.state, TxState::Open | TxState::Sealed))
            .map(|(id, _)| *id)
            .collect();
        rec.open.sort_unstable();
        rec.unfinished = core.txs.len();
        (core, rec)
    }

    fn parse_logged(&self, s: &str) -> Result<Scope, String> {
        self.scopes.parse(s).map_err(|e| format!("logged scope no longer parses: {e}"))
    }

    pub(super) fn apply(&mut self, ev: &Event) -> Result<(), String> {
        let missing = |tx: TxId| format!("event for {tx}, which is not open at this point of the ledger");
        match ev {
            Event::Begin { tx, epoch, agent, group, may_touch, lease_until } => {
                self.next_tx = self.next_tx.max(tx.0 + 1);
                self.next_epoch = self.next_epoch.max(epoch.0 + 1);
                let mut claims: SmallVec<[Scope; 4]> = SmallVec::new();
                let mt = match may_touch {
                    Some(list) => {
                        let mut v = SmallVec::new();
                        for s in list {
                            let s = self.parse_logged(s)?;
                            if !claims.contains(&s) {
                                self.index.claim(&s, *epoch);
                                claims.push(s.clone());
                            }
                            v.push(s);
                        }
                        Some(v)
                    }
                    None => {
                        *self.undeclared.entry(*epoch).or_insert(0) += 1;
                        None
                    }
                };
                if let Some(g) = group {
                    self.next_group = self.next_group.max(g.0 + 1);
                    self.groups
                        .entry(*g)
                        .or_insert_with(|| Group { branches: SmallVec::new(), winner: None })
                        .branches
                        .push(*tx);
                }
                self.leases.insert((*lease_until, *tx));
                self.txs.insert(
                    *tx,
                    Tx {
                        epoch: *epoch,
                        agent: agent.clone(),
                        group: *group,
                        state: TxState::Open,
                        blocks_all: mt.is_none(),
                        may_touch: mt,
                        reads: SmallVec::new(),
                        effects: Vec::new(),
                        claims,
                        lease_until: *lease_until,
                        lease: self.cfg.lease,
                        in_flight: 0,
                        reason: None,
                        began: Timestamp(0),
                        lv: super::LevelState { snapshot: self.stamp, ..Default::default() },
                    },
                );
            }
            Event::Read { tx, scope, version } => {
                let s = self.parse_logged(scope)?;
                let now = self.stamp;
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                t.reads.push((s, *version));
                t.lv.read_at.push(now);
            }
            Event::ToolChanged { tool, version, present } => {
                self.registry.apply(tool, *version, *present);
            }
            Event::EffectRecorded { tx, effect, tool, class, scopes, key, args, compensable, adapter_key } => {
                let mut parsed = SmallVec::new();
                for s in scopes {
                    parsed.push(self.parse_logged(s)?);
                }
                let replay =
                    *adapter_key && matches!(self.keys.get(key), Some(KeyEntry { state: KeyState::Done(_), .. }));
                let status = if replay {
                    EffStatus::Replayed
                } else if class.executes_eagerly() {
                    EffStatus::InFlight
                } else if *class == EffectClass::Bufferable {
                    EffStatus::Held(HeldAck::Staged)
                } else {
                    EffStatus::Held(HeldAck::Queued)
                };
                if *adapter_key && !replay {
                    self.keys.insert(key.clone(), KeyEntry { tx: *tx, effect: *effect, state: KeyState::Pending });
                }
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                if effect.0 as usize != t.effects.len() {
                    return Err(format!("effect {effect} of {tx} out of issuance order"));
                }
                if status == EffStatus::InFlight {
                    t.in_flight += 1;
                }
                t.effects.push(Eff {
                    tool: tool.clone(),
                    class: *class,
                    scopes: parsed,
                    key: key.clone(),
                    global_key: *adapter_key,
                    args: args.clone(),
                    compensable: *compensable,
                    status,
                    output: None,
                });
            }
            Event::EffectExecuted { tx, effect, output } => {
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                let e = t.effects.get_mut(effect.0 as usize).ok_or_else(|| format!("no effect {effect} in {tx}"))?;
                if e.status == EffStatus::InFlight {
                    e.status = EffStatus::Executed;
                    t.in_flight -= 1;
                }
                e.output = Some(output.clone());
            }
            Event::EffectFailed { tx, effect, unknown, .. } => {
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                let e = t.effects.get_mut(effect.0 as usize).ok_or_else(|| format!("no effect {effect} in {tx}"))?;
                if e.status == EffStatus::InFlight {
                    t.in_flight -= 1;
                }
                e.status = EffStatus::Failed { unknown: *unknown };
            }
            Event::Sealed { tx } => {
                if !self.txs.contains_key(tx) {
                    return Err(missing(*tx));
                }
                self.freeze_footprint(*tx);
            }
            Event::Decided { tx, commit: true, stamp, .. } => {
                let stamp = stamp.ok_or_else(|| format!("commit of {tx} without a stamp"))?;
                self.stamp = self.stamp.max(stamp);
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                t.state = TxState::Committing;
                t.lv.stamp = Some(stamp);
                self.committing.push(*tx);
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                for e in &t.effects {
                    if e.status != EffStatus::Replayed {
                        for s in &e.scopes {
                            self.index.record_write(s, stamp);
                        }
                    }
                }
            }
            Event::Decided { tx, commit: false, reason, .. } => {
                if self.txs.get(tx).is_some_and(|t| t.state == TxState::Committing) {
                    self.retract(*tx);
                }
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                t.state = TxState::Aborting;
                t.reason = reason.clone();
                let lease = (t.lease_until, *tx);
                self.leases.remove(&lease);
            }
            Event::ReleaseStarted { tx, effect } => {
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                let e = t.effects.get_mut(effect.0 as usize).ok_or_else(|| format!("no effect {effect} in {tx}"))?;
                // Until a Released record says otherwise, the outcome is unknown.
                e.status = EffStatus::ReleaseFailed {
                    error: "outcome unknown: the process stopped during the release".into(),
                    unknown: true,
                };
            }
            Event::Released { tx, effect, output, error, unknown } => {
                let t = self.txs.get_mut(tx).ok_or_else(|| missing(*tx))?;
                let e = t.effects.get_mut(effect.0 as usize).ok_or_else(|| format!("no effect {effect} in {tx}"))?;
                match error {
                    None => {
                        e.status = EffStatus::Released;
                        e.output = output.clone();
                    }
                    Some(m) => e.status = EffStatus::ReleaseFailed { error: m.clone(), unknown: *unknown },
                }
            }
            Event::Compensated { tx, effect, residue, error } => {
                // Late compensations arrive for settled transactions: nothing to rebuild.
                let Some(t) = self.txs.get_mut(tx) else { return Ok(()) };
                let e = t.effects.get_mut(effect.0 as usize).ok_or_else(|| format!("no effect {effect} in {tx}"))?;
                e.status = match error {
                    None => EffStatus::Compensated { residue: residue.clone() },
                    Some(m) => EffStatus::CompensationFailed(m.clone()),
                };
            }
            Event::Settled { tx, committed, effects } => {
                let t = self.txs.remove(tx).ok_or_else(|| missing(*tx))?;
                // The live engine dropped the lease when the commit was requested (no event);
                // drop it here, or replayed lease entries would grow with history.
                self.leases.remove(&(t.lease_until, *tx));
                let outcome = crate::effect::Outcome {
                    tx: *tx,
                    epoch: t.epoch,
                    agent: t.agent.clone(),
                    committed: *committed,
                    reason: t.reason.clone(),
                    effects: effects
                        .iter()
                        .zip(&t.effects)
                        .map(|((id, disposition, tag), e)| crate::effect::EffectOutcome {
                            id: *id,
                            tool: e.tool.clone(),
                            class: e.class,
                            key: e.key.clone(),
                            disposition: disposition.clone(),
                            tag: *tag,
                            detail: None,
                        })
                        .collect(),
                    partial: None,
                };
                if outcome.effects.len() != t.effects.len() {
                    return Err(format!(
                        "settlement of {tx} lists {} effects, the ledger recorded {}",
                        effects.len(),
                        t.effects.len()
                    ));
                }
                if *committed {
                    self.committed += 1;
                } else {
                    self.aborted += 1;
                }
                self.finish(*tx, t, &outcome);
                self.events.clear();
                self.actions.clear();
            }
        }
        Ok(())
    }

    /// Continues an interrupted commit: returns the held effects never attempted, in
    /// issuance order (those with an unknown outcome stay unreleased and are tagged).
    pub fn resume_commit(&self, tx: TxId) -> Result<super::ReleasePlan, crate::EngineError> {
        let t = self.tx(tx)?;
        if t.state != TxState::Committing {
            return Err(crate::EngineError::WrongState { tx, op: "resume the commit of", state: t.state, hint: "" });
        }
        if t.effects.iter().any(|e| matches!(e.status, EffStatus::ReleaseFailed { .. })) {
            // A release failed or is in doubt: nothing after it may fire.
            return Ok(super::ReleasePlan { tx, releases: Vec::new() });
        }
        let releases = t
            .effects
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.status, EffStatus::Held(_)))
            .map(|(i, e)| super::ReleaseTask {
                effect: EffectId(i as u32),
                tool: e.tool.clone(),
                class: e.class,
                args: e.args.clone(),
            })
            .collect();
        Ok(super::ReleasePlan { tx, releases })
    }

    /// The held effects of an interrupted commit whose release outcome is unknown (started
    /// and never recorded, or recorded as unknown), in issuance order: ask their tools'
    /// probes and report with [`Core::release_probed`] before [`Core::resume_commit`].
    pub fn unknown_releases(&self, tx: TxId) -> Result<Vec<super::ReleaseTask>, crate::EngineError> {
        let t = self.tx(tx)?;
        Ok(t.effects
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.status, EffStatus::ReleaseFailed { unknown: true, .. }))
            .map(|(i, e)| super::ReleaseTask {
                effect: EffectId(i as u32),
                tool: e.tool.clone(),
                class: e.class,
                args: e.args.clone(),
            })
            .collect())
    }

    /// Records what a probe found for a release whose outcome was unknown after a restart
    /// (`Done`: it happened; otherwise it did not, or the probe did not know). Logged as the
    /// `released` record the crash lost.
    pub fn release_probed(
        &mut self,
        tx: TxId,
        effect: EffectId,
        result: crate::CallOutcome,
    ) -> Result<(), crate::EngineError> {
        let t = self.tx_mut(tx)?;
        let ok = t.state == TxState::Committing
            && t.effects
                .get(effect.0 as usize)
                .is_some_and(|e| matches!(e.status, EffStatus::ReleaseFailed { unknown: true, .. }));
        if !ok {
            return Err(crate::EngineError::InvalidArgument {
                field: "effect",
                value: format!("{tx}{effect}"),
                expected: "a release of a committing transaction whose outcome is unknown",
            });
        }
        let e = &mut t.effects[effect.0 as usize];
        let (error, unknown) = match result {
            crate::CallOutcome::Done { output } => {
                e.status = EffStatus::Released;
                e.output = Some(output.clone());
                self.events.push(Event::Released { tx, effect, output: Some(output), error: None, unknown: false });
                return Ok(());
            }
            crate::CallOutcome::NotApplied { message, .. } => (message, false),
            crate::CallOutcome::Unknown { message } => (message, true),
        };
        e.status = EffStatus::ReleaseFailed { error: error.clone(), unknown };
        self.events.push(Event::Released { tx, effect, output: None, error: Some(error), unknown });
        Ok(())
    }

    /// Continues an interrupted abort: the compensations not yet reported.
    pub fn resume_abort(&self, tx: TxId) -> Result<super::AbortPlan, crate::EngineError> {
        let t = self.tx(tx)?;
        if t.state != TxState::Aborting {
            return Err(crate::EngineError::WrongState { tx, op: "resume the abort of", state: t.state, hint: "" });
        }
        let compensations = t
            .effects
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, e)| super::settle::needs_compensation(e))
            .map(|(i, e)| super::CompensationTask {
                tx,
                effect: EffectId(i as u32),
                tool: e.tool.clone(),
                args: e.args.clone(),
                output: e.output.clone().unwrap_or_default(),
                blind: e.status != EffStatus::Executed,
            })
            .collect();
        Ok(super::AbortPlan { tx, reason: t.reason.clone().unwrap_or(AbortReason::LeaseExpired), compensations })
    }
}
