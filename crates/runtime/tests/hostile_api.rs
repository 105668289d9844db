//! The public API used as a hostile (or merely careless) user would (issue 10): identical
//! calls, reused idempotency keys, expired leases under `run`, and what a Rust user expects of
//! a well-kept library. Each test is named after the finding it guards.

#![allow(clippy::unwrap_used)] // tests unwrap by design

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::World;
use serde_json::json;
use tidegate_runtime::{
    AbortReason, Ack, CallOptions, Compensation, EffectClass, EngineError, Error, FnHook, SealedView, Tidegate, Tool,
    TxOptions, Verdict,
};
use tidegate_storage::MemoryStore;

fn engine() -> Tidegate {
    Tidegate::in_memory().expect("engine")
}

/// The `KeyReused` refusal in `err`, with its fields.
fn key_reused(err: &Error) -> (&str, &str, &str, &str) {
    match err {
        Error::Engine(EngineError::KeyReused { key, first, this, differs }) => (key, first, this, differs),
        other => panic!("expected KeyReused, got {other:?}"),
    }
}

// Bug: a derived key did not include the call's position, so the second of two identical
// calls without a key was silently replayed and never ran.
#[tokio::test]
async fn identical_calls_without_key_both_run() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let mail = w.tool("mail", EffectClass::Gated, "mail:to");
    let tx = tg.begin("a").unwrap();
    let first = tx.call(&hotel, json!({"id": "H"})).await.unwrap();
    let second = tx.call(&hotel, json!({"id": "H"})).await.unwrap();
    assert!(matches!(first, Ack::Executed { .. }) && matches!(second, Ack::Executed { .. }), "{second:?}");
    assert_ne!(first.effect(), second.effect());
    tx.call(&mail, json!({"id": "bob"})).await.unwrap();
    tx.call(&mail, json!({"id": "bob"})).await.unwrap();
    tx.seal().unwrap();
    let outcome = tx.commit().await.unwrap();
    assert_eq!(outcome.effects.len(), 4);
    assert_eq!(w.count("hotel", "exec"), 2, "two calls, two bookings");
    assert_eq!(w.count("mail", "fire"), 2, "two sends, two mails");
}

// A retry of the same call (the same call id) still runs once; the same call id with other
// arguments is refused.
#[tokio::test]
async fn a_retry_with_the_same_call_id_replays_and_other_arguments_are_refused() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let tx = tg.begin("a").unwrap();
    let first = tx.call_with(&hotel, json!({"id": "H"}), CallOptions::call_id("c1")).await.unwrap();
    let retry = tx.call_with(&hotel, json!({"id": "H"}), CallOptions::call_id("c1")).await.unwrap();
    assert!(matches!(retry, Ack::Replayed { .. }), "{retry:?}");
    assert_eq!(first.effect(), retry.effect());
    let err = tx.call_with(&hotel, json!({"id": "H9"}), CallOptions::call_id("c1")).await.unwrap_err();
    let (key, _, _, differs) = key_reused(&err);
    assert!(key.contains("c1") && differs.contains("`id`"), "{err}");
    assert!(!err.retryable());
    assert_eq!(w.count("hotel", "exec"), 1);
    tx.seal().unwrap();
    tx.commit().await.unwrap();
}

