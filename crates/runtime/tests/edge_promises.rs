//! Issue 26, items 1–3: promises of DESIGN.md §2 that broke at the edges, each replayed
//! through the public API against a simulated world that counts what reached it.
//!
//! 1. A losing speculation branch's compensation must never overwrite the winner's committed
//!    value (rules 10 and 13).
//! 2. A plan's compensation advances the version of the scopes it writes, so a read made
//!    before it cannot commit after it (rules 6 and 13).
//! 3. A capability handler that panics or never answers does not strand its plan: the call's
//!    outcome is unknown, and the plan goes to its owner (rule 14).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_core::{AbortReason, EngineError, Level};
use tidegate_runtime::plans::{Status, StuckReason};
use tidegate_runtime::{
    CallOptions, CallOutcome, CapabilityOptions, Compensation, Descriptor, EffectClass, Error, PlanOptions, Tidegate,
    Tool, TxOptions,
};

/// A key-value world: every write and undo it saw, in order, and its current values.
#[derive(Clone, Default)]
struct Kv {
    values: Arc<Mutex<BTreeMap<String, i64>>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Kv {
    fn get(&self, k: &str) -> i64 {
        self.values.lock().get(k).copied().unwrap_or(0)
    }
    fn log(&self) -> Vec<String> {
        self.log.lock().clone()
    }
}

/// `set {key, value}`: a reversible set whose undo restores the value it overwrote (the shape
/// rule 13 names: "a reversible set whose undo restores the previous value"). With
/// `slow_undo`, the undo takes 50 ms.
fn set_tool(kv: &Kv, slow_undo: bool) -> Tool {
    let (a, b) = (kv.clone(), kv.clone());
    Tool::builder("set", EffectClass::Reversible)
        .scope(|a| format!("kv:{}", a["key"].as_str().unwrap_or_default()))
        .call(move |args| {
            let kv = a.clone();
            async move {
                let key = args["key"].as_str().unwrap_or_default().to_owned();
                let value = args["value"].as_i64().unwrap_or_default();
                let prev = kv.values.lock().insert(key.clone(), value).unwrap_or(0);
                kv.log.lock().push(format!("set {key}={value}"));
                Ok(json!({"prev": prev}))
            }
        })
        .compensate(move |args, out| {
            let kv = b.clone();
            async move {
                if slow_undo {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let key = args["key"].as_str().unwrap_or_default().to_owned();
                let prev = out["prev"].as_i64().unwrap_or_default();
                kv.values.lock().insert(key.clone(), prev);
                kv.log.lock().push(format!("undo {key}={prev}"));
                Ok(Compensation::clean())
            }
        })
        .build()
        .unwrap()
}

/// `put {key, value}`: the same write, held until commit (gated).
fn put_tool(kv: &Kv) -> Tool {
    let a = kv.clone();
    Tool::builder("put", EffectClass::Gated)
        .scope(|a| format!("kv:{}", a["key"].as_str().unwrap_or_default()))
        .call(move |args| {
            let kv = a.clone();
            async move {
                let key = args["key"].as_str().unwrap_or_default().to_owned();
                let value = args["value"].as_i64().unwrap_or_default();
                kv.values.lock().insert(key.clone(), value);
                kv.log.lock().push(format!("put {key}={value}"));
                Ok(json!("ok"))
            }
        })
        .build()
        .unwrap()
}

fn set(key: &str, value: i64) -> Value {
    json!({"key": key, "value": value})
}

// ----- item 1: speculation losers never undo the winner -----

/// Issue 26 item 1: b0 set x = 10 (undo restores 0), b1 set x = 11 (undo restores 10), and
/// `commit_winner(b1)` ended at x = 0. The second eager writer among siblings is now refused
/// before it runs, so whichever branch wins, the world ends at what the winner committed.
#[tokio::test]
async fn speculation_loser_compensation_never_overwrites_the_winner() {
    for branches in [2usize, 3] {
        for winner in 0..branches {
            let kv = Kv::default();
            let tg = Tidegate::in_memory().unwrap();
            let tool = set_tool(&kv, false);
            let spec = tg.speculate(TxOptions::agent("planner").may_touch(["kv:x"]), branches).unwrap();
            let b = spec.branches().to_vec();
            b[0].call(&tool, set("x", 10)).await.unwrap();
            for (i, branch) in b.iter().enumerate().skip(1) {
                let err = branch.call(&tool, set("x", 10 + i as i64)).await.unwrap_err();
                match &err {
                    Error::Engine(EngineError::SiblingConflict { tx, sibling, scope }) => {
                        assert_eq!((*tx, *sibling, scope.as_str()), (branch.id(), b[0].id(), "kv:x"));
                    }
                    other => panic!("expected a sibling conflict, got {other:?}"),
                }
                assert!(!err.retryable(), "a sibling conflict does not go away by retrying");
                assert_eq!(branch.state().unwrap(), tidegate_core::TxState::Open, "the branch stays open");
            }
            assert_eq!(kv.log(), vec!["set x=10"], "the refused calls never ran");
            let out = spec.commit_winner(b[winner].id()).await.unwrap();
            assert!(out.winner.committed);
            let expected = if winner == 0 { 10 } else { 0 };
            assert_eq!(kv.get("x"), expected, "{branches} branches, winner b{winner}: {:?}", kv.log());
        }
    }
}

/// Siblings on disjoint scopes still write eagerly side by side, and a sibling's *held* write
/// on a scope a loser wrote eagerly is allowed: the winner's held effect is released after
/// every loser's compensation settled (the winner's commit waits for them).
#[tokio::test]
async fn a_winner_commits_only_after_its_losers_compensations_settled() {
    let kv = Kv::default();
    let tg = Tidegate::in_memory().unwrap();
    let (set, put) = (set_tool(&kv, true), put_tool(&kv));
    let spec = tg.speculate(TxOptions::agent("planner").may_touch(["kv:x", "kv:y", "kv:z"]), 2).unwrap();
    let b = spec.branches().to_vec();
    b[0].call(&set, set_args("x", 10)).await.unwrap();
    b[1].call(&set, set_args("y", 5)).await.unwrap();
    b[0].call(&set, set_args("z", 7)).await.unwrap();
    b[1].call(&put, set_args("x", 11)).await.unwrap();
    b[1].seal().unwrap();
    // Choose b1 and commit it at once, without waiting for the loser's (slow) undo: the
    // commit must not be decided before b0's compensations settled.
    let (losers, winner) = tokio::join!(spec.choose(b[1].id()), async {
        tokio::task::yield_now().await;
        b[1].commit().await
    });
    assert_eq!(losers.unwrap().len(), 1);
    assert!(winner.unwrap().committed);
    assert_eq!((kv.get("x"), kv.get("y"), kv.get("z")), (11, 5, 0), "{:?}", kv.log());
    let log = kv.log();
    let undo_x = log.iter().position(|l| l == "undo x=0").unwrap();
    let put_x = log.iter().position(|l| l == "put x=11").unwrap();
    assert!(undo_x < put_x, "the loser's undo of x lands before the winner's write: {log:?}");
}

fn set_args(key: &str, value: i64) -> Value {
    set(key, value)
}

// ----- item 2: a plan's compensation advances the version -----

/// A counter world with a plan capability `sub` that undoes `add`.
fn counter(tg: &Tidegate, kv: &Kv) -> Tool {
    let (a, b) = (kv.clone(), kv.clone());
    tg.capability("sub", move |req| {
        let kv = b.clone();
        async move {
            let key = req.args["key"].as_str().unwrap_or_default().to_owned();
            *kv.values.lock().entry(key.clone()).or_insert(0) -= 1;
            kv.log.lock().push(format!("sub {key}"));
            CallOutcome::done(json!("ok"))
        }
    });
    Tool::builder("add", EffectClass::Reversible)
        .scope(|a| format!("travel:{}", a["key"].as_str().unwrap_or_default()))
        .call(move |args| {
            let kv = a.clone();
            async move {
                let key = args["key"].as_str().unwrap_or_default().to_owned();
                *kv.values.lock().entry(key.clone()).or_insert(0) += 1;
                kv.log.lock().push(format!("add {key}"));
                Ok(json!("ok"))
            }
        })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()
        .unwrap()
}

/// Issue 26 item 2: plans A and B each commit a step adding +1 on `travel:seat_h` (world 2);
/// T reads the scope; A fails and its compensation takes the world to 1; T's plan ("report 2")
/// must not commit. At L1 it aborts `stale_read`; at L2 and above `cascading_abort` naming
/// A's step.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn plan_compensation_advances_the_version_so_a_stale_read_aborts() {
    for level in [Level::L1, Level::L2, Level::L4] {
        let kv = Kv::default();
        let tg = Tidegate::builder().level(level).build().unwrap();
        let add = counter(&tg, &kv);
        let report = Tool::builder("report", EffectClass::Bufferable)
            .scope(|_| "travel:report".to_owned())
            .call(|_| async { Ok(json!("ok")) })
            .build()
            .unwrap();
        let mut steps = Vec::new();
        let mut plans = Vec::new();
        for _ in 0..2 {
            let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
            let tx = plan.begin(TxOptions::agent("booker").may_touch(["travel:seat_h"])).await.unwrap();
            let d = Descriptor::new("sub", json!({"key": "seat_h"}));
            tx.call_with(&add, json!({"key": "seat_h"}), CallOptions::compensate(d)).await.unwrap();
            tx.seal().unwrap();
            tx.commit().await.unwrap();
            steps.push(tx.id());
            plans.push(plan);
        }
        assert_eq!(kv.get("seat_h"), 2);
        let t = tg.begin_with(TxOptions::agent("reporter").may_touch(["travel:seat_h", "travel:report"])).unwrap();
        let before = t.read("travel:seat_h").unwrap().version;
        plans[0].fail("the trip was cancelled").await.unwrap();
        wait_for("A's compensation", || kv.log().iter().any(|l| l == "sub seat_h")).await;
        // Let the executor record the compensation's outcome too.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(kv.get("seat_h"), 1);
        t.call(&report, json!({"seats": 2})).await.unwrap();
        t.seal().unwrap();
        let err = t.commit().await.unwrap_err();
        let Error::Aborted(out) = err else { panic!("{level:?}: expected an abort, got {err:?}") };
        match (level, out.reason.as_ref().unwrap()) {
            (Level::L1, AbortReason::StaleRead { scope, read, current }) => {
                assert_eq!(scope, "travel:seat_h");
                assert_eq!(*read, before.0);
                assert!(*current > *read);
            }
            (Level::L2 | Level::L4, AbortReason::CascadingAbort { predecessor }) => {
                assert_eq!(*predecessor, steps[0], "{level:?}: the compensated step is named");
            }
            (l, r) => panic!("{l:?}: unexpected abort reason {r:?}"),
        }
        // A fresh reader after the compensation commits.
        let t2 = tg.begin_with(TxOptions::agent("reporter").may_touch(["travel:seat_h", "travel:report"])).unwrap();
        let after = t2.read("travel:seat_h").unwrap().version;
        assert!(after > before, "{level:?}: the compensation advanced the version ({before:?} → {after:?})");
        t2.call(&report, json!({"seats": 1})).await.unwrap();
        t2.seal().unwrap();
        assert!(t2.commit().await.unwrap().committed);
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..4000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

// ----- item 3: a panicking or hanging capability does not strand a plan -----

async fn one_step_plan(tg: &Tidegate, kv: &Kv, capability: &str) -> tidegate_runtime::Plan {
    let add = Tool::builder("add", EffectClass::Reversible)
        .scope(|a| format!("travel:{}", a["key"].as_str().unwrap_or_default()))
        .call({
            let kv = kv.clone();
            move |args| {
                let kv = kv.clone();
                async move {
                    let key = args["key"].as_str().unwrap_or_default().to_owned();
                    *kv.values.lock().entry(key.clone()).or_insert(0) += 1;
                    Ok(json!("ok"))
                }
            }
        })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()
        .unwrap();
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    for key in ["low", "top"] {
        let tx = plan.begin(TxOptions::agent("booker").may_touch([format!("travel:{key}")])).await.unwrap();
        let d = Descriptor::new(if key == "top" { capability } else { "fine" }, json!({"key": key}));
        tx.call_with(&add, json!({"key": key}), CallOptions::compensate(d)).await.unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
    }
    plan
}

fn fine_capability(tg: &Tidegate, kv: &Kv) {
    let kv = kv.clone();
    tg.capability("fine", move |req| {
        let kv = kv.clone();
        async move {
            kv.log.lock().push(format!("undo {}", req.args["key"].as_str().unwrap_or_default()));
            CallOutcome::done(json!("ok"))
        }
    });
}

/// Issue 26 item 3: a capability handler that panics left the plan `failing` forever with the
/// registration in flight, invisible to `stuck_plans()`. A panic is now an unknown outcome:
/// with no probe to ask, the plan goes to its owner, and nothing below it is compensated
/// meanwhile (LIFO: the next one waits for this one).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn panicking_capability_handler_sends_the_plan_to_its_owner() {
    let kv = Kv::default();
    let tg = Tidegate::in_memory().unwrap();
    fine_capability(&tg, &kv);
    tg.capability("undo", |_| async { panic!("the handler is broken") });
    let plan = one_step_plan(&tg, &kv, "undo").await;
    plan.fail("cancelled").await.unwrap();
    let stuck = wait_stuck(&tg).await;
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].0, plan.id());
    assert!(matches!(stuck[0].1, StuckReason::CompensationInDoubt { .. }), "{:?}", stuck[0].1);
    let d = plan.detail().await.unwrap();
    assert!(matches!(d.view.status, Status::Stuck { .. }), "{:?}", d.view.status);
    assert!(kv.log().is_empty(), "nothing below the stuck registration was compensated: {:?}", kv.log());
    let done = comp_done_errors(&tg);
    assert!(done.iter().any(|e| e.contains("panicked: the handler is broken")), "the ledger says why: {done:?}");
}

