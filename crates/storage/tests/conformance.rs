//! The backend conformance suite, run once per backend.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_storage::conformance::{self, Reopenable};
use tidegate_storage::{FaultOptions, FaultyStore, LedgerStore, MemoryStore, SqliteStore};

#[test]
fn memory_store_conforms() {
    conformance::run_all(MemoryStore::new);
}

#[test]
fn sqlite_store_conforms() {
    let root = tempfile::tempdir().unwrap();
    let mut n = 0;
    conformance::run_all(Reopenable::new(
        || {
            n += 1;
            SqliteStore::open(root.path().join(format!("ledger-{n}"))).unwrap()
        },
        |store: SqliteStore| {
            let dir = store.dir().to_owned();
            store.close().unwrap();
            let store = SqliteStore::open(&dir).unwrap();
            assert!(store.open_report().cut_rows.is_empty(), "a clean reopen cuts nothing");
            store
        },
    ));
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
