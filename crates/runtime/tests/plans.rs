//! Plans bound to the engine (docs/plans.md, "Binding"): steps are ordinary transactions whose
//! compensation descriptors ride their effect records, are held until the plan commits, and are
//! fired last-in-first-out by the engine's plan executor when the plan fails, also after the
//! process that ran the steps is gone (a reopen of the same ledger).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;
use tidegate_runtime::plans::{Outcome, Status, Tagged, Tri};
use tidegate_runtime::{
    CallOptions, CallOutcome, Compensation, Descriptor, EffectClass, Error, PlanError, PlanOptions, Predicate,
    SqliteStore, StoreError, Tidegate, Tool, TxOptions,
};

/// What the world saw: forward calls and compensations, in order.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<String>>>);

impl Sink {
    fn seen(&self) -> Vec<String> {
        self.0.lock().clone()
    }
    fn compensations(&self) -> Vec<String> {
        self.seen().into_iter().filter(|s| s.starts_with("cancel ")).collect()
    }
}

fn book(sink: &Sink) -> Tool {
    let s = sink.clone();
    Tool::builder("book", EffectClass::Reversible)
        .scope(|a| format!("travel:booking:{}", a["id"].as_str().unwrap_or_default()))
        .key(|a| format!("book-{}", a["id"].as_str().unwrap_or_default()))
        .call(move |a| {
            let s = s.clone();
            async move {
                let id = a["id"].as_str().unwrap_or_default().to_owned();
                s.0.lock().push(format!("book {id}"));
                Ok(json!({"booking": format!("B-{id}")}))
            }
        })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()
        .unwrap()
}

fn notify() -> Tool {
    Tool::builder("notify", EffectClass::Gated)
        .scope(|a| format!("mail:to:{}", a["to"].as_str().unwrap_or_default()))
        .call(|_| async { Ok(json!("sent")) })
        .build()
        .unwrap()
}

/// The compensation capability: records `cancel <booking> <key>`.
fn cancel_capability(tg: &Tidegate, sink: &Sink) {
    let s = sink.clone();
    tg.capability("cancel", move |req| {
        let s = s.clone();
        async move {
            let booking = req.args["booking"].as_str().unwrap_or("?").to_owned();
            s.0.lock().push(format!("cancel {booking} {}", req.key));
            CallOutcome::done(json!({"cancelled": booking}))
        }
    });
}

fn descriptor() -> Descriptor {
    Descriptor::new("cancel", json!({"booking": {"$output": "/booking"}}))
}

