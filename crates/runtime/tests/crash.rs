//! Crash windows × effect classes: a workload runs on a ledger that crashes at its N-th sync;
//! a new engine is rebuilt from what was synced, recovers, and the outside world is audited.
//!
//! For each effect, the crash falls in one of four windows, told apart from the synced ledger
//! and the world's log:
//!   W1 before the pending record (`effect_recorded` / `release_started` not durable),
//!   W2 after it, before the call (durable, the world never saw the call),
//!   W3 after the call, before the done record (`effect_executed` / `released` not durable),
//!   W4 after the done record.
//! Every window × class is hit at least 50 times per default run (about 40 s in a debug
//! build), and at least `TIDEGATE_CRASH_HITS` times when that is set: the soak run is
//! `TIDEGATE_CRASH_HITS=1000 cargo test --release -p tidegate-runtime --test crash`.

#![allow(clippy::unwrap_used)] // tests unwrap by design

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::World;
use serde_json::json;
use tidegate_core::Event;
use tidegate_runtime::{EffectClass, Probe, Tidegate, Tool, TxOptions};
use tidegate_storage::{FaultOptions, FaultyStore, MemoryStore};

const CLASSES: [EffectClass; 5] = [
    EffectClass::Reversible,
    EffectClass::ReversibleWithCost,
    EffectClass::Bufferable,
    EffectClass::Gated,
    EffectClass::Idempotent,
];

type Faulty = FaultyStore<MemoryStore>;

/// Where the "process" dies: at the N-th ledger sync, or inside the k-th call of the tool
/// under test, just before or just after the provider acts.
#[derive(Debug, Clone, Copy)]
enum Crash {
    AtSync(u64),
    InCall { call: u32, after_acting: bool },
}

/// The effect under test records "exec"/"apply"/"fire" with its `id` argument; its probe
/// answers from the world's log (a provider that can be asked whether a call happened).
fn tool_under_test(w: &World, class: EffectClass, store: Option<(Arc<Faulty>, u32, bool)>) -> Tool {
    let what = if class.executes_eagerly() {
        "exec"
    } else if class == EffectClass::Bufferable {
        "apply"
    } else {
        "fire"
    };
    let (w2, w3, w4) = (w.clone(), w.clone(), w.clone());
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    Tool::builder("subject", class)
        .scope(|a| format!("retail:order:{}", a["id"].as_str().unwrap_or("none")))
        .call(move |a| {
            let w = w3.clone();
            let store = store.clone();
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                // A dead process calls nothing (the policy would otherwise retry in place a
                // call the probe says did not happen).
                if store.as_ref().is_some_and(|(s, _, _)| s.crashed()) {
                    return Err(tidegate_runtime::ToolError::unknown("the process is dead"));
                }
                let die = store.as_ref().filter(|(_, k, _)| *k == n);
                if let Some((s, _, false)) = die {
                    s.crash_now();
                    return Err(tidegate_runtime::ToolError::unknown("process died before the provider acted"));
                }
                w.log.lock().push(common::Hit { tool: "subject".into(), what, args: a["id"].to_string() });
                if let Some((s, _, true)) = die {
                    s.crash_now();
                    return Err(tidegate_runtime::ToolError::unknown("process died after the provider acted"));
                }
                Ok(json!({"ok": *a}))
            }
        })
        .compensate(move |a, _| {
            let w = w4.clone();
            async move {
                w.log.lock().push(common::Hit {
                    tool: "subject".into(),
                    what: "compensate",
                    args: a["id"].to_string(),
                });
                Ok(tidegate_runtime::Compensation::clean())
            }
        })
        .probe(move |a| {
            let w = w2.clone();
            async move {
                let id = a["id"].to_string();
                if w.log.lock().iter().any(|h| h.what == what && h.args == id) {
                    Probe::Happened(json!({"ok": *a}))
                } else {
                    Probe::DidNotHappen
                }
            }
        })
        .build()
        .unwrap()
}

#[derive(Debug, Default, Clone, Copy)]
struct Windows([u32; 4]);

/// Runs `n` one-effect transactions (some aborted on purpose) on a store that crashes after
/// `crash_after` syncs. Returns the ids whose commit was acknowledged.
async fn workload(tg: &Tidegate, tool: &Tool, n: usize, abort_every: usize) -> Vec<String> {
    let mut acked = Vec::new();
    for i in 0..n {
        let id = format!("W{i}");
        let Ok(tx) = tg.begin_with(TxOptions::agent("a").may_touch([format!("retail:order:{id}")])) else { break };
        if tx.call(tool, json!({"id": id})).await.is_err() {
            break;
        }
        if i % abort_every == abort_every - 1 {
            if tx.abort("planned").await.is_err() {
                break;
            }
            continue;
        }
        if tx.seal().is_err() {
            break;
        }
        match tx.commit().await {
            Ok(o) if o.committed => acked.push(id),
            _ => break,
        }
    }
    acked
}

