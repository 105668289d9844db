//! The in-memory ledger: ordered, atomic per batch, never durable across processes.

use parking_lot::Mutex;
use tidegate_core::Event;

use crate::{LedgerStore, Lsn, StoreError};

/// A ledger held in memory. Every append is immediately "durable" (there is nothing to
/// survive). `retain_events(false)` keeps only the LSN counter, for benchmarks of the engine
/// alone; the default keeps every event so the ledger can be inspected.
#[derive(Debug)]
pub struct MemoryStore {
    events: Mutex<Vec<Event>>,
    last: Mutex<Lsn>,
    retain: bool,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore { events: Mutex::new(Vec::new()), last: Mutex::new(0), retain: true }
    }
}

impl MemoryStore {
    /// An empty store that keeps every event.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
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
        let mut last = self.last.lock();
        if self.retain {
            let mut all = self.events.lock();
            let before = all.len();
            all.extend(events);
            *last += (all.len() - before) as Lsn;
        } else {
            *last += events.count() as Lsn;
        }
        Ok(*last)
    }

    fn is_durable(&self, _lsn: Lsn) -> bool {
        true
    }

    fn wait_durable(&self, _lsn: Lsn) -> Result<(), StoreError> {
        Ok(())
    }

    fn last_lsn(&self) -> Lsn {
        *self.last.lock()
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let all = self.events.lock();
        let start = from.max(1) as usize - 1;
        for (i, e) in all.iter().enumerate().skip(start) {
            if !visit(i as Lsn + 1, e) {
                break;
            }
        }
        Ok(())
    }
}
