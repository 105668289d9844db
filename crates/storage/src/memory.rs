//! The in-memory ledger: ordered, atomic per batch, never durable across processes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tidegate_core::{Batch, Event};

use crate::{LedgerStore, Lsn, Ownership, StoreError, StoredCheckpoint};

/// Streams of this process get distinct names (`memory-1`, `memory-2`, ...).
static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

/// One in-memory ledger stream, shared by the handles of its successive owners.
#[derive(Debug)]
struct Ledger {
    name: Arc<str>,
    /// The events, and the token of the stream's current owner (checked under the same lock
    /// as the append, as a networked backend checks it in the append's transaction).
    inner: Mutex<Inner>,
    /// The last LSN; written only under `inner`'s lock, read without it.
    last: AtomicU64,
    checkpoint: Mutex<Option<StoredCheckpoint>>,
}

#[derive(Debug)]
struct Inner {
    /// The appended batches as the engine shared them (nothing is copied), each with the LSN
    /// of its first event, in order.
    batches: Vec<(Lsn, Batch)>,
    owner: u64,
}

impl Inner {
    /// The index of the batch holding `lsn` (or the first after it).
    fn batch_of(&self, lsn: Lsn) -> usize {
        self.batches.partition_point(|(first, b)| first + b.len() as Lsn <= lsn)
    }
}

/// A ledger held in memory. Every append is immediately "durable" (there is nothing to
/// survive). `retain_events(false)` keeps only the LSN counter, for benchmarks of the engine
/// alone; the default keeps every event so the ledger can be inspected.
///
/// [`MemoryStore::take_over`] models a change of owner of the stream (as a networked backend
/// does when another node takes a tenant): the new handle gets a larger fencing token and the
/// old one's appends are refused with [`StoreError::Fenced`] from then on.
#[derive(Debug)]
pub struct MemoryStore {
    ledger: Arc<Ledger>,
    token: u64,
    retain: bool,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::from_events(Vec::new())
    }
}

impl MemoryStore {
    /// An empty store that keeps every event.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// A store holding `events` at LSNs `1..=events.len()`, as if they had been appended
    /// (e.g. the durable events of a [`crate::FaultyStore`] after a simulated crash).
    pub fn from_events(events: Vec<Event>) -> MemoryStore {
        let last = events.len() as Lsn;
        let n = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
        let batches = if events.is_empty() { Vec::new() } else { vec![(1, Batch::from(events))] };
        MemoryStore {
            ledger: Arc::new(Ledger {
                name: format!("memory-{n}").into(),
                inner: Mutex::new(Inner { batches, owner: 1 }),
                last: AtomicU64::new(last),
                checkpoint: Mutex::new(None),
            }),
            token: 1,
            retain: true,
        }
    }

    /// The same store holding `checkpoint` as its latest checkpoint (e.g. the one a
    /// [`crate::FaultyStore`] had synced before a simulated crash).
    pub fn with_checkpoint(self, checkpoint: Option<StoredCheckpoint>) -> MemoryStore {
        *self.ledger.checkpoint.lock() = checkpoint;
        self
    }

    /// Whether appended events are kept (default `true`).
    pub fn retain_events(mut self, retain: bool) -> MemoryStore {
        self.retain = retain;
        self
    }

    /// A copy of every retained event, in order.
    pub fn events(&self) -> Vec<Event> {
        self.ledger.inner.lock().batches.iter().flat_map(|(_, b)| b.iter().cloned()).collect()
    }

    /// A new owner takes the stream: returns its handle, with a fencing token larger than
    /// every earlier one. From now on every append through an older handle fails with
    /// [`StoreError::Fenced`]; the new handle sees every event appended before.
    pub fn take_over(&self) -> MemoryStore {
        let mut inner = self.ledger.inner.lock();
        inner.owner += 1;
        MemoryStore { ledger: self.ledger.clone(), token: inner.owner, retain: self.retain }
    }

    fn fenced(&self, current: u64) -> StoreError {
        StoreError::Fenced { stream: self.ledger.name.to_string(), token: self.token, current }
    }
}

impl LedgerStore for MemoryStore {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        let mut inner = self.ledger.inner.lock();
        if inner.owner != self.token {
            return Err(self.fenced(inner.owner));
        }
        let added = batch.len();
        let first = self.ledger.last.load(Ordering::Relaxed) + 1;
        if self.retain && added > 0 {
            inner.batches.push((first, batch.clone()));
        }
        let last = first - 1 + added as Lsn;
        self.ledger.last.store(last, Ordering::Release);
        Ok(last)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.ledger.last.load(Ordering::Acquire)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        let last = self.ledger.last.load(Ordering::Acquire);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        Ok(())
    }

    fn poll_durable(&self, lsn: Lsn, _cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        Poll::Ready(self.wait_durable(lsn))
    }

    fn last_lsn(&self) -> Lsn {
        self.ledger.last.load(Ordering::Acquire)
    }

    fn ownership(&self) -> Ownership {
        Ownership { stream: self.ledger.name.clone(), token: self.token }
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let inner = self.ledger.inner.lock();
        let from = from.max(1);
        for (first, b) in &inner.batches[inner.batch_of(from)..] {
            let skip = usize::try_from(from.saturating_sub(*first)).unwrap_or(usize::MAX);
            for (i, e) in b.iter().enumerate().skip(skip) {
                if !visit(first + i as Lsn, e) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        let inner = self.ledger.inner.lock();
        if inner.owner != self.token {
            return Err(self.fenced(inner.owner));
        }
        let last = self.ledger.last.load(Ordering::Acquire);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        *self.ledger.checkpoint.lock() = Some(StoredCheckpoint { lsn, bytes: bytes.to_vec() });
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(self.ledger.checkpoint.lock().clone())
    }
}
