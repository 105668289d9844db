//! Commit and abort semantics, effect by effect class.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::World;
use serde_json::json;
use tidegate_runtime::{
    AbortReason, Ack, Disposition, EffectClass, EngineError, Error, FnHook, Tag, Tidegate, TxOptions, TxState, Verdict,
};

fn engine() -> Tidegate {
    Tidegate::in_memory().expect("engine")
}

fn aborted(e: Error) -> tidegate_runtime::Outcome {
    match e {
        Error::Aborted(o) => *o,
        other => panic!("expected an abort, got {other}"),
    }
}

#[tokio::test]
async fn commit_releases_held_effects_in_issuance_order_after_eager_ones_ran() {
    let (tg, w) = (engine(), World::new());
    let flight = w.tool("flight", EffectClass::ReversibleWithCost, "travel:flight");
    let email = w.tool("email", EffectClass::Gated, "mail");
    let note = w.tool("note", EffectClass::Bufferable, "kv:note");
    let tx = tg.begin("agent").unwrap();
    assert!(matches!(tx.call(&email, json!({"id": "a@x.io"})).await.unwrap(), Ack::Queued { .. }));
    assert!(matches!(tx.call(&note, json!({"id": "n1"})).await.unwrap(), Ack::Staged { .. }));
    let ack = tx.call(&flight, json!({"id": "F1"})).await.unwrap();
    assert_eq!(ack.output().unwrap()["ok"], "flight");
    assert_eq!(w.names(), ["exec:flight"], "held effects must not reach the world before commit");
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed && out.is_clean());
    assert_eq!(w.names(), ["exec:flight", "fire:email", "apply:note"]);
    let disp: Vec<_> = out.effects.iter().map(|e| e.disposition.clone()).collect();
    assert_eq!(disp, [Disposition::Fired, Disposition::Applied, Disposition::Accepted]);
    tg.check_integrity().unwrap();
}

#[tokio::test]
async fn tool_failure_aborts_compensates_in_reverse_order_and_never_fires_gated() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let car = w.tool("car", EffectClass::Reversible, "travel:car");
    let email = w.tool("email", EffectClass::Gated, "mail");
    let flight = w.tool("flight", EffectClass::ReversibleWithCost, "travel:flight");
    w.fail_calls("flight", 1);
    let tx = tg.begin("agent").unwrap();
    tx.call(&hotel, json!({"id": "H"})).await.unwrap();
    tx.call(&car, json!({"id": "C"})).await.unwrap();
    tx.call(&email, json!({"id": "x@y.z"})).await.unwrap();
    let out = aborted(tx.call(&flight, json!({"id": "F"})).await.unwrap_err());
    assert!(matches!(out.reason, Some(AbortReason::ToolFailed { ref tool, .. }) if tool == "flight"));
    assert_eq!(w.names(), ["exec:hotel", "exec:car", "compensate:car", "compensate:hotel"]);
    assert_eq!(w.count("email", "fire"), 0);
    let tags: Vec<_> = out.effects.iter().map(|e| (e.tool.to_string(), e.disposition.clone(), e.tag)).collect();
    assert_eq!(
        tags,
        [
            ("hotel".into(), Disposition::Compensated, Tag::Clean),
            ("car".into(), Disposition::Compensated, Tag::Clean),
            ("email".into(), Disposition::Discarded, Tag::Clean),
            ("flight".into(), Disposition::Discarded, Tag::Clean),
        ]
    );
    let err = tx.seal().unwrap_err();
    assert!(matches!(err, Error::Finished { committed: false, settled: true, .. }), "{err}");
    assert!(err.to_string().contains("has already aborted"), "the error says how it ended: {err}");
    tg.check_integrity().unwrap();
}

