//! Speculation groups: alternative branches sharing one epoch; exactly one may commit.

use std::sync::Arc;

use super::Core;
use crate::effect::AbortReason;
use crate::error::{EngineError, TxState};
use crate::ids::{Epoch, GroupId, Timestamp, TxId};
use crate::scope::Scope;

use super::ops::BeginRequest;
use super::settle::AbortPlan;

/// A begun speculation group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStart {
    /// The group.
    pub group: GroupId,
    /// The epoch its branches share.
    pub epoch: Epoch,
    /// One transaction per branch.
    pub branches: Vec<TxId>,
}

impl Core {
    /// Begins `branches` transactions sharing one fresh epoch. Branches never wait for each
    /// other (the commit predicate looks at strictly smaller epochs); later transactions wait
    /// for the group as for one transaction.
    pub fn begin_group(
        &mut self,
        agent: Arc<str>,
        branches: usize,
        may_touch: Option<Vec<Scope>>,
        now: Timestamp,
    ) -> Result<GroupStart, EngineError> {
        if branches == 0 || branches > 1024 {
            return Err(EngineError::InvalidArgument {
                field: "branches",
                value: branches.to_string(),
                expected: "between 1 and 1024 branches",
            });
        }
        self.ids_left(branches as u64)?;
        if self.next_group == u64::MAX {
            return Err(EngineError::Exhausted { counter: "group id", value: self.next_group });
        }
        let epoch = Epoch(self.next_epoch);
        self.next_epoch += 1;
        let group = GroupId(self.next_group);
        self.next_group += 1;
        // Each branch's `begin` adds it to the group (apply.rs).
        let mut list = Vec::with_capacity(branches);
        for _ in 0..branches {
            let req = BeginRequest { agent: agent.clone(), may_touch: may_touch.clone(), lease: None };
            list.push(self.begin_at(req, epoch, Some(group), now).tx);
        }
        Ok(GroupStart { group, epoch, branches: list })
    }

    /// Chooses the winner of a group: every other unfinished branch aborts as a lost branch
    /// (plans returned, to run before the winner commits). The winner may then
    /// [`Core::request_commit`].
    pub fn choose_winner(&mut self, group: GroupId, winner: TxId) -> Result<Vec<AbortPlan>, EngineError> {
        let g = self.groups.get(&group).ok_or(EngineError::UnknownGroup { group })?;
        if !g.branches.contains(&winner) {
            return Err(EngineError::NotInGroup { tx: winner, group, branches: g.branches.to_vec() });
        }
        if let Some(w) = g.winner {
            return Err(EngineError::InvalidArgument {
                field: "winner",
                value: winner.to_string(),
                expected: if w == winner {
                    "a group whose winner is not yet chosen (this one already won)"
                } else {
                    "a group whose winner is not yet chosen"
                },
            });
        }
        match self.txs.get(&winner).map(|t| t.state) {
            Some(TxState::Open | TxState::Sealed) => {}
            Some(state) => return Err(EngineError::WrongState { tx: winner, op: "choose as winner", state, hint: "" }),
            None => return Err(EngineError::Settled { tx: winner }),
        }
        let losers: Vec<TxId> =
            g.branches.iter().copied().filter(|&b| b != winner && self.txs.contains_key(&b)).collect();
        self.groups.get_mut(&group).expect("present").winner = Some(winner);
        let mut plans = Vec::with_capacity(losers.len());
        for b in losers {
            if matches!(self.txs.get(&b).map(|t| t.state), Some(TxState::Open | TxState::Sealed | TxState::Waiting)) {
                plans.push(self.abort(b, AbortReason::LostBranch { winner })?);
            }
        }
        Ok(plans)
    }

    /// The chosen winner, or [`EngineError::NoWinner`].
    pub fn winner(&self, group: GroupId) -> Result<TxId, EngineError> {
        let g = self.groups.get(&group).ok_or(EngineError::UnknownGroup { group })?;
        g.winner.ok_or_else(|| EngineError::NoWinner {
            group,
            branches: g.branches.iter().copied().filter(|b| self.txs.contains_key(b)).collect(),
        })
    }

    /// Aborts every unfinished branch of a group (no winner).
    pub fn abort_group(&mut self, group: GroupId, reason: AbortReason) -> Result<Vec<AbortPlan>, EngineError> {
        let g = self.groups.get(&group).ok_or(EngineError::UnknownGroup { group })?;
        let branches: Vec<TxId> = g.branches.to_vec();
        let mut plans = Vec::new();
        for b in branches {
            if matches!(self.txs.get(&b).map(|t| t.state), Some(TxState::Open | TxState::Sealed | TxState::Waiting)) {
                plans.push(self.abort(b, reason.clone())?);
            }
        }
        Ok(plans)
    }

    /// The branches of a group.
    pub fn branches(&self, group: GroupId) -> Result<Vec<TxId>, EngineError> {
        Ok(self.groups.get(&group).ok_or(EngineError::UnknownGroup { group })?.branches.to_vec())
    }

    pub(super) fn group_member_finished(&mut self, group: GroupId, _tx: TxId) {
        let done = self.groups.get(&group).is_some_and(|g| g.branches.iter().all(|b| !self.txs.contains_key(b)));
        if done {
            self.groups.remove(&group);
        }
    }
}
