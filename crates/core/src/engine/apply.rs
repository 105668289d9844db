//! The one place a ledger event changes the engine's state, for live transitions and replay
//! alike.
//!
//! A live operation (ops.rs, settle.rs, group.rs, registry.rs) checks its arguments and
//! decides, builds the event(s) that record the decision, and hands each to [`Core::emit`],
//! which applies it with [`Core::apply`] and appends it to the ledger outbox. Replay
//! (recover.rs) checks each logged event against the state before it (the impossible-history
//! rules, [`super::ReplayRule`]), parses its scopes and hands it to the same [`Core::apply`].
//! So a state change exists once: adding an event kind is one arm here (plus its replay
//! checks), never a second transition function to keep in step.
//!
//! `apply` never decides and never fails: whoever calls it has checked that the event is
//! allowed. Follow-up work it finds (a waiter that may now decide) goes to the action outbox,
//! which the live engine's caller drains and replay discards. What a live caller does with
//! the state afterwards (build a release plan, hand back a late compensation, renew a lease)
//! is not a fact of the ledger and stays with the caller.
//!
//! What the ledger does not carry, and so differs between a live engine and its replay: the
//! lease length and begin time (`Given::Begin`), lease renewals, the waiting set, running late
//! compensations (`Compensating`, the `late` table), and a group's winner between
//! [`Core::choose_winner`] and its commit. `crates/core/tests/live_replay.rs` and
//! `live_state_equals_the_replay_of_its_ledger` (recovery.rs) check that nothing else differs.

use std::time::Duration;

use smallvec::SmallVec;

use super::{Core, Eff, EffStatus, Group, KeyEntry, KeyOutput, KeyState, LevelState, Tx};
use crate::effect::{Disposition, EffectClass, HeldAck, Tag};
use crate::error::TxState;
use crate::ids::{EffectId, Timestamp, TxId};
use crate::ledger::Event;
use crate::scope::Scope;

/// The status of a held effect whose release was started and whose outcome is not recorded
/// yet: live, while its tool runs; after a restart, until a probe says what happened.
pub(super) const RELEASE_IN_DOUBT: &str = "outcome unknown: the process stopped during the release";

/// What [`Core::apply`] needs besides the event: its scopes parsed (a live caller has them;
/// replay parses the logged text), and what the ledger does not log.
#[derive(Debug)]
pub(super) enum Given {
    /// Nothing beyond the event.
    Nothing,
    /// For [`Event::Begin`]: the may-touch set, the lease length and the begin time.
    Begin { may_touch: Option<SmallVec<[Scope; 2]>>, lease: Duration, began: Timestamp },
    /// For [`Event::Read`]: the scope, and the unsettled writers the read observed when the
    /// caller already knows them (`None`: apply asks [`Core::sight`]).
    Read { scope: Scope, writers: Option<SmallVec<[TxId; 2]>> },
    /// For [`Event::EffectRecorded`]: the effect's scopes.
    Effect(SmallVec<[Scope; 2]>),
}

impl Core {
    /// Applies `ev` (see the module docs) and appends it to the ledger outbox.
    pub(super) fn emit(&mut self, ev: Event, given: Given) {
        self.apply(&ev, given);
        self.events.push(ev);
    }