#[tokio::test(start_paused = true)]
async fn residue_failed_and_missing_compensations_are_unresolved() {
    let (tg, w) = (engine(), World::new());
    let fee = w.tool_with("flight", EffectClass::ReversibleWithCost, "travel:flight", true, Some("fee 40 EUR"));
    let stubborn = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let bare = w.tool_with("car", EffectClass::Reversible, "travel:car", false, None);
    w.fail_compensations("hotel", 100);
    let tx = tg.begin("agent").unwrap();
    tx.call(&fee, json!({"id": "F"})).await.unwrap();
    tx.call(&stubborn, json!({"id": "H"})).await.unwrap();
    tx.call(&bare, json!({"id": "C"})).await.unwrap();
    let out = tx.abort("user cancelled").await.unwrap();
    let tags: Vec<_> = out.effects.iter().map(|e| (e.disposition.clone(), e.tag)).collect();
    assert_eq!(
        tags,
        [
            (Disposition::Compensated, Tag::Unresolved),
            (Disposition::CompensationFailed, Tag::Unresolved),
            (Disposition::NotCompensable, Tag::Unresolved),
        ]
    );
    assert!(out.effects[0].detail.as_deref().unwrap().contains("fee 40 EUR"));
    assert!(out.effects[1].detail.as_deref().unwrap().contains("after 4 attempts"));
    assert_eq!(out.residue().count(), 3);
}

#[tokio::test]
async fn staged_writes_are_read_back_in_their_transaction_only() {
    let (tg, w) = (engine(), World::new());
    let note = w.tool("note", EffectClass::Bufferable, "kv:note");
    let tx = tg.begin_with(TxOptions::agent("a").may_touch(["kv:note"])).unwrap();
    tx.call(&note, json!({"id": "n1", "text": "draft"})).await.unwrap();
    let mine = tx.read("kv:note:n1").unwrap();
    assert_eq!(mine.staged.as_deref().unwrap()["text"], "draft");
    let other = tg.begin_with(TxOptions::agent("b").may_touch(["kv:note"])).unwrap();
    assert!(other.read("kv:note:n1").unwrap().staged.is_none(), "staged values are private");
    assert!(tx.read("kv:note:n2").unwrap().staged.is_none(), "only overlapping scopes see it");
    tx.abort("changed my mind").await.unwrap();
    assert_eq!(w.count("note", "apply"), 0, "an aborted staged write is dropped");
}

#[tokio::test]
async fn effect_after_seal_is_a_protocol_violation_that_aborts() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let tx = tg.begin("agent").unwrap();
    tx.call(&hotel, json!({"id": "H1"})).await.unwrap();
    tx.seal().unwrap();
    let err = tx.call(&hotel, json!({"id": "H2"})).await.unwrap_err();
    assert!(matches!(err, Error::Engine(EngineError::ProtocolViolation { .. })), "{err}");
    // The abort (with its compensation) runs in the background; wait for it.
    for _ in 0..100 {
        if w.count("hotel", "compensate") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(w.count("hotel", "compensate"), 1);
    assert_eq!(w.count("hotel", "exec"), 1, "the late call never ran");
    assert!(tx.read("travel:hotel:H1").is_err());
}

#[tokio::test]
async fn commit_before_seal_is_refused_and_leaves_the_transaction_open() {
    let (tg, w) = (engine(), World::new());
    let email = w.tool("email", EffectClass::Gated, "mail");
    let tx = tg.begin("agent").unwrap();
    tx.call(&email, json!({"id": "a@b.c"})).await.unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(err.to_string().contains("seal it first"), "{err}");
    assert_eq!(tx.state().unwrap(), TxState::Open);
    tx.seal().unwrap();
    tx.commit().await.unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(matches!(err, Error::Finished { committed: true, .. }), "double commit: {err}");
    assert!(err.to_string().contains("has already committed"), "{err}");
    assert!(matches!(tx.abort("late").await.unwrap_err(), Error::Finished { committed: true, .. }));
    assert_eq!(w.count("email", "fire"), 1);
}

#[tokio::test]
async fn touching_outside_the_declared_may_touch_set_aborts() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let tx = tg.begin_with(TxOptions::agent("a").may_touch(["travel:hotel:H1"])).unwrap();
    tx.call(&hotel, json!({"id": "H1"})).await.unwrap();
    let err = tx.call(&hotel, json!({"id": "H2"})).await.unwrap_err();
    assert!(err.to_string().contains("outside the declared may-touch set"), "{err}");
    assert_eq!(w.count("hotel", "exec"), 1);
}

