//! What a sealed transaction's commit waits for: the same rule as the commit predicate
//! (`admissible` in settle.rs), asked for its reasons instead of a yes or no.
//!
//! ```text
//!  waits_for(tx) ─► L2 predecessors still releasing   (Predecessor: the read that saw its write)
//!               ─► ordering / ablation:
//!                    L0, no frontier      ─► nothing
//!                    global frontier      ─► every earlier unfinished one (Frontier)
//!                    first committer wins ─► overlapping commits releasing (Releasing)
//!                    epoch order          ─► earlier open ones with no may-touch (Undeclared)
//!                                            + earlier ones claiming an overlapping scope (Overlap)
//! ```
//!
//! The predicate itself asks the scope index; this walks the unfinished transactions, which
//! costs O(unfinished × claims²) and is meant for people looking (the console), not for the
//! commit path. `tests/waits_for.rs` checks that the two agree.

use super::{Core, Tx};
use crate::engine::Level;
use crate::engine::Ordering;
use crate::error::{EngineError, TxState};
use crate::ids::{Epoch, TxId};
use crate::scope::Scope;

/// Why a commit waits for another transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WaitCause {
    /// The other one has a smaller epoch and may touch an overlapping scope: commits on
    /// overlapping scopes are ordered by epoch.
    Overlap,
    /// The other one has a smaller epoch, is open and declared no may-touch set: it may touch
    /// any scope until it seals.
    Undeclared,
    /// This one read a write of the other, whose commit is still releasing (L2: the read
    /// stands only if that commit does).
    Predecessor,
    /// First-committer-wins: the other one's commit on an overlapping scope is still
    /// releasing, and commits reach the world in commit order.
    Releasing,
    /// The global-frontier ablation: every earlier unfinished transaction.
    Frontier,
}

impl WaitCause {
    /// The cause's name (`overlap`, `undeclared`, `predecessor`, `releasing`, `frontier`).
    pub fn as_str(self) -> &'static str {
        match self {
            WaitCause::Overlap => "overlap",
            WaitCause::Undeclared => "undeclared",
            WaitCause::Predecessor => "predecessor",
            WaitCause::Releasing => "releasing",
            WaitCause::Frontier => "frontier",
        }
    }
}

/// One transaction a commit waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitsFor {
    /// The transaction waited for.
    pub tx: TxId,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its state.
    pub state: TxState,
    /// Why.
    pub cause: WaitCause,
    /// The waiting transaction's scope that overlaps (`None`: every scope, for
    /// [`WaitCause::Undeclared`] and [`WaitCause::Frontier`]).
    pub scope: Option<Scope>,
    /// The other transaction's scope it overlaps (its may-touch entry or footprint scope, or
    /// the scope it wrote that this one read); `None` as for `scope`.
    pub theirs: Option<Scope>,
}

fn first_overlap<'a>(mine: impl Iterator<Item = &'a Scope> + Clone, theirs: &'a [Scope]) -> Option<(Scope, Scope)> {
    for a in mine {
        if let Some(b) = theirs.iter().find(|b| a.overlaps(b)) {
            return Some((a.clone(), b.clone()));
        }
    }
    None
}

impl Core {
    /// What the commit of `tx` waits for now, oldest first: empty when it would decide at once
    /// (or is past deciding). Meaningful for a sealed transaction (what a commit asked now
    /// would wait for) and a waiting one (what it waits for); an open one answers for its
    /// current claims. The same rule as the commit decision: when this is empty for a waiting
    /// transaction, [`Core::try_commit`] does not answer `Wait`.
    pub fn waits_for(&self, tx: TxId) -> Result<Vec<WaitsFor>, EngineError> {
        let t = self.tx(tx)?;
        if !matches!(t.state, TxState::Open | TxState::Sealed | TxState::Waiting) || self.read_only_bypass(t) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let entry = |id: TxId, o: &Tx, cause: WaitCause, pair: Option<(Scope, Scope)>| {
            let (scope, theirs) = pair.map_or((None, None), |(a, b)| (Some(a), Some(b)));
            WaitsFor { tx: id, epoch: o.epoch, state: o.state, cause, scope, theirs }
        };
        if self.cfg.level >= Level::L2 {
            for p in t.lv.preds.iter().filter(|p| self.committing.contains(p)) {
                if let Some(o) = self.txs.get(p) {
                    let pair = first_overlap(t.reads.iter().map(|(s, _)| s), &o.claims);
                    out.push(entry(*p, o, WaitCause::Predecessor, pair));
                }
            }
        }
        let earlier = || self.txs.iter().filter(|(id, o)| **id != tx && o.epoch < t.epoch);
        if self.cfg.level == Level::L0 || self.cfg.ablation.no_frontier {
            // No ordering wait.
        } else if self.cfg.ablation.global_frontier {
            for (id, o) in earlier().filter(|(_, o)| o.state != TxState::Aborting) {
                out.push(entry(*id, o, WaitCause::Frontier, None));
            }
        } else if self.cfg.ordering == Ordering::FirstCommitterWins {
            for (id, o) in self.txs.iter().filter(|(id, o)| **id != tx && o.state == TxState::Committing) {
                if let Some(pair) = first_overlap(t.claims.iter(), &o.claims) {
                    out.push(entry(*id, o, WaitCause::Releasing, Some(pair)));
                }
            }
        } else {
            for (id, o) in earlier() {
                if o.blocks_all {
                    out.push(entry(*id, o, WaitCause::Undeclared, None));
                } else if let Some(pair) = first_overlap(t.claims.iter(), &o.claims) {
                    out.push(entry(*id, o, WaitCause::Overlap, Some(pair)));
                }
            }
        }
        out.sort_by_key(|w| (w.epoch, w.tx));
        out.dedup_by_key(|w| w.tx);
        Ok(out)
    }
}
