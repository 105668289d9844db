//! The disciplines of the consistency levels (docs/levels.md) and the operation records.
//!
//! | level | adds | where |
//! |-------|------|-------|
//! | L0 | nothing: commits neither wait nor validate | [`Core::admissible`] |
//! | L1 | stale-generation prevention ([`Isolation`]) and the epoch-order frontier | [`Core::validate`] |
//! | L2 | wait for unsettled predecessors; cascade a retraction | [`Core::sight`], [`Core::retract`] |
//! | L3 | a transaction's calls reach the world in issuance order | [`Core::earlier_in_flight`] |
//! | L4 | commit validates the registry pins | [`Core::validate`] |

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Action, Core, EffStatus, Isolation, Level, Tx};
use crate::effect::AbortReason;
use crate::error::{EngineError, TxState};
use crate::ids::{EffectId, Epoch, GroupId, TxId};
use crate::scope::Scope;
use crate::trace::{TRACE_SCHEMA_VERSION, TraceRead, TraceRecord, TraceTool};

/// How a transaction is about to touch a scope, for the isolation of eager effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Touch {
    /// A read.
    Read,
    /// An eager effect (executes now, visible at once).
    Eager,
    /// A held effect (reaches the world at commit).
    Held,
}

/// What one read sees: see [`Core::sight`].
#[derive(Debug)]
pub(super) struct Sight {
    /// The version the read records.
    pub(super) version: crate::ids::Version,
    /// Unsettled (or, below L2, retracted) commits whose writes overlap the scope.
    pub(super) writers: SmallVec<[TxId; 2]>,
}

impl Core {
    /// The level in force.
    pub fn level(&self) -> Level {
        self.cfg.level
    }

    /// Whether reads are validated at commit (serializable and pessimistic strategies).
    fn validates_reads(&self) -> bool {
        self.cfg.level >= Level::L1
            && !self.cfg.ablation.no_stale_read_abort
            && self.cfg.isolation != Isolation::SnapshotIsolation
    }

    /// Pessimistic locking: aborts `tx` if an earlier unfinished transaction holds `scope`.
    pub(super) fn lock_check(&mut self, tx: TxId, scope: &Scope) -> Result<(), EngineError> {
        if self.cfg.level < Level::L1 || self.cfg.isolation != Isolation::Pessimistic {
            return Ok(());
        }
        let Some(t) = self.txs.get(&tx) else { return Ok(()) };
        let epoch = t.epoch;
        let held = self.undeclared.first_key_value().is_some_and(|(e, _)| *e < epoch)
            || self.index.blocked_before(scope, epoch);
        if !held {
            return Ok(());
        }
        let scope = scope.to_string();
        match self.abort(tx, AbortReason::LockConflict { scope: scope.clone() }) {
            Ok(plan) => self.actions.push(Action::RunAbort(plan)),
            Err(e) => debug_assert!(false, "lock-conflict abort of {tx} failed: {e}"),
        }
        Err(EngineError::LockConflict { tx, scope })
    }

    /// Whether an effect leaves a dirty mark while its transaction is unfinished: an eager
    /// effect with a compensation (its compensation may write the scope again, later).
    pub(super) fn marks_dirty(e: &super::Eff) -> bool {
        e.class.executes_eagerly() && e.compensable && e.status != EffStatus::Replayed
    }

