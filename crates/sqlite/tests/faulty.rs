//! `FaultyStore` over the embedded store: a crash drops what was not synced.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_core::Event;
use tidegate_sqlite::SqliteStore;
use tidegate_storage::conformance::{collect, event};
use tidegate_storage::{FaultOptions, FaultyStore, LedgerStore, Lsn, StoreError};

fn append(store: &dyn LedgerStore, events: Vec<Event>) -> Result<Lsn, StoreError> {
    store.append(&tidegate_core::Batch::from(events))
}

fn events(tx: u64, n: u64) -> Vec<Event> {
    (0..n).map(|i| event(tx, i)).collect()
}

#[test]
fn wrapping_a_sqlite_store_crashes_it_without_committing_pending_batches() {
    let root = tempfile::tempdir().unwrap();
    let store = FaultyStore::new(
        SqliteStore::open(root.path()).unwrap(),
        FaultOptions { crash_after_syncs: Some(1), ..Default::default() },
    );
    let a = append(&store, events(1, 2)).unwrap();
    store.wait_durable(a).unwrap();
    let b = append(&store, events(2, 2)).unwrap();
    assert!(store.wait_durable(b).unwrap_err().is_injected_crash());
    drop(store);
    let reopened = SqliteStore::open(root.path()).unwrap();
    assert_eq!(collect(&reopened, 1).unwrap().into_iter().map(|(_, e)| e).collect::<Vec<_>>(), events(1, 2));
}
