//! `TappedStore`: the ledger store a tenant's engine writes to. It delegates every call to
//! the real store and, after an append succeeded, applies the batch to the tenant's
//! [`LedgerIndex`] (still under the engine lock, so the index sees ledger order). It also
//! measures how long appended events take to be observed durable.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use parking_lot::Mutex;
use tidegate_core::Event;
use tidegate_storage::{LedgerStore, Lsn, StoreError, StoredCheckpoint};

use crate::index::LedgerIndex;
use crate::metrics::Metrics;

/// Appends not yet observed durable, for the durability-latency histogram (bounded).
const PENDING_CAP: usize = 4096;

/// A store that feeds the ledger index.
pub struct TappedStore {
    inner: Arc<dyn LedgerStore>,
    index: Arc<LedgerIndex>,
    metrics: Arc<Metrics>,
    pending: Mutex<VecDeque<(Lsn, Instant)>>,
}

impl std::fmt::Debug for TappedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TappedStore").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl TappedStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LedgerStore>, index: Arc<LedgerIndex>, metrics: Arc<Metrics>) -> TappedStore {
        TappedStore { inner, index, metrics, pending: Mutex::new(VecDeque::new()) }
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

impl LedgerStore for TappedStore {
    fn append(&self, events: &mut dyn Iterator<Item = Event>) -> Result<Lsn, StoreError> {
        let batch: Vec<Event> = events.collect();
        let lsn = self.inner.append(&mut batch.iter().cloned())?;
        if !batch.is_empty() {
            self.index.apply_batch(lsn, &batch, true);
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
