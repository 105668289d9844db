//! Engine behaviours the harness surfaced, reduced to the engine alone: regression tests for
//! two engine fixes (a read during an earlier commit's release is not visible as committed;
//! an unknown-outcome release asks the tool's probe).
#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use serde_json::json;
use tidegate_runtime::{EffectClass, Probe, Tidegate, Tool, ToolError, TxOptions};

/// A provider holding one order's status and version, applying writes keyed for dedup.
#[derive(Default)]
struct Order {
    status: Mutex<(String, u64)>,
    keys: Mutex<Vec<String>>,
    stale_applies: AtomicU32,
}

fn order_tool(order: Arc<Order>, transient_failures: u32, unknown_failures: u32) -> Tool {
    let left = Arc::new(AtomicU32::new(transient_failures));
    let unknown = Arc::new(AtomicU32::new(unknown_failures));
    let (o2, o3) = (order.clone(), order.clone());
    Tool::builder("order_op", EffectClass::Bufferable)
        .scope(|_| "retail:order:W1")
        .key(|a| a["key"].as_str().unwrap_or_default().to_owned())
        .call(move |a| {
            let (order, left, unknown) = (o2.clone(), left.clone(), unknown.clone());
            async move {
                if left.load(Ordering::SeqCst) > 0 {
                    left.fetch_sub(1, Ordering::SeqCst);
                    return Err(ToolError::transient("connection refused"));
                }
                let key = a["key"].as_str().unwrap_or_default().to_owned();
                if !order.keys.lock().contains(&key) {
                    order.keys.lock().push(key);
                    let mut s = order.status.lock();
                    if a["based_on"].as_u64() != Some(s.1) {
                        order.stale_applies.fetch_add(1, Ordering::SeqCst);
                    }
                    *s = (a["op"].as_str().unwrap_or_default().to_owned(), s.1 + 1);
                }
                if unknown.load(Ordering::SeqCst) > 0 {
                    unknown.fetch_sub(1, Ordering::SeqCst);
                    return Err(ToolError::unknown("connection reset after the request"));
                }
                Ok(json!({"ok": true}))
            }
        })
        .probe(move |a| {
            let hit = o3.keys.lock().contains(&a["key"].as_str().unwrap_or_default().to_owned());
            async move { if hit { Probe::Happened(json!({"ok": true})) } else { Probe::DidNotHappen } }
        })
        .build()
        .unwrap()
}

/// A transaction that reads a scope while an earlier commit's release to it is still being
/// retried registers the new version but plans on the provider's old state; its own write
/// then commits on a stale plan. (Seen in `stress` under mixed faults.)
#[tokio::test(start_paused = true)]
async fn a_read_during_an_earlier_release_cannot_commit_a_stale_plan() {
    let order = Arc::new(Order { status: Mutex::new(("pending".into(), 0)), ..Order::default() });
    let tg = Tidegate::in_memory().unwrap();
    let tool = order_tool(order.clone(), 2, 0);
    let opts = || TxOptions::agent("a").may_touch(["retail:order:W1"]);
    let t1 = tg.begin_with(opts()).unwrap();
    t1.read("retail:order:W1").unwrap();
    t1.call(&tool, json!({"op": "cancelled", "based_on": 0, "key": "t1"})).await.unwrap();
    t1.seal().unwrap();
    // The release fails twice (transient) and is retried with backoff.
    let c1 = tokio::spawn(async move { t1.commit().await });
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let t2 = tg.begin_with(opts()).unwrap();
    t2.read("retail:order:W1").unwrap();
    let seen = order.status.lock().clone();
    t2.call(&tool, json!({"op": "modified", "based_on": seen.1, "key": "t2"})).await.unwrap();
    t2.seal().unwrap();
    let r2 = t2.commit().await;
    c1.await.unwrap().unwrap();
    assert!(
        r2.is_err() || seen.0 == "cancelled",
        "t2 planned on {seen:?} while t1's cancel was releasing, and committed"
    );
    assert_eq!(order.stale_applies.load(Ordering::SeqCst), 0);
}

/// A release whose outcome is unknown (the provider applied it, the answer was lost) is
/// tagged and the rest of the commit is not released, although the tool has a probe that
/// would say it happened. (Seen in `recovery` and `stress` under F2 and F5.)
#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_release_is_resolved_by_the_probe() {
    let order = Arc::new(Order { status: Mutex::new(("pending".into(), 0)), ..Order::default() });
    let tg = Tidegate::in_memory().unwrap();
    let tool = order_tool(order.clone(), 0, 1);
    let tx = tg.begin("a").unwrap();
    tx.call(&tool, json!({"op": "shipped", "based_on": 0, "key": "k1"})).await.unwrap();
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed);
    assert!(out.is_clean(), "the probe says the release happened: {out:?}");
}
