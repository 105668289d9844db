//! Extension records (`Tidegate::append_extension`): another component's records kept in the
//! ledger in order with the engine's events, read back per stream, and invisible to the
//! engine: a replay (full, or from a checkpoint whose shadow replayed them) recovers the same
//! state as without them.

#![allow(clippy::unwrap_used)] // tests unwrap by design

mod common;

use std::sync::Arc;

use common::World;
use serde_json::json;
use tidegate_runtime::{CheckpointPolicy, EffectClass, Error, Tidegate, TxOptions};
use tidegate_storage::{LedgerStore, MemoryStore};

#[tokio::test(flavor = "current_thread")]
async fn extension_records_interleave_with_transactions_and_replay_ignores_them() {
    let w = World::new();
    let store = Arc::new(MemoryStore::new());
    let policy = CheckpointPolicy { every_events: Some(3), on_close: true };
    let tg = Tidegate::builder().store(store.clone()).checkpoints(policy).build().unwrap();
    let book = w.tool("book", EffectClass::Reversible, "travel:booking");
    tg.register(&book).unwrap();
    let mut lsns = Vec::new();
    for i in 0..6 {
        lsns.push(tg.append_extension("review", json!({"n": i})).await.unwrap());
        let tx = tg.begin_with(TxOptions::agent("a").may_touch([format!("travel:booking:b{i}")])).unwrap();
        tx.call(&book, json!({"id": format!("b{i}")})).await.unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
        lsns.push(tg.append_extension_blocking("other", json!(["x", i])).unwrap());
    }
    assert!(lsns.windows(2).all(|w| w[0] < w[1]), "{lsns:?}");
    assert!(store.is_durable(*lsns.last().unwrap()), "durable when it returns");
    let got: Vec<_> = tg.extension_records("review").unwrap().into_iter().map(|(_, b)| (*b).clone()).collect();
    assert_eq!(got, (0..6).map(|n| json!({"n": n})).collect::<Vec<_>>());
    assert_eq!(tg.extension_records("other").unwrap().len(), 6);
    assert!(tg.extension_records("none").unwrap().is_empty());
    for bad in ["", "a\nb", &"s".repeat(201)] {
        match tg.append_extension(bad, json!(1)).await {
            Err(Error::InvalidArgument { field: "stream", .. }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let versions: Vec<_> = (0..6).map(|i| tg.version(&format!("travel:booking:b{i}")).unwrap()).collect();
    assert!(versions.iter().all(|v| v.0 > 0), "{versions:?}");
    tg.checkpoint_now().unwrap();
    drop(tg);

    for policy in [CheckpointPolicy::never(), CheckpointPolicy { every_events: Some(3), on_close: true }] {
        let again = Tidegate::builder().store(store.clone()).checkpoints(policy).build().unwrap();
        again.register(&book).unwrap();
        let rep = again.recover().await.unwrap();
        again.check_integrity().unwrap();
        assert_eq!(rep.unfinished, 0, "nothing is made of the extension records");
        let after: Vec<_> = (0..6).map(|i| again.version(&format!("travel:booking:b{i}")).unwrap()).collect();
        assert_eq!(after, versions, "the same committed state");
        assert_eq!(again.extension_records("review").unwrap().len(), 6);
    }
}