#[tokio::test]
async fn stale_read_aborts_and_the_retry_helper_commits_at_a_fresh_epoch() {
    let (tg, w) = (engine(), World::new());
    let modify = w.tool("modify", EffectClass::Reversible, "retail:order");
    let writer = tg.begin_with(TxOptions::agent("writer").may_touch(["retail:order:W1"])).unwrap();
    let reader = tg.begin_with(TxOptions::agent("reader").may_touch(["retail:order:W1"])).unwrap();
    reader.read("retail:order:W1").unwrap();
    writer.call(&modify, json!({"id": "W1"})).await.unwrap();
    writer.seal().unwrap();
    writer.commit().await.unwrap();
    reader.call(&modify, json!({"id": "W1", "plan": "stale"})).await.unwrap();
    reader.seal().unwrap();
    let out = aborted(reader.commit().await.unwrap_err());
    assert!(matches!(out.reason, Some(AbortReason::StaleRead { ref scope, .. }) if scope == "retail:order:W1"));
    assert_eq!(w.count("modify", "compensate"), 1, "the stale write was compensated");

    // The helper re-runs the body at a fresh epoch and commits. On the first attempt an
    // earlier transaction commits a write to W1 between the body's read and its commit.
    let earlier = tg.begin_with(TxOptions::agent("earlier").may_touch(["retail:order:W1"])).unwrap();
    let mut earlier = Some(earlier);
    let mut attempts = 0;
    let m = modify.clone();
    let ((), out) = tg
        .run(TxOptions::agent("retrier").may_touch(["retail:order:W1"]), |tx| {
            attempts += 1;
            let m = m.clone();
            let interferer = earlier.take();
            async move {
                tx.read("retail:order:W1")?;
                if let Some(e) = interferer {
                    e.call(&m, json!({"id": "W1", "by": "earlier"})).await?;
                    e.seal()?;
                    e.commit().await?;
                }
                tx.call(&m, json!({"id": "W1", "by": "retrier"})).await?;
                Ok(())
            }
        })
        .await
        .unwrap();
    assert!(out.committed);
    assert_eq!(attempts, 2, "one stale abort, then a commit at a fresh epoch");
    tg.check_integrity().unwrap();
}

#[tokio::test]
async fn read_only_transactions_abort_on_stale_reads_too() {
    let (tg, w) = (engine(), World::new());
    let modify = w.tool("modify", EffectClass::Reversible, "retail:order");
    let writer = tg.begin_with(TxOptions::agent("w").may_touch(["retail:order:W1"])).unwrap();
    let reader = tg.begin_with(TxOptions::agent("r").may_touch(["retail:order:W1"])).unwrap();
    reader.read("retail:order:W1").unwrap();
    writer.call(&modify, json!({"id": "W1"})).await.unwrap();
    writer.seal().unwrap();
    writer.commit().await.unwrap();
    reader.seal().unwrap();
    let out = aborted(reader.commit().await.unwrap_err());
    assert_eq!(out.reason.as_ref().map(AbortReason::kind), Some("stale_read"));
    assert!(Error::Aborted(Box::new(out)).retryable());
}

