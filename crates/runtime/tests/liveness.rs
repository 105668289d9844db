//! Settlement never depends on the caller's future, and a panicking handler is a failed
//! handler: regression tests for issue 10 items 2, 3 and 7 (second half). Every wait below is
//! on tokio's paused clock; a `timeout` of an hour only says "this must not hang forever".
#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tidegate_core::engine::SealedView;
use tidegate_runtime::{
    AbortReason, Ack, Compensation, Disposition, EffectClass, Error, PreCommitHook, Tag, Tidegate, Tool, TxOptions,
    TxState, Verdict,
};
use tokio::time::{sleep, timeout};

const NEVER: Duration = Duration::from_secs(3600);

/// Counts calls and compensations; each call takes `delay`; `panic_call`/`panic_comp` make the
/// handler panic (after acting, for calls).
#[derive(Default)]
struct Counts {
    calls: AtomicU32,
    comps: AtomicU32,
}

fn tool(name: &str, class: EffectClass, delay: Duration, panic_call: bool, panic_comp: bool) -> (Tool, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let (c1, c2) = (counts.clone(), counts.clone());
    let tool = Tool::builder(name, class)
        .scope(|a: &Value| format!("retail:order:{}", a["id"].as_str().unwrap_or_default()))
        .call(move |_a: Arc<Value>| {
            let c = c1.clone();
            async move {
                sleep(delay).await;
                c.calls.fetch_add(1, Ordering::SeqCst);
                if panic_call {
                    panic!("the adapter crashed");
                }
                Ok(json!({"ok": true}))
            }
        })
        .compensate(move |_a, _o| {
            let c = c2.clone();
            async move {
                if panic_comp {
                    panic!("the undo crashed");
                }
                c.comps.fetch_add(1, Ordering::SeqCst);
                Ok(Compensation::clean())
            }
        })
        .build()
        .unwrap();
    (tool, counts)
}

fn on(scope: &str) -> TxOptions {
    TxOptions::agent("a").may_touch([format!("retail:order:{scope}")])
}