// Bug: the same adapter key with other arguments silently returned the first call's output
// and executed nothing.
#[tokio::test]
async fn key_reused_with_other_arguments_is_refused() {
    let (tg, w) = (engine(), World::new());
    let charge = w.tool("charge", EffectClass::Idempotent, "retail:payment");
    let t1 = tg.begin("a").unwrap();
    t1.call_with(&charge, json!({"id": "P", "amount": 10}), CallOptions::key("pay-1")).await.unwrap();
    // While the first use is unsettled (formerly "key in use, retry later": retrying could
    // never help) and within the same transaction.
    let t2 = tg.begin("b").unwrap();
    let err = t2.call_with(&charge, json!({"id": "P", "amount": 20}), CallOptions::key("pay-1")).await.unwrap_err();
    let (key, first, this, differs) = key_reused(&err);
    assert_eq!(key, "pay-1");
    assert!(first.contains("`charge`") && first.contains("10") && this.contains("20"), "{err}");
    assert_eq!(differs, "arguments: `amount` (10 then 20)", "{err}");
    assert!(!err.retryable(), "another call under the same key never succeeds");
    let err = t1.call_with(&charge, json!({"id": "P", "amount": 20}), CallOptions::key("pay-1")).await.unwrap_err();
    key_reused(&err);
    t1.seal().unwrap();
    t1.commit().await.unwrap();
    // After it committed: the same call replays, another call is refused.
    let same = t2.call_with(&charge, json!({"amount": 10, "id": "P"}), CallOptions::key("pay-1")).await.unwrap();
    assert!(matches!(same, Ack::Replayed { .. }), "member order does not matter: {same:?}");
    let err = t2.call_with(&charge, json!({"id": "P", "amount": 20}), CallOptions::key("pay-1")).await.unwrap_err();
    let (_, _, _, differs) = key_reused(&err);
    assert!(differs.starts_with("arguments"), "{err}");
    assert_eq!(w.count("charge", "exec"), 1, "only the first call reached the provider");
    t2.seal().unwrap();
    t2.commit().await.unwrap();
}

// Bug: the same adapter key on another tool silently returned the first tool's output.
#[tokio::test]
async fn key_reused_on_other_tool_is_refused() {
    let (tg, w) = (engine(), World::new());
    let charge = w.tool("charge", EffectClass::Idempotent, "retail:payment");
    let refund = w.tool("refund", EffectClass::Idempotent, "retail:payment");
    let t1 = tg.begin("a").unwrap();
    t1.call_with(&charge, json!({"id": "P"}), CallOptions::key("op-7")).await.unwrap();
    t1.seal().unwrap();
    t1.commit().await.unwrap();
    let t2 = tg.begin("b").unwrap();
    let err = t2.call_with(&refund, json!({"id": "P"}), CallOptions::key("op-7")).await.unwrap_err();
    let (key, first, this, differs) = key_reused(&err);
    assert_eq!(key, "op-7");
    assert!(first.contains("`charge`") && this.contains("`refund`"), "{err}");
    assert_eq!(differs, "tool (`charge` then `refund`)");
    assert!(err.to_string().contains("op-7") && err.to_string().contains("refund"), "{err}");
    assert_eq!(w.count("refund", "exec"), 0);
    t2.abort("done").await.unwrap();
}

// The refusal holds across a restart: the key table is rebuilt from the ledger (and from a
// checkpoint of it) with what each key was used for.
#[tokio::test]
async fn key_reuse_is_refused_across_restart() {
    for checkpoint in [false, true] {
        let w = World::new();
        let charge = w.tool("charge", EffectClass::Idempotent, "retail:payment");
        let refund = w.tool("refund", EffectClass::Idempotent, "retail:payment");
        let store = Arc::new(MemoryStore::new());
        {
            let tg = Tidegate::builder().store(store.clone()).build().unwrap();
            let tx = tg.begin("a").unwrap();
            tx.call_with(&charge, json!({"id": "P", "amount": 10}), CallOptions::key("pay-1")).await.unwrap();
            tx.seal().unwrap();
            tx.commit().await.unwrap();
            if checkpoint {
                tg.checkpoint_now().unwrap();
            }
        }
        let tg = Tidegate::builder().store(store).build().unwrap();
        tg.register(&charge).unwrap();
        tg.register(&refund).unwrap();
        tg.recover().await.unwrap();
        let tx = tg.begin("b").unwrap();
        let err = tx.call_with(&charge, json!({"id": "P", "amount": 20}), CallOptions::key("pay-1")).await.unwrap_err();
        assert_eq!(key_reused(&err).3, "arguments", "checkpoint {checkpoint}: {err}");
        let err = tx.call_with(&refund, json!({"id": "P", "amount": 10}), CallOptions::key("pay-1")).await.unwrap_err();
        assert!(key_reused(&err).3.starts_with("tool"), "checkpoint {checkpoint}: {err}");
        let ack = tx.call_with(&charge, json!({"id": "P", "amount": 10}), CallOptions::key("pay-1")).await.unwrap();
        assert!(matches!(ack, Ack::Replayed { .. }), "checkpoint {checkpoint}: {ack:?}");
        assert_eq!(w.count("charge", "exec"), 1);
        tx.seal().unwrap();
        tx.commit().await.unwrap();
        tg.check_integrity().unwrap();
    }
}