#[tokio::test]
async fn a_later_transaction_waits_for_an_earlier_one_on_an_overlapping_scope() {
    let (tg, w) = (engine(), World::new());
    let modify = w.tool("modify", EffectClass::Gated, "retail:order");
    let early = tg.begin_with(TxOptions::agent("early").may_touch(["retail:order:W1"])).unwrap();
    let late = tg.begin_with(TxOptions::agent("late").may_touch(["retail:order:W1:lines"])).unwrap();
    late.call(&modify, json!({"id": "W1:lines"})).await.unwrap();
    late.seal().unwrap();
    let late_commit = tokio::spawn(async move { late.commit().await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!late_commit.is_finished(), "the later transaction must wait for the earlier one");
    assert_eq!(tg.stats().waiting, 1);
    early.call(&modify, json!({"id": "W1"})).await.unwrap();
    early.seal().unwrap();
    early.commit().await.unwrap();
    late_commit.await.unwrap().unwrap();
    assert_eq!(w.names(), ["fire:modify", "fire:modify"]);
    let hits = w.hits();
    assert!(hits[0].args.contains("\"W1\"") && hits[1].args.contains("W1:lines"), "epoch order per scope: {hits:?}");
}

#[tokio::test]
async fn disjoint_declared_transactions_never_wait() {
    let (tg, w) = (engine(), World::new());
    let modify = w.tool("modify", EffectClass::Gated, "retail:order");
    let early = tg.begin_with(TxOptions::agent("a").may_touch(["retail:order:W1"])).unwrap();
    let late = tg.begin_with(TxOptions::agent("b").may_touch(["retail:order:W12"])).unwrap();
    late.call(&modify, json!({"id": "W12"})).await.unwrap();
    late.seal().unwrap();
    tokio::time::timeout(Duration::from_secs(5), late.commit()).await.expect("no wait").unwrap();
    early.abort("done").await.unwrap();
}

#[tokio::test]
async fn an_undeclared_open_transaction_blocks_every_later_commit_until_it_seals() {
    let (tg, w) = (engine(), World::new());
    let modify = w.tool("modify", EffectClass::Gated, "retail:order");
    let undeclared = tg.begin("slow").unwrap();
    let late = tg.begin_with(TxOptions::agent("b").may_touch(["retail:order:W9"])).unwrap();
    late.call(&modify, json!({"id": "W9"})).await.unwrap();
    late.seal().unwrap();
    let h = tokio::spawn(async move { late.commit().await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!h.is_finished());
    undeclared.call(&modify, json!({"id": "W1"})).await.unwrap();
    undeclared.seal().unwrap(); // narrows to W1, disjoint from W9
    h.await.unwrap().unwrap();
    undeclared.commit().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn hooks_run_on_the_sealed_footprint_and_a_veto_aborts() {
    let (tg, w) = (engine(), World::new());
    let pay = w.tool("pay", EffectClass::Gated, "retail:payment");
    tg.add_hook(Arc::new(FnHook::new("limit", |view: tidegate_core::engine::SealedView| async move {
        // A slow reviewer: an hour of virtual time.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let amount = view.effects.iter().filter_map(|e| e.args["amount"].as_u64()).sum::<u64>();
        if amount > 100 { Verdict::Veto(format!("amount {amount} over limit 100")) } else { Verdict::Approve }
    })));
    let ok = tg.begin("a").unwrap();
    ok.call(&pay, json!({"id": "P1", "amount": 60})).await.unwrap();
    ok.seal().unwrap();
    assert!(ok.commit().await.unwrap().committed);
    let big = tg.begin("a").unwrap();
    big.call(&pay, json!({"id": "P2", "amount": 600})).await.unwrap();
    big.seal().unwrap();
    let out = aborted(big.commit().await.unwrap_err());
    assert!(
        matches!(out.reason, Some(AbortReason::Vetoed { ref hook, ref reason }) if hook == "limit" && reason.contains("600"))
    );
    assert_eq!(w.count("pay", "fire"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failing_second_release_is_a_partial_commit_naming_what_left() {
    let (tg, w) = (engine(), World::new());
    let a = w.tool("send_a", EffectClass::Gated, "mail");
    let b = w.tool("send_b", EffectClass::Gated, "mail");
    let c = w.tool("send_c", EffectClass::Gated, "mail");
    w.fail_calls("send_b", 100);
    let tx = tg.begin("agent").unwrap();
    for (t, id) in [(&a, "a@x"), (&b, "b@x"), (&c, "c@x")] {
        tx.call(t, json!({"id": id})).await.unwrap();
    }
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed);
    let p = out.partial.as_ref().expect("partial-commit record");
    assert_eq!(p.released.len(), 1);
    assert_eq!(p.failed.0, 1);
    assert_eq!(p.not_attempted.len(), 1);
    let tags: Vec<_> = out.effects.iter().map(|e| e.tag).collect();
    assert_eq!(tags, [Tag::Clean, Tag::PartialCommit, Tag::PartialCommit]);
    assert_eq!(w.names(), ["fire:send_a"]);
}

#[tokio::test(start_paused = true)]
async fn a_failing_first_release_aborts_with_nothing_externalised() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let mail = w.tool("mail", EffectClass::Gated, "mail");
    w.fail_calls("mail", 100);
    let tx = tg.begin("agent").unwrap();
    tx.call(&hotel, json!({"id": "H"})).await.unwrap();
    tx.call(&mail, json!({"id": "m@x"})).await.unwrap();
    tx.seal().unwrap();
    let out = aborted(tx.commit().await.unwrap_err());
    assert_eq!(out.reason.as_ref().map(AbortReason::kind), Some("release_failed"));
    assert_eq!(w.names(), ["exec:hotel", "compensate:hotel"]);
}

#[tokio::test]
async fn transient_tool_errors_are_retried_with_backoff() {
    let tg = engine();
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c2 = calls.clone();
    let flaky = tidegate_runtime::Tool::builder("flaky", EffectClass::Idempotent)
        .scope(|_| "kv:flaky")
        .call(move |_| {
            let c = c2.clone();
            async move {
                if c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                    Err(tidegate_runtime::ToolError::transient("503"))
                } else {
                    Ok(json!("done"))
                }
            }
        })
        .build()
        .unwrap();
    let tx = tg.begin("a").unwrap();
    assert_eq!(tx.call(&flaky, json!({})).await.unwrap().output().unwrap(), "done");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn bad_scopes_are_refused_naming_the_field_and_value() {
    let (tg, w) = (engine(), World::new());
    let err = tg.begin_with(TxOptions::agent("a").may_touch(["nope-x"])).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("may_touch[0]") && msg.contains("nope-x") && msg.contains("has no type"), "{msg}");
    let tx = tg.begin("a").unwrap();
    let msg = tx.read("fs:relative/path").unwrap_err().to_string();
    assert!(msg.contains("read scope") && msg.contains("not absolute"), "{msg}");
    let hotel = w.tool("hotel", EffectClass::Reversible, "");
    let msg = tx.call(&hotel, json!({"id": "H"})).await.unwrap_err().to_string();
    assert!(msg.contains("scope of tool `hotel`"), "{msg}");
    assert_eq!(tx.state().unwrap(), TxState::Open, "refused input changes nothing");
    assert_eq!(w.count("hotel", "exec"), 0);
    tg.check_integrity().unwrap();
}

/// Seal narrows a transaction's claims to its footprint also past the size where the
/// bookkeeping switches from pairwise comparison to hashing (16 scopes): a later transaction
/// on a declared-but-unused scope commits at once, one on a used scope waits.
#[tokio::test]
async fn a_wide_transaction_narrows_to_its_footprint_at_seal() {
    let (tg, w) = (engine(), World::new());
    let modify = w.tool("modify", EffectClass::Gated, "retail:order");
    for declared in [true, false] {
        let ids: Vec<String> = (0..40).map(|n| format!("retail:order:W{n}")).collect();
        let wide = if declared {
            tg.begin_with(TxOptions::agent("wide").may_touch(ids.iter().map(String::as_str))).unwrap()
        } else {
            tg.begin("wide").unwrap()
        };
        // 25 distinct scopes, each touched twice.
        for round in 0..2 {
            for n in 0..25 {
                wide.call(&modify, json!({"id": format!("W{n}"), "round": round})).await.unwrap();
            }
        }
        wide.seal().unwrap();

        let unused = tg.begin_with(TxOptions::agent("b").may_touch(["retail:order:W30"])).unwrap();
        unused.call(&modify, json!({"id": "W30"})).await.unwrap();
        unused.seal().unwrap();
        tokio::time::timeout(Duration::from_secs(5), unused.commit())
            .await
            .expect("a scope outside the sealed footprint does not wait")
            .unwrap();

        let used = tg.begin_with(TxOptions::agent("c").may_touch(["retail:order:W7"])).unwrap();
        used.call(&modify, json!({"id": "W7"})).await.unwrap();
        used.seal().unwrap();
        let h = tokio::spawn(async move { used.commit().await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!h.is_finished(), "a scope in the footprint waits for the earlier transaction (declared: {declared})");
        wide.commit().await.unwrap();
        h.await.unwrap().unwrap();
    }
}