    /// Changes the state as `ev` says. The caller has checked that `ev` is allowed now (live:
    /// the operation's own checks; replay: [`super::ReplayRule`]) and gives what the event does
    /// not carry in `given`.
    pub(super) fn apply(&mut self, ev: &Event, given: Given) {
        match ev {
            Event::Begin { tx, epoch, agent, group, lease_until, .. } => {
                let Given::Begin { may_touch, lease, began } = given else {
                    debug_assert!(false, "begin of {tx} applied without its scopes");
                    return;
                };
                self.next_tx = self.next_tx.max(tx.0 + 1);
                self.next_epoch = self.next_epoch.max(epoch.0 + 1);
                let mut claims: SmallVec<[Scope; 4]> = SmallVec::new();
                match &may_touch {
                    Some(mt) => {
                        for s in mt {
                            if !claims.contains(s) {
                                self.index.claim(s, *epoch);
                                claims.push(s.clone());
                            }
                        }
                    }
                    None => *self.undeclared.entry(*epoch).or_insert(0) += 1,
                }
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
                        blocks_all: may_touch.is_none(),
                        may_touch,
                        reads: SmallVec::new(),
                        effects: Vec::new(),
                        claims,
                        lease_until: *lease_until,
                        lease,
                        in_flight: 0,
                        reason: None,
                        began,
                        lv: LevelState { snapshot: self.stamp, ..Default::default() },
                    },
                );
            }
            Event::Read { tx, version, .. } => {
                let Given::Read { scope, writers } = given else {
                    debug_assert!(false, "read of {tx} applied without its scope");
                    return;
                };
                let writers = writers.unwrap_or_else(|| self.sight(*tx, &scope).writers);
                let (stamp, reg) = (self.stamp, self.registry.version);
                let Some(t) = self.txs.get_mut(tx) else { return };
                t.reads.push((scope, *version));
                // What the read observed beyond its version: its logical time, the registry
                // pin and its causal predecessors (the levels, docs/levels.md).
                t.lv.read_at.push(stamp);
                t.lv.reg_seen.get_or_insert(reg);
                for c in writers {
                    if !t.lv.preds.contains(&c) {
                        t.lv.preds.push(c);
                    }
                }
            }
            Event::EffectRecorded { tx, effect, tool, class, key, args, compensable, adapter_key, .. } => {
                let Given::Effect(scopes) = given else {
                    debug_assert!(false, "effect {effect} of {tx} applied without its scopes");
                    return;
                };
                // A key that already executed and settled replays its output: the effect
                // touches nothing. Otherwise an adapter's key is held by this effect.
                let replayed =
                    *adapter_key && matches!(self.keys.get(key), Some(KeyEntry { state: KeyState::Done(_), .. }));
                let status = if replayed {
                    EffStatus::Replayed
                } else if class.executes_eagerly() {
                    EffStatus::InFlight
                } else if *class == EffectClass::Bufferable {
                    EffStatus::Held(HeldAck::Staged)
                } else {
                    EffStatus::Held(HeldAck::Queued)
                };
                if *adapter_key && !replayed {
                    self.keys.insert(key.clone(), KeyEntry::pending(*tx, *effect, tool, args));
                }
                let reg = self.registry.version;
                let Some(t) = self.txs.get_mut(tx) else { return };
                t.lv.reg_seen.get_or_insert(reg);
                if status == EffStatus::InFlight {
                    t.in_flight += 1;
                }
                let epoch = t.epoch;
                let eff = Eff {
                    tool: tool.clone(),
                    class: *class,
                    scopes,
                    key: key.clone(),
                    global_key: *adapter_key,
                    args: args.clone(),
                    compensable: *compensable,
                    status,
                    output: None,
                };
                self.mark_dirty(epoch, &eff);
                if let Some(t) = self.txs.get_mut(tx) {
                    t.effects.push(eff);
                }
            }
            Event::EffectExecuted { tx, effect, output } => {
                // A late result (its transaction settled while the call ran) changes nothing
                // here; its compensation follows.
                let Some(t) = self.txs.get_mut(tx) else { return };
                let Some(e) = t.effects.get_mut(effect.0 as usize) else { return };
                if e.status == EffStatus::InFlight {
                    e.status = EffStatus::Executed;
                    t.in_flight -= 1;
                    t.lv.ext_order.push(effect.0);
                }
                // Otherwise a replayed key: its output is recorded right after it.
                e.output = Some(output.clone());
            }
            Event::EffectFailed { tx, effect, unknown, .. } => {
                let Some(t) = self.txs.get_mut(tx) else { return };
                let Some(e) = t.effects.get_mut(effect.0 as usize) else { return };
                if e.status == EffStatus::InFlight {
                    t.in_flight -= 1;
                }
                e.status = EffStatus::Failed { unknown: *unknown };
            }
            Event::Sealed { tx } => {
                if self.txs.contains_key(tx) {
                    let epoch = self.freeze_footprint(*tx);
                    self.wake_after(epoch);
                }
            }
            Event::Decided { tx, commit: true, stamp, .. } => {
                let stamp = stamp.unwrap_or(self.stamp);
                let reg = self.registry.version;
                let Some(t) = self.txs.get_mut(tx) else { return };
                t.state = TxState::Committing;
                t.lv.stamp = Some(stamp);
                t.lv.reg_decided = Some(reg);
                let (epoch, group) = (t.epoch, t.group);
                self.stamp = self.stamp.max(stamp);
                self.waiting.remove(&(epoch, *tx));
                self.committing.push(*tx);
                if let Some(gr) = group.and_then(|g| self.groups.get_mut(&g)) {
                    gr.winner = Some(*tx);
                }
                let t = &self.txs[tx];
                for e in t.effects.iter().filter(|e| e.status != EffStatus::Replayed) {
                    for s in &e.scopes {
                        self.index.record_write(s, stamp);
                    }
                }
                // Readers waiting behind this commit are now stale: let them abort early.
                self.wake_after(epoch);
            }
            Event::Decided { tx, commit: false, reason, .. } => {
                let Some(t) = self.txs.get(tx) else { return };
                if t.state == TxState::Committing {
                    // A retraction: the first release failed before anything left.
                    self.retract(*tx);
                }
                let Some(t) = self.txs.get_mut(tx) else { return };
                let (lease, epoch) = ((t.lease_until, *tx), t.epoch);
                t.state = TxState::Aborting;
                t.reason = reason.clone();
                self.leases.remove(&lease);
                self.waiting.remove(&(epoch, *tx));
            }
            Event::ReleaseStarted { tx, effect } => {
                // Until a `released` record says otherwise, the outcome is unknown.
                if let Some(e) = self.txs.get_mut(tx).and_then(|t| t.effects.get_mut(effect.0 as usize)) {
                    e.status = EffStatus::ReleaseFailed { error: RELEASE_IN_DOUBT.into(), unknown: true };
                }
            }
            Event::Released { tx, effect, output, error, unknown } => {
                let Some(t) = self.txs.get_mut(tx) else { return };
                let Some(e) = t.effects.get_mut(effect.0 as usize) else { return };
                match error {
                    None => {
                        e.status = EffStatus::Released;
                        e.output = output.clone();
                        t.lv.ext_order.push(effect.0);
                    }
                    Some(m) => e.status = EffStatus::ReleaseFailed { error: m.clone().into(), unknown: *unknown },
                }
            }
            Event::Compensated { tx, effect, residue, error } => {
                match self.txs.get_mut(tx).and_then(|t| t.effects.get_mut(effect.0 as usize)) {
                    Some(e) => {
                        e.status = match error {
                            None => EffStatus::Compensated { residue: residue.clone() },
                            Some(m) => EffStatus::CompensationFailed(m.clone()),
                        };
                    }
                    // A late compensation of a settled transaction: a clean one frees the key
                    // its settlement left unresolved.
                    None if residue.is_none() && error.is_none() => {
                        let key = self
                            .keys
                            .iter()
                            .find(|(_, k)| {
                                k.tx == *tx && k.effect == *effect && matches!(k.state, KeyState::Unresolved)
                            })
                            .map(|(key, _)| key.clone());
                        if let Some(key) = key {
                            self.keys.remove(&key);
                        }
                    }
                    None => {}
                }
            }
            Event::Settled { tx, committed, effects } => {
                let Some(t) = self.txs.remove(tx) else { return };
                // A commit request drops the lease without an event; drop it here too, or
                // replayed lease entries would grow with history.
                self.leases.remove(&(t.lease_until, *tx));
                if *committed {
                    self.committed += 1;
                } else {
                    self.aborted += 1;
                }
                self.finish(*tx, t, *committed, effects);
            }
            Event::ToolChanged { tool, version, present } => self.registry.apply(tool, *version, *present),
            // Another component's record: the engine keeps nothing of it (replay also leaves a
            // group's run of begins open across it).
            Event::Extension { .. } => {}
            Event::Touched { undoes, .. } => {
                let Given::Effect(scopes) = given else {
                    debug_assert!(false, "touched by {undoes} applied without its scopes");
                    return;
                };
                self.touch(*undoes, &scopes);
            }
        }
    }

    /// A compensation outside its transaction's settlement writes `scopes` (docs/engine.md,
    /// "A compensation advances the version"): one fresh stamp for all of them, and at L2 and
    /// above every unsettled, undecided transaction that read an overlapping scope is doomed
    /// (its commit aborts `cascading_abort` naming `undoes`). Waiters that can now only abort
    /// are woken.
    fn touch(&mut self, undoes: TxId, scopes: &[Scope]) {
        // Saturating: at the end of the range the next commit is refused (`Exhausted`).
        self.stamp = self.stamp.saturating_add(1);
        for s in scopes {
            self.index.record_write(s, self.stamp);
        }
        if self.cfg.level >= super::Level::L2 {
            for t in self.txs.values_mut() {
                if t.lv.doomed.is_none()
                    && t.lv.stamp.is_none()
                    && t.reads.iter().any(|(r, _)| scopes.iter().any(|s| s.overlaps(r)))
                {
                    t.lv.doomed = Some(undoes);
                }
            }
        }
        self.wake_after(crate::ids::Epoch(0));
    }

    /// Releases everything a finished transaction held, settles its keys by the dispositions
    /// of its `settled` record, and wakes those it blocked.
    fn finish(&mut self, tx: TxId, t: Tx, committed: bool, effects: &[(EffectId, Disposition, Tag)]) {
        self.settle_marks(&t, committed);
        if t.lv.stamp.is_some() {
            self.committing.retain(|c| *c != tx);
        }
        if self.cfg.trace {
            let record = self.trace_record(tx, &t, committed);
            self.traces.push(record);
        }
        for s in &t.claims {
            self.index.unclaim(s, t.epoch);
        }
        if t.blocks_all {
            self.remove_undeclared(t.epoch);
        }
        self.waiting.remove(&(t.epoch, tx));
        for ((i, e), (_, disposition, tag)) in t.effects.iter().enumerate().zip(effects) {
            if !e.global_key {
                continue;
            }
            let Some(entry) = self.keys.get_mut(&e.key) else { continue };
            if entry.tx != tx || entry.effect.0 as usize != i {
                continue;
            }
            match (disposition, tag) {
                (Disposition::Discarded | Disposition::Compensated, Tag::Clean) => {
                    self.keys.remove(&e.key);
                }
                (
                    Disposition::Accepted | Disposition::Applied | Disposition::Fired | Disposition::NotCompensable,
                    _,
                ) => {
                    entry.state = KeyState::Done(KeyOutput::Value(e.output.clone().unwrap_or_default()));
                }
                (Disposition::NotReleased | Disposition::ReleaseFailed, _) => {
                    self.keys.remove(&e.key);
                }
                _ => entry.state = KeyState::Unresolved,
            }
        }
        if let Some(g) = t.group {
            self.group_member_finished(g, tx);
        }
        self.wake_after(t.epoch);
    }
}
