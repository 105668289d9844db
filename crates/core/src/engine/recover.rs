//! Rebuilding the engine's projections from the ledger after a restart.
//!
//! Every projection (unfinished transactions, claims, scope versions, idempotency keys,
//! groups, id allocators) is a function of the event sequence. Replaying checks each event
//! against the state before it ([`ReplayRule`]) and applies it with the live engine's own
//! `Core::apply` (apply.rs; it does not re-run decisions), then classifies the work the crash
//! interrupted:
//!
//! | what the ledger shows for an effect                    | recovery                              |
//! |--------------------------------------------------------|---------------------------------------|
//! | eager effect recorded, no executed/failed record       | in doubt: ask the probe, else `unresolved`; the transaction aborts |
//! | committing, held effect with no `ReleaseStarted`       | release it now (it never left)        |
//! | committing, `ReleaseStarted` but no `Released`         | outcome unknown: never fired again; `unresolved` |
//! | aborting, executed compensable effect not compensated  | compensate it (compensations may run twice; handlers must be idempotent) |
//! | open or sealed, lease ended while the process was down | abort `lease_expired`                 |

use std::collections::BTreeSet;
use std::sync::Arc;

use smallvec::SmallVec;

use super::apply::Given;
use super::{Core, CoreConfig, EffStatus, KeyState, Tx};
use crate::effect::AbortReason;
use crate::error::TxState;
use crate::ids::{EffectId, Epoch, GroupId, Timestamp, TxId};
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

/// The rule of the ledger an event breaks (see [`RecoverError`]). A ledger the engine wrote
/// never breaks one; a ledger that does was edited, reordered, duplicated, renumbered or forged,
/// and replaying it would rebuild a state the engine can never be in (issue 11: a duplicated
/// `begin` hung the next run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplayRule {
    /// A `begin` for a transaction id that is already unfinished.
    DuplicateBegin,
    /// An event for a transaction id that never began.
    UnknownTx,
    /// An event for a transaction that has already settled (other than a late result of a
    /// call that was in flight at its settlement, or that result's compensation).
    FinishedTx,
    /// A transaction id not above every id begun before it (ids are allocated in order and
    /// never reused), or 0.
    TxIdNotIncreasing,
    /// An epoch not above every epoch begun before it (only the branches of one speculation
    /// group, begun one after the other, share one), or 0.
    EpochNotIncreasing,
    /// A speculation group id not above every group begun before it, a branch of a group
    /// begun after other events, or more than 1,024 branches.
    GroupOrder,
    /// A commit stamp not above every earlier commit stamp (or missing), a read of a version
    /// above every stamp handed out, or a tool registry version that does not increase.
    StampNotIncreasing,
    /// A transition the transaction's or the effect's current state does not allow (a read
    /// after seal, a second decision, a release of an effect that is not held, ...).
    IllegalTransition,
    /// A value at `u64::MAX`, which no allocator hands out (the next one would overflow).
    Overflow,
    /// A scope that does not parse, or lies outside the transaction's declared may-touch set.
    BadScope,
    /// An effect out of issuance order, or one the transaction does not have.
    EffectOrder,
    /// An idempotency key used in a way the engine refuses (held by an unfinished
    /// transaction, or unresolved).
    KeyConflict,
    /// A settlement whose effect list does not match the effects recorded.
    SettlementMismatch,
}

impl ReplayRule {
    /// A short name of the rule, as used in error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayRule::DuplicateBegin => "duplicate begin",
            ReplayRule::UnknownTx => "event for an unknown transaction",
            ReplayRule::FinishedTx => "event for a finished transaction",
            ReplayRule::TxIdNotIncreasing => "transaction ids must increase",
            ReplayRule::EpochNotIncreasing => "epochs must increase",
            ReplayRule::GroupOrder => "speculation group out of order",
            ReplayRule::StampNotIncreasing => "stamps and versions must increase",
            ReplayRule::IllegalTransition => "transition not allowed from the current state",
            ReplayRule::Overflow => "value would overflow",
            ReplayRule::BadScope => "bad scope",
            ReplayRule::EffectOrder => "effect out of issuance order",
            ReplayRule::KeyConflict => "idempotency key conflict",
            ReplayRule::SettlementMismatch => "settlement does not match the effects",
        }
    }
}