/// A body's own error type, as an application would have.
#[derive(Debug)]
enum AppError {
    Engine(Error),
    Rejected(&'static str),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Engine(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Engine(e) => write!(f, "engine: {e}"),
            AppError::Rejected(why) => write!(f, "rejected: {why}"),
        }
    }
}

// Bug: a body whose transaction's lease expired saw a non-retryable `Settled` that said
// nothing about why, so `run` gave up instead of the documented retry.
#[tokio::test(start_paused = true)]
async fn run_retries_after_expired_lease() {
    let tg = Tidegate::builder().lease(Duration::from_secs(1)).build().unwrap();
    let _reaper = tg.spawn_reaper();
    let w = World::new();
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let mut attempt = 0;
    let report = tg
        .run_reporting(TxOptions::agent("slow").may_touch(["travel:hotel"]), 3, |tx| {
            attempt += 1;
            let (hotel, first) = (hotel.clone(), attempt == 1);
            async move {
                tx.call(&hotel, json!({"id": "H"})).await?;
                if first {
                    // Thinks for longer than the lease: the reaper aborts the transaction.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                let err = match tx.call(&hotel, json!({"id": "H"})).await {
                    Ok(_) => return Ok(attempt),
                    Err(e) => e,
                };
                assert!(
                    matches!(&err, Error::Finished { committed: false, reason: Some(AbortReason::LeaseExpired), .. }),
                    "the body is told its lease expired: {err}"
                );
                assert!(err.retryable() && err.to_string().contains("lease expired"), "{err}");
                Err(AppError::from(err))
            }
        })
        .await;
    let (attempts, outcome) = report.result.unwrap();
    assert_eq!(attempts, 2, "retried once");
    assert!(outcome.committed);
    assert_eq!(report.retried.len(), 1);
    assert_eq!(report.retried[0].reason, Some(AbortReason::LeaseExpired));
    assert!(report.retried[0].error.contains("lease expired"), "{:?}", report.retried[0]);
    assert_eq!(w.count("hotel", "exec"), 3, "one call in the expired attempt, two in the retry");
    assert_eq!(w.count("hotel", "compensate"), 1, "the expired attempt's call was undone");
}

// A body's own error that is not about its transaction is not retried: the transaction is
// aborted and the error returned as it was.
#[tokio::test]
async fn run_returns_a_body_error_of_its_own_type_without_retrying() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let mut attempts = 0;
    let report = tg
        .run_reporting(TxOptions::agent("a"), 5, |tx| {
            attempts += 1;
            let hotel = hotel.clone();
            async move {
                tx.call(&hotel, json!({"id": "H"})).await?;
                Err::<(), _>(AppError::Rejected("over budget"))
            }
        })
        .await;
    assert!(matches!(report.result, Err(AppError::Rejected("over budget"))));
    assert!(report.retried.is_empty());
    assert_eq!(attempts, 1);
    assert_eq!(w.count("hotel", "compensate"), 1, "the aborted attempt was compensated");
}

// Errors on a finished transaction say how it ended.
#[tokio::test]
async fn errors_on_a_finished_transaction_say_how_it_ended() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let tx = tg.begin("a").unwrap();
    tx.call(&hotel, json!({"id": "H"})).await.unwrap();
    tx.abort("changed my mind").await.unwrap();
    let err = tx.call(&hotel, json!({"id": "H"})).await.unwrap_err();
    assert!(matches!(err, Error::Finished { committed: false, settled: true, .. }), "{err}");
    assert!(err.to_string().contains("aborted") && err.to_string().contains("changed my mind"), "{err}");
    assert!(!err.retryable());
    let err = tx.state().unwrap_err();
    assert!(err.to_string().contains("changed my mind"), "{err}");
    let tx = tg.begin("b").unwrap();
    tx.seal().unwrap();
    tx.commit().await.unwrap();
    let err = tx.read("travel:hotel:H").unwrap_err();
    assert!(err.to_string().contains("has already committed"), "{err}");
}