/// Runs one step of `plan` booking each of `ids` with a descriptor, and commits it.
async fn step(plan: &tidegate_runtime::Plan, tool: &Tool, ids: &[&str]) {
    let scopes: Vec<String> = ids.iter().map(|i| format!("travel:booking:{i}")).collect();
    let tx = plan.begin(TxOptions::agent("agent").may_touch(scopes)).await.unwrap();
    for id in ids {
        tx.call_with(tool, json!({"id": id}), CallOptions::compensate(descriptor())).await.unwrap();
    }
    tx.seal().unwrap();
    tx.commit().await.unwrap();
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    wait_until(what, || std::future::ready(done())).await
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    for _ in 0..2000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_committed_plan_retires_its_held_compensations() {
    let sink = Sink::default();
    let tg = Tidegate::in_memory().unwrap();
    cancel_capability(&tg, &sink);
    let tool = book(&sink);
    let plan = tg.plan(PlanOptions::owner("ops").deadline(Duration::from_secs(60))).await.unwrap();
    step(&plan, &tool, &["f1"]).await;
    step(&plan, &tool, &["h1", "c1"]).await;
    let d = plan.detail().await.unwrap();
    assert_eq!(d.view.status, Status::Open);
    assert_eq!(d.view.held, 3, "a committed step's compensations are held, not retired: {d:?}");
    let seqs: Vec<u32> = d.registrations.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![2, 1, 0], "listed in unwind order");
    assert_eq!(d.triggers[0].kind, "deadline");
    assert_eq!(d.triggers[0].value, Tri::Unknown);
    plan.commit().await.unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    let d = plan.detail().await.unwrap();
    assert_eq!(d.view.status, Status::Ended(Outcome::Committed));
    assert_eq!(d.view.held, 0);
    assert_eq!(d.triggers[0].value, Tri::False, "a committed plan's deadline never fires");
    assert!(sink.compensations().is_empty(), "{:?}", sink.seen());
    assert!(matches!(plan.fail("late").await, Err(Error::Plan(PlanError::WrongState { .. }))));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_plan_unwinds_last_in_first_out_across_steps() {
    let sink = Sink::default();
    let tg = Tidegate::in_memory().unwrap();
    cancel_capability(&tg, &sink);
    let tool = book(&sink);
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    step(&plan, &tool, &["f1", "f2"]).await;
    step(&plan, &tool, &["h1"]).await;
    step(&plan, &tool, &["c1"]).await;
    plan.fail("visa refused").await.unwrap();
    wait_for("four compensations", || sink.compensations().len() == 4).await;
    assert_eq!(
        sink.compensations(),
        vec![
            "cancel B-c1 book-c1#compensate",
            "cancel B-h1 book-h1#compensate",
            "cancel B-f2 book-f2#compensate",
            "cancel B-f1 book-f1#compensate",
        ]
    );
    wait_until("the plan to end", || async {
        plan.detail().await.unwrap().view.status == Status::Ended(Outcome::Unwound)
    })
    .await;
    // The forward effects were called once each, the compensations once each.
    assert_eq!(sink.seen().iter().filter(|s| s.starts_with("book ")).count(), 4);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_deadline_on_virtual_time_fails_the_plan_and_fires_the_compensations() {
    let sink = Sink::default();
    let tg = Tidegate::in_memory().unwrap();
    cancel_capability(&tg, &sink);
    let tool = book(&sink);
    let plan = tg.plan(PlanOptions::owner("ops").deadline(Duration::from_secs(3600))).await.unwrap();
    step(&plan, &tool, &["f1"]).await;
    step(&plan, &tool, &["h1"]).await;
    tokio::time::sleep(Duration::from_secs(3599)).await;
    assert!(sink.compensations().is_empty(), "not before the deadline");
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for("two compensations", || sink.compensations().len() == 2).await;
    assert_eq!(sink.compensations(), vec!["cancel B-h1 book-h1#compensate", "cancel B-f1 book-f1#compensate"]);
    let d = plan.detail().await.unwrap();
    assert_eq!(d.failure.map(|f| f.0), Some(tidegate_runtime::plans::Cause::Deadline));
}

#[tokio::test(flavor = "current_thread")]
async fn a_reversible_call_in_a_plan_without_a_descriptor_is_refused_naming_the_tool() {
    let sink = Sink::default();
    let tg = Tidegate::in_memory().unwrap();
    let tool = book(&sink);
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    let tx = plan.begin(TxOptions::agent("a").may_touch(["travel:booking:x"])).await.unwrap();
    let err = tx.call(&tool, json!({"id": "x"})).await.unwrap_err();
    match &err {
        Error::MissingDescriptor { tool, plan: p } => {
            assert_eq!(tool, "book");
            assert_eq!(*p, plan.id());
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("`book`"), "{err}");
    assert!(sink.seen().is_empty(), "nothing ran: {:?}", sink.seen());
    // Outside a plan the same call needs none.
    let free = tg.begin_with(TxOptions::agent("a").may_touch(["travel:booking:y"])).unwrap();
    free.call(&tool, json!({"id": "y"})).await.unwrap();
    // A gated call in a plan cannot carry one.
    let gated = notify();
    let err = tx.call_with(&gated, json!({"to": "x"}), CallOptions::compensate(descriptor())).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { field: "compensate", .. }), "{err:?}");
    // A malformed descriptor is refused before anything is recorded.
    let bad = Descriptor::new("", json!({}));
    let err = tx.call_with(&tool, json!({"id": "x"}), CallOptions::compensate(bad)).await.unwrap_err();
    assert!(err.to_string().contains("descriptor.capability"), "{err}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_trigger_naming_another_tenant_is_refused() {
    let tg = Tidegate::builder().tenant("acme").build().unwrap();
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    let other = Predicate::Tagged(Tagged { tenant: Some("globex".into()), tx: 1, effect: 0, tag: "leaked".into() });
    match plan.arm(other.clone()).await {
        Err(Error::Plan(PlanError::CrossTenant { found, tenant, .. })) => {
            assert_eq!(found, "globex");
            assert_eq!(tenant, "acme");
        }
        other => panic!("{other:?}"),
    }
    let mine = Predicate::Tagged(Tagged { tenant: Some("acme".into()), tx: 1, effect: 0, tag: "leaked".into() });
    plan.arm(mine).await.unwrap();
    // At opening, too: the plan is refused and never runs.
    let err = tg.plan(PlanOptions::owner("ops").trigger(other)).await.unwrap_err();
    assert!(matches!(err, Error::Plan(PlanError::CrossTenant { .. })), "{err:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_gated_effect_that_fired_makes_a_failed_plan_stuck_and_the_owner_unwinds_the_rest() {
    let sink = Sink::default();
    let tg = Tidegate::in_memory().unwrap();
    cancel_capability(&tg, &sink);
    let tool = book(&sink);
    let gated = notify();
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    step(&plan, &tool, &["f1"]).await;
    let tx = plan.begin(TxOptions::agent("a").may_touch(["mail:to:bob"])).await.unwrap();
    tx.call(&gated, json!({"to": "bob"})).await.unwrap();
    tx.seal().unwrap();
    tx.commit().await.unwrap();
    plan.fail("refused").await.unwrap();
    wait_until("the plan to be stuck", || async { !tg.stuck_plans().await.unwrap().is_empty() }).await;
    let stuck = tg.stuck_plans().await.unwrap();
    assert_eq!(stuck[0].0, plan.id());
    assert!(matches!(&stuck[0].1, tidegate_runtime::plans::StuckReason::Irreversible { seqs } if seqs == &vec![1]));
    assert!(sink.compensations().is_empty(), "nothing compensated while stuck");
    plan.resolve(tidegate_runtime::Choice::Unwind).await.unwrap();
    wait_for("the compensable part", || sink.compensations().len() == 1).await;
    assert_eq!(sink.compensations(), vec!["cancel B-f1 book-f1#compensate"]);
}

fn durable(dir: &std::path::Path) -> Tidegate {
    let store = Arc::new(SqliteStore::open(dir).unwrap());
    Tidegate::builder().store(store).build().unwrap()
}

/// Opens the same directory until the previous engine's lock is released (its tasks end
/// asynchronously after a drop).
async fn reopen(dir: &std::path::Path) -> Tidegate {
    for _ in 0..400 {
        match SqliteStore::open(dir) {
            Ok(store) => return Tidegate::builder().store(Arc::new(store)).build().unwrap(),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("the directory stayed locked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_engine_rearms_the_deadline_and_fires_each_compensation_exactly_once() {
    let dir = std::env::temp_dir().join(format!("tidegate-plans-reopen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sink = Sink::default();
    let tool = book(&sink);
    let plan_id;
    {
        let tg = durable(&dir);
        tg.register(&tool).unwrap();
        tg.recover().await.unwrap();
        // The first process has no compensation capability: nothing could fire here anyway.
        let plan = tg.plan(PlanOptions::owner("ops").deadline(Duration::from_secs(4))).await.unwrap();
        plan_id = plan.id();
        step(&plan, &tool, &["f1"]).await;
        step(&plan, &tool, &["h1"]).await;
        step(&plan, &tool, &["c1"]).await;
        tg.stop();
    }
    // The process that ran the steps is gone; another opens the ledger and recovers.
    let tg = reopen(&dir).await;
    // The clean close checkpointed the executor with the engine: the open loaded it.
    assert!(tg.open_report().plans_from_checkpoint, "{:?}", tg.open_report());
    assert_eq!(tg.open_report().plans_fallback, None);
    tg.register(&tool).unwrap();
    cancel_capability(&tg, &sink);
    tg.recover().await.unwrap();
    let d = tg.plan_detail(plan_id).await.unwrap().unwrap();
    assert_eq!(d.registrations.len(), 3, "rebuilt from the ledger: {d:?}");
    wait_for("three compensations", || sink.compensations().len() == 3).await;
    assert_eq!(
        sink.compensations(),
        vec!["cancel B-c1 book-c1#compensate", "cancel B-h1 book-h1#compensate", "cancel B-f1 book-f1#compensate"]
    );
    wait_until("the plan to end", || async {
        tg.plan_detail(plan_id).await.unwrap().unwrap().view.status == Status::Ended(Outcome::Unwound)
    })
    .await;
    tg.stop();
    drop(tg);
    // A third process finds nothing left to do.
    let tg = reopen(&dir).await;
    tg.register(&tool).unwrap();
    cancel_capability(&tg, &sink);
    tg.recover().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.compensations().len(), 3, "exactly once: {:?}", sink.seen());
    let plans = tg.plan_list().await.unwrap();
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].status, Status::Ended(Outcome::Unwound));
    tg.stop();
    drop(tg);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Confirm before undo: a held effect whose release ended with an unknown outcome is in doubt;
/// the executor asks its `forward_probe` and, told it never happened, skips its compensation
/// (while the effect before it, which did happen, is compensated).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_in_doubt_forward_effect_is_probed_and_never_compensated_if_it_did_not_happen() {
    let sink = Sink::default();
    let tg = Tidegate::in_memory().unwrap();
    cancel_capability(&tg, &sink);
    let s = sink.clone();
    tg.capability("unstage", move |req| {
        let s = s.clone();
        async move {
            s.0.lock().push(format!("unstage {}", req.key));
            CallOutcome::done(json!(null))
        }
    });
    let s = sink.clone();
    tg.capability("stage-happened", move |req| {
        let s = s.clone();
        async move {
            s.0.lock().push(format!("probe {}", req.key));
            CallOutcome::not_applied("no such write", false)
        }
    });
    let tool = book(&sink);
    let stage = Tool::builder("stage", EffectClass::Bufferable)
        .scope(|a| format!("kv:stage:{}", a["id"].as_str().unwrap_or_default()))
        .call(|_| async { Err(tidegate_runtime::ToolError::unknown("timed out after sending")) })
        .build()
        .unwrap();
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    step(&plan, &tool, &["f1"]).await;
    let tx = plan.begin(TxOptions::agent("a").may_touch(["kv:stage:s1"])).await.unwrap();
    let d = Descriptor { forward_probe: Some("stage-happened".into()), ..Descriptor::new("unstage", json!({})) };
    tx.call_with(&stage, json!({"id": "s1"}), CallOptions::compensate(d)).await.unwrap();
    tx.seal().unwrap();
    let _ = tx.commit().await; // the release's outcome is unknown, however the commit reports it
    let detail = plan.detail().await.unwrap();
    assert_eq!(
        detail.registrations[0].forward,
        tidegate_runtime::plans::Forward::InDoubt,
        "the release ended unknown: {detail:?}"
    );
    plan.fail("refused").await.unwrap();
    wait_until("the plan to end", || async {
        plan.detail().await.unwrap().view.status == Status::Ended(Outcome::Unwound)
    })
    .await;
    let seen = sink.seen();
    assert!(seen.iter().any(|s| s.starts_with("probe ")), "the forward probe was asked: {seen:?}");
    assert!(!seen.iter().any(|s| s.starts_with("unstage")), "never compensated: {seen:?}");
    assert_eq!(sink.compensations(), vec!["cancel B-f1 book-f1#compensate"]);
}

/// Opens `dir` with the given checkpoint policy (retrying while the previous engine's lock is
/// released).
async fn reopen_with(dir: &std::path::Path, policy: tidegate_runtime::CheckpointPolicy) -> Tidegate {
    for _ in 0..400 {
        match SqliteStore::open(dir) {
            Ok(store) => return Tidegate::builder().store(Arc::new(store)).checkpoints(policy).build().unwrap(),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("the directory stayed locked");
}

/// Runs a three-step plan whose deadline has not passed, with a checkpoint taken after the
/// first step and no checkpoint at close (as after a crash): the ledger's checkpoint covers one
/// step, the tail holds the other two.
async fn plan_with_checkpoint_then_tail(dir: &std::path::Path, tool: &Tool) -> (tidegate_runtime::PlanId, u64) {
    let no_close = tidegate_runtime::CheckpointPolicy { every_events: None, on_close: false };
    let tg = reopen_with(dir, no_close).await;
    tg.register(tool).unwrap();
    tg.recover().await.unwrap();
    let plan = tg.plan(PlanOptions::owner("ops").deadline(Duration::from_secs(3))).await.unwrap();
    step(&plan, tool, &["f1"]).await;
    let tg2 = tg.clone();
    let info = tokio::task::spawn_blocking(move || tg2.checkpoint_now()).await.unwrap().unwrap();
    step(&plan, tool, &["h1"]).await;
    step(&plan, tool, &["c1"]).await;
    let id = plan.id();
    tg.stop();
    drop((plan, tg));
    (id, info.lsn)
}

async fn expect_three_lifo(
    dir: &std::path::Path,
    tool: &Tool,
    sink: &Sink,
    tg: Tidegate,
    plan: tidegate_runtime::PlanId,
) {
    tg.register(tool).unwrap();
    cancel_capability(&tg, sink);
    tg.recover().await.unwrap();
    assert_eq!(tg.plan_detail(plan).await.unwrap().unwrap().registrations.len(), 3);
    wait_for("three compensations", || sink.compensations().len() == 3).await;
    assert_eq!(
        sink.compensations(),
        vec!["cancel B-c1 book-c1#compensate", "cancel B-h1 book-h1#compensate", "cancel B-f1 book-f1#compensate"]
    );
    wait_until("the plan to end", || async {
        tg.plan_detail(plan).await.unwrap().unwrap().view.status == Status::Ended(Outcome::Unwound)
    })
    .await;
    tg.stop();
    drop(tg);
    let _ = std::fs::remove_dir_all(dir);
}

/// Checkpoint + tail: the executor state in the checkpoint covers the first step only; the
/// reopen folds the two later steps from the ledger after it and unwinds all three, LIFO,
/// once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_continues_the_executor_from_its_checkpoint_and_folds_the_tail() {
    let dir = std::env::temp_dir().join(format!("tidegate-plans-ckpt-tail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sink = Sink::default();
    let tool = book(&sink);
    let (plan, at) = plan_with_checkpoint_then_tail(&dir, &tool).await;
    let tg = reopen(&dir).await;
    let r = tg.open_report().clone();
    assert_eq!(r.checkpoint_lsn, Some(at));
    assert!(r.plans_from_checkpoint && r.plans_fallback.is_none(), "{r:?}");
    assert!(r.replayed_events > 0, "the two later steps are a tail: {r:?}");
    expect_three_lifo(&dir, &tool, &sink, tg, plan).await;
}

/// A checkpoint without the executor's section (an older build wrote it) or with a section
/// that does not decode is not trusted for plans: the open says why and folds the plans from
/// the ledger's start, with the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_without_a_usable_plans_section_falls_back_to_the_whole_ledger() {
    use tidegate_core::engine::Replay;
    use tidegate_core::{CoreConfig, ScopeRegistry};
    use tidegate_runtime::LedgerStore;
    for (case, section) in [("absent", None), ("garbage", Some(&b"not a snapshot"[..]))] {
        let dir = std::env::temp_dir().join(format!("tidegate-plans-ckpt-{case}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sink = Sink::default();
        let tool = book(&sink);
        let (plan, at) = plan_with_checkpoint_then_tail(&dir, &tool).await;
        {
            let mut store = None;
            for _ in 0..400 {
                match SqliteStore::open(&dir) {
                    Ok(s) => {
                        store = Some(s);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            let store = store.expect("the directory stayed locked");
            let c = store.checkpoint().unwrap().unwrap();
            assert_eq!(c.lsn, at);
            let replay = Replay::load(CoreConfig::default(), ScopeRegistry::default(), c.lsn, &c.bytes).unwrap();
            let sections: Vec<(&str, &[u8])> = section.map(|b| ("plans", b)).into_iter().collect();
            store.put_checkpoint(c.lsn, &replay.checkpoint_with(&sections).unwrap()).unwrap();
        }
        let tg = reopen(&dir).await;
        let r = tg.open_report().clone();
        assert_eq!(r.checkpoint_lsn, Some(at), "{case}: the engine part is still used");
        assert!(!r.plans_from_checkpoint, "{case}: {r:?}");
        let why = r.plans_fallback.clone().unwrap_or_default();
        assert!(why.contains("folded the plans from the ledger's start"), "{case}: {why}");
        if case == "absent" {
            assert!(why.contains("no plans section"), "{why}");
        }
        expect_three_lifo(&dir, &tool, &sink, tg, plan).await;
    }
}

/// A `no_commit` predicate read from the ledger: a commit on its scope is compared with the
/// predicate's time by the commit's own recorded time (`decided.at`), not by when the executor
/// happens to fold it. The second process commits on the scope before its executor starts (it
/// starts at `recover`), so the executor learns of the commit only by folding the ledger: a
/// commit after the predicate's time leaves it to fire (the plan unwinds), a commit before it
/// makes it false (nothing is compensated, ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_commit_predicate_rebuilt_from_the_ledger_reads_the_commit_time_recorded_there() {
    use tidegate_runtime::plans::NoCommit;
    for (case, commit_at_s, fires) in [("after", 20, true), ("before", 5, false)] {
        let dir = std::env::temp_dir().join(format!("tidegate-plans-nocommit-{case}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sink = Sink::default();
        let tool = book(&sink);
        let no_close = tidegate_runtime::CheckpointPolicy { every_events: None, on_close: false };
        let open = |clock: &tidegate_runtime::ManualClock| {
            let store = Arc::new(SqliteStore::open(&dir).unwrap());
            let tg = Tidegate::builder().store(store).clock(Arc::new(clock.clone())).checkpoints(no_close).build();
            tg.unwrap()
        };
        let plan_id = {
            let clock = tidegate_runtime::ManualClock::new();
            clock.advance(Duration::from_secs(1));
            let tg = open(&clock);
            tg.register(&tool).unwrap();
            tg.recover().await.unwrap();
            let unpaid =
                Predicate::NoCommit(NoCommit { tenant: None, scope: "travel:booking:pay".into(), before_ms: 10_000 });
            let plan = tg.plan(PlanOptions::owner("ops").trigger(unpaid)).await.unwrap();
            step(&plan, &tool, &["f1"]).await;
            let id = plan.id();
            tg.stop();
            id
        };
        // The engine's lock is released once the first engine's tasks end.
        let mut tg = None;
        let clock = tidegate_runtime::ManualClock::new();
        clock.advance(Duration::from_secs(commit_at_s));
        for _ in 0..400 {
            match SqliteStore::open(&dir) {
                Ok(s) => {
                    drop(s);
                    tg = Some(open(&clock));
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        let tg = tg.expect("the directory stayed locked");
        tg.register(&tool).unwrap();
        cancel_capability(&tg, &sink);
        let pay = tg.begin_with(TxOptions::agent("payer").may_touch(["travel:booking:pay"])).unwrap();
        pay.call(&tool, json!({"id": "pay"})).await.unwrap();
        pay.seal().unwrap();
        pay.commit().await.unwrap();
        clock.advance(Duration::from_secs(30));
        tg.recover().await.unwrap();
        if fires {
            wait_for("the unpaid plan's compensation", || sink.compensations().len() == 1).await;
            assert_eq!(sink.compensations(), vec!["cancel B-f1 book-f1#compensate"], "{case}");
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(sink.compensations().is_empty(), "{case}: {:?}", sink.seen());
            let d = tg.plan_detail(plan_id).await.unwrap().unwrap();
            assert_eq!(d.triggers[0].value, Tri::False, "{case}: {d:?}");
        }
        tg.stop();
        drop(tg);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A memory ledger whose appends fail with a transient I/O error while `fail` is set.
#[derive(Debug, Default)]
struct FlakyStore {
    inner: tidegate_runtime::MemoryStore,
    fail: std::sync::atomic::AtomicBool,
}

impl tidegate_runtime::LedgerStore for FlakyStore {
    fn append(&self, events: &tidegate_core::Batch) -> Result<u64, StoreError> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Io { op: "append", source: std::io::Error::other("disk busy") });
        }
        self.inner.append(events)
    }
    fn is_durable(&self, lsn: u64) -> bool {
        self.inner.is_durable(lsn)
    }
    fn wait_durable(&self, lsn: u64) -> Result<(), StoreError> {
        self.inner.wait_durable(lsn)
    }
    fn poll_durable(&self, lsn: u64, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), StoreError>> {
        self.inner.poll_durable(lsn, cx)
    }
    fn last_lsn(&self) -> u64 {
        self.inner.last_lsn()
    }
    fn ownership(&self) -> tidegate_storage::Ownership {
        self.inner.ownership()
    }
    fn scan(&self, from: u64, visit: &mut dyn FnMut(u64, &tidegate_core::Event) -> bool) -> Result<(), StoreError> {
        self.inner.scan(from, visit)
    }
}

/// A plan command whose ledger append fails keeps the store's error, typed, and whether it is
/// worth retrying (the binding used to flatten it into `PlanError::Log(String)`, and every plan
/// error was not retryable); the executor then refuses every call, naming that failure, until
/// the engine is reopened.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_plan_log_failure_keeps_the_store_error_and_whether_to_retry() {
    let store = Arc::new(FlakyStore::default());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    store.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = plan.fail("stop").await.unwrap_err();
    assert!(err.retryable(), "a transient I/O failure is retryable: {err}");
    let Error::Plan(PlanError::Log { op: "append", retryable: true, source }) = &err else { panic!("{err:?}") };
    let cause = source.downcast_ref::<Error>();
    assert!(matches!(cause, Some(Error::Store(StoreError::Io { op: "append", .. }))), "{cause:?}");
    store.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let again = plan.commit().await.unwrap_err();
    assert!(matches!(again, Error::Plan(PlanError::Stopped { .. })), "{again:?}");
    assert!(!again.retryable() && again.to_string().contains("disk busy"), "{again}");
}
