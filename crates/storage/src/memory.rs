//! The in-memory ledger: ordered, atomic per batch, never durable across processes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tidegate_core::Event;

use crate::{LedgerStore, Lsn, StoreError, StoredCheckpoint};

/// A ledger held in memory. Every append is immediately "durable" (there is nothing to
/// survive). `retain_events(false)` keeps only the LSN counter, for benchmarks of the engine
/// alone; the default keeps every event so the ledger can be inspected.
#[derive(Debug)]
pub struct MemoryStore {
    events: Mutex<Vec<Event>>,
    /// The last LSN; written only under `events`' lock, read without it.
    last: AtomicU64,
    retain: bool,
    checkpoint: Mutex<Option<StoredCheckpoint>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            events: Mutex::new(Vec::new()),
            last: AtomicU64::new(0),
            retain: true,
            checkpoint: Mutex::new(None),
        }
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
        MemoryStore {
            events: Mutex::new(events),
            last: AtomicU64::new(last),
            retain: true,
            checkpoint: Mutex::new(None),
        }
    }

    /// The same store holding `checkpoint` as its latest checkpoint (e.g. the one a
    /// [`crate::FaultyStore`] had synced before a simulated crash).
    pub fn with_checkpoint(self, checkpoint: Option<StoredCheckpoint>) -> MemoryStore {
        *self.checkpoint.lock() = checkpoint;
        self
    }

    /// Whether appended events are kept (default `true`).
    pub fn retain_events(mut self, retain: bool) -> MemoryStore {
        self.retain = retain;
        self
    }

    /// A copy of every retained event, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }
}

impl LedgerStore for MemoryStore {
    fn append(&self, events: &mut dyn Iterator<Item = Event>) -> Result<Lsn, StoreError> {
        let mut all = self.events.lock();
        let added = if self.retain {
            let before = all.len();
            all.extend(events);
            all.len() - before
        } else {
            events.count()
        };
        let last = self.last.load(Ordering::Relaxed) + added as Lsn;
        self.last.store(last, Ordering::Release);
        Ok(last)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.last.load(Ordering::Acquire)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        let last = self.last.load(Ordering::Acquire);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        Ok(())
    }

    fn poll_durable(&self, lsn: Lsn, _cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        Poll::Ready(self.wait_durable(lsn))
    }

    fn last_lsn(&self) -> Lsn {
        self.last.load(Ordering::Acquire)
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let all = self.events.lock();
        let start = usize::try_from(from.max(1) - 1).unwrap_or(usize::MAX);
        for (i, e) in all.iter().enumerate().skip(start) {
            if !visit(i as Lsn + 1, e) {
                break;
            }
        }
        Ok(())
    }

    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        let last = self.last.load(Ordering::Acquire);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        *self.checkpoint.lock() = Some(StoredCheckpoint { lsn, bytes: bytes.to_vec() });
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(self.checkpoint.lock().clone())
    }
}