/// A declaration built from scratch each time, as a handler registry or a second task would.
fn build_refund(class: EffectClass) -> Tool {
    let b = Tool::builder("refund", class)
        .scope(|a| format!("retail:order:{}", a["order"].as_str().unwrap_or_default()))
        .call(|a| async move { Ok(json!({"refunded": *a})) });
    let b = if class.executes_eagerly() { b.compensate(|_, _| async { Ok(Compensation::clean()) }) } else { b };
    b.build().unwrap()
}

// Bug: tools compared by pointer, so building the same declaration twice was refused as
// "name taken".
#[tokio::test]
async fn building_the_same_tool_twice_is_not_a_name_taken() {
    let tg = engine();
    let (first, again) = (build_refund(EffectClass::Reversible), build_refund(EffectClass::Reversible));
    let tx = tg.begin("a").unwrap();
    tx.call(&first, json!({"order": "W1"})).await.unwrap();
    tx.call(&again, json!({"order": "W2"})).await.unwrap();
    tg.register(&again).unwrap();
    // A different declaration under the taken name is still refused, saying what differs.
    let other = build_refund(EffectClass::Gated);
    let err = tg.register(&other).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { field: "tool name", .. }), "{err}");
    assert!(err.to_string().contains("class reversible vs gated"), "{err}");
    let labelled = Tool::builder("refund", EffectClass::Reversible)
        .scope(|_| "retail:order:x")
        .call(|_| async { Ok(json!(null)) })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .version("v2")
        .build()
        .unwrap();
    let err = tx.call(&labelled, json!({"order": "W3"})).await.unwrap_err();
    assert!(err.to_string().contains("version none vs \"v2\""), "{err}");
    tx.seal().unwrap();
    tx.commit().await.unwrap();
}

// Bug: a reversible tool with no compensation and a zero lease were accepted without a word.
#[test]
fn a_reversible_tool_without_compensation_and_a_zero_lease_are_refused_at_build() {
    let b = || Tool::builder("book", EffectClass::Reversible).scope(|_| "travel:x").call(|_| async { Ok(json!(1)) });
    let err = b().build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { field: "compensate", .. }), "{err}");
    assert!(err.to_string().contains("book") && err.to_string().contains("without_compensation"), "{err}");
    b().without_compensation().build().unwrap();
    let err = Tidegate::builder().lease(Duration::ZERO).build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { field: "lease", .. }), "{err}");
    let tg = Tidegate::in_memory().unwrap();
    let err = tg.begin_with(TxOptions::agent("a").lease(Duration::ZERO)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { field: "lease", .. }), "{err}");
}

// `read_with` records the version before it observes the world: a write committed while
// the agent looks makes the transaction stale instead of vouching for an old value.
#[tokio::test]
async fn read_with_records_the_version_before_observing() {
    let (tg, w) = (engine(), World::new());
    let set = w.tool("set", EffectClass::Bufferable, "kv:stock");
    // An earlier writer (so the reader never waits for it) ...
    let other = tg.begin_with(TxOptions::agent("writer").may_touch(["kv:stock:A"])).unwrap();
    let tx = tg.begin_with(TxOptions::agent("reader").may_touch(["kv:stock:A"])).unwrap();
    let seen = tx
        .read_with("kv:stock:A", || async move {
            // ... commits while the reader is looking at the world.
            other.call(&set, json!({"id": "A", "to": 5})).await.unwrap();
            other.seal_and_commit().await.unwrap();
            "old value"
        })
        .await
        .unwrap();
    assert_eq!(seen.value, "old value");
    assert!(seen.read.version < tg.version("kv:stock:A").unwrap());
    tx.seal().unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(matches!(err.abort_reason(), Some(AbortReason::StaleRead { .. })), "{err}");
}

