//! Executing settlements: releasing held effects at commit and compensating at abort, each
//! with bounded retry and backoff from the engine's clock.

use tidegate_core::engine::{AbortPlan, CompensationTask, ReleasePlan, Settlement};
use tidegate_core::{CallOutcome, Outcome};

use std::future::Future;

use futures::future::BoxFuture;

use crate::engine::Tidegate;
use crate::{Error, Result};

impl Tidegate {
    /// Runs `work` to completion whether or not the returned future stays alive: dropping
    /// the returned future does not cancel the work, so settlement never depends on the
    /// caller's future staying alive.
    ///
    /// The first poll runs inline, in the caller's task (inside the engine's runtime
    /// context): work that completes at once (the usual commit on a ledger whose sync is
    /// immediate) costs no task. Work that has to wait is handed, after that first poll, to a
    /// task of its own ([`Tidegate::spawn_owned`]) before this future returns `Pending`, so the
    /// caller can drop it only once the engine owns the rest. (Dropped before its first poll,
    /// nothing ran, as for any future.)
    ///
    /// Only the boxing is generic over the work's type; the rest is compiled once per output
    /// type (see [`Tidegate::spawn_owned`]).
    pub(crate) fn detached<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> impl Future<Output = Result<T>> + Send + '_ {
        // Boxed once: moved to a task afterwards without copying the (large) future itself.
        self.detached_boxed(Box::pin(work))
    }

    async fn detached_boxed<T: Send + 'static>(&self, mut work: BoxFuture<'static, Result<T>>) -> Result<T> {
        if self.inner.poisoned.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.stopped_error());
        }
        let handle = &self.inner.handle;
        let first = std::future::poll_fn(|cx| {
            let _rt = handle.enter();
            std::task::Poll::Ready(work.as_mut().poll(cx))
        })
        .await;
        if let std::task::Poll::Ready(r) = first {
            return r;
        }
        // The work's wakers now point at this task; the spawned task's first poll replaces them.
        match self.spawn_boxed(work).await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down: the work did not finish here.
            Err(_) => Err(self.stopped_error()),
        }
    }

    /// Spawns `work` on the engine's runtime as a task the engine owns: it runs whether or not
    /// anyone waits for it, until it finishes or [`Tidegate::stop`] cancels it.
    ///
    /// The work is boxed and the task is built around the box, so the task's machinery (its
    /// wrapper future, tokio's harness for it) is compiled once per output type, not once per
    /// work type: a generic caller otherwise multiplies it (docs/performance.md, "First run
    /// and test run").
    pub(crate) fn spawn_owned<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> tokio::task::JoinHandle<Result<T>> {
        self.spawn_boxed(Box::pin(work))
    }

    fn spawn_boxed<T: Send + 'static>(
        &self,
        work: BoxFuture<'static, Result<T>>,
    ) -> tokio::task::JoinHandle<Result<T>> {
        let inner = self.inner.clone();
        // Taken on the caller's task: the wrapper re-enters the caller's context in the task.
        let scope = self.inner.task_scope.as_ref().map(|f| f());
        let body = async move {
            let stop = inner.stop.notified();
            tokio::pin!(stop);
            // Registered before the check, so a stop between the two is not missed.
            stop.as_mut().enable();
            if inner.poisoned.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(inner.stopped_error());
            }
            tokio::select! {
                r = work => r,
                () = stop => Err(inner.stopped_error()),
            }
        };
        let stopped = self.inner.clone();
        self.inner.handle.spawn(async move {
            let Some(wrap) = scope else { return body.await };
            let slot = std::sync::Arc::new(parking_lot::Mutex::new(None));
            let out = slot.clone();
            wrap(Box::pin(async move {
                let r = body.await;
                *out.lock() = Some(r);
            }))
            .await;
            let r = slot.lock().take();
            r.unwrap_or_else(|| Err(stopped.stopped_error()))
        })
    }

    /// Stops the engine as a process stop would, for an owner shutting it down (a server
    /// closing a tenant): every settlement task still running is cancelled where it stands
    /// (the ledger has what it did; the next open's recovery finishes it) and no further work
    /// is accepted (`StoreError::Closed`, or [`Error::Fenced`] once the store fenced it out). Settlement tasks otherwise outlive the futures of
    /// the calls that started them, and keep the engine (and its store) alive until done.
    pub fn stop(&self) {
        self.inner.poisoned.store(true, std::sync::atomic::Ordering::SeqCst);
        self.inner.stop.notify_waiters();
        self.inner.plans.stop();
    }

    /// [`Tidegate::run_abort`] in a task of its own (see [`Tidegate::detached`]).
    pub(crate) async fn run_abort_detached(&self, plan: AbortPlan) -> Result<Outcome> {
        let tg = self.clone();
        self.detached(async move { tg.run_abort(plan).await }).await
    }

    /// Releases a decided commit's held effects in issuance order, stopping at the first that
    /// fails after retries, then finishes the commit.
    pub(crate) async fn release(&self, plan: ReleasePlan) -> Result<Outcome> {
        let tx = plan.tx;
        // Whether the commit decision is already durable (it shares the first release's sync).
        let mut decided_durably = false;
        for r in plan.releases {
            let (_, lsn) = self.with_core(|c| c.release_started(tx, r.effect))?;
            self.durable(lsn).await?;
            decided_durably = true;
            // The one retry-and-probe policy: an unknown outcome is never fired again unless
            // the probe says it did not happen.
            let result = match self.tool(&r.tool) {
                Ok(tool) => self.call_under_policy(&tool, &self.call_ctx(&tool, tx, r.effect), &r.args).await,
                Err(e) => CallOutcome::not_applied(e.to_string(), false),
            };
            let failed = !matches!(result, CallOutcome::Done { .. });
            // Not waited on here: a crash before this record is durable leaves a started,
            // unrecorded release, which recovery treats as unknown and never fires again; the
            // next release's start (or the settlement) makes it durable.
            self.with_core(|c| c.release_done(tx, r.effect, result))?;
            if failed {
                break;
            }
        }
        let (settlement, lsn) = self.with_core(|c| c.finish_commit(tx))?;
        match settlement {
            Settlement::Committed(outcome) => {
                // A commit is acknowledged once its decision is durable. With releases, it is
                // (the first `release_started` waited for it), and the last `released` and the
                // settlement ride the next group commit instead of costing a sync of their
                // own: if a crash loses them, recovery finds the commit decided and the
                // release started but unrecorded, asks the tool's probe, and otherwise tags
                // the release unknown (never fires it again). Without releases the decision
                // is in this very append, so wait for it.
                if !decided_durably {
                    self.durable(lsn).await?;
                }
                Ok(outcome)
            }
            Settlement::Abort(plan) => Err(Error::Aborted(Box::new(self.run_abort(plan).await?))),
        }
    }

    /// Runs an abort's compensations (last-issued first) and finishes the abort.
    pub(crate) async fn run_abort(&self, plan: AbortPlan) -> Result<Outcome> {
        let tx = plan.tx;
        for task in plan.compensations {
            let result = self.compensate(&task).await;
            self.with_core(|c| c.compensated(tx, task.effect, result))?;
        }
        let (outcome, lsn) = self.with_core(|c| c.finish_abort(tx))?;
        self.durable(lsn).await?;
        Ok(outcome)
    }

    /// Compensates an effect that finished after its transaction aborted.
    pub(crate) async fn late_compensate(&self, task: CompensationTask) {
        let result = self.compensate(&task).await;
        let _ = self.with_core(|c| {
            c.late_compensated(task.tx, task.effect, result, task.blind);
            Ok(())
        });
    }

    async fn compensate(&self, task: &CompensationTask) -> Result<Option<String>, String> {
        let tool = self.tool(&task.tool).map_err(|e| e.to_string())?;
        self.compensate_under_policy(&tool, &self.call_ctx(&tool, task.tx, task.effect), &task.args, &task.output).await
    }
}