/// The `error` of every `comp_done` plan record in the ledger.
fn comp_done_errors(tg: &Tidegate) -> Vec<String> {
    tg.extension_records("plans")
        .unwrap()
        .into_iter()
        .filter(|(_, r)| r["fact"] == "comp_done")
        .map(|(_, r)| r["error"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The same for a handler that never answers: after its capability's deadline the outcome is
/// unknown and the plan goes to its owner instead of waiting forever.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn hanging_capability_handler_times_out_and_sends_the_plan_to_its_owner() {
    let kv = Kv::default();
    let tg = Tidegate::in_memory().unwrap();
    fine_capability(&tg, &kv);
    tg.capability_with("undo", CapabilityOptions::deadline(Duration::from_millis(200)), |_| {
        std::future::pending::<CallOutcome>()
    });
    let plan = one_step_plan(&tg, &kv, "undo").await;
    plan.fail("cancelled").await.unwrap();
    let stuck = wait_stuck(&tg).await;
    assert_eq!(stuck[0].0, plan.id());
    assert!(matches!(stuck[0].1, StuckReason::CompensationInDoubt { .. }), "{:?}", stuck[0].1);
    let done = comp_done_errors(&tg);
    assert!(done.iter().any(|e| e.contains("deadline of 200 ms")), "the ledger names the deadline: {done:?}");
    assert!(kv.log().is_empty());
}

/// With a probe that says the panicking attempt did not take effect, the compensation is sent
/// again under the same key, and a handler that recovered finishes the unwind.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_compensation_whose_handler_panicked_once_is_probed_and_retried() {
    let kv = Kv::default();
    let tg = Tidegate::in_memory().unwrap();
    fine_capability(&tg, &kv);
    let calls = Arc::new(Mutex::new(Vec::<String>::new()));
    let c = calls.clone();
    let k = kv.clone();
    tg.capability("flaky", move |req| {
        let (c, k) = (c.clone(), k.clone());
        async move {
            let first = {
                let mut c = c.lock();
                c.push(req.key.to_string());
                c.len() == 1
            };
            if first {
                panic!("first attempt dies");
            }
            k.log.lock().push(format!("undo {}", req.args["key"].as_str().unwrap_or_default()));
            CallOutcome::done(json!("ok"))
        }
    });
    tg.capability("flaky-probe", |_| async { CallOutcome::not_applied("no such cancellation", false) });
    let add = Tool::builder("add", EffectClass::Reversible)
        .scope(|_| "travel:top".to_owned())
        .call(|_| async { Ok(json!("ok")) })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()
        .unwrap();
    let plan = tg.plan(PlanOptions::owner("ops")).await.unwrap();
    let tx = plan.begin(TxOptions::agent("booker").may_touch(["travel:top"])).await.unwrap();
    let mut d = Descriptor::new("flaky", json!({"key": "top"}));
    d.probe = Some("flaky-probe".into());
    tx.call_with(&add, json!({"key": "top"}), CallOptions::compensate(d)).await.unwrap();
    tx.seal().unwrap();
    tx.commit().await.unwrap();
    plan.fail("cancelled").await.unwrap();
    wait_for("the retried compensation", || kv.log().iter().any(|l| l == "undo top")).await;
    for _ in 0..200 {
        if matches!(plan.detail().await.unwrap().view.status, Status::Ended(_)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(matches!(plan.detail().await.unwrap().view.status, Status::Ended(_)));
    let calls = calls.lock().clone();
    assert_eq!(calls.len(), 2, "one panicking attempt, one retry: {calls:?}");
    assert_eq!(calls[0], calls[1], "every attempt carries the same key");
    assert!(tg.stuck_plans().await.unwrap().is_empty());
}

async fn wait_stuck(tg: &Tidegate) -> Vec<(tidegate_runtime::PlanId, StuckReason)> {
    for _ in 0..4000 {
        let s = tg.stuck_plans().await.unwrap();
        if !s.is_empty() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the plan never reached the owner-intervention queue");
}
