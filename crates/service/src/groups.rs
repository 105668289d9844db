//! Speculation groups as typed operations: branches sharing one epoch, of which one commits.
//! Begin, read, commit the winner, abort, and the wait for every branch to settle; the live
//! handle of a group kept open across a restart is resumed through the engine.
//!
//! ```text
//!  begin_group(opts, n) ─► engine.speculate ─► n live branches + the live group
//!  commit_group(id, winner) ─ live group ─ start_settle("commit") ─┐ on a node task
//!  abort_group(id, reason)  ─ live group ─ start_settle("abort")  ─┘
//!  wait_group(order, op, timeout) ─ the op's end, then every branch's durable settlement
//! ```

use std::sync::Arc;
use std::time::Duration;

use tidegate_runtime::{GroupId, TxId, TxOptions};

use crate::error::{Result, ServiceError};
use crate::ids;
use crate::index::{Phase, TxView};
use crate::node::Service;
use crate::settle::{MAX_REASON_BYTES, WaitSlots, start_settle};
use crate::tenant::{LiveGroup, SettleOp, Tenant};

/// A speculation group as the ledger shows it.
#[derive(Debug, Clone)]
pub struct GroupView {
    /// The group's number (`grp_<tag>_<n>` in public).
    pub group: u64,
    /// Its branches that the ledger shows, in branch order.
    pub branches: Vec<TxView>,
    /// Every branch settled.
    pub settled: bool,
    /// The branch that committed, if one did.
    pub winner: Option<TxId>,
    /// Unsettled and still held by the engine (so a commit or abort can run).
    pub resumable: bool,
}

/// A group settlement started: what to wait for and the operation.
#[derive(Debug, Clone)]
pub struct GroupSettle {
    /// The group's number.
    pub group: u64,
    /// Its branches, in branch order.
    pub branches: Vec<TxId>,
    /// The branches in the order to wait for them (a commit's winner first).
    pub order: Vec<TxId>,
    /// The commit or abort running.
    pub op: SettleOp,
}

enum GroupRun {
    Commit(TxId),
    Abort(String),
}

impl Tenant {
    /// The group named by the public id `id` (another tenant's, or a malformed one, is
    /// `NotFound`).
    pub fn parse_group(&self, id: &str) -> Result<u64> {
        ids::parse(ids::Kind::Group, &self.tag, id)
            .ok_or_else(|| ServiceError::NotFound { what: "speculation group", name: id.to_owned() })
    }

    /// The branches of group `g`: the live group's, else the ledger index's.
    pub fn branches_of(&self, g: u64) -> Option<Vec<TxId>> {
        self.group(g).map(|lg| lg.spec.branches().iter().map(|b| b.id()).collect()).or_else(|| self.index.group(g))
    }

    /// Group `g` with `branches` as the ledger shows them now.
    pub fn group_view(&self, g: u64, branches: &[TxId]) -> GroupView {
        let views: Vec<TxView> = branches.iter().filter_map(|b| self.view(*b).ok().flatten()).collect();
        let settled = views.iter().all(|v| v.phase.settled());
        let winner = views.iter().find(|v| v.phase == Phase::Committed).map(|v| v.tx);
        let resumable = !settled && (self.group(g).is_some() || self.engine.speculation(GroupId(g)).is_ok());
        GroupView { group: g, branches: views, settled, winner, resumable }
    }

    /// The group named `id` with its branches.
    pub fn group_of(&self, id: &str) -> Result<GroupView> {
        let g = self.parse_group(id)?;
        let branches = self
            .branches_of(g)
            .ok_or_else(|| ServiceError::NotFound { what: "speculation group", name: id.to_owned() })?;
        Ok(self.group_view(g, &branches))
    }

    /// Begins a speculation group of `branches` branches (the front door bounds the count),
    /// each a live transaction. Returns the group's number and its branches.
    pub fn begin_group(&self, opts: TxOptions, branches: usize) -> Result<(u64, Vec<TxId>)> {
        let spec = self.engine.speculate(opts, branches)?;
        let g = spec.id().0;
        for b in spec.branches() {
            self.add_live(b.clone(), Some(g));
        }
        let ids: Vec<TxId> = spec.branches().iter().map(|b| b.id()).collect();
        self.add_group(spec);
        Ok((g, ids))
    }

