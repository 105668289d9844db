//! Finishing what a previous process left unfinished, once its tools are registered again.

use tidegate_core::engine::{ExecResult, Recovery};
use tidegate_core::{Action, CallOutcome, EffectId, TxId};

use crate::engine::Tidegate;
use crate::tool::Probe;
use crate::{Error, Result};

/// What [`Tidegate::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Events replayed when the engine was built.
    pub events: u64,
    /// Transactions unfinished after replay.
    pub unfinished: usize,
    /// In-doubt eager calls the probe confirmed as done.
    pub probed_happened: Vec<(TxId, EffectId)>,
    /// In-doubt eager calls the probe confirmed as not done.
    pub probed_not_happened: Vec<(TxId, EffectId)>,
    /// In-doubt calls left `unresolved` (no probe, or it did not know): listed for an operator.
    pub unresolved: Vec<(TxId, EffectId)>,
    /// Commits finished (their never-attempted held effects released).
    pub commits_resumed: Vec<TxId>,
    /// Aborts finished (their remaining compensations run).
    pub aborts_resumed: Vec<TxId>,
    /// Transactions aborted because their lease ended while the process was down.
    pub expired: Vec<TxId>,
    /// Open transactions of the previous process aborted as orphans (see
    /// [`Tidegate::recover`]), or left open by [`Tidegate::recover_keeping_open`].
    pub orphans: Vec<TxId>,
}

impl Tidegate {
    /// Finishes the work the previous process left: resolves in-doubt calls through their
    /// tools' probes (never re-executing them), completes interrupted commits and aborts, and
    /// aborts transactions whose lease ended meanwhile. Register every tool first; an effect
    /// of an unregistered tool is an [`Error::UnknownTool`]. Idempotent: a second call does
    /// nothing.
    ///
    /// Transactions the previous process left open are aborted as orphans: in an embedded
    /// engine their agents died with the process. A server whose agents reconnect uses
    /// [`Tidegate::recover_keeping_open`] and lets their leases decide.
    pub async fn recover(&self) -> Result<RecoveryReport> {
        self.recover_with(true).await
    }

    /// [`Tidegate::recover`], leaving transactions whose leases still run open.
    pub async fn recover_keeping_open(&self) -> Result<RecoveryReport> {
        self.recover_with(false).await
    }

    async fn recover_with(&self, abort_open: bool) -> Result<RecoveryReport> {
        let report = self.recover_engine(abort_open).await?;
        // The plan executor rebuilds itself from the ledger once the engine's own unfinished
        // work is done (it starts later, at the first plan operation, in a ledger without plans).
        self.start_plans_if_any().await?;
        Ok(report)
    }

    async fn recover_engine(&self, abort_open: bool) -> Result<RecoveryReport> {
        // Every tool the unfinished work needs must be registered before any of it is taken,
        // so that an `UnknownTool` error leaves the work for a later call.
        let needed: Vec<std::sync::Arc<str>> = {
            let rec = self.inner.recovery.lock();
            let Some(rec) = rec.as_ref() else { return Ok(RecoveryReport::default()) };
            let core = &self.inner.shared.lock().core;
            let mut names: Vec<std::sync::Arc<str>> = rec.in_doubt.iter().map(|d| d.tool.clone()).collect();
            for tx in rec.committing.iter().chain(&rec.aborting).chain(&rec.open).chain(&rec.expired) {
                if let Ok(view) = core.view(*tx) {
                    names.extend(view.effects.iter().map(|e| e.tool.clone()));
                }
            }
            names
        };
        for name in &needed {
            self.tool(name)?;
        }
        let Some(rec) = self.inner.recovery.lock().take() else { return Ok(RecoveryReport::default()) };
        let Recovery { events, unfinished, in_doubt, committing, aborting, expired, open } = rec;
        let mut report =
            RecoveryReport { events, unfinished, expired, orphans: open.clone(), ..RecoveryReport::default() };
        for d in in_doubt {
            let tool = self.tool(&d.tool)?;
            let result = match tool.probe_call(self.recovered_ctx(d.tx, d.effect), d.args.clone()) {
                Some(p) => match p.await {
                    Probe::Happened(v) => {
                        report.probed_happened.push((d.tx, d.effect));
                        CallOutcome::done(v)
                    }
                    Probe::DidNotHappen => {
                        report.probed_not_happened.push((d.tx, d.effect));
                        CallOutcome::not_applied("did not happen (probe after restart)", false)
                    }
                    Probe::Unknown => {
                        report.unresolved.push((d.tx, d.effect));
                        CallOutcome::unknown("outcome unknown after restart (probe did not know)")
                    }
                },
                None => {
                    report.unresolved.push((d.tx, d.effect));
                    CallOutcome::unknown("outcome unknown after restart and the tool has no probe")
                }
            };
            let (exec, lsn) = self.with_core(|c| c.executed(d.tx, d.effect, result))?;
            self.durable(lsn).await?;
            if let ExecResult::Aborted(plan) = exec {
                self.run_abort(plan).await?;
            }
        }
        for tx in committing {
            // Releases started but never recorded (the crash took their `released` record,
            // which rides the group commit after the acknowledgement): the probe says whether
            // they happened; without one they stay unknown and are never fired again.
            let (unknown, _) = self.with_core(|c| c.unknown_releases(tx))?;
            for r in unknown {
                let tool = self.tool(&r.tool)?;
                let Some(p) = tool.probe_call(self.recovered_ctx(tx, r.effect), r.args.clone()) else {
                    report.unresolved.push((tx, r.effect));
                    continue;
                };
                let result = match p.await {
                    Probe::Happened(v) => {
                        report.probed_happened.push((tx, r.effect));
                        CallOutcome::done(v)
                    }
                    Probe::DidNotHappen => {
                        report.probed_not_happened.push((tx, r.effect));
                        CallOutcome::not_applied("release did not happen (probe after restart)", false)
                    }
                    Probe::Unknown => {
                        report.unresolved.push((tx, r.effect));
                        CallOutcome::unknown("release outcome unknown after restart (probe did not know)")
                    }
                };
                self.with_core(|c| c.release_probed(tx, r.effect, result))?;
            }
            let (plan, _) = self.with_core(|c| c.resume_commit(tx))?;
            for r in &plan.releases {
                self.tool(&r.tool)?;
            }
            match self.release(plan).await {
                Ok(_) | Err(Error::Aborted(_)) => report.commits_resumed.push(tx),
                Err(e) => return Err(e),
            }
        }
        for tx in aborting {
            let (plan, _) = self.with_core(|c| c.resume_abort(tx))?;
            self.run_abort(plan).await?;
            report.aborts_resumed.push(tx);
        }
        if abort_open {
            for tx in open {
                let reason = tidegate_core::AbortReason::Explicit { reason: "orphaned: its process stopped".into() };
                // In-doubt resolution above may already have aborted it.
                if let Ok((plan, _)) = self.with_core(|c| c.abort(tx, reason)) {
                    self.run_abort(plan).await?;
                }
            }
        }
        // Lease expiries decided during replay are queued as actions; run them now.
        let actions: Vec<Action> = self.inner.shared.lock().core.take_actions().collect();
        for a in actions {
            if let Action::RunAbort(plan) = a {
                self.run_abort(plan).await?;
            }
        }
        Ok(report)
    }
}
