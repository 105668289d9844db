//! Attacks on what landed on 2026-11-23, through the public API only: inline-first settlement
//! (`settle.rs`), the two-step protocol (`ticket.rs`, `Tidegate::transaction(TxId)`) and
//! extension records. Each test asserts the promised behaviour: never stuck, released or
//! compensated exactly once, nothing lost. A failing one is `#[ignore]`d with its FINDING.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::FutureExt;
use serde_json::{Value, json};
use tidegate_runtime::{
    Ack, CallOptions, CallOutcome, Compensation, EffectClass, EngineError, Error, Step, TicketAction, Tidegate, Tool,
    TxId, TxOptions, TxState,
};
use tidegate_storage::MemoryStore;
use tokio::sync::Notify;

/// What reached the provider, and a gate a handler may wait at.
#[derive(Default)]
struct Provider {
    /// Handler entries (before any panic or gate).
    entries: AtomicU32,
    calls: AtomicU32,
    comps: AtomicU32,
    /// Signalled when a gated handler has been entered.
    entered: Notify,
    /// Signalled to let a gated handler return.
    go: Notify,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    /// The call handler waits at the gate (async).
    Gate,
    /// The call handler panics.
    Panic,
    /// The call handler blocks its thread for a while (a badly written handler).
    Block,
}

fn tool(name: &str, class: EffectClass, p: &Arc<Provider>, mode: Mode) -> Tool {
    let (p1, p2) = (p.clone(), p.clone());
    let mut b = Tool::builder(name, class).scope(|a: &Value| format!("h:{}", a["id"].as_str().unwrap_or("x"))).call(
        move |a: Arc<Value>| {
            let p = p1.clone();
            async move {
                p.entries.fetch_add(1, Ordering::SeqCst);
                match mode {
                    Mode::Gate => {
                        p.entered.notify_one();
                        p.go.notified().await;
                    }
                    Mode::Panic => panic!("handler blew up"),
                    Mode::Block => std::thread::sleep(Duration::from_millis(50)),
                    Mode::Plain => {}
                }
                p.calls.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"did": a["id"]}))
            }
        },
    );
    if class.executes_eagerly() {
        b = b.compensate(move |_a: Arc<Value>, _o: Arc<Value>| {
            let p = p2.clone();
            async move {
                p.comps.fetch_add(1, Ordering::SeqCst);
                Ok(Compensation::clean())
            }
        });
    }
    b.build().unwrap()
}

