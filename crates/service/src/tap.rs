//! `TimedStore`: the ledger store a tenant's engine writes to. It delegates every call to the
//! real store (the batch is passed on as the engine shared it, nothing is copied) and measures
//! how long appended events take to be observed durable. The tenant's ledger index follows the
//! ledger as one of the engine's append observers (`tidegate_runtime::AppendObserver`), not
//! through this wrapper.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use parking_lot::Mutex;
use tidegate_core::{Batch, Event};
use tidegate_storage::{LedgerStore, Lsn, StoreError, StoredCheckpoint};

use crate::metrics::Metrics;

/// Appends not yet observed durable, for the durability-latency histogram (bounded).
const PENDING_CAP: usize = 4096;

/// A store that times durability.
pub struct TimedStore {
    inner: Arc<dyn LedgerStore>,
    metrics: Arc<Metrics>,
    pending: Mutex<VecDeque<(Lsn, Instant)>>,
}

impl std::fmt::Debug for TimedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedStore").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl TimedStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LedgerStore>, metrics: Arc<Metrics>) -> TimedStore {
        TimedStore { inner, metrics, pending: Mutex::new(VecDeque::new()) }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn LedgerStore> {
        &self.inner
    }

    fn observed_durable(&self, lsn: Lsn) {
        let now = Instant::now();
        let mut p = self.pending.lock();
        while p.front().is_some_and(|(l, _)| *l <= lsn) {
            if let Some((_, at)) = p.pop_front() {
                self.metrics.durable_wait.observe(now.duration_since(at).as_secs_f64());
            }
        }
    }
}

impl LedgerStore for TimedStore {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        let lsn = self.inner.append(batch)?;
        if !batch.is_empty() {
            let mut p = self.pending.lock();
            if p.len() == PENDING_CAP {
                p.pop_front();
            }
            p.push_back((lsn, Instant::now()));
        }
        Ok(lsn)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        self.inner.is_durable(lsn)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        let r = self.inner.wait_durable(lsn);
        if r.is_ok() {
            self.observed_durable(lsn);
        }
        r
    }

    fn poll_durable(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        let r = self.inner.poll_durable(lsn, cx);
        if let Poll::Ready(Ok(())) = r {
            self.observed_durable(lsn);
        }
        r
    }

    fn last_lsn(&self) -> Lsn {
        self.inner.last_lsn()
    }

    fn ownership(&self) -> tidegate_storage::Ownership {
        self.inner.ownership()
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        self.inner.scan(from, visit)
    }

    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put_checkpoint(lsn, bytes)
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.inner.checkpoint()
    }
}