    /// The isolation of eager effects (docs/engine.md, "Isolation of eager effects"), at L1
    /// and above: refuses (aborting `tx`, retryable `lock_conflict`) a touch of `scope` that
    /// would interleave with another unfinished transaction's uncommitted eager write there.
    /// Branches of one speculation group (one epoch) are exempt from each other.
    ///
    /// * a read of a scope with another transaction's dirty mark: it would read a value that
    ///   is not committed (and, with this engine's versions, is stale whichever way the writer
    ///   settles);
    /// * an eager effect on a scope with another transaction's dirty mark (the second writer
    ///   dies: either compensation would restore a value over the other's write), or on a
    ///   scope where an earlier unfinished transaction holds an effect that will be released
    ///   before this one settles;
    /// * a held effect on a scope with a later transaction's dirty mark (its release would land
    ///   before that transaction's compensation).
    ///
    /// Disjoint scopes pay one query of the (usually empty) dirty index; the scan for held
    /// effects runs only when an earlier transaction claims the scope.
    pub(super) fn eager_check(&mut self, tx: TxId, scope: &Scope, touch: Touch) -> Result<(), EngineError> {
        if self.cfg.level < Level::L1 {
            return Ok(());
        }
        let Some(t) = self.txs.get(&tx) else { return Ok(()) };
        let epoch = t.epoch;
        if touch == Touch::Eager
            && let Some(group) = t.group
            && let Some(sibling) = self.sibling_dirty(tx, group, scope)
        {
            return Err(EngineError::SiblingConflict { tx, sibling, scope: scope.to_string() });
        }
        // A compensation of a settled transaction's effect is writing here right now: reading
        // would see a value in flux, writing eagerly would race its restore.
        let undoing = touch != Touch::Held
            && !self.undoing.is_empty()
            && self.undoing.iter().any(|(_, _, scopes)| scopes.iter().any(|s| s.overlaps(scope)));
        // Under the epoch-order frontier, a later transaction settles after this one; without
        // it, either may settle first.
        let ordered = self.cfg.ordering == super::Ordering::EpochOrder && !self.cfg.ablation.no_frontier;
        let conflict = undoing
            || match touch {
                // A decided commit's writes are not dirty for readers: L2 makes their readers wait
                // for the settlement and cascades a retraction; below L2 reading them is A3,
                // which those levels admit (docs/levels.md).
                Touch::Read => {
                    self.dirty_elsewhere(epoch)
                        && self.dirty.claimed_by_other(scope, epoch)
                        && self.txs.values().any(|o| {
                            o.epoch != epoch
                                && o.state != TxState::Committing
                                && o.effects
                                    .iter()
                                    .any(|e| Self::marks_dirty(e) && e.scopes.iter().any(|s| s.overlaps(scope)))
                        })
                }
                Touch::Held => {
                    if ordered {
                        self.dirty_epochs.last_key_value().is_some_and(|(e, _)| *e > epoch)
                            && self.dirty.claimed_after(scope, epoch)
                    } else {
                        self.dirty_elsewhere(epoch) && self.dirty.claimed_by_other(scope, epoch)
                    }
                }
                Touch::Eager => {
                    (self.dirty_elsewhere(epoch) && self.dirty.claimed_by_other(scope, epoch))
                        || self.held_elsewhere(tx, epoch, scope, ordered)
                }
            };
        if !conflict {
            return Ok(());
        }
        let scope = scope.to_string();
        match self.abort(tx, AbortReason::LockConflict { scope: scope.clone() }) {
            Ok(plan) => self.actions.push(Action::RunAbort(plan)),
            Err(e) => debug_assert!(false, "eager-isolation abort of {tx} failed: {e}"),
        }
        Err(EngineError::LockConflict { tx, scope })
    }

    /// A sibling branch of `group` (not `tx`) holding an eager effect with a compensation on a
    /// scope overlapping `scope` (docs/engine.md, "Speculation and eager effects"): the
    /// branches share an epoch, so the dirty index cannot tell them apart; a group has at
    /// most 1,024 branches and only its members are looked at.
    fn sibling_dirty(&self, tx: TxId, group: GroupId, scope: &Scope) -> Option<TxId> {
        let g = self.groups.get(&group)?;
        g.branches.iter().copied().find(|&b| {
            b != tx
                && self.txs.get(&b).is_some_and(|o| {
                    o.state != TxState::Committing
                        && o.effects.iter().any(|e| Self::marks_dirty(e) && e.scopes.iter().any(|s| s.overlaps(scope)))
                })
        })
    }

    /// Places (`done: false`) or takes away (`done: true`) the live mark of a running
    /// compensation of effect `effect` of the settled transaction `undoes`.
    pub(super) fn mark_undoing(&mut self, undoes: TxId, effect: EffectId, scopes: &[Scope], done: bool) {
        if done {
            if let Some(i) = self.undoing.iter().position(|(t, e, _)| *t == undoes && *e == effect) {
                self.undoing.swap_remove(i);
            }
        } else if self.keeps_marks() {
            self.undoing.push((undoes, effect, scopes.iter().cloned().collect()));
        }
    }

    /// Whether a transaction at another epoch holds a dirty mark (O(1)).
    fn dirty_elsewhere(&self, epoch: Epoch) -> bool {
        self.dirty_epochs.first_key_value().is_some_and(|(e, _)| *e != epoch)
            || self.dirty_epochs.last_key_value().is_some_and(|(e, _)| *e != epoch)
    }