// The embedded store and the hook's argument type are reachable from this crate alone.
#[tokio::test]
async fn the_sqlite_store_and_the_hook_view_are_reachable_from_the_runtime() {
    let dir = std::env::temp_dir().join(format!("tidegate-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Arc::new(tidegate_runtime::SqliteStore::open(&dir).unwrap());
    let tg = Tidegate::builder().store(store).build().unwrap();
    tg.add_hook(Arc::new(FnHook::new("no-empty", |view: SealedView| async move {
        if view.effects.is_empty() { Verdict::Veto("nothing to do".into()) } else { Verdict::Approve }
    })));
    let tx = tg.begin("a").unwrap();
    tx.seal().unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(err.to_string().contains("nothing to do"), "{err}");
    drop(tg);
    let _ = std::fs::remove_dir_all(&dir);
}

// Issue 12 item 6: a per-call handle travels from the call to its compensation through the
// runtime (no task-local, no side table keyed by a pointer), and is dropped when the
// transaction settles.
#[tokio::test]
async fn a_call_handle_reaches_the_compensation_and_is_dropped_at_settlement() {
    type Live = parking_lot::Mutex<Vec<String>>;
    let tg = engine();
    let book = Tool::builder("book", EffectClass::Reversible)
        .scope(|_| "travel:room:1")
        .call_ctx(|ctx, _args| async move {
            let live = ctx.handle.as_ref().and_then(|h| h.downcast_ref::<Arc<Live>>()).expect("the call's handle");
            live.lock().push(format!("called {}{} id={:?}", ctx.tx, ctx.effect, ctx.call_id.as_deref()));
            Ok(json!({"room": 1}))
        })
        .compensate_ctx(|ctx, _args, output| async move {
            let live = ctx.handle.as_ref().and_then(|h| h.downcast_ref::<Arc<Live>>()).expect("the call's handle");
            live.lock().push(format!("undone {output} key={:?}", ctx.key.as_deref()));
            Ok(Compensation::clean())
        })
        .build()
        .unwrap();
    let live: Arc<Live> = Arc::default();
    let tx = tg.begin("a").unwrap();
    let opts = CallOptions {
        call_id: Some("c-7".into()),
        key: Some("book-1".into()),
        handle: Some(tidegate_runtime::CallHandle::new(live.clone())),
        ..CallOptions::default()
    };
    tx.call_with(&book, json!({}), opts).await.unwrap();
    assert_eq!(Arc::strong_count(&live), 2, "the engine holds the handle while the transaction runs");
    tx.abort("no").await.unwrap();
    let id = tx.id();
    assert_eq!(
        *live.lock(),
        [format!("called {id}#0 id=Some(\"c-7\")"), "undone {\"room\":1} key=Some(\"book-1\")".into()]
    );
    assert_eq!(Arc::strong_count(&live), 1, "the handle was dropped when the transaction settled");
}

/// A tool may be built without a scope extractor (a front door that renders scopes itself):
/// a call of it that names no scopes is refused before anything is recorded or run.
#[tokio::test]
async fn a_tool_without_a_scope_extractor_needs_the_calls_scopes() {
    let tg = Tidegate::in_memory().unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let r = ran.clone();
    let tool = Tool::builder("send", EffectClass::Idempotent)
        .call(move |_| {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok(json!("ok")) }
        })
        .build()
        .unwrap();
    let tx = tg.begin("agent").unwrap();
    let err = tx.call(&tool, json!({})).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { field: "scopes", .. }), "{err:?}");
    let opts = CallOptions { scopes: Some(vec!["mail:ann@example.com".into()]), ..CallOptions::default() };
    let ack = tx.call_with(&tool, json!({}), opts).await.unwrap();
    assert_eq!(ack.effect().0, 0, "the refused call recorded nothing");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}