/// Waits (bounded, as a hang guard only) until `id` has finished and settled; returns whether
/// it committed.
async fn settled(tg: &Tidegate, id: TxId) -> bool {
    let wait = async {
        loop {
            match tg.transaction(id) {
                Err(Error::Finished { committed, settled: true, .. }) => return committed,
                Ok(_) | Err(Error::Finished { .. }) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(e) => panic!("unexpected {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait).await.expect("the transaction never settled")
}

/// [`settled`] for an engine reopened on a store (a transaction the last process finished
/// answers `Finished` read from the ledger; `Settled` is still accepted here).
async fn settled_after_reopen(tg: &Tidegate, id: TxId) {
    let wait = async {
        loop {
            match tg.transaction(id) {
                Err(Error::Finished { settled: true, .. } | Error::Engine(EngineError::Settled { .. })) => return,
                Ok(_) | Err(Error::Finished { .. }) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(e) => panic!("unexpected {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait).await.expect("the transaction never settled");
}

fn gated_tx(tg: &Tidegate) -> tidegate_runtime::Transaction {
    tg.begin_with(TxOptions::agent("a").may_touch(["h:e1"])).unwrap()
}

// ---------------------------------------------------------------- 1. inline-first settlement

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_dropped_right_after_its_first_poll_still_releases_exactly_once() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Gate);
    let tx = gated_tx(&tg);
    tx.call(&mail, json!({"id": "e1"})).await.unwrap();
    tx.seal().unwrap();
    // One poll, then the future is dropped: the release waits at the gate, so it was pending.
    assert!(tx.commit().now_or_never().is_none(), "the release is still at the gate");
    p.go.notify_one();
    assert!(settled(&tg, tx.id()).await, "the commit finishes without its caller");
    assert_eq!(p.calls.load(Ordering::SeqCst), 1);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_under_a_zero_timeout_and_a_lost_select_is_never_stuck() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Gate);
    let tx = gated_tx(&tg);
    tx.call(&mail, json!({"id": "e1"})).await.unwrap();
    tx.seal().unwrap();
    // A biased select whose first branch is ready never polls the commit: nothing started.
    tokio::select! {
        biased;
        () = std::future::ready(()) => {}
        _ = tx.commit() => panic!("the commit branch must not win"),
    }
    assert_eq!(tx.state().unwrap(), TxState::Sealed, "a never-polled commit did nothing");
    assert!(tokio::time::timeout(Duration::ZERO, tx.commit()).await.is_err(), "pending at the gate");
    // A second commit while the first runs in the engine's task must not release again.
    let again = tokio::spawn({
        let tx = tx.clone();
        async move { tx.commit().await }
    });
    p.go.notify_one();
    assert!(settled(&tg, tx.id()).await);
    let second = tokio::time::timeout(Duration::from_secs(20), again).await.expect("second commit hung").unwrap();
    assert!(
        matches!(&second, Ok(o) if o.committed) || matches!(&second, Err(Error::Finished { committed: true, .. })),
        "{second:?}"
    );
    assert_eq!(p.calls.load(Ordering::SeqCst), 1, "released exactly once");
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_from_another_task_while_the_commit_releases_inline_does_not_undo_the_decision() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Gate);
    let tx = gated_tx(&tg);
    tx.call(&mail, json!({"id": "e1"})).await.unwrap();
    tx.seal().unwrap();
    let commit = tokio::spawn({
        let tx = tx.clone();
        async move { tx.commit().await }
    });
    p.entered.notified().await;
    let abort = tokio::time::timeout(Duration::from_secs(20), tx.abort("too late")).await.expect("abort hung");
    assert!(matches!(abort, Err(Error::Finished { committed: true, .. })), "the commit was decided: {abort:?}");
    p.go.notify_one();
    let out = tokio::time::timeout(Duration::from_secs(20), commit).await.expect("commit hung").unwrap().unwrap();
    assert!(out.committed);
    assert_eq!(p.calls.load(Ordering::SeqCst), 1);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_handler_that_panics_during_the_inline_poll_settles_the_transaction() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Panic);
    let tx = gated_tx(&tg);
    tx.call(&mail, json!({"id": "e1"})).await.unwrap();
    tx.seal().unwrap();
    // Run in a task of its own so that a panic escaping `commit` is seen, not fatal here.
    let r = tokio::spawn({
        let tx = tx.clone();
        async move { tx.commit().await.map(|o| o.committed) }
    })
    .await;
    assert!(r.is_ok(), "a handler's panic must not unwind through the caller's commit");
    let _ = settled(&tg, tx.id()).await;
    assert_eq!(p.entries.load(Ordering::SeqCst), 1, "a release whose outcome is unknown is never fired again");
    tg.check_integrity().unwrap();
    // The engine still works.
    let tx2 = tg.begin_with(TxOptions::agent("b").may_touch(["h:e2"])).unwrap();
    let plain = tool("plain", EffectClass::Gated, &p, Mode::Plain);
    tx2.call(&plain, json!({"id": "e2"})).await.unwrap();
    assert!(tx2.seal_and_commit().await.unwrap().committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_release_handler_delays_only_its_own_commit() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let slow = tool("slow", EffectClass::Gated, &p, Mode::Block);
    let mut joins = Vec::new();
    for i in 0..4 {
        let tx = tg.begin_with(TxOptions::agent("a").may_touch([format!("h:s{i}")])).unwrap();
        tx.call(&slow, json!({"id": format!("s{i}")})).await.unwrap();
        tx.seal().unwrap();
        joins.push(tokio::spawn(async move { tx.commit().await.map(|o| o.committed) }));
    }
    for j in joins {
        assert!(tokio::time::timeout(Duration::from_secs(20), j).await.expect("hung").unwrap().unwrap());
    }
    assert_eq!(p.calls.load(Ordering::SeqCst), 4);
    tg.check_integrity().unwrap();
}

#[test]
fn commit_from_a_non_tokio_executor_settles() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (tg, p) = rt.block_on(async { (Tidegate::in_memory().unwrap(), Arc::new(Provider::default())) });
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Plain);
    let gate = tool("gate", EffectClass::Gated, &p, Mode::Gate);
    // Immediate release: finishes in the inline poll, on the futures executor's thread.
    let (tg2, mail2) = (tg.clone(), mail.clone());
    let out = std::thread::spawn(move || {
        futures::executor::block_on(async move {
            let tx = tg2.begin_with(TxOptions::agent("a").may_touch(["h:e1"])).unwrap();
            tx.call(&mail2, json!({"id": "e1"})).await.unwrap();
            tx.seal_and_commit().await
        })
    })
    .join()
    .expect("no panic on a non-tokio executor");
    assert!(out.unwrap().committed);
    // A release that has to wait: handed to the engine's task, awaited from the foreign executor.
    let (tg3, p3) = (tg.clone(), p.clone());
    let waiter = std::thread::spawn(move || {
        futures::executor::block_on(async move {
            let tx = tg3.begin_with(TxOptions::agent("b").may_touch(["h:e2"])).unwrap();
            tx.call(&gate, json!({"id": "e2"})).await.unwrap();
            tx.seal_and_commit().await
        })
    });
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), p3.entered.notified()).await.expect("release never ran");
    });
    p.go.notify_one();
    assert!(waiter.join().unwrap().unwrap().committed);
    assert_eq!(p.calls.load(Ordering::SeqCst), 2);
    drop(tg);
    drop(rt);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_racing_a_pending_settlement_is_finished_by_the_next_open() {
    let store = Arc::new(MemoryStore::new());
    let p = Arc::new(Provider::default());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Gate);
    let tx = gated_tx(&tg);
    let id = tx.id();
    tx.call(&mail, json!({"id": "e1"})).await.unwrap();
    tx.seal().unwrap();
    let commit = tokio::spawn(async move { tx.commit().await });
    tokio::time::timeout(Duration::from_secs(20), p.entered.notified()).await.expect("release never ran");
    tg.stop();
    p.go.notify_one();
    let r = tokio::time::timeout(Duration::from_secs(20), commit).await.expect("commit hung after stop").unwrap();
    assert!(r.is_ok() || matches!(r, Err(Error::Store(_))), "{r:?}");
    // New work is refused with a typed error, never a hang.
    let refused = tokio::time::timeout(Duration::from_secs(20), tg.append_extension("s", json!(1))).await.unwrap();
    assert!(refused.is_err(), "a stopped engine takes no more work");
    drop(tg);
    let again = Tidegate::builder().store(store).build().unwrap();
    again.register(&tool("mail", EffectClass::Gated, &p, Mode::Plain)).unwrap();
    again.recover().await.unwrap();
    settled_after_reopen(&again, id).await;
    assert!(p.calls.load(Ordering::SeqCst) <= 1, "a release in flight at the stop is never fired again blindly");
    again.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_handler_that_calls_back_into_the_engine_during_the_inline_poll_does_not_deadlock() {
    let tg = Tidegate::in_memory().unwrap();
    let seen = Arc::new(AtomicU32::new(0));
    let (tg2, seen2) = (tg.clone(), seen.clone());
    let mail = Tool::builder("mail", EffectClass::Gated)
        .scope(|_a: &Value| "h:e1".to_owned())
        .call(move |_a: Arc<Value>| {
            let (tg, seen) = (tg2.clone(), seen2.clone());
            async move {
                // Re-entering the engine from a release: its lock must not be held here.
                tg.append_extension("from-release", json!(1))
                    .await
                    .map_err(|e| tidegate_runtime::ToolError::failed(e.to_string()))?;
                let _ = tg.version("h:e1");
                let inner = tg.begin_with(TxOptions::agent("nested").may_touch(["h:other"])).unwrap();
                inner.abort("nested").await.unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
                Ok(json!("sent"))
            }
        })
        .build()
        .unwrap();
    let tx = gated_tx(&tg);
    tx.call(&mail, json!({"id": "e1"})).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), tx.seal_and_commit()).await.expect("deadlock").unwrap();
    assert!(out.committed && out.is_clean(), "{out:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_eq!(tg.extension_records("from-release").unwrap().len(), 1);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_during_an_inline_release_that_blocks_its_thread_never_fires_it_twice() {
    let store = Arc::new(MemoryStore::new());
    let p = Arc::new(Provider::default());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let slow = tool("slow", EffectClass::Gated, &p, Mode::Block);
    let tx = gated_tx(&tg);
    let id = tx.id();
    tx.call(&slow, json!({"id": "e1"})).await.unwrap();
    tx.seal().unwrap();
    let commit = tokio::spawn(async move { tx.commit().await });
    while p.entries.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // The release is inside its (blocking) inline poll on the other worker.
    tg.stop();
    let r = tokio::time::timeout(Duration::from_secs(20), commit).await.expect("commit hung").unwrap();
    assert!(r.is_ok() || matches!(r, Err(Error::Store(_))), "{r:?}");
    drop(tg);
    let again = Tidegate::builder().store(store).build().unwrap();
    again.register(&tool("slow", EffectClass::Gated, &p, Mode::Plain)).unwrap();
    again.recover().await.unwrap();
    settled_after_reopen(&again, id).await;
    assert_eq!(p.entries.load(Ordering::SeqCst), 1, "released at most once across the stop and the reopen");
    again.check_integrity().unwrap();
}