    fn count_mark(&mut self, epoch: Epoch, add: bool) {
        if add {
            *self.dirty_epochs.entry(epoch).or_insert(0) += 1;
        } else if let Some(n) = self.dirty_epochs.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                self.dirty_epochs.remove(&epoch);
            }
        }
    }

    /// Whether another unfinished, not aborting transaction (an earlier one, if `ordered`)
    /// holds an effect on a scope overlapping `scope` that is not released yet.
    fn held_elsewhere(&self, tx: TxId, epoch: Epoch, scope: &Scope, ordered: bool) -> bool {
        if ordered
            && !(self.undeclared.first_key_value().is_some_and(|(e, _)| *e < epoch)
                || self.index.blocked_before(scope, epoch))
        {
            return false;
        }
        self.txs.iter().any(|(id, o)| {
            *id != tx
                && o.epoch != epoch
                && (!ordered || o.epoch < epoch)
                && o.state != TxState::Aborting
                && o.effects.iter().any(|e| e.status.unreleased() && e.scopes.iter().any(|s| s.overlaps(scope)))
        })
    }

    /// Whether this engine keeps dirty marks: only the isolation checks of L1 and above read
    /// them, so below L1 none are placed (an effect then costs no mark and no unmark).
    pub(super) fn keeps_marks(&self) -> bool {
        self.cfg.level >= Level::L1
    }

    /// Places the dirty marks of a new effect of the transaction at `epoch`.
    pub(super) fn mark_dirty(&mut self, epoch: Epoch, e: &super::Eff) {
        if self.keeps_marks() && Self::marks_dirty(e) {
            for s in &e.scopes {
                self.dirty.claim(s, epoch);
                self.count_mark(epoch, true);
            }
        }
    }

    /// Places every unfinished transaction's dirty marks (a checkpoint written before them).
    pub(super) fn rebuild_dirty_marks(&mut self) {
        if !self.keeps_marks() {
            return;
        }
        let marks: Vec<(Epoch, Scope)> = self
            .txs
            .values()
            .flat_map(|t| {
                t.effects
                    .iter()
                    .filter(|e| Self::marks_dirty(e))
                    .flat_map(move |e| e.scopes.iter().map(move |s| (t.epoch, s.clone())))
            })
            .collect();
        for (epoch, s) in marks {
            self.dirty.claim(&s, epoch);
            self.count_mark(epoch, true);
        }
    }

    /// A transaction finishes: its dirty marks go, and, at L1 and above, if it aborted before
    /// any commit decision, every scope they covered gets a fresh version (one new stamp): its
    /// compensations wrote there, so any read that saw its eager values (or the values before
    /// them) is stale. (A retracted commit gets its fresh version from [`Core::retract`] at L2
    /// and above; below L2 reading a retracted write is A3, which those levels admit.)
    pub(super) fn settle_marks(&mut self, t: &Tx, committed: bool) {
        if !self.keeps_marks() {
            return;
        }
        let committed = committed || t.lv.stamp.is_some();
        let mut bumped = None;
        for e in t.effects.iter().filter(|e| Self::marks_dirty(e)) {
            for s in &e.scopes {
                self.dirty.unclaim(s, t.epoch);
                self.count_mark(t.epoch, false);
                if !committed && self.cfg.level >= Level::L1 {
                    let stamp = *bumped.get_or_insert_with(|| {
                        // Saturating: at the end of the range the next commit is refused.
                        self.stamp = self.stamp.saturating_add(1);
                        self.stamp
                    });
                    self.index.record_write(s, stamp);
                }
            }
        }
    }

    /// What a read of `scope` by `tx` sees, in one pass over the unsettled commits.
    ///
    /// * Its **version**. A commit that is decided but whose held effects on the scope have
    ///   not all reached the world yet is not visible: the world does not show it, so a plan
    ///   built on what the agent reads there would be built on the state before it. At L1 and
    ///   above (validated reads) the read therefore records a version just below that
    ///   commit's stamp, and the reader's commit aborts `stale_read` instead of committing a
    ///   plan made on the old state.
    /// * Its **predecessors**: the unsettled commits whose writes overlap the scope, and,
    ///   below L2, the writer of a retracted version.
    pub(super) fn sight(&self, tx: TxId, scope: &Scope) -> Sight {
        let committed = self.index.version(scope);
        let mut sight = Sight { version: committed, writers: SmallVec::new() };
        if let Some(&w) = self.retracted.get(&committed.0) {
            sight.writers.push(w);
        }
        if !self.may_see_unsettled(tx, scope) {
            return sight;
        }
        let hide = self.validates_reads();
        let mut unreleased: Option<u64> = None;
        for &c in self.committing.iter().filter(|c| **c != tx) {
            let Some(w) = self.txs.get(&c) else { continue };
            let mut wrote = false;
            for e in w.effects.iter().filter(|e| e.status != EffStatus::Replayed) {
                if e.scopes.iter().any(|s| s.overlaps(scope)) {
                    wrote = true;
                    if hide
                        && e.status.unreleased()
                        && let Some(st) = w.lv.stamp
                    {
                        unreleased = Some(unreleased.map_or(st, |u| u.min(st)));
                    }
                }
            }
            if wrote && !sight.writers.contains(&c) {
                sight.writers.push(c);
            }
        }
        if let Some(s) = unreleased
            && s <= committed.0
        {
            sight.version = crate::ids::Version(s - 1);
        }
        sight
    }

    /// Whether a decided, unsettled commit may have written something overlapping `scope`
    /// that `tx` can observe. Such a commit still claims its footprint in the scope index, and
    /// under the epoch-order frontier it has an earlier epoch than any reader whose claim
    /// covers the scope (a later writer would have waited for the reader), so one index query
    /// answers "no" for the common disjoint case without scanning the committing set.
    fn may_see_unsettled(&self, tx: TxId, scope: &Scope) -> bool {
        if self.committing.is_empty() {
            return false;
        }
        let epoch_ordered = self.cfg.ordering == super::Ordering::EpochOrder
            && self.cfg.level >= Level::L1
            && !self.cfg.ablation.no_frontier;
        match self.txs.get(&tx) {
            Some(t) if epoch_ordered => {
                self.undeclared.first_key_value().is_some_and(|(e, _)| *e < t.epoch)
                    || self.index.blocked_before(scope, t.epoch)
            }
            _ => true,
        }
    }

    /// A commit decision turned into an abort after its writes became visible: at L2 every
    /// unsettled reader of them is doomed and the written scopes get a fresh version (so no
    /// later read observes the retracted writes); below L2 the retraction is only remembered
    /// for the trace.
    pub(super) fn retract(&mut self, tx: TxId) {
        self.committing.retain(|c| *c != tx);
        let Some(t) = self.txs.get(&tx) else { return };
        let stamp = t.lv.stamp;
        if self.cfg.level >= Level::L2 {
            let scopes: SmallVec<[Scope; 4]> = t
                .effects
                .iter()
                .filter(|e| e.status != EffStatus::Replayed)
                .flat_map(|e| e.scopes.iter().cloned())
                .collect();
            for other in self.txs.values_mut() {
                if other.lv.preds.contains(&tx) && other.lv.doomed.is_none() {
                    other.lv.doomed = Some(tx);
                }
            }
            // Saturating: at the end of the range the next commit is refused (`Exhausted`).
            self.stamp = self.stamp.saturating_add(1);
            for s in &scopes {
                self.index.record_write(s, self.stamp);
            }
        } else if let Some(s) = stamp {
            self.retracted.insert(s, tx);
        }
    }

    /// Level checks at the commit decision, made before the frontier is consulted: every
    /// reason found here persists (versions and signatures only grow, a doomed reader stays
    /// doomed), so a transaction that would fail them aborts without waiting. Skipped by the
    /// read-only bypass. `Some(reason)`: abort.
    pub(super) fn validate(&self, t: &Tx) -> Option<AbortReason> {
        let lvl = self.cfg.level;
        if lvl >= Level::L2
            && let Some(p) = t.lv.doomed
        {
            return Some(AbortReason::CascadingAbort { predecessor: p });
        }
        if self.validates_reads()
            && let Some((scope, read, current)) =
                t.reads.iter().map(|(s, v)| (s, *v, self.index.version(s))).find(|(_, read, cur)| cur > read)
        {
            return Some(AbortReason::StaleRead { scope: scope.to_string(), read: read.0, current: current.0 });
        }
        if lvl >= Level::L1
            && !self.cfg.ablation.no_stale_read_abort
            && self.cfg.isolation == Isolation::SnapshotIsolation
        {
            for e in t.effects.iter().filter(|e| e.status != EffStatus::Replayed) {
                for s in &e.scopes {
                    let current = self.index.version(s).0;
                    if current > t.lv.snapshot {
                        return Some(AbortReason::WriteConflict {
                            scope: s.to_string(),
                            snapshot: t.lv.snapshot,
                            current,
                        });
                    }
                }
            }
        }
        if lvl >= Level::L4
            && let Some(seen) = t.lv.reg_seen
        {
            for e in &t.effects {
                if let Some(pinned) = self.registry.at(&e.tool, seen) {
                    let current = self.registry.current(&e.tool);
                    if current != Some(pinned) {
                        return Some(AbortReason::PhantomTool {
                            tool: e.tool.to_string(),
                            pinned: pinned.signature,
                            current: current.map(|c| c.signature),
                        });
                    }
                }
            }
        }
        None
    }

    /// Snapshot isolation's read-only bypass: a transaction with no effects commits at once.
    pub(super) fn read_only_bypass(&self, t: &Tx) -> bool {
        self.cfg.level >= Level::L1 && self.cfg.isolation == Isolation::SnapshotIsolation && t.effects.is_empty()
    }

    /// L2: an unsettled predecessor still decides whether this transaction's reads stand.
    pub(super) fn awaits_predecessor(&self, t: &Tx) -> bool {
        self.cfg.level >= Level::L2 && t.lv.preds.iter().any(|p| self.committing.contains(p))
    }

    /// L3: whether an eager call of `tx` issued before `effect` is still running. Under L3 the
    /// runtime starts `effect`'s call only when this is false, so calls reach the world in
    /// issuance order even when the agent issues them concurrently. Below L3 it is always
    /// false.
    pub fn earlier_in_flight(&self, tx: TxId, effect: EffectId) -> bool {
        if self.cfg.level < Level::L3 {
            return false;
        }
        self.txs.get(&tx).is_some_and(|t| {
            // The common case, one call at a time: only `effect` itself is in flight.
            let own = t.effects.get(effect.0 as usize).is_some_and(|e| e.status == EffStatus::InFlight);
            t.in_flight > u32::from(own)
                && t.effects.iter().take(effect.0 as usize).any(|e| e.status == EffStatus::InFlight)
        })
    }

    /// Under a global frontier: whether an unfinished transaction with a smaller epoch exists.
    pub(super) fn any_earlier(&self, epoch: Epoch) -> bool {
        self.txs.values().any(|o| o.epoch < epoch && !matches!(o.state, TxState::Aborting))
    }

    /// Drains the operation records of transactions finished since the last call.
    pub fn take_traces(&mut self) -> std::vec::Drain<'_, TraceRecord> {
        self.traces.drain(..)
    }

    /// Whether operation records are waiting to be drained.
    pub fn has_traces(&self) -> bool {
        !self.traces.is_empty()
    }

    /// Builds the operation record of a finishing transaction.
    pub(super) fn trace_record(&self, tx: TxId, t: &Tx, committed: bool) -> TraceRecord {
        let mut planned: Vec<Arc<str>> = Vec::new();
        for e in &t.effects {
            if !planned.contains(&e.tool) {
                planned.push(e.tool.clone());
            }
        }
        let tools_at = |at: u64| -> Vec<TraceTool> {
            planned
                .iter()
                .filter_map(|name| {
                    self.registry.at(name, at).map(|v| TraceTool { name: name.clone(), signature: v.signature })
                })
                .collect()
        };
        let registry_at_read = t.lv.reg_seen.map(tools_at).unwrap_or_default();
        let registry_at_commit = tools_at(t.lv.reg_decided.unwrap_or(self.registry.version));
        let reads: Vec<TraceRead> = t
            .reads
            .iter()
            .zip(t.lv.read_at.iter().copied().chain(std::iter::repeat(t.lv.snapshot)))
            .map(|((s, v), time)| TraceRead { cell: s.as_arc(), value: v.0, time })
            .collect();
        let read_time = reads.first().map_or(t.lv.snapshot, |r| r.time);
        let mut writes = Vec::new();
        if let Some(stamp) = t.lv.stamp {
            for e in t.effects.iter().filter(|e| e.status != EffStatus::Replayed) {
                for s in &e.scopes {
                    let s = s.as_arc();
                    if !writes.iter().any(|(w, _): &(Arc<str>, u64)| *w == s) {
                        writes.push((s, stamp));
                    }
                }
            }
        }
        let pair = |i: u32| {
            let e = &t.effects[i as usize];
            let cell = e.scopes.first().map(Scope::as_arc).unwrap_or_default();
            (cell, format!("{}/{}:{}", tx.0, i, e.tool))
        };
        let mut io_ids: SmallVec<[u32; 4]> = t.lv.ext_order.clone();
        io_ids.sort_unstable();
        TraceRecord {
            schema_version: TRACE_SCHEMA_VERSION,
            tx: tx.0,
            agent: t.agent.clone(),
            level: self.cfg.level,
            read_time,
            reads,
            registry_at_read,
            planned_tools: planned.clone(),
            writes,
            write_time: t.lv.stamp,
            registry_at_commit,
            io: io_ids.iter().map(|&i| pair(i)).collect(),
            co: t.lv.ext_order.iter().map(|&i| pair(i)).collect(),
            aborted: !committed,
            predecessors: t.lv.preds.iter().map(|p| p.0).collect(),
        }
    }
}