impl std::fmt::Display for ReplayRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A ledger that cannot be replayed: the event at `lsn` breaks `rule`. Never retryable: the
/// ledger must be restored from a backup (or the event removed by an operator who knows why it
/// is there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ledger replay refused at LSN {lsn} ({event}): {rule}: {detail}")]
pub struct RecoverError {
    /// 0-based position in the ledger (`lsn - 1`).
    pub index: u64,
    /// The LSN of the offending event.
    pub lsn: u64,
    /// The event kind.
    pub event: String,
    /// The rule it breaks.
    pub rule: ReplayRule,
    /// What is inconsistent, naming the transaction, effect or value.
    pub detail: String,
}

impl RecoverError {
    /// Whether retrying may succeed (never: the ledger must change).
    pub fn retryable(&self) -> bool {
        false
    }
}

/// Bookkeeping only replay needs to check the ledger's order (a function of the ledger,
/// checkpointed with the projections; a live engine does not maintain it).
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(super) struct ReplayGuard {
    /// The largest commit stamp decided so far.
    last_commit_stamp: u64,
    /// The group (and its epoch) whose branch the previous event began: the only group a
    /// following `begin` may add a branch to.
    open_group: Option<(GroupId, Epoch)>,
    /// Calls in flight when their transaction settled: a late executed/failed record may
    /// still come.
    late_calls: BTreeSet<(TxId, EffectId)>,
    /// Effects of aborted transactions that executed (or whose outcome is unknown) and whose
    /// compensation was not recorded before settlement, or that executed late: a late
    /// compensated record may still come.
    late_comps: BTreeSet<(TxId, EffectId)>,
    /// Loaded from a checkpoint written before these checks: the late sets above are unknown
    /// for transactions settled before it, so late records for settled transactions are
    /// accepted (and ignored), as that build did.
    lenient_late: bool,
}

impl ReplayGuard {
    /// The guard of a checkpoint that has none (written by an older build).
    pub(super) fn of_old_checkpoint() -> ReplayGuard {
        ReplayGuard { lenient_late: true, ..ReplayGuard::default() }
    }
}

type Refusal = (ReplayRule, String);

