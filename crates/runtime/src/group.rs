//! Speculation: alternative branches of one decision, run as transactions sharing one epoch.
//! Exactly one wins; the others abort and leave no bufferable or irreversible residue.

use smallvec::SmallVec;
use tidegate_core::{AbortReason, Epoch, GroupId, Outcome, TxId, TxState};

use crate::Result;
use crate::engine::{Tidegate, TxOptions};
use crate::tx::Transaction;

/// A speculation group. Later transactions on its scopes wait for it as for one transaction.
#[derive(Debug, Clone)]
pub struct Speculation {
    engine: Tidegate,
    group: GroupId,
    epoch: Epoch,
    branches: Vec<Transaction>,
}

/// The settlement of a speculation group.
#[derive(Debug, Clone)]
pub struct SpeculationOutcome {
    /// The winner's settlement.
    pub winner: Outcome,
    /// Each loser's settlement (lost_branch aborts).
    pub losers: Vec<Outcome>,
}

impl Tidegate {
    /// Begins a speculation group of `branches` transactions sharing one epoch.
    pub fn speculate(&self, opts: TxOptions, branches: usize) -> Result<Speculation> {
        let may_touch = match &opts.may_touch {
            None => None,
            Some(list) => Some(
                list.iter()
                    .enumerate()
                    .map(|(i, s)| self.parse_scope(s, &format!("may_touch[{i}]")))
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        let agent = opts.agent.as_deref().unwrap_or("agent").into();
        let now = self.inner.clock.now();
        let (start, _) = self.with_core(|c| c.begin_group(agent, branches, may_touch, now))?;
        let branches = start.branches.iter().map(|&tx| Transaction::new(self.clone(), tx, start.epoch)).collect();
        Ok(Speculation { engine: self.clone(), group: start.group, epoch: start.epoch, branches })
    }
}

impl Tidegate {
    /// A handle on the unsettled speculation group `id` of this engine, e.g. one whose
    /// branches `recover_keeping_open` kept open across a restart, so that its agent (or a
    /// server acting for it) can choose a winner and commit, or abort it. Branches that have
    /// finished are in [`Speculation::branches`] too (their operations say how they ended).
    /// A winner chosen before a restart is not in the ledger: choose it again. A group whose
    /// branches have all finished, or an id never issued, is `EngineError::UnknownGroup`.
    pub fn speculation(&self, id: GroupId) -> Result<Speculation> {
        let g = self.inner.shared.lock();
        let branches = g.core.branches(id)?;
        let epoch = branches
            .iter()
            .find_map(|b| g.core.epoch(*b).ok())
            .ok_or(tidegate_core::EngineError::UnknownGroup { group: id })?;
        drop(g);
        let branches = branches.into_iter().map(|tx| Transaction::new(self.clone(), tx, epoch)).collect();
        Ok(Speculation { engine: self.clone(), group: id, epoch, branches })
    }

    /// Runs the losers' aborts in a task of their own (dropping the caller's future does not
    /// leave them aborting), in the plans' order.
    ///
    /// Consecutive plans with nothing to compensate (branches that only held effects, the
    /// usual loser) finish in one transition: the same events in the same order as one
    /// transition each, but one lock, one append and one durability wait for the run instead
    /// of one per branch (a 16-branch commit made 15 such rounds).
    async fn run_aborts_detached(&self, plans: Vec<tidegate_core::engine::AbortPlan>) -> Result<Vec<Outcome>> {
        let tg = self.clone();
        self.detached(async move {
            let mut out = Vec::with_capacity(plans.len());
            let mut plans = plans.into_iter().peekable();
            while let Some(plan) = plans.next() {
                if !plan.compensations.is_empty() {
                    out.push(tg.run_abort(plan).await?);
                    continue;
                }
                let mut run: SmallVec<[TxId; 16]> = SmallVec::new();
                run.push(plan.tx);
                while let Some(next) = plans.next_if(|p| p.compensations.is_empty()) {
                    run.push(next.tx);
                }
                // Stops at the first refusal, as one transition per plan did; the plans
                // finished before it are in the ledger either way.
                let (outcomes, lsn) = tg.with_core(|c| {
                    run.iter().map(|tx| c.finish_abort(*tx)).collect::<std::result::Result<Vec<_>, _>>()
                })?;
                tg.durable(lsn).await?;
                out.extend(outcomes);
            }
            Ok(out)
        })
        .await
    }
}

impl Speculation {
    /// The group's id.
    pub fn id(&self) -> GroupId {
        self.group
    }

    /// The epoch every branch shares.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The branches, one transaction each.
    pub fn branches(&self) -> &[Transaction] {
        &self.branches
    }

    /// Chooses the winner and aborts every other branch (compensating what they executed,
    /// dropping what they held). Returns the losers' settlements.
    pub async fn choose(&self, winner: TxId) -> Result<Vec<Outcome>> {
        let (plans, _) = self.engine.with_core(|c| c.choose_winner(self.group, winner))?;
        self.engine.run_aborts_detached(plans).await
    }

    /// Commits the chosen winner (sealing it if still open). Refuses with `NoWinner` if no
    /// winner has been chosen.
    pub async fn commit(&self) -> Result<Outcome> {
        let winner = self.engine.inner.shared.lock().core.winner(self.group)?;
        let tx =
            self.branches.iter().find(|b| b.id() == winner).cloned().ok_or(tidegate_core::EngineError::NotInGroup {
                tx: winner,
                group: self.group,
                branches: self.branches.iter().map(Transaction::id).collect(),
            })?;
        if tx.state()? == TxState::Open {
            tx.seal()?;
        }
        tx.commit().await
    }

    /// Chooses `winner`, aborts the losers first, then commits the winner.
    pub async fn commit_winner(&self, winner: TxId) -> Result<SpeculationOutcome> {
        let losers = self.choose(winner).await?;
        let winner = self.commit().await?;
        Ok(SpeculationOutcome { winner, losers })
    }

    /// Aborts every branch (no winner).
    pub async fn abort(&self, reason: impl Into<String>) -> Result<Vec<Outcome>> {
        let reason = AbortReason::Explicit { reason: reason.into() };
        let (plans, _) = self.engine.with_core(|c| c.abort_group(self.group, reason))?;
        self.engine.run_aborts_detached(plans).await
    }
}