// ---------------------------------------------------------------- 2. the two-step protocol

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_future_dropped_while_the_probe_runs_leaves_the_ticket_pending_and_its_drop_settles() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let p2 = p.clone();
    let h = Tool::builder("hotel", EffectClass::Reversible)
        .scope(|_a: &Value| "h:w1".to_owned())
        .call(|_a: Arc<Value>| async { Ok(json!("engine call")) })
        .compensate({
            let p = p.clone();
            move |_a: Arc<Value>, _o: Arc<Value>| {
                let p = p.clone();
                async move {
                    p.comps.fetch_add(1, Ordering::SeqCst);
                    Ok(Compensation::clean())
                }
            }
        })
        .probe(move |_a: Arc<Value>| {
            let p = p2.clone();
            async move {
                p.entered.notify_one();
                p.go.notified().await;
                tidegate_runtime::Probe::Happened(json!("probed"))
            }
        })
        .build()
        .unwrap();
    let tx = tg.begin("a").unwrap();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    assert!(t.report(CallOutcome::unknown("timeout")).now_or_never().is_none(), "the probe waits at the gate");
    assert!(t.pending(), "a report dropped mid-probe leaves the ticket pending");
    p.go.notify_one();
    drop(t);
    assert!(!settled(&tg, tx.id()).await, "the drop reports unknown: the transaction aborts");
    assert_eq!(p.comps.load(Ordering::SeqCst), 1, "compensated blind exactly once");
    tg.check_integrity().unwrap();
}

