//! The fault-injecting wrapper: deterministic crashes at the N-th append or sync.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_core::Event;
use tidegate_storage::conformance::{collect, event};
use tidegate_storage::{FaultOptions, FaultyStore, LedgerStore, Lsn, MemoryStore, StoreError};

fn append(store: &dyn LedgerStore, events: Vec<Event>) -> Result<Lsn, StoreError> {
    store.append(&tidegate_core::Batch::from(events))
}

fn events(tx: u64, n: u64) -> Vec<Event> {
    (0..n).map(|i| event(tx, i)).collect()
}

#[test]
fn a_crash_at_the_nth_sync_keeps_exactly_the_synced_batches() {
    for n in 0..4u64 {
        let store =
            FaultyStore::new(MemoryStore::new(), FaultOptions { crash_after_syncs: Some(n), ..Default::default() });
        let mut synced = Vec::new();
        for tx in 0..6u64 {
            let batch = events(tx, 2);
            let lsn = append(&store, batch.clone()).unwrap();
            match store.wait_durable(lsn) {
                Ok(()) => synced.extend(batch),
                Err(e) => {
                    assert!(e.is_injected_crash(), "{e}");
                    break;
                }
            }
        }
        assert_eq!(store.counts().1, n);
        assert!(store.crashed());
        assert!(matches!(append(&store, events(9, 1)), Err(StoreError::Failed { .. })));
        assert!(collect(&store, 1).is_err());
        assert_eq!(store.into_inner().events(), synced, "crash after {n} syncs");
    }
}

#[test]
fn a_crash_at_the_nth_append_drops_what_was_pending() {
    let store =
        FaultyStore::new(MemoryStore::new(), FaultOptions { crash_after_appends: Some(3), ..Default::default() });
    let a = append(&store, events(1, 2)).unwrap();
    store.wait_durable(a).unwrap();
    append(&store, events(2, 1)).unwrap();
    append(&store, events(3, 1)).unwrap();
    let err = append(&store, events(4, 1)).unwrap_err();
    assert!(err.to_string().contains("injected crash at append #4"), "{err}");
    assert!(store.wait_durable(4).is_err());
    assert!(store.wait_durable(2).is_ok() && store.is_durable(2), "what was durable stays durable");
    assert_eq!(store.into_inner().events(), events(1, 2));
}

#[test]
fn concurrent_waiters_share_one_sync() {
    let store = FaultyStore::new(MemoryStore::new(), FaultOptions::default());
    for tx in 0..10 {
        append(&store, events(tx, 1)).unwrap();
    }
    std::thread::scope(|s| {
        for lsn in 1..=10 {
            let store = &store;
            s.spawn(move || store.wait_durable(lsn).unwrap());
        }
    });
    assert_eq!(store.counts(), (10, 1));
}

#[test]
fn scan_shows_synced_and_pending_events_in_order() {
    let store = FaultyStore::new(MemoryStore::new(), FaultOptions::default());
    let l = append(&store, events(1, 3)).unwrap();
    store.wait_durable(l).unwrap();
    append(&store, events(2, 2)).unwrap();
    let got: Vec<Lsn> = collect(&store, 2).unwrap().into_iter().map(|(l, _)| l).collect();
    assert_eq!(got, vec![2, 3, 4, 5]);
    assert_eq!(store.inner().last_lsn(), 3);
}
