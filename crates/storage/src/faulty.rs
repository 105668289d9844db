//! A fault-injecting wrapper: group commit simulated over any store, crashing on cue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tidegate_core::{Batch, Event};

use crate::{LedgerStore, Lsn, Ownership, StoreError, StoredCheckpoint};

/// Where a [`FaultyStore`] crashes. `None` never crashes there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultOptions {
    /// Let this many non-empty appends succeed; the next one crashes the store (and fails).
    pub crash_after_appends: Option<u64>,
    /// Let this many syncs succeed; the next one crashes the store before writing anything.
    /// Storing a checkpoint is a sync too (it syncs what is pending, then the checkpoint),
    /// so a crash can be placed just before, at, or just after a checkpoint write.
    pub crash_after_syncs: Option<u64>,
}

/// A [`LedgerStore`] wrapper for crash tests: it keeps appended batches pending (like a
/// group-commit queue) and hands them to the inner store only when a durability wait (or
/// [`FaultyStore::sync`]) asks for them, one "sync" for everything pending. It can crash at
/// the N-th append or the N-th sync ([`FaultOptions`]), or on demand
/// ([`FaultyStore::crash_now`]).
///
/// A crash drops every pending batch and stops the wrapper: every later call fails with
/// [`StoreError::Failed`] (its cause [`StoreError::InjectedCrash`]). The inner store then holds
/// exactly the synced events, which is what a real store shows after reopening:
/// [`FaultyStore::into_inner`] returns it (for a [`crate::MemoryStore`], that *is* the
/// reopened ledger; for a durable backend such as `tidegate_sqlite::SqliteStore`, drop it and
/// reopen the directory).
///
/// Syncs happen only when asked for, under the wrapper's lock, so a single-threaded test is
/// deterministic: the N-th sync is the N-th wait that found something pending. Concurrent
/// waiters share a sync (whoever takes the lock first syncs for all), as in a real group
/// commit. The inner store should hold only durable events when wrapped.
///
/// ```
/// use tidegate_storage::{FaultOptions, FaultyStore, LedgerStore, MemoryStore};
/// # fn ev(i: u64) -> tidegate_core::Event { tidegate_core::Event::Sealed { tx: tidegate_core::TxId(i) } }
/// let store = FaultyStore::new(MemoryStore::new(), FaultOptions { crash_after_syncs: Some(1), ..Default::default() });
/// let a = store.append(&tidegate_core::Batch::from(vec![ev(1)])).unwrap();
/// store.wait_durable(a).unwrap(); // sync #1
/// let b = store.append(&tidegate_core::Batch::from(vec![ev(2)])).unwrap();
/// assert!(store.wait_durable(b).unwrap_err().is_injected_crash()); // sync #2 crashes
/// assert!(store.append(&tidegate_core::Batch::from(vec![ev(3)])).is_err());
/// assert_eq!(store.into_inner().events().len(), 1); // only the synced batch survived
/// ```
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    opts: FaultOptions,
    state: Mutex<State>,
    durable: AtomicU64,
    last: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Events appended but not yet synced: LSNs `durable + 1 ..= last`.
    pending: Vec<Event>,
    appends: u64,
    syncs: u64,
    failed: Option<Arc<StoreError>>,
}

impl<S: LedgerStore> FaultyStore<S> {
    /// Wraps `inner`, whose events (LSNs `1..=inner.last_lsn()`) count as durable.
    pub fn new(inner: S, opts: FaultOptions) -> FaultyStore<S> {
        let last = inner.last_lsn();
        FaultyStore {
            inner,
            opts,
            state: Mutex::new(State::default()),
            durable: AtomicU64::new(last),
            last: AtomicU64::new(last),
        }
    }

