//! The one subscription to appended batches (crates/runtime/src/observer.rs): an observer sees
//! every batch the store accepted, in ledger order, as the very batch the store got (no copy),
//! and a batch the store refused is never observed.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde_json::json;
use tidegate_core::{Batch, Event};
use tidegate_runtime::{AppendObserver, CheckpointPolicy, EffectClass, Tidegate, Tool};
use tidegate_storage::{LedgerStore, Lsn, MemoryStore, Ownership, StoreError, StoredCheckpoint};

#[derive(Debug, Default)]
struct Seen(Mutex<Vec<(Lsn, Batch)>>);

impl AppendObserver for Seen {
    fn appended(&self, last: Lsn, batch: &Batch) {
        self.0.lock().push((last, batch.clone()));
    }
}

/// A memory store that remembers the batches it was handed and can refuse the next append.
#[derive(Debug, Default)]
struct Recording {
    inner: MemoryStore,
    handed: Mutex<Vec<Batch>>,
    refuse: AtomicBool,
}

impl LedgerStore for Recording {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        self.handed.lock().push(batch.clone());
        self.inner.append(batch)
    }
    fn is_durable(&self, lsn: Lsn) -> bool {
        self.inner.is_durable(lsn)
    }
    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        self.inner.wait_durable(lsn)
    }
    fn last_lsn(&self) -> Lsn {
        self.inner.last_lsn()
    }
    fn ownership(&self) -> Ownership {
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

#[tokio::test]
async fn an_observer_sees_every_accepted_batch_in_order_as_the_store_got_it() {
    let store = Arc::new(Recording::default());
    let seen = Arc::new(Seen::default());
    let observer = seen.clone();
    let tg = Tidegate::builder().store(store.clone()).observer(observer.clone()).build().unwrap();
    let tool = Tool::builder("note", EffectClass::Bufferable)
        .scope(|_| "kv:x")
        .call(|_| async { Ok(json!(1)) })
        .build()
        .unwrap();
    for _ in 0..3 {
        let tx = tg.begin("agent").unwrap();
        tx.call(&tool, json!({})).await.unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
    }
    let seen = seen.0.lock().clone();
    let handed = store.handed.lock().clone();
    assert_eq!(seen.len(), handed.len());
    assert!(!seen.is_empty());
    let mut expected_last = 0;
    for ((last, batch), given) in seen.iter().zip(&handed) {
        assert!(batch.same(given), "the observer got the store's very batch, not a copy");
        expected_last += batch.len() as Lsn;
        assert_eq!(*last, expected_last, "batches are observed in ledger order, with their last LSN");
    }
    let all: Vec<Event> = seen.iter().flat_map(|(_, b)| b.iter().cloned()).collect();
    assert_eq!(all, store.inner.events(), "together they are the ledger");

    // A batch the store refuses is never observed.
    store.refuse.store(true, Ordering::SeqCst);
    let before = store.handed.lock().len();
    assert!(tg.begin("agent").is_err());
    assert_eq!(store.handed.lock().len(), before);
    assert_eq!(observer.0.lock().len(), seen.len(), "the refused batch was not observed");
}

/// Keeps a handle on every other batch and a deep copy of every batch, and notes where each
/// batch's events live.
#[derive(Debug, Default)]
struct Sometimes {
    kept: Mutex<Vec<(usize, Batch)>>,
    copies: Mutex<Vec<Vec<Event>>>,
    addresses: Mutex<Vec<usize>>,
}

impl AppendObserver for Sometimes {
    fn appended(&self, _last: Lsn, batch: &Batch) {
        let mut copies = self.copies.lock();
        let n = copies.len();
        copies.push(batch.to_vec());
        self.addresses.lock().push(batch.events().as_ptr() as usize);
        if n.is_multiple_of(2) {
            self.kept.lock().push((n, batch.clone()));
        }
    }
}

#[tokio::test]
async fn a_kept_batch_is_never_refilled_and_an_unkept_one_is_reused() {
    let run = |keep: bool| async move {
        let seen = Arc::new(Sometimes::default());
        let store = Arc::new(MemoryStore::new().retain_events(false));
        // Projection checkpoints off: their shadow keeps batches until it applies them.
        let mut b = Tidegate::builder().store(store).checkpoints(CheckpointPolicy::never());
        if keep {
            b = b.observer(seen.clone());
        } else {
            b = b.observer(Arc::new(Addresses(seen.clone())));
        }
        let tg = b.build().unwrap();
        let tool = Tool::builder("note", EffectClass::Bufferable)
            .scope(|_| "kv:x")
            .call(|_| async { Ok(json!(1)) })
            .build()
            .unwrap();
        for _ in 0..20 {
            let tx = tg.begin("agent").unwrap();
            tx.call(&tool, json!({})).await.unwrap();
            tx.seal().unwrap();
            tx.commit().await.unwrap();
        }
        seen
    };

    // Every other batch kept: each kept handle still holds exactly the events it was given.
    let seen = run(true).await;
    {
        let copies = seen.copies.lock();
        let kept = seen.kept.lock();
        assert!(kept.len() >= 20);
        for (n, batch) in kept.iter() {
            assert_eq!(batch.events(), copies[*n].as_slice(), "kept batch {n} was changed after it was observed");
        }
    }

    // Nothing kept: after the first batches the engine refills one allocation.
    let seen = run(false).await;
    let addresses = seen.addresses.lock();
    let distinct: std::collections::HashSet<_> = addresses.iter().collect();
    assert!(addresses.len() >= 60);
    assert!(distinct.len() <= 8, "{} allocations for {} batches nobody kept", distinct.len(), addresses.len());
}

/// Notes only where each batch's events live (keeps no handle).
#[derive(Debug)]
struct Addresses(Arc<Sometimes>);

impl AppendObserver for Addresses {
    fn appended(&self, _last: Lsn, batch: &Batch) {
        self.0.addresses.lock().push(batch.events().as_ptr() as usize);
    }
}
