//! Fencing and stopping: the first fence met is kept and named by every refusal after it, the
//! engine halts its settlement tasks and wakes its waiters, and an owner can watch for it.

use std::sync::Arc;
use std::sync::atomic::Ordering as AtomicOrdering;

use smallvec::SmallVec;
use tidegate_storage::StoreError;
use tokio::sync::Notify;

use super::{Inner, Tidegate};
use crate::{Error, Fence, Result};

impl Inner {
    /// See [`Tidegate::stopped_error`].
    pub(crate) fn stopped_error(&self) -> Error {
        match &*self.fence.borrow() {
            Some(f) => Error::Fenced(f.clone()),
            None => Error::Store(StoreError::Closed),
        }
    }
}

impl Tidegate {
    /// The runtime error for a store failure met outside the engine lock (a durability wait):
    /// a fence stops the engine (its queued events will never be durable, so its state is
    /// ahead of the ledger); any other failure is returned as it is.
    pub(crate) fn store_failed(&self, e: StoreError) -> Error {
        let Some(fence) = Fence::from_store(self.plan_tenant(), &e) else { return Error::Store(e) };
        self.record_fence(&fence);
        self.inner.poisoned.store(true, AtomicOrdering::SeqCst);
        self.halt();
        Error::Fenced(self.fenced().unwrap_or(fence))
    }

    /// Keeps the first fence met (later ones say the same thing).
    pub(super) fn record_fence(&self, fence: &Fence) {
        self.inner.fence.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            *f = Some(fence.clone());
            true
        });
    }

    /// After a fence: cancels the settlement tasks (the new owner's recovery finishes what
    /// they left, from the ledger), stops the plan executor, and wakes every commit and
    /// turnstile waiter, who find the engine stopped. Called without the engine lock.
    pub(super) fn halt(&self) {
        self.inner.stop.notify_waiters();
        self.inner.turnstile.notify_waiters();
        let waiters: SmallVec<[Arc<Notify>; 4]> = self.inner.shared.lock().waiters.values().cloned().collect();
        for w in waiters {
            w.notify_one();
        }
        self.inner.plans.stop();
    }

    /// The error every operation gets once the engine has stopped: [`Error::Fenced`] after a
    /// fence, else `StoreError::Closed`.
    pub(crate) fn stopped_error(&self) -> Error {
        self.inner.stopped_error()
    }

    /// Refuses a read of the engine's state once it was fenced out: its state may be ahead of
    /// the ledger (a decision whose append was refused), and nothing unrecorded is shown.
    pub(crate) fn refuse_if_fenced(&self) -> Result<()> {
        match &*self.inner.fence.borrow() {
            Some(f) => Err(Error::Fenced(f.clone())),
            None => Ok(()),
        }
    }

    /// The fence, if this engine's store refused it as an old owner of its ledger stream (see
    /// [`Error::Fenced`]): the engine has stopped, and its owner should stop serving it.
    pub fn fenced(&self) -> Option<Fence> {
        self.inner.fence.borrow().clone()
    }

    /// Resolves with the fence once this engine is fenced out (at once if it already is), or
    /// with `None` if the engine is dropped first. Holds no reference to the engine, so an
    /// owner can watch from a task of its own without keeping the engine alive.
    pub fn when_fenced(&self) -> impl std::future::Future<Output = Option<Fence>> + Send + 'static {
        let mut rx = self.inner.fence.subscribe();
        async move { rx.wait_for(Option::is_some).await.ok().and_then(|f| f.clone()) }
    }
}