    /// The live handle of a group: one this process began, or one kept open across a restart
    /// (`recover_keeping_open`), resumed through the engine with its unsettled branches.
    fn live_group(&self, id: &str) -> Result<(u64, Arc<LiveGroup>)> {
        let g = self.parse_group(id)?;
        if let Some(lg) = self.group(g) {
            return Ok((g, lg));
        }
        let Some(branches) = self.index.group(g) else {
            return Err(ServiceError::NotFound { what: "speculation group", name: id.to_owned() });
        };
        let settled = |b: &TxId| self.index.phase(*b).is_none_or(|p| p.settled());
        let spec = match self.engine.speculation(GroupId(g)) {
            Ok(spec) if !branches.iter().all(settled) => spec,
            _ => return Err(ServiceError::conflict("not_resumable", format!("group {id} has settled"))),
        };
        for b in spec.branches().iter().filter(|b| !settled(&b.id())) {
            self.resume_live(b.clone(), Some(g));
        }
        Ok((g, self.resume_group(spec)))
    }

    /// Commits the winner of group `id` (the public id of one of its branches): the other
    /// branches abort, then the winner commits, on a node task.
    pub fn commit_group(&self, node: &Service, id: &str, winner: &str) -> Result<GroupSettle> {
        let (g, lg) = self.live_group(id)?;
        let bad_winner = || ServiceError::invalid("winner", winner, "the id of one of the group's branches");
        let w = self.parse_tx(winner).map_err(|_| bad_winner())?;
        let branches: Vec<TxId> = lg.spec.branches().iter().map(|b| b.id()).collect();
        if !branches.contains(&w) {
            return Err(bad_winner());
        }
        let op = start_group(node, &lg, "commit", GroupRun::Commit(w));
        let mut order = vec![w];
        order.extend(branches.iter().copied().filter(|b| *b != w));
        Ok(GroupSettle { group: g, branches, order, op })
    }

    /// Aborts every branch of group `id` for `reason` (at most [`MAX_REASON_BYTES`]), on a
    /// node task.
    pub fn abort_group(&self, node: &Service, id: &str, reason: String) -> Result<GroupSettle> {
        if reason.len() > MAX_REASON_BYTES {
            return Err(ServiceError::invalid("reason", reason, format!("at most {MAX_REASON_BYTES} bytes")));
        }
        let (g, lg) = self.live_group(id)?;
        let branches: Vec<TxId> = lg.spec.branches().iter().map(|b| b.id()).collect();
        let op = start_group(node, &lg, "abort", GroupRun::Abort(reason));
        Ok(GroupSettle { group: g, order: branches.clone(), branches, op })
    }

    /// Waits, within `total`, for a group settlement: the operation first (its refusal is the
    /// answer), then every branch in `s.order`. `Ok(true)` when all settled durably.
    pub async fn wait_group<W: WaitSlots + ?Sized>(
        &self,
        node: &Service,
        s: &GroupSettle,
        total: Duration,
        slots: &W,
    ) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + total;
        let op = &s.op;
        let first = s.order.first().copied().unwrap_or(TxId(0));
        let mut settled = self.wait_settled(node, first, Some(op.done.clone()), total, slots).await?;
        // The first branch's record can show it settled a moment before the group operation
        // reports its end: wait for that report too (within the same deadline), or a group that
        // has settled would be answered as still settling.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut done_rx = op.done.clone();
        let done = match tokio::time::timeout(left, done_rx.wait_for(Option::is_some)).await {
            Ok(Ok(result)) => {
                if let Some(Err(e)) = &*result {
                    return Err(e.clone());
                }
                true
            }
            // Timed out, or the operation's task is gone without a report.
            _ => op.done.borrow().is_some(),
        };
        if done {
            for b in &s.order {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                settled &= self.wait_settled(node, *b, None, left, slots).await?;
            }
        } else {
            settled = false;
        }
        Ok(settled)
    }
}

fn start_group(node: &Service, lg: &Arc<LiveGroup>, kind: &'static str, run: GroupRun) -> SettleOp {
    let lg2 = lg.clone();
    let work = async move {
        let r = match run {
            GroupRun::Commit(winner) => lg2.spec.commit_winner(winner).await.map(|_| ()),
            GroupRun::Abort(reason) => lg2.spec.abort(reason).await.map(|_| ()),
        };
        match r {
            Ok(()) | Err(tidegate_runtime::Error::Aborted(_)) => Ok(()),
            // The group was looked up before: the engine no longer knowing it means it settled
            // (every branch finished), not that it never existed.
            Err(tidegate_runtime::Error::Engine(tidegate_runtime::EngineError::UnknownGroup { .. })) => {
                Err(ServiceError::conflict("wrong_state", "the speculation group has already settled"))
            }
            Err(e) => Err(ServiceError::engine(e)),
        }
    };
    start_settle(node, lg, |lg: &LiveGroup| &lg.settle, (kind, false), || {}, work)
}