fn classify(events: &[Event], world: &World, class: EffectClass, id: &str, windows: &mut Windows) {
    let arg = format!("\"{id}\"");
    let mut effect = None;
    for e in events {
        if let Event::EffectRecorded { tx, effect: eid, args, .. } = e
            && args["id"].as_str() == Some(id)
        {
            effect = Some((*tx, *eid));
        }
    }
    let called = world.hits().iter().any(|h| h.args == arg && h.what != "compensate");
    let Some((tx, eid)) = effect else {
        if !called {
            windows.0[0] += 1;
        }
        return;
    };
    let (pending, done) = if class.executes_eagerly() {
        (
            true,
            events.iter().any(|e| matches!(e, Event::EffectExecuted { tx: t, effect: f, .. } if *t == tx && *f == eid)),
        )
    } else {
        let started =
            events.iter().any(|e| matches!(e, Event::ReleaseStarted { tx: t, effect: f } if *t == tx && *f == eid));
        if !started {
            windows.0[0] += 1;
            return;
        }
        (true, events.iter().any(|e| matches!(e, Event::Released { tx: t, effect: f, .. } if *t == tx && *f == eid)))
    };
    match (pending, called, done) {
        (true, false, false) => windows.0[1] += 1,
        (true, true, false) => windows.0[2] += 1,
        (true, _, true) => windows.0[3] += 1,
        _ => {}
    }
}

async fn crash_once(class: EffectClass, crash: Crash, windows: &mut Windows) {
    let world = World::new();
    let opts = match crash {
        Crash::AtSync(n) => FaultOptions { crash_after_syncs: Some(n), crash_after_appends: None },
        Crash::InCall { .. } => FaultOptions::default(),
    };
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), opts));
    let in_call = match crash {
        Crash::InCall { call, after_acting } => Some((faulty.clone(), call, after_acting)),
        Crash::AtSync(_) => None,
    };
    let tool = tool_under_test(&world, class, in_call);
    let tg = Tidegate::builder().store(faulty.clone()).build().unwrap();
    let acked = workload(&tg, &tool, 6, 3).await;
    drop(tg);
    // "Reopen": a new engine over exactly the synced events, with the tool registered again
    // (without the crash trigger).
    let synced = faulty.inner().events();
    for i in 0..6 {
        classify(&synced, &world, class, &format!("W{i}"), windows);
    }
    let store = Arc::new(MemoryStore::from_events(synced));
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let tool = tool_under_test(&world, class, None);
    tg.register(&tool).unwrap();
    tg.recover().await.unwrap();
    tg.check_integrity().unwrap();
    audit(&world, class, &acked, &store.events());
}