fn hotel(p: &Arc<Provider>) -> Tool {
    tool("hotel", EffectClass::Reversible, p, Mode::Plain)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_dropped_unreported_aborts_and_compensates_blind_exactly_once() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin("a").unwrap();
    let t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    drop(t);
    assert!(!settled(&tg, tx.id()).await, "a dropped in-flight ticket aborts");
    assert_eq!(p.comps.load(Ordering::SeqCst), 1, "compensated blind once");
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_dropped_after_a_retry_step_is_settled() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin("a").unwrap();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    let step = t.report(CallOutcome::not_applied("503", true)).await.unwrap();
    assert!(matches!(step, Step::Retry { attempt: 2, .. }), "{step:?}");
    drop(t);
    assert!(!settled(&tg, tx.id()).await);
    assert!(p.comps.load(Ordering::SeqCst) <= 1);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_future_dropped_before_it_returned_leaves_nothing_in_flight() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin("a").unwrap();
    // Dropped after its first poll (on a memory store the record may finish at once).
    if let Some(t) = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).now_or_never() {
        drop(t.unwrap());
    }
    let r = tokio::time::timeout(Duration::from_secs(20), tx.seal_and_commit()).await.expect("commit hung");
    assert!(r.is_err() || r.as_ref().unwrap().committed, "{r:?}");
    let _ = settled(&tg, tx.id()).await;
    tg.check_integrity().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_report_after_the_lease_ran_out_is_accepted_because_an_in_flight_call_extends_the_lease() {
    // docs/engine.md: while a call is in flight its lease runs on (a reaper extends it).
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin_with(TxOptions::agent("a").lease(Duration::from_secs(1))).unwrap();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(tg.reap().await.unwrap(), 0, "an in-flight call keeps its transaction");
    let r = t.report(CallOutcome::done(json!({"hold": 1}))).await.unwrap();
    assert!(matches!(r, Step::Acked(Ack::Executed { .. })), "{r:?}");
    // The lease now runs from the report: it can expire, and the reaper compensates once.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(tg.reap().await.unwrap(), 1);
    assert!(!settled(&tg, tx.id()).await);
    assert_eq!(p.comps.load(Ordering::SeqCst), 1, "what the caller did is undone exactly once");
    drop(t);
    assert_eq!(p.comps.load(Ordering::SeqCst), 1, "dropping the reported ticket does nothing more");
    tg.check_integrity().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_ticket_kept_but_never_reported_holds_its_transaction_open_forever() {
    // As documented (the lease runs on while a call is in flight), but a hazard: a server
    // that keeps tickets in a map for clients that vanish never frees their claims.
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin_with(TxOptions::agent("a").lease(Duration::from_secs(1))).unwrap();
    let t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    for _ in 0..24 {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(tg.reap().await.unwrap(), 0);
    }
    assert!(matches!(tx.state(), Ok(TxState::Open)), "a day later: {:?}", tx.state());
    drop(t);
    assert!(!settled(&tg, tx.id()).await, "only the drop ends it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_by_id_after_reopen_says_how_a_finished_transaction_ended() {
    let store = Arc::new(MemoryStore::new());
    let p = Arc::new(Provider::default());
    let id = {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let tx = gated_tx(&tg);
        tx.call(&tool("mail", EffectClass::Gated, &p, Mode::Plain), json!({"id": "e1"})).await.unwrap();
        assert!(tx.seal_and_commit().await.unwrap().committed);
        tx.id()
    };
    let aborted = {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let tx = tg.begin("b").unwrap();
        tx.abort("the user changed their mind").await.unwrap();
        tx.id()
    };
    let again = Tidegate::builder().store(store).build().unwrap();
    match again.transaction(id) {
        Err(Error::Finished { committed: true, settled: true, reason: None, .. }) => {}
        other => panic!("expected Finished{{committed: true}}, got {:?}", other.map(|t| t.id())),
    }
    match again.transaction(aborted) {
        Err(Error::Finished { committed: false, settled: true, reason: Some(r), .. }) => {
            assert!(r.to_string().contains("changed their mind"), "{r}");
        }
        other => panic!("expected Finished{{committed: false}}, got {:?}", other.map(|t| t.id())),
    }
    // An id never issued is still UnknownTx, not a scan's guess.
    assert!(matches!(again.transaction(TxId(aborted.0 + 100)), Err(Error::Engine(EngineError::UnknownTx { .. }))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_while_a_ticket_is_in_flight_then_report_done_compensates_once() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin("a").unwrap();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    let abort = tokio::spawn({
        let tx = tx.clone();
        async move { tx.abort("user cancelled").await }
    });
    tokio::task::yield_now().await;
    let r = tokio::time::timeout(Duration::from_secs(20), t.report(CallOutcome::done(json!({"hold": 1}))))
        .await
        .expect("report hung");
    let a = tokio::time::timeout(Duration::from_secs(20), abort).await.expect("abort hung").unwrap();
    assert!(a.is_ok() || matches!(a, Err(Error::Finished { committed: false, .. })), "{a:?}");
    assert!(
        matches!(r, Ok(Step::Acked(_)) | Err(Error::CallInterrupted { .. }) | Err(Error::Finished { .. })),
        "{r:?}"
    );
    assert!(!settled(&tg, tx.id()).await);
    assert_eq!(p.comps.load(Ordering::SeqCst), 1, "the call that happened is undone exactly once");
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_after_stop_is_refused_and_the_next_open_settles_the_effect() {
    let store = Arc::new(MemoryStore::new());
    let p = Arc::new(Provider::default());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let h = hotel(&p);
    let tx = tg.begin("a").unwrap();
    let id = tx.id();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    tg.stop();
    let r = tokio::time::timeout(Duration::from_secs(20), t.report(CallOutcome::done(json!(1))))
        .await
        .expect("report hung after stop");
    assert!(r.is_err(), "a stopped engine takes no report: {r:?}");
    drop(t);
    drop(tx);
    drop(tg);
    let again = Tidegate::builder().store(store).build().unwrap();
    again.register(&h).unwrap();
    again.recover().await.unwrap();
    settled_after_reopen(&again, id).await;
    assert!(p.comps.load(Ordering::SeqCst) <= 1, "compensated at most once");
    again.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reporting_done_for_a_held_ticket_is_misuse_and_changes_nothing() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Plain);
    let tx = gated_tx(&tg);
    let mut t = tx.record(&mail, json!({"id": "e1"}), CallOptions::default()).await.unwrap();
    assert!(matches!(t.action(), TicketAction::Queued { .. }));
    assert!(!t.pending());
    for _ in 0..2 {
        let e = t.report(CallOutcome::done(json!("I sent it myself"))).await.unwrap_err();
        assert!(matches!(e, Error::TicketMisuse { .. }), "{e}");
    }
    let e = tx.report(&mut t, CallOutcome::unknown("?")).await.unwrap_err();
    assert!(matches!(e, Error::TicketMisuse { .. }), "{e}");
    drop(t);
    assert_eq!(p.calls.load(Ordering::SeqCst), 0, "nothing released before commit");
    assert!(tx.seal_and_commit().await.unwrap().committed);
    assert_eq!(p.calls.load(Ordering::SeqCst), 1, "released exactly once, by the engine");
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_reported_to_another_transaction_is_refused_and_stays_reportable() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let (tx, other) = (tg.begin("a").unwrap(), tg.begin("b").unwrap());
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    let e = other.report(&mut t, CallOutcome::done(json!(1))).await.unwrap_err();
    assert!(matches!(e, Error::TicketMisuse { .. }), "{e}");
    assert!(t.pending(), "the refused report changed nothing");
    assert!(matches!(tx.report(&mut t, CallOutcome::done(json!(1))).await.unwrap(), Step::Acked(_)));
    assert!(tx.seal_and_commit().await.unwrap().committed);
    assert!(other.seal_and_commit().await.unwrap().committed);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_and_report_mixed_with_concurrent_calls_on_one_transaction() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let car = tool("car", EffectClass::Reversible, &p, Mode::Plain);
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Plain);
    let tx = tg.begin("a").unwrap();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    // Calls by other tasks while the ticket is in flight (same and other scopes).
    let mut calls = Vec::new();
    for (tl, id) in [(car.clone(), "c1"), (h.clone(), "w1"), (mail.clone(), "m1")] {
        let tx = tx.clone();
        calls.push(tokio::spawn(async move { tx.call(&tl, json!({"id": id})).await }));
    }
    tokio::task::yield_now().await;
    assert!(matches!(t.report(CallOutcome::done(json!({"hold": 1}))).await.unwrap(), Step::Acked(_)));
    for c in calls {
        let r = tokio::time::timeout(Duration::from_secs(20), c).await.expect("call hung").unwrap();
        assert!(r.is_ok(), "{r:?}");
    }
    let out = tokio::time::timeout(Duration::from_secs(20), tx.seal_and_commit()).await.expect("hung").unwrap();
    assert!(out.committed && out.effects.len() == 4, "{out:?}");
    // car, hotel(engine's call), mail release: the ticket's call is the caller's.
    assert_eq!(p.calls.load(Ordering::SeqCst), 3);
    assert_eq!(p.comps.load(Ordering::SeqCst), 0);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_handle_commits_while_another_handle_holds_an_unreported_ticket() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let tx = tg.begin("a").unwrap();
    let mut t = tx.record(&h, json!({"id": "w1"}), CallOptions::default()).await.unwrap();
    let resumed = tg.transaction(tx.id()).unwrap();
    assert_eq!(resumed.epoch(), tx.epoch());
    let commit = tokio::spawn(async move {
        match resumed.seal() {
            Ok(()) => resumed.commit().await,
            Err(e) => Err(e),
        }
    });
    tokio::task::yield_now().await;
    let r = tokio::time::timeout(Duration::from_secs(20), t.report(CallOutcome::done(json!({"hold": 1}))))
        .await
        .expect("report hung");
    let c = tokio::time::timeout(Duration::from_secs(20), commit).await.expect("commit hung").unwrap();
    // A seal that found the effect still in flight is refused (typed) and changes nothing:
    // the transaction stays open, and commits once the report is in.
    if let Err(Error::Engine(EngineError::InFlight { .. })) = c {
        assert!(matches!(tx.state(), Ok(TxState::Open)), "{:?}", tx.state());
        assert!(tx.seal_and_commit().await.unwrap().committed);
    }
    let committed = settled(&tg, tx.id()).await;
    // Either the commit waited for the in-flight effect, or the seal refused it: never an
    // effect that happened and is neither accepted nor compensated.
    if committed {
        assert!(matches!(r, Ok(Step::Acked(_))), "{r:?}");
        assert_eq!(p.comps.load(Ordering::SeqCst), 0);
    } else {
        assert_eq!(p.comps.load(Ordering::SeqCst), 1, "r={r:?} c={c:?}");
    }
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_of_one_transaction_abort_and_commit_at_once_settle_once() {
    let (tg, p) = (Tidegate::in_memory().unwrap(), Arc::new(Provider::default()));
    let h = hotel(&p);
    let mail = tool("mail", EffectClass::Gated, &p, Mode::Plain);
    let tx = tg.begin("a").unwrap();
    tx.call(&h, json!({"id": "w1"})).await.unwrap();
    tx.call(&mail, json!({"id": "m1"})).await.unwrap();
    let b = tg.transaction(tx.id()).unwrap();
    tx.seal().unwrap();
    let (c, a) = tokio::join!(tx.commit(), b.abort("other handle"));
    let committed = settled(&tg, tx.id()).await;
    assert!(c.is_ok() != a.is_ok() || c.is_err(), "c={c:?} a={a:?}");
    let (calls, comps) = (p.calls.load(Ordering::SeqCst), p.comps.load(Ordering::SeqCst));
    if committed {
        assert_eq!((calls, comps), (2, 0));
    } else {
        assert_eq!((calls, comps), (1, 1));
    }
    tg.check_integrity().unwrap();
}

// ---------------------------------------------------------------- 3. extension records

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_extension_body_is_refused_with_an_error_naming_the_limit() {
    // Found by this file: a 64 MiB body was accepted. The limit is 4 MiB of JSON text.
    let tg = Tidegate::in_memory().unwrap();
    let body = json!({"blob": "x".repeat(64 << 20)});
    match tg.append_extension("review", body).await {
        Err(e @ Error::InvalidArgument { field: "body", .. }) => assert!(e.to_string().contains("4 MiB"), "{e}"),
        other => panic!("a 64 MiB extension body was accepted: {:?}", other.map(|_| ())),
    }
    let just_over = json!("x".repeat(tidegate_runtime::extension::MAX_BODY_BYTES));
    assert!(matches!(
        tg.append_extension("review", just_over).await,
        Err(Error::InvalidArgument { field: "body", .. })
    ));
    let just_under = json!("x".repeat(tidegate_runtime::extension::MAX_BODY_BYTES - 2));
    tg.append_extension("review", just_under).await.unwrap();
    assert_eq!(tg.extension_records("review").unwrap().len(), 1, "nothing of the refused ones was kept");
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tidegate-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_and_a_large_body_interleaved_with_transactions_survive_reopen_on_sqlite() {
    let dir = tempdir("ext");
    let p = Arc::new(Provider::default());
    let h = hotel(&p);
    let big = json!({"blob": "y".repeat(2 << 20), "nested": [[[[[{"k": "\u{0}\u{1f}é"}]]]]]});
    let mut expect: Vec<(String, Value)> = Vec::new();
    let versions;
    {
        let store = Arc::new(tidegate_runtime::SqliteStore::open(&dir).unwrap());
        let tg = Tidegate::builder().store(store).build().unwrap();
        let mut joins = Vec::new();
        for i in 0..200u32 {
            let stream = format!("s{}-{}", i % 50, "é".repeat(60));
            let body = json!({"i": i});
            expect.push((stream.clone(), body.clone()));
            let tg2 = tg.clone();
            // From concurrent tasks, mixed with transactions.
            joins.push(tokio::spawn(async move { tg2.append_extension(&stream, body).await }));
            if i % 20 == 0 {
                let tx = tg.begin_with(TxOptions::agent("a").may_touch([format!("h:w{i}")])).unwrap();
                tx.call(&h, json!({"id": format!("w{i}")})).await.unwrap();
                assert!(tx.seal_and_commit().await.unwrap().committed);
            }
        }
        let lsns: Vec<_> = futures::future::join_all(joins).await.into_iter().map(|r| r.unwrap().unwrap()).collect();
        let mut sorted = lsns.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), lsns.len(), "every record got its own LSN");
        tg.append_extension("big", big.clone()).await.unwrap();
        // Exactly 200 bytes (100 two-byte characters) is accepted; one more byte is not.
        tg.append_extension(&"é".repeat(100), json!(1)).await.unwrap();
        assert!(matches!(
            tg.append_extension(&format!("{}a", "é".repeat(100)), json!(1)).await,
            Err(Error::InvalidArgument { field: "stream", .. })
        ));
        versions = (0..10).map(|i| tg.version(&format!("h:w{}", i * 20)).unwrap()).collect::<Vec<_>>();
        drop(tg);
    }
    let store = Arc::new(tidegate_runtime::SqliteStore::open(&dir).unwrap());
    let report = store.verify().unwrap();
    let _ = format!("{report:?}");
    let tg = Tidegate::builder().store(store).build().unwrap();
    tg.register(&h).unwrap();
    let rep = tg.recover().await.unwrap();
    assert_eq!(rep.unfinished, 0);
    tg.check_integrity().unwrap();
    for s in 0..50 {
        let stream = format!("s{s}-{}", "é".repeat(60));
        let mut want: Vec<_> =
            expect.iter().filter(|(n, _)| *n == stream).map(|(_, b)| b["i"].as_u64().unwrap()).collect();
        let mut got: Vec<_> =
            tg.extension_records(&stream).unwrap().into_iter().map(|(_, b)| b["i"].as_u64().unwrap()).collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "stream {s}: nothing lost, nothing doubled");
    }
    let bigs = tg.extension_records("big").unwrap();
    assert_eq!(bigs.len(), 1);
    assert_eq!(*bigs[0].1, big, "the large body round-trips byte for byte");
    let after: Vec<_> = (0..10).map(|i| tg.version(&format!("h:w{}", i * 20)).unwrap()).collect();
    assert_eq!(after, versions);
    drop(tg);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_appends_racing_stop_are_refused_or_kept_never_hung() {
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    // Fifty acknowledged before the stop, fifty racing it.
    for i in 0..50 {
        tg.append_extension("race", json!(i)).await.unwrap();
    }
    let mut joins = Vec::new();
    for i in 50..100 {
        let tg2 = tg.clone();
        joins.push(tokio::spawn(async move { tg2.append_extension("race", json!(i)).await }));
        if i == 75 {
            tg.stop();
        }
    }
    let mut ok = 50;
    for j in joins {
        let r = tokio::time::timeout(Duration::from_secs(20), j).await.expect("hung").unwrap();
        match r {
            Ok(_) => ok += 1,
            Err(Error::Store(_)) => {}
            Err(e) => panic!("a refusal after stop is a store error: {e}"),
        }
    }
    drop(tg);
    let again = Tidegate::builder().store(store).build().unwrap();
    let kept = again.extension_records("race").unwrap().len();
    assert!(kept >= ok, "an acknowledged append is never lost: {kept} kept, {ok} acknowledged");
    let _ = Ack::Queued { effect: tidegate_runtime::EffectId(0) };
}