fn refuse<T>(rule: ReplayRule, detail: impl Into<String>) -> Result<T, Refusal> {
    Err((rule, detail.into()))
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

    fn parse_logged(&self, s: &str) -> Result<Scope, Refusal> {
        // What was accepted once still replays: no size limits here (the index is iterative,
        // so depth costs no stack).
        self.scopes.parse_logged(s).map_err(|e| (ReplayRule::BadScope, format!("logged scope no longer parses: {e}")))
    }

    /// The unfinished transaction an event names, or why there is none.
    fn replay_tx(&mut self, tx: TxId) -> Result<&mut Tx, Refusal> {
        if !self.txs.contains_key(&tx) {
            return if tx.0 == 0 || tx.0 >= self.next_tx {
                refuse(ReplayRule::UnknownTx, format!("{tx} never began"))
            } else {
                refuse(ReplayRule::FinishedTx, format!("{tx} has already settled"))
            };
        }
        Ok(self.txs.get_mut(&tx).expect("checked above"))
    }

    /// Replays one ledger event: refuses any event the engine could not have written at this
    /// point of the ledger (see [`ReplayRule`]), then applies it with the live engine's own
    /// [`Core::apply`] (apply.rs). Only the checks and the guard's bookkeeping are here.
    pub(super) fn replay_event(&mut self, ev: &Event) -> Result<(), Refusal> {
        use ReplayRule as R;
        let open_group = self.guard.open_group.take();
        let no_effect = |tx: TxId, effect: EffectId| (R::EffectOrder, format!("{tx} has no effect {effect}"));
        match ev {
            Event::Begin { tx, epoch, group, may_touch, .. } => {
                if self.txs.contains_key(tx) {
                    return refuse(R::DuplicateBegin, format!("{tx} is already unfinished"));
                }
                for (what, v) in [("transaction id", tx.0), ("epoch", epoch.0), ("group id", group.map_or(0, |g| g.0))]
                {
                    if v == u64::MAX {
                        return refuse(R::Overflow, format!("{what} {v} is u64::MAX"));
                    }
                }
                if tx.0 == 0 || tx.0 < self.next_tx {
                    return refuse(
                        R::TxIdNotIncreasing,
                        format!("{tx} begins after transaction ids up to tx-{} were used", self.next_tx - 1),
                    );
                }
                match group {
                    Some(g) if open_group.is_some_and(|(og, _)| og == *g) => {
                        let (_, ge) = open_group.expect("matched");
                        if *epoch != ge {
                            return refuse(
                                R::EpochNotIncreasing,
                                format!("branch {tx} of {g} at {epoch}, the group's epoch is {ge}"),
                            );
                        }
                        if self.groups.get(g).is_some_and(|gr| gr.branches.len() >= 1024) {
                            return refuse(R::GroupOrder, format!("{g} has more than 1024 branches"));
                        }
                    }
                    Some(g) if g.0 == 0 || g.0 < self.next_group => {
                        return refuse(
                            R::GroupOrder,
                            format!(
                                "branch {tx} of {g} begins after other events (groups up to group-{} were begun)",
                                self.next_group - 1
                            ),
                        );
                    }
                    _ if epoch.0 == 0 || epoch.0 < self.next_epoch => {
                        return refuse(
                            R::EpochNotIncreasing,
                            format!("{tx} begins at {epoch}, after epochs up to e{} were used", self.next_epoch - 1),
                        );
                    }
                    _ => {}
                }
                let mt = match may_touch {
                    Some(list) => {
                        let mut v = SmallVec::new();
                        for s in list {
                            v.push(self.parse_logged(s)?);
                        }
                        Some(v)
                    }
                    None => None,
                };
                // Every check passed: change the state.
                self.apply(ev, Given::Begin { may_touch: mt, lease: self.cfg.lease, began: Timestamp(0) });
                if let Some(g) = group {
                    self.guard.open_group = Some((*g, *epoch));
                }
            }
            Event::Read { tx, scope, version } => {
                let s = self.parse_logged(scope)?;
                let now = self.stamp;
                let all_stamps = self.cfg.level >= super::Level::L2;
                let t = self.replay_tx(*tx)?;
                if t.state != TxState::Open {
                    return refuse(R::IllegalTransition, format!("read of `{s}` by {tx}, which is {}", t.state));
                }
                if let Some(mt) = &t.may_touch
                    && !mt.iter().any(|m| m.covers(&s))
                {
                    return refuse(R::BadScope, format!("read of `{s}` by {tx} outside its declared may-touch set"));
                }
                // Stamps that were not commits (retractions at L2, aborts at L1) are reproduced
                // only by a replay at a level that makes them; at L2 and above every one is.
                if version.0 > now && all_stamps {
                    return refuse(
                        R::StampNotIncreasing,
                        format!("{tx} read `{s}` at {version}, above the last stamp {now}"),
                    );
                }
                if t.reads.iter().any(|(r, v)| *r == s && v == version) {
                    return refuse(R::IllegalTransition, format!("{tx} read `{s}` at {version} twice"));
                }
                self.apply(ev, Given::Read { scope: s, writers: None });
            }
            Event::Extension { .. } => {
                // Another component's record: invisible to the engine (it does not even end
                // a group's run of begins).
                self.guard.open_group = open_group;
                self.apply(ev, Given::Nothing);
            }
            Event::Touched { scopes, undoes, effect, .. } => {
                let mut parsed = SmallVec::new();
                for s in scopes {
                    parsed.push(self.parse_logged(s)?);
                }
                if parsed.is_empty() {
                    return refuse(
                        R::BadScope,
                        format!("touched by the compensation of {undoes}{effect} has no scope"),
                    );
                }
                if undoes.0 == 0 || undoes.0 >= self.next_tx {
                    return refuse(
                        R::IllegalTransition,
                        format!("touched by the compensation of {undoes}{effect}, a transaction never begun"),
                    );
                }
                // Engine-wide, like an extension: it does not end a group's run of begins.
                self.guard.open_group = open_group;
                self.apply(ev, Given::Effect(parsed));
            }
            Event::ToolChanged { tool, version, present } => {
                if *version == u64::MAX {
                    return refuse(R::Overflow, format!("registry version {version} of `{tool}` is u64::MAX"));
                }
                if *version <= self.registry.version {
                    return refuse(
                        R::StampNotIncreasing,
                        format!("registry version {version} of `{tool}` after version {}", self.registry.version),
                    );
                }
                if !*present && self.registry.current(tool).is_none() {
                    return refuse(R::IllegalTransition, format!("removal of `{tool}`, which is not registered"));
                }
                self.apply(ev, Given::Nothing);
            }
            Event::EffectRecorded { tx, effect, tool, scopes, key, adapter_key, .. } => {
                let mut parsed = SmallVec::new();
                for s in scopes {
                    parsed.push(self.parse_logged(s)?);
                }
                if parsed.is_empty() {
                    return refuse(R::BadScope, format!("effect {effect} of {tx} (tool `{tool}`) has no scope"));
                }
                let t = self.replay_tx(*tx)?;
                if t.state != TxState::Open {
                    return refuse(
                        R::IllegalTransition,
                        format!("effect {effect} recorded for {tx}, which is {}", t.state),
                    );
                }
                if effect.0 as usize != t.effects.len() {
                    return refuse(
                        R::EffectOrder,
                        format!("effect {effect} of {tx} recorded when it has {} effects", t.effects.len()),
                    );
                }
                if let Some(mt) = &t.may_touch
                    && let Some(s) = parsed.iter().find(|s| !mt.iter().any(|m| m.covers(s)))
                {
                    return refuse(
                        R::BadScope,
                        format!("effect {effect} of {tx} on `{s}` outside its declared may-touch set"),
                    );
                }
                // A key that executed and settled replays (apply makes the effect `Replayed`).
                let key_state = if *adapter_key { self.keys.get(key).map(|k| (&k.state, k.tx)) } else { None };
                match key_state {
                    Some((KeyState::Done(_), _)) | None => {}
                    Some((KeyState::Pending, holder)) => {
                        return refuse(
                            R::KeyConflict,
                            format!("key `{key}` of {tx}{effect} is held by unfinished {holder}"),
                        );
                    }
                    Some((KeyState::Unresolved, _)) => {
                        return refuse(R::KeyConflict, format!("key `{key}` of {tx}{effect} is unresolved"));
                    }
                }
                self.apply(ev, Given::Effect(parsed));
            }
            Event::EffectExecuted { tx, .. } | Event::EffectFailed { tx, .. } | Event::Compensated { tx, .. }
                if self.guard.lenient_late && !self.txs.contains_key(tx) && tx.0 != 0 && tx.0 < self.next_tx =>
            {
                // Late records for a transaction settled before an old checkpoint.
            }
            Event::EffectExecuted { tx, effect, .. } => {
                if !self.txs.contains_key(tx) && self.guard.late_calls.remove(&(*tx, *effect)) {
                    // The late result of a call in flight at settlement: its compensation follows.
                    self.guard.late_comps.insert((*tx, *effect));
                    return Ok(());
                }
                let t = self.replay_tx(*tx)?;
                let e = t.effects.get(effect.0 as usize).ok_or_else(|| no_effect(*tx, *effect))?;
                match e.status {
                    EffStatus::InFlight => {}
                    // A key replayed: its output is recorded right after it.
                    EffStatus::Replayed if e.output.is_none() => {}
                    ref other => {
                        return refuse(
                            R::IllegalTransition,
                            format!("{tx}{effect} executed, but it is {other:?}, not in flight"),
                        );
                    }
                }
                self.apply(ev, Given::Nothing);
            }
            Event::EffectFailed { tx, effect, unknown, .. }
                if !self.txs.contains_key(tx) && self.guard.late_calls.remove(&(*tx, *effect)) =>
            {
                // A late call whose outcome came back unknown is compensated blind.
                if *unknown {
                    self.guard.late_comps.insert((*tx, *effect));
                }
            }
            Event::EffectFailed { tx, effect, .. } => {
                let t = self.replay_tx(*tx)?;
                let e = t.effects.get(effect.0 as usize).ok_or_else(|| no_effect(*tx, *effect))?;
                if e.status != EffStatus::InFlight {
                    return refuse(
                        R::IllegalTransition,
                        format!("{tx}{effect} failed, but it is {:?}, not in flight", e.status),
                    );
                }
                self.apply(ev, Given::Nothing);
            }
            Event::Sealed { tx } => {
                let t = self.replay_tx(*tx)?;
                if t.state != TxState::Open {
                    return refuse(R::IllegalTransition, format!("seal of {tx}, which is {}", t.state));
                }
                if t.in_flight > 0 {
                    return refuse(R::IllegalTransition, format!("seal of {tx} with {} calls in flight", t.in_flight));
                }
                self.apply(ev, Given::Nothing);
            }
            Event::Decided { tx, commit: true, stamp, .. } => {
                let Some(stamp) = *stamp else {
                    return refuse(R::StampNotIncreasing, format!("commit of {tx} without a stamp"));
                };
                if stamp == u64::MAX {
                    return refuse(R::Overflow, format!("commit stamp {stamp} of {tx} is u64::MAX"));
                }
                if stamp <= self.guard.last_commit_stamp || stamp < self.stamp {
                    return refuse(
                        R::StampNotIncreasing,
                        format!(
                            "commit of {tx} at stamp {stamp}, after stamp {}",
                            self.guard.last_commit_stamp.max(self.stamp)
                        ),
                    );
                }
                let t = self.replay_tx(*tx)?;
                if t.state != TxState::Sealed {
                    return refuse(R::IllegalTransition, format!("commit of {tx}, which is {}", t.state));
                }
                if let Some(g) = t.group {
                    let winner = self.groups.get(&g).and_then(|gr| gr.winner);
                    if winner.is_some_and(|w| w != *tx) {
                        return refuse(
                            R::IllegalTransition,
                            format!("commit of {tx}, a second branch of {g} to commit"),
                        );
                    }
                }
                self.guard.last_commit_stamp = stamp;
                self.apply(ev, Given::Nothing);
            }
            Event::Decided { tx, commit: false, .. } => {
                let t = self.replay_tx(*tx)?;
                match t.state {
                    TxState::Open | TxState::Sealed | TxState::Waiting => {}
                    // A retraction: the first release failed before anything left.
                    TxState::Committing if !t.effects.iter().any(|e| e.status == EffStatus::Released) => {}
                    state => return refuse(R::IllegalTransition, format!("abort of {tx}, which is {state}")),
                }
                self.apply(ev, Given::Nothing);
            }
            Event::ReleaseStarted { tx, effect } => {
                let t = self.replay_tx(*tx)?;
                let state = t.state;
                let e = t.effects.get(effect.0 as usize).ok_or_else(|| no_effect(*tx, *effect))?;
                if state != TxState::Committing || !matches!(e.status, EffStatus::Held(_)) {
                    return refuse(
                        R::IllegalTransition,
                        format!(
                            "release of {tx}{effect} started, but the transaction is {state} and the effect {:?}",
                            e.status
                        ),
                    );
                }
                self.apply(ev, Given::Nothing);
            }
            Event::Released { tx, effect, .. } => {
                let t = self.replay_tx(*tx)?;
                let state = t.state;
                let e = t.effects.get(effect.0 as usize).ok_or_else(|| no_effect(*tx, *effect))?;
                // Held (a ledger without release_started), started, or probed after a restart.
                let ok = state == TxState::Committing
                    && matches!(e.status, EffStatus::Held(_) | EffStatus::ReleaseFailed { unknown: true, .. });
                if !ok {
                    return refuse(
                        R::IllegalTransition,
                        format!("{tx}{effect} released, but the transaction is {state} and the effect {:?}", e.status),
                    );
                }
                self.apply(ev, Given::Nothing);
            }
            Event::Compensated { tx, effect, .. } => {
                if !self.txs.contains_key(tx) && self.guard.late_comps.remove(&(*tx, *effect)) {
                    // A late compensation of a settled transaction: a clean one frees the key
                    // its settlement left unresolved.
                    self.apply(ev, Given::Nothing);
                    return Ok(());
                }
                let t = self.replay_tx(*tx)?;
                let state = t.state;
                let e = t.effects.get(effect.0 as usize).ok_or_else(|| no_effect(*tx, *effect))?;
                // Executed, or failed with an unknown outcome (compensated blind).
                let compensable = matches!(e.status, EffStatus::Executed | EffStatus::Failed { unknown: true });
                if state != TxState::Aborting || !compensable {
                    return refuse(
                        R::IllegalTransition,
                        format!(
                            "{tx}{effect} compensated, but the transaction is {state} and the effect {:?}",
                            e.status
                        ),
                    );
                }
                self.apply(ev, Given::Nothing);
            }
            Event::Settled { tx, committed, effects } => {
                let t = self.replay_tx(*tx)?;
                let expected = if *committed { TxState::Committing } else { TxState::Aborting };
                if t.state != expected {
                    let what = if *committed { "committed" } else { "aborted" };
                    return refuse(R::IllegalTransition, format!("{tx} settled {what}, but it is {}", t.state));
                }
                if effects.len() != t.effects.len() {
                    return refuse(
                        R::SettlementMismatch,
                        format!(
                            "settlement of {tx} lists {} effects, the ledger recorded {}",
                            effects.len(),
                            t.effects.len()
                        ),
                    );
                }
                if let Some((i, (id, ..))) = effects.iter().enumerate().find(|(i, (id, ..))| id.0 as usize != *i) {
                    return refuse(R::SettlementMismatch, format!("settlement of {tx} lists {id} in position {i}"));
                }
                if !*committed {
                    // What may still come after the settlement: a late call's result, and the
                    // compensation of an effect that executed or whose outcome is unknown (the
                    // live engine may be compensating it, blind, when the abort settles).
                    // Regression: a blind one was refused, so the engine could not reopen a
                    // ledger it had written (`live_replay.rs`, seed 107).
                    let t = &self.txs[tx];
                    for (i, e) in t.effects.iter().enumerate() {
                        let id = (*tx, EffectId(i as u32));
                        if e.status == EffStatus::InFlight {
                            self.guard.late_calls.insert(id);
                        } else if super::settle::needs_compensation(e) {
                            self.guard.late_comps.insert(id);
                        }
                    }
                }
                self.apply(ev, Given::Nothing);
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
        let t = self.tx(tx)?;
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
        self.emit(super::settle::released(tx, effect, result), Given::Nothing);
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
