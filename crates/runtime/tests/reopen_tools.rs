//! A ledger reopened after a transaction's lease ran out while no process held it (a crash, a
//! take-over by another node): its abort starts at the engine's first change, so its
//! compensation must find its tool then. Found by the cluster failover test: a server that
//! registered its tools one by one after the build had the first registration set off the
//! abort, and the compensation of a tool registered later failed (`unresolved`).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tidegate_runtime::{Compensation, EffectClass, Tidegate, Tool, TxOptions};
use tidegate_sqlite::SqliteStore;

fn tools(undone: &Arc<AtomicU32>) -> (Tool, Tool) {
    let u = undone.clone();
    let reserve = Tool::builder("reserve", EffectClass::Reversible)
        .scope(|a: &Value| format!("kv:room:{}", a["id"]))
        .call(|_| async { Ok(json!({"held": true})) })
        .compensate(move |_, _| {
            let u = u.clone();
            async move {
                u.fetch_add(1, Ordering::SeqCst);
                Ok(Compensation::clean())
            }
        })
        .build()
        .unwrap();
    // Registered first by the embedder (its name sorts first).
    let audit = Tool::builder("audit", EffectClass::Gated)
        .scope(|a: &Value| format!("log:audit:{}", a["id"]))
        .call(|_| async { Ok(Value::Null) })
        .build()
        .unwrap();
    (audit, reserve)
}

/// Leaves a transaction with an executed reversible effect open under a 100 ms lease in a new
/// ledger at `dir`, and closes the engine.
async fn leave_one_open(dir: &std::path::Path) {
    let undone = Arc::new(AtomicU32::new(0));
    let (audit, reserve) = tools(&undone);
    let tg = Tidegate::builder().store(Arc::new(SqliteStore::open(dir).unwrap())).build().unwrap();
    tg.register(&audit).unwrap();
    let tx = tg.begin_with(TxOptions::agent("a").lease(Duration::from_millis(100))).unwrap();
    tx.call(&reserve, json!({"id": 1})).await.unwrap();
    drop(tx);
    drop(tg);
    tokio::time::sleep(Duration::from_millis(300)).await;
}

async fn settled(tg: &Tidegate) -> Value {
    for _ in 0..100 {
        if tg.stats().unfinished == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    json!(tg.stats().unfinished)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_given_to_the_builder_compensate_a_lease_that_ran_out_while_the_ledger_was_closed() {
    let dir = std::env::temp_dir().join(format!("tidegate-reopen-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    leave_one_open(&dir).await;

    let undone = Arc::new(AtomicU32::new(0));
    let (audit, reserve) = tools(&undone);
    let tg = Tidegate::builder()
        .store(Arc::new(SqliteStore::open(&dir).unwrap()))
        .tools([audit.clone(), reserve.clone()])
        .build()
        .unwrap();
    // The embedder's registrations after the build are no-ops for the same declarations.
    tg.register(&audit).unwrap();
    tg.register(&reserve).unwrap();
    assert_eq!(settled(&tg).await, json!(0), "the expired transaction settled");
    assert_eq!(undone.load(Ordering::SeqCst), 1, "its reversible effect was compensated once");
    drop(tg);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The hazard the builder's tools remove, kept visible: registering tools one by one after the
/// build lets the first registration start the abort before the later tools are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_after_the_build_can_leave_the_expired_effect_unresolved() {
    let dir = std::env::temp_dir().join(format!("tidegate-reopen-late-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    leave_one_open(&dir).await;

    let undone = Arc::new(AtomicU32::new(0));
    let (audit, reserve) = tools(&undone);
    let tg = Tidegate::builder().store(Arc::new(SqliteStore::open(&dir).unwrap())).build().unwrap();
    tg.register(&audit).unwrap();
    // Give the abort the first registration set off time to run before `reserve` is there.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tg.register(&reserve).unwrap();
    assert_eq!(settled(&tg).await, json!(0));
    assert_eq!(undone.load(Ordering::SeqCst), 0, "the compensation ran before its tool was registered");
    drop(tg);
    std::fs::remove_dir_all(&dir).unwrap();
}
