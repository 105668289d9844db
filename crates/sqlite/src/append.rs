//! The write side of the contract: queueing a batch ([`LedgerStore::append`]), waiting for
//! durability (blocking and async, one registry of wakers), and handing a checkpoint to the
//! writer. The commit itself is the writer thread's (`writer.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use tidegate_storage::{LedgerStore, Lsn, StoreError};

use crate::SqliteStore;
use crate::writer::{Queued, tx_column};

impl SqliteStore {
    pub(crate) fn append_batch(&self, batch: &tidegate_core::Batch) -> Result<Lsn, StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.shared.path.clone(), op: "append" });
        }
        // Nothing is encoded here: the caller holds the engine's lock. The writer encodes the
        // batch when it commits it; only the cheap check of the `tx` column happens now, so a
        // bad id still fails this append with nothing queued.
        for (i, e) in batch.iter().enumerate() {
            tx_column(i, e)?;
        }
        let mut st = self.shared.state.lock();
        st.failure()?;
        let last = self.shared.last.load(Ordering::Relaxed);
        if batch.is_empty() {
            return Ok(last);
        }
        if self.crash_after_appends.is_some_and(|n| st.appends >= n) {
            let n = st.appends + 1;
            return Err(self.shared.fail(st, StoreError::InjectedCrash { what: "append", n }));
        }
        let new_last = last + batch.len() as Lsn;
        if i64::try_from(new_last).is_err() {
            return Err(StoreError::InvalidArgument {
                field: "batch length",
                value: batch.len().to_string(),
                expected: "LSNs that fit in a signed 64-bit integer",
            });
        }
        st.appends += 1;
        let was_empty = st.queue.is_empty();
        let parked = st.writer_parked;
        if was_empty {
            st.oldest = Some(Instant::now());
        }
        st.queued_rows += batch.len();
        let full = st.queued_rows >= self.max_batch_rows;
        st.queue.push(Queued { first: last + 1, events: batch.clone() });
        self.shared.last.store(new_last, Ordering::Release);
        drop(st);
        if (was_empty && parked) || full {
            // A parked writer learns the idle deadline; any writer, that the queue is full.
            self.shared.work.notify_one();
        }
        Ok(new_last)
    }

    pub(crate) fn wait_durable_blocking(&self, lsn: Lsn) -> Result<(), StoreError> {
        if self.is_durable(lsn) {
            return Ok(());
        }
        // The same registration as an async waiter, with a waker that unparks this thread:
        // a commit wakes only the waiters it satisfies.
        let unpark = Arc::new(Unpark { thread: std::thread::current(), woken: AtomicBool::new(false) });
        let waker = Waker::from(unpark.clone());
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = self.poll_durable(lsn, &mut cx) {
                return r;
            }
            while !unpark.woken.swap(false, Ordering::AcqRel) {
                std::thread::park();
            }
        }
    }

    pub(crate) fn poll_durable_lsn(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        if self.is_durable(lsn) {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.shared.state.lock();
        if st.durable >= lsn {
            return Poll::Ready(Ok(()));
        }
        if let Err(e) = st.failure() {
            return Poll::Ready(Err(e));
        }
        let last = self.shared.last.load(Ordering::Relaxed);
        if lsn > last {
            return Poll::Ready(Err(StoreError::BeyondEnd { lsn, last }));
        }
        let wakers = st.wakers.entry(lsn).or_default();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        if st.wanted < lsn {
            st.wanted = lsn;
            self.shared.work.notify_one();
        }
        Poll::Pending
    }

    /// Hands the checkpoint to the writer, which writes it in its next commit (started at
    /// once), after every batch queued so far; waits for that commit.
    pub(crate) fn put_checkpoint_now(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.shared.path.clone(), op: "put_checkpoint" });
        }
        if i64::try_from(lsn).is_err() {
            return Err(StoreError::InvalidArgument {
                field: "checkpoint lsn",
                value: lsn.to_string(),
                expected: "an LSN that fits in a signed 64-bit integer",
            });
        }
        let mut st = self.shared.state.lock();
        st.failure()?;
        let last = self.shared.last.load(Ordering::Relaxed);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        st.checkpoint_requested += 1;
        let seq = st.checkpoint_requested;
        st.checkpoint = Some((seq, lsn, Arc::from(bytes)));
        self.shared.work.notify_one();
        while st.checkpoint_written < seq {
            st.failure()?;
            self.shared.marked.wait(&mut st);
        }
        Ok(())
    }
}

/// Wakes a thread blocked in [`SqliteStore::wait_durable`].
struct Unpark {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}
