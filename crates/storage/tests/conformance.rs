//! The backend conformance suite, run once per backend.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_storage::conformance::{self, Owned, Reopenable};
use tidegate_storage::{FaultOptions, FaultyStore, LedgerStore, MemoryStore};

#[test]
fn memory_store_conforms() {
    conformance::run_all(Owned::new(MemoryStore::new, |s: &MemoryStore| Ok(s.take_over())));
}

/// The fault-injecting wrapper with no faults configured is itself a conforming store; its
/// "reopen" is a clean close (sync) and a new wrapper around the inner store.
#[test]
fn faulty_store_over_memory_conforms() {
    conformance::run_all(Reopenable::new(
        || FaultyStore::new(MemoryStore::new(), FaultOptions::default()),
        |store: FaultyStore<MemoryStore>| {
            store.sync().unwrap();
            let inner = store.into_inner();
            assert!(inner.is_durable(inner.last_lsn()));
            FaultyStore::new(inner, FaultOptions::default())
        },
    ));
}