/// Waits (on the paused clock) until `tx` has settled.
async fn settled(tx: &tidegate_runtime::Transaction) {
    timeout(NEVER, async {
        while tx.state().is_ok() {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the transaction settles");
}

/// Issue 10 item 2: `timeout(200 ms, tx.commit())` while an earlier transaction held the scope
/// left the transaction `waiting` with nobody to decide it, blocking every later one.
#[tokio::test(start_paused = true)]
async fn timeout_around_commit_does_not_strand_the_transaction() {
    let tg = Tidegate::in_memory().unwrap();
    let (t, _) = tool("set", EffectClass::Bufferable, Duration::ZERO, false, false);
    let first = tg.begin_with(on("X")).unwrap();
    let second = tg.begin_with(on("X")).unwrap();
    second.call(&t, json!({"id": "X"})).await.unwrap();
    second.seal().unwrap();
    assert!(timeout(Duration::from_millis(200), second.commit()).await.is_err(), "it waits for `first`");
    assert_eq!(second.state().unwrap(), TxState::Waiting);
    first.seal().unwrap();
    first.commit().await.unwrap();
    // The dropped commit's own task decides it.
    settled(&second).await;
    let third = tg.begin_with(on("X")).unwrap();
    third.call(&t, json!({"id": "X"})).await.unwrap();
    third.seal().unwrap();
    assert!(timeout(NEVER, third.commit()).await.expect("not blocked").unwrap().committed);
    assert_eq!(tg.stats().committed, 3);
    tg.check_integrity().unwrap();
}

/// Issue 10 item 2: a commit dropped during its release stayed `committing` and its decided
/// gated effect never fired.
#[tokio::test(start_paused = true)]
async fn dropped_release_still_fires_once() {
    let tg = Tidegate::in_memory().unwrap();
    let (mail, counts) = tool("mail", EffectClass::Gated, Duration::from_secs(1), false, false);
    let tx = tg.begin_with(on("M")).unwrap();
    assert!(matches!(tx.call(&mail, json!({"id": "M"})).await.unwrap(), Ack::Queued { .. }));
    tx.seal().unwrap();
    assert!(timeout(Duration::from_millis(100), tx.commit()).await.is_err());
    settled(&tx).await;
    sleep(Duration::from_secs(5)).await;
    assert_eq!(counts.calls.load(Ordering::SeqCst), 1, "fired exactly once");
    assert_eq!(tg.stats().committed, 1);
    tg.check_integrity().unwrap();
}

/// Dropping `abort()` while a compensation runs still finishes the abort.
#[tokio::test(start_paused = true)]
async fn dropped_abort_still_compensates() {
    let tg = Tidegate::in_memory().unwrap();
    let (hold, counts) = tool("hold", EffectClass::Reversible, Duration::ZERO, false, false);
    let slow_undo = Tool::builder("slow_undo", EffectClass::Reversible)
        .scope(|_: &Value| "retail:order:S")
        .call(|_| async { Ok(json!(1)) })
        .compensate(|_, _| async {
            sleep(Duration::from_secs(1)).await;
            Ok(Compensation::clean())
        })
        .build()
        .unwrap();
    let tx = tg.begin("a").unwrap();
    tx.call(&hold, json!({"id": "H"})).await.unwrap();
    tx.call(&slow_undo, json!({})).await.unwrap();
    assert!(timeout(Duration::from_millis(100), tx.abort("changed my mind")).await.is_err());
    settled(&tx).await;
    assert_eq!(counts.comps.load(Ordering::SeqCst), 1);
    assert_eq!(tg.stats().aborted, 1);
    tg.check_integrity().unwrap();
}

/// Issue 10 item 2: `tx.abort()` from another task did not wake a committer waiting for its
/// turn.
#[tokio::test(start_paused = true)]
async fn abort_from_another_task_wakes_the_committer() {
    let tg = Tidegate::in_memory().unwrap();
    let (t, _) = tool("set", EffectClass::Bufferable, Duration::ZERO, false, false);
    let first = tg.begin_with(on("X")).unwrap();
    let second = tg.begin_with(on("X")).unwrap();
    second.call(&t, json!({"id": "X"})).await.unwrap();
    second.seal().unwrap();
    let committer = {
        let second = second.clone();
        tokio::spawn(async move { second.commit().await })
    };
    sleep(Duration::from_millis(50)).await;
    let out = second.abort("the user gave up").await.unwrap();
    assert!(!out.committed);
    let r = timeout(NEVER, committer).await.expect("the committer wakes").unwrap();
    assert!(r.is_err(), "{r:?}");
    drop(first);
    tg.check_integrity().unwrap();
}

/// Issue 10 item 3: a panicking compensation propagated out of `abort()` and left the
/// transaction `aborting` forever.
#[tokio::test(start_paused = true)]
async fn panicking_compensation_is_tagged_not_stuck() {
    let tg = Tidegate::in_memory().unwrap();
    let (t, _) = tool("book", EffectClass::Reversible, Duration::ZERO, false, true);
    let tx = tg.begin("a").unwrap();
    tx.call(&t, json!({"id": "B"})).await.unwrap();
    let out = tx.abort("no").await.unwrap();
    assert_eq!(
        (out.effects[0].disposition.clone(), out.effects[0].tag),
        (Disposition::CompensationFailed, Tag::Unresolved)
    );
    assert!(out.effects[0].detail.as_deref().unwrap().contains("panicked"), "{out:?}");
    // The engine stays live: an undeclared transaction blocks nothing any more.
    let next = tg.begin("b").unwrap();
    next.call(&t, json!({"id": "B"})).await.unwrap();
    next.seal().unwrap();
    assert!(timeout(NEVER, next.commit()).await.unwrap().unwrap().committed);
    assert_eq!(tg.reap().await.unwrap(), 0);
    tg.check_integrity().unwrap();
}

/// Issue 10 item 3: a panicking gated release left the transaction `committing` forever.
#[tokio::test(start_paused = true)]
async fn panicking_release_is_tagged_not_stuck() {
    let tg = Tidegate::in_memory().unwrap();
    let (mail, counts) = tool("mail", EffectClass::Gated, Duration::ZERO, true, false);
    let tx = tg.begin("a").unwrap();
    tx.call(&mail, json!({"id": "M"})).await.unwrap();
    tx.seal().unwrap();
    let out = timeout(NEVER, tx.commit()).await.unwrap().unwrap();
    assert_eq!((out.effects[0].disposition.clone(), out.effects[0].tag), (Disposition::Unknown, Tag::Unresolved));
    assert_eq!(counts.calls.load(Ordering::SeqCst), 1, "never fired again");
    let next = tg.begin("b").unwrap();
    next.seal().unwrap();
    assert!(timeout(NEVER, next.commit()).await.unwrap().unwrap().committed);
    tg.check_integrity().unwrap();
}

struct PanickingHook;

impl PreCommitHook for PanickingHook {
    fn name(&self) -> &str {
        "review"
    }
    fn check<'a>(&'a self, _view: &'a SealedView) -> BoxFuture<'a, Verdict> {
        Box::pin(async { panic!("the reviewer service crashed") })
    }
}

/// Issue 10 item 3: a panicking pre-commit hook left an undeclared transaction `waiting`,
/// blocking every scope in the engine.
#[tokio::test(start_paused = true)]
async fn panicking_hook_aborts_cleanly() {
    let tg = Tidegate::in_memory().unwrap();
    let (t, counts) = tool("book", EffectClass::Reversible, Duration::ZERO, false, false);
    let tx = tg.begin("a").unwrap();
    tx.add_hook(Arc::new(PanickingHook));
    tx.call(&t, json!({"id": "B"})).await.unwrap();
    tx.seal().unwrap();
    let err = timeout(NEVER, tx.commit()).await.unwrap().unwrap_err();
    let Error::Aborted(out) = err else { panic!("{err}") };
    assert!(matches!(&out.reason, Some(AbortReason::Vetoed { reason, .. }) if reason.contains("panicked")));
    assert!(out.is_clean(), "compensated: {out:?}");
    assert_eq!(counts.comps.load(Ordering::SeqCst), 1);
    let next = tg.begin("b").unwrap();
    next.call(&t, json!({"id": "C"})).await.unwrap();
    next.seal().unwrap();
    assert!(timeout(NEVER, next.commit()).await.unwrap().unwrap().committed);
    tg.check_integrity().unwrap();
}

/// A call whose future is dropped while the tool runs is reported as an unknown outcome (the
/// transaction aborts and compensates it blind) instead of staying in flight forever.
#[tokio::test(start_paused = true)]
async fn dropped_call_is_settled_not_left_in_flight() {
    let tg = Tidegate::in_memory().unwrap();
    let (t, counts) = tool("book", EffectClass::Reversible, Duration::from_secs(1), false, false);
    let tx = tg.begin_with(on("B")).unwrap();
    assert!(timeout(Duration::from_millis(100), tx.call(&t, json!({"id": "B"}))).await.is_err());
    settled(&tx).await;
    assert_eq!(counts.comps.load(Ordering::SeqCst), 1, "compensated blind");
    assert!(matches!(tx.state(), Err(Error::Finished { committed: false, settled: true, .. })));
    let next = tg.begin_with(on("B")).unwrap();
    next.seal().unwrap();
    assert!(timeout(NEVER, next.commit()).await.unwrap().unwrap().committed);
    tg.check_integrity().unwrap();
}

/// Issue 10 item 7: the lease was renewed when a call started, not while it ran, so a long
/// call cost its transaction the lease.
#[tokio::test(start_paused = true)]
async fn long_call_keeps_its_lease() {
    let tg = Tidegate::builder().lease(Duration::from_secs(1)).build().unwrap();
    let _reaper = tg.spawn_reaper();
    let (t, _) = tool("export", EffectClass::Reversible, Duration::from_secs(5), false, false);
    let tx = tg.begin_with(on("E")).unwrap();
    let ack = tx.call(&t, json!({"id": "E"})).await.unwrap();
    assert!(matches!(ack, Ack::Executed { .. }));
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().committed);
    // An idle transaction still loses its lease.
    let idle = tg.begin_with(on("F")).unwrap();
    sleep(Duration::from_secs(3)).await;
    assert!(idle.state().is_err(), "expired");
}