/// The invariants of DESIGN.md §4 over the outside world and the recovered ledger.
fn audit(world: &World, class: EffectClass, acked: &[String], ledger: &[Event]) {
    let mut forward: HashMap<String, usize> = HashMap::new();
    let mut undone: HashMap<String, usize> = HashMap::new();
    for h in world.hits() {
        let id = h.args.trim_matches('"').to_owned();
        if h.what == "compensate" {
            *undone.entry(id).or_default() += 1;
        } else {
            *forward.entry(id).or_default() += 1;
        }
    }
    // No duplicate: no call reached the world twice.
    for (id, n) in &forward {
        assert!(*n <= 1, "{class}: {id} reached the world {n} times");
    }
    // Final outcome per id from the recovered ledger.
    let mut tx_of: HashMap<String, tidegate_core::TxId> = HashMap::new();
    let mut settled: HashMap<tidegate_core::TxId, bool> = HashMap::new();
    for e in ledger {
        match e {
            Event::EffectRecorded { tx, args, .. } => {
                tx_of.insert(args["id"].as_str().unwrap_or_default().to_owned(), *tx);
            }
            Event::Settled { tx, committed, .. } => {
                settled.insert(*tx, *committed);
            }
            _ => {}
        }
    }
    for id in acked {
        // No lost committed effect: an acknowledged commit's effect left exactly once and was
        // never undone.
        assert_eq!(forward.get(id).copied().unwrap_or(0), 1, "{class}: acknowledged {id} did not leave exactly once");
        assert_eq!(undone.get(id).copied().unwrap_or(0), 0, "{class}: acknowledged {id} was compensated");
    }
    for (id, tx) in &tx_of {
        let committed = settled.get(tx).copied();
        if !class.executes_eagerly() && committed != Some(true) {
            // Zero held effects externalised for a transaction that did not commit.
            assert_eq!(forward.get(id).copied().unwrap_or(0), 0, "{class}: held {id} left though {tx} did not commit");
        }
        if class.executes_eagerly() && committed == Some(false) && forward.get(id).copied().unwrap_or(0) == 1 {
            // Every held compensation was still there to run: an executed effect of an
            // aborted transaction was compensated (the probe tells recovery it happened).
            // Compensation is at-least-once: a crash after an undo but before its record is
            // durable runs it again on recovery (docs/engine.md: handlers must be idempotent).
            let n = undone.get(id).copied().unwrap_or(0);
            assert!(n >= 1, "{class}: executed {id} of aborted {tx} not compensated");
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_crash_window_of_every_effect_class_loses_nothing_and_duplicates_nothing() {
    let hits: u64 = match std::env::var("TIDEGATE_CRASH_HITS") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("TIDEGATE_CRASH_HITS={v:?}: expected a whole number")),
        Err(_) => 50,
    };
    for class in CLASSES {
        let mut windows = Windows::default();
        let mut runs = 0u64;
        while windows.0.iter().any(|&w| u64::from(w) < hits) {
            let crash = match runs % 3 {
                0 => Crash::AtSync(1 + (runs / 3) % 40),
                r => Crash::InCall { call: ((runs / 3) % 6) as u32, after_acting: r == 2 },
            };
            crash_once(class, crash, &mut windows).await;
            runs += 1;
            assert!(
                runs < 100 * hits.max(200),
                "{class}: windows not all reached after {runs} crashes: {:?}",
                windows.0
            );
        }
        println!("{class}: {runs} seeded crashes; per effect, windows W1..W4 hit {:?}", windows.0);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_adapter_key_that_executed_replays_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("tidegate-idem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let world = World::new();
    let charge = world.tool("charge", EffectClass::Idempotent, "retail:payment");
    let opts = || tidegate_runtime::CallOptions::key("charge-order-42");
    {
        let store = Arc::new(tidegate_sqlite::SqliteStore::open(&dir).unwrap());
        let tg = Tidegate::builder().store(store).build().unwrap();
        let tx = tg.begin("a").unwrap();
        tx.call_with(&charge, json!({"id": "P42"}), opts()).await.unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
    }
    let store = Arc::new(tidegate_sqlite::SqliteStore::open(&dir).unwrap());
    let tg = Tidegate::builder().store(store).build().unwrap();
    tg.register(&charge).unwrap();
    tg.recover().await.unwrap();
    let tx = tg.begin("a-again").unwrap();
    let ack = tx.call_with(&charge, json!({"id": "P42"}), opts()).await.unwrap();
    assert!(matches!(ack, tidegate_runtime::Ack::Replayed { .. }), "{ack:?}");
    assert_eq!(world.count("charge", "exec"), 1, "the provider was charged once across the restart");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handler run by recovery (no call context survives the process) gets the call's key from
/// the ledger: an orphaned transaction's compensation and an in-doubt call's probe see the
/// adapter key the call was made under, and a call with a derived key gets none.
#[tokio::test(flavor = "current_thread")]
async fn recovery_gives_handlers_the_adapter_key_recorded_in_the_ledger() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let tool = |keyed: bool, name: &str, seen: &Arc<parking_lot::Mutex<Vec<String>>>| {
        let (c, p) = (seen.clone(), seen.clone());
        let b = Tool::builder(name, EffectClass::Reversible)
            .scope(|a| format!("shop:item:{}", a["id"].as_str().unwrap_or_default()))
            .call(|_| async { Ok(json!("done")) })
            .compensate_ctx(move |ctx, a, _| {
                let c = c.clone();
                async move {
                    c.lock().push(format!("compensate {} key={:?}", a["id"], ctx.key.as_deref()));
                    Ok(tidegate_runtime::Compensation::clean())
                }
            })
            .probe_ctx(move |ctx, a| {
                let p = p.clone();
                async move {
                    p.lock().push(format!("probe {} key={:?}", a["id"], ctx.key.as_deref()));
                    Probe::DidNotHappen
                }
            });
        let b = if keyed { b.key(|a| format!("order-{}", a["id"].as_str().unwrap_or_default())) } else { b };
        b.build().unwrap()
    };
    let (keyed, plain) = (tool(true, "keyed", &seen), tool(false, "plain", &seen));
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    tg.register(&keyed).unwrap();
    tg.register(&plain).unwrap();
    let tx = tg.begin_with(TxOptions::agent("a")).unwrap();
    tx.call(&keyed, json!({"id": "k1"})).await.unwrap();
    tx.call(&plain, json!({"id": "p1"})).await.unwrap();
    // The process stops here: the transaction is open, its two calls executed.
    let mut events = store.events();
    std::mem::forget(tx);
    drop(tg);
    // A third call was recorded but never finished (in doubt after the restart).
    let t = events.iter().find(|e| matches!(e, Event::Begin { .. })).map(Event::tx).unwrap();
    events.push(Event::EffectRecorded {
        tx: t,
        effect: tidegate_core::EffectId(2),
        tool: "keyed".into(),
        class: EffectClass::Reversible,
        scopes: vec!["shop:item:k2".into()],
        key: "order-k2".into(),
        args: Arc::new(json!({"id": "k2"})),
        compensable: true,
        adapter_key: true,
        compensation: None,
    });
    let tg = Tidegate::builder().store(Arc::new(MemoryStore::from_events(events))).build().unwrap();
    tg.register(&keyed).unwrap();
    tg.register(&plain).unwrap();
    let report = tg.recover().await.unwrap();
    assert_eq!(report.orphans, vec![t]);
    let mut got = seen.lock().clone();
    got.sort();
    assert_eq!(
        got,
        vec![
            r#"compensate "k1" key=Some("order-k1")"#.to_owned(),
            r#"compensate "p1" key=None"#.to_owned(),
            r#"probe "k2" key=Some("order-k2")"#.to_owned(),
        ]
    );
}