    /// The wrapped store: it holds exactly the synced events.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store, dropping whatever is still pending (as a crash would).
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// How many non-empty appends and how many syncs have succeeded so far.
    pub fn counts(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.appends, st.syncs)
    }

    /// Whether the wrapper has crashed (or failed).
    pub fn crashed(&self) -> bool {
        self.state.lock().failed.is_some()
    }

    /// Syncs everything pending now (one sync, if anything is pending).
    pub fn sync(&self) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        self.sync_locked(&mut st)
    }

    /// Crashes now: drops everything pending; every later call fails.
    pub fn crash_now(&self) {
        let mut st = self.state.lock();
        if st.failed.is_none() {
            let n = st.syncs + 1;
            Self::fail(&mut st, StoreError::InjectedCrash { what: "crash_now", n });
        }
    }

    fn fail(st: &mut State, cause: StoreError) -> StoreError {
        st.pending = Vec::new();
        let cause = Arc::new(cause);
        st.failed = Some(cause.clone());
        StoreError::Failed { cause }
    }

    fn failed(st: &State) -> Result<(), StoreError> {
        match &st.failed {
            Some(cause) => Err(StoreError::Failed { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    fn sync_locked(&self, st: &mut State) -> Result<(), StoreError> {
        self.sync_with(st, None)
    }

    /// One sync: everything pending, then the checkpoint if one is given (both or, on an
    /// injected crash, neither).
    fn sync_with(&self, st: &mut State, checkpoint: Option<(Lsn, &[u8])>) -> Result<(), StoreError> {
        Self::failed(st)?;
        if st.pending.is_empty() && checkpoint.is_none() {
            return Ok(());
        }
        if self.opts.crash_after_syncs.is_some_and(|n| st.syncs >= n) {
            let n = st.syncs + 1;
            return Err(Self::fail(st, StoreError::InjectedCrash { what: "sync", n }));
        }
        let pending = std::mem::take(&mut st.pending);
        let written =
            self.inner.append(&Batch::from(pending)).and_then(|l| self.inner.wait_durable(l).map(|()| l)).and_then(
                |l| match checkpoint {
                    Some((lsn, bytes)) => self.inner.put_checkpoint(lsn, bytes).map(|()| l),
                    None => Ok(l),
                },
            );
        match written {
            Ok(l) => {
                debug_assert_eq!(l, self.last.load(Ordering::Relaxed), "inner store's LSNs diverged");
                st.syncs += 1;
                self.durable.store(l, Ordering::Release);
                Ok(())
            }
            Err(e) => Err(Self::fail(st, e)),
        }
    }
}

impl<S: LedgerStore> LedgerStore for FaultyStore<S> {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        let mut st = self.state.lock();
        Self::failed(&st)?;
        if batch.is_empty() {
            return Ok(self.last.load(Ordering::Relaxed));
        }
        if self.opts.crash_after_appends.is_some_and(|n| st.appends >= n) {
            let n = st.appends + 1;
            return Err(Self::fail(&mut st, StoreError::InjectedCrash { what: "append", n }));
        }
        st.appends += 1;
        let last = self.last.load(Ordering::Relaxed) + batch.len() as Lsn;
        st.pending.extend(batch.iter().cloned());
        self.last.store(last, Ordering::Release);
        Ok(last)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.durable.load(Ordering::Acquire)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        // What was durable stays durable, even after a crash.
        if lsn <= self.durable.load(Ordering::Acquire) {
            return Ok(());
        }
        Self::failed(&st)?;
        let last = self.last.load(Ordering::Relaxed);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        self.sync_locked(&mut st)
    }

    fn poll_durable(&self, lsn: Lsn, _cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        Poll::Ready(self.wait_durable(lsn))
    }

    fn last_lsn(&self) -> Lsn {
        self.last.load(Ordering::Acquire)
    }

    /// The inner store's: the wrapper appends through it.
    fn ownership(&self) -> Ownership {
        self.inner.ownership()
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        // Snapshot the pending tail, then read the inner store without holding the lock (so
        // `visit` may use this store): events only move from `pending` into the inner store.
        let (durable, pending) = {
            let st = self.state.lock();
            Self::failed(&st)?;
            (self.durable.load(Ordering::Acquire), st.pending.clone())
        };
        let from = from.max(1);
        let mut go_on = true;
        if from <= durable {
            self.inner.scan(from, &mut |lsn, e| {
                if lsn > durable {
                    return false;
                }
                go_on = visit(lsn, e);
                go_on
            })?;
        }
        if !go_on {
            return Ok(());
        }
        for (i, e) in pending.iter().enumerate() {
            let lsn = durable + 1 + i as Lsn;
            if lsn >= from && !visit(lsn, e) {
                break;
            }
        }
        Ok(())
    }

    /// One sync of everything pending plus the checkpoint, counted (and crashable) like any
    /// other sync.
    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        Self::failed(&st)?;
        let last = self.last.load(Ordering::Relaxed);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        self.sync_with(&mut st, Some((lsn, bytes)))
    }

    /// The inner store's: only synced checkpoints exist.
    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        Self::failed(&self.state.lock())?;
        self.inner.checkpoint()
    }
}
