//! One transition of the state machine: run under the engine lock, its events appended to the
//! ledger and handed to every observer in ledger order, its actions dispatched after the lock;
//! and the durability waits that follow.

use std::sync::atomic::Ordering as AtomicOrdering;

use smallvec::SmallVec;
use tidegate_core::{Action, Core};
use tidegate_storage::Lsn;

use super::{Shared, Tidegate};
use crate::tool::CallCtx;
use crate::{Error, Fence, Result};

impl Tidegate {
    /// Runs `f` on the state machine under the lock, appends the events it produced to the
    /// ledger (in decision order), and dispatches its actions. Returns `f`'s result and the
    /// LSN to wait on for durability.
    pub(crate) fn with_core<R>(
        &self,
        f: impl FnOnce(&mut Core) -> std::result::Result<R, tidegate_core::EngineError>,
    ) -> Result<(R, Lsn)> {
        if self.inner.poisoned.load(AtomicOrdering::Relaxed) {
            return Err(self.stopped_error());
        }
        let mut g = self.inner.shared.lock();
        let r = f(&mut g.core);
        let lsn = self.after_transition(g)?;
        match r {
            Ok(r) => Ok((r, lsn)),
            Err(e) => Err(self.inner.shared.lock().endings.explain(e)),
        }
    }

    /// The part of [`Tidegate::with_core`] that does not depend on the transition: appends
    /// the events, hands them to the observers, dispatches the actions and releases the lock.
    /// Kept out of the generic function on purpose: a closure or `async` block written inside
    /// a generic function is a new type for each instantiation, so the two settlement tasks
    /// spawned below were compiled once per caller of `with_core` (about a hundred copies of
    /// the task machinery in the binary; docs/performance.md, "First run and test run").
    fn after_transition(&self, mut g: parking_lot::MutexGuard<'_, Shared>) -> Result<Lsn> {
        let mut background: SmallVec<[Action; 2]> = SmallVec::new();
        let mut lsn = 0;
        // Contexts of settled transactions, dropped after the lock (a handle may be a language
        // binding's object whose drop must not run under the engine's lock).
        let mut finished_ctxs: SmallVec<[SmallVec<[CallCtx; 2]>; 1]> = SmallVec::new();
        if g.core.has_events() {
            let Shared { core, endings, ctxs, .. } = &mut *g;
            for e in core.events() {
                endings.note(e);
                if let tidegate_core::Event::Settled { tx, .. } = e
                    && !ctxs.is_empty()
                    && let Some(c) = ctxs.remove(tx)
                {
                    finished_ctxs.push(c);
                }
            }
            // One shared batch (observer.rs): the store, the plan executor's feed, the
            // checkpoint shadow and the embedder's observers all get the same handle, in ledger
            // order, under the lock. The last batch is kept as a spare: if no listener kept it,
            // its allocation carries this one.
            let spare = g.spare.take();
            let batch = g.core.take_batch(spare);
            match self.inner.store.append(&batch) {
                Ok(l) => {
                    lsn = l;
                    if self.plans_listening() {
                        self.feed_plans(&batch);
                    }
                    if let Some(ck) = &self.inner.checkpointer {
                        ck.appended(l, &batch);
                    }
                    for o in &self.inner.observers {
                        o.appended(l, &batch);
                    }
                    g.spare = Some(batch);
                }
                Err(e) => {
                    // The state machine moved on but its facts are not in the ledger: stop
                    // accepting work rather than acknowledge something unrecorded. A fence is
                    // recorded first, so that every refusal from now on names it.
                    let fence = Fence::from_store(self.plan_tenant(), &e);
                    if let Some(f) = &fence {
                        self.record_fence(f);
                    }
                    self.inner.poisoned.store(true, AtomicOrdering::SeqCst);
                    drop(g);
                    drop(finished_ctxs);
                    return Err(match fence {
                        Some(f) => {
                            self.halt();
                            Error::Fenced(f)
                        }
                        None => Error::Store(e),
                    });
                }
            }
        }
        let traces: SmallVec<[tidegate_core::TraceRecord; 1]> =
            if g.core.has_traces() { g.core.take_traces().collect() } else { SmallVec::new() };
        if g.core.has_actions() {
            let actions: SmallVec<[Action; 4]> = g.core.take_actions().collect();
            for a in actions {
                match a {
                    Action::Wake(tx) => {
                        if let Some(n) = g.waiters.get(&tx) {
                            n.notify_one();
                        }
                    }
                    other => background.push(other),
                }
            }
        }
        drop(g);
        drop(finished_ctxs);
        if let Some(sink) = &self.inner.trace {
            for r in &traces {
                sink.record(r);
            }
        }
        for a in background {
            let tg = self.clone();
            match a {
                Action::RunAbort(plan) => {
                    self.spawn_owned(async move { tg.run_abort(plan).await });
                }
                Action::LateCompensate(task) => {
                    self.spawn_owned(async move {
                        tg.late_compensate(task).await;
                        Ok(())
                    });
                }
                _ => {}
            }
        }
        Ok(lsn)
    }

    /// Waits until everything the engine has appended so far is durable: after a settlement
    /// seen through an [`crate::AppendObserver`] (which sees batches when they are appended,
    /// before the store made them durable), this is the wait that makes it safe to report.
    pub async fn appended_durable(&self) -> Result<()> {
        self.durable(self.inner.store.last_lsn()).await
    }

    /// Waits until the ledger holds everything up to `lsn` durably.
    pub(crate) async fn durable(&self, lsn: Lsn) -> Result<()> {
        if lsn == 0 || self.inner.store.is_durable(lsn) {
            return Ok(());
        }
        // Resolved by the store's group-commit writer; no thread is parked per waiter.
        tidegate_storage::durable(&*self.inner.store, lsn).await.map_err(|e| self.store_failed(e))
    }
}
