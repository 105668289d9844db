//! The two-step effect protocol (issue 14 item 2; docs/engine.md, "The two-step effect
//! protocol"): `record` makes the effect durable and says what to do, `report` applies the
//! engine's retry-and-probe policy to how the caller's call ended.
#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_runtime::{
    AbortReason, Ack, CallOptions, CallOutcome, Compensation, EffectClass, Error, Probe, RetryPolicy, Step, Tag,
    TicketAction, Tidegate, Tool, TxState,
};

/// What reached the provider's handlers (the engine's own calls: releases, compensations,
/// probes; the caller's executions are the test's).
#[derive(Default)]
struct Seen {
    released: Mutex<Vec<Value>>,
    compensated: Mutex<Vec<Value>>,
    probes: Mutex<u32>,
}

fn tool(name: &str, class: EffectClass, seen: &Arc<Seen>, probe: Option<Probe>) -> Tool {
    let (s1, s2, s3) = (seen.clone(), seen.clone(), seen.clone());
    let mut b =
        Tool::builder(name, class).scope(|a: &Value| format!("retail:order:{}", a["id"])).call(move |a: Arc<Value>| {
            let s = s1.clone();
            async move {
                s.released.lock().push((*a).clone());
                Ok(json!({"released": a["id"]}))
            }
        });
    if class.executes_eagerly() {
        b = b.compensate(move |_a: Arc<Value>, out: Arc<Value>| {
            let s = s2.clone();
            async move {
                s.compensated.lock().push((*out).clone());
                Ok(Compensation::clean())
            }
        });
    }
    if let Some(answer) = probe {
        b = b.probe(move |_a: Arc<Value>| {
            let (s, answer) = (s3.clone(), answer.clone());
            async move {
                *s.probes.lock() += 1;
                answer
            }
        });
    }
    b.build().unwrap()
}

fn engine(attempts: u32) -> Tidegate {
    Tidegate::builder()
        .retry(RetryPolicy {
            attempts,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(5),
        })
        .build()
        .unwrap()
}

fn aborted(e: Error) -> tidegate_runtime::Outcome {
    match e {
        Error::Aborted(o) => *o,
        other => panic!("expected an abort, got {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_reported_done_executes_the_effect_and_its_output_reaches_the_compensation() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::key("book-W1")).await.unwrap();
    match ticket.action() {
        TicketAction::ExecuteNow { key, attempt, .. } => assert_eq!((&**key, *attempt), ("book-W1", 1)),
        other => panic!("expected ExecuteNow, got {other:?}"),
    }
    assert!(ticket.pending());
    let step = ticket.report(CallOutcome::done(json!({"hold": "H1"}))).await.unwrap();
    assert_eq!(step, Step::Acked(Ack::Executed { effect: ticket.effect(), output: Arc::new(json!({"hold": "H1"})) }));
    assert!(!ticket.pending());
    assert!(seen.released.lock().is_empty(), "the engine never ran the caller's call");
    let out = tx.abort("changed my mind").await.unwrap();
    assert_eq!(*seen.compensated.lock(), vec![json!({"hold": "H1"})], "the reported output is what is undone");
    assert!(out.is_clean(), "{out:?}");
    tg.check_integrity().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_keyless_ticket_names_the_key_the_engine_derived() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut first = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    first.report(CallOutcome::done(json!(1))).await.unwrap();
    let mut second = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    let key = |t: &tidegate_runtime::Ticket| match t.action() {
        TicketAction::ExecuteNow { key, .. } => key.to_string(),
        other => panic!("expected ExecuteNow, got {other:?}"),
    };
    let (k1, k2) = (key(&first), key(&second));
    assert!(k1.starts_with("hotel:") && k2.starts_with("hotel:"), "{k1} {k2}");
    assert_ne!(k1, k2, "two calls without a key are two calls");
    second.report(CallOutcome::done(json!(2))).await.unwrap();
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().committed);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_not_applied_asks_for_another_attempt_until_the_policy_runs_out() {
    let (tg, seen) = (engine(3), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    for next in [2, 3] {
        match ticket.report(CallOutcome::not_applied("503 before processing", true)).await.unwrap() {
            Step::Retry { attempt, backoff } => {
                assert_eq!(attempt, next);
                assert!(backoff > Duration::ZERO);
            }
            other => panic!("expected a retry, got {other:?}"),
        }
        assert!(matches!(ticket.action(), TicketAction::ExecuteNow { attempt, .. } if *attempt == next));
    }
    let out = aborted(ticket.report(CallOutcome::not_applied("503 before processing", true)).await.unwrap_err());
    assert!(
        matches!(&out.reason, Some(AbortReason::ToolUnavailable { message, .. }) if message.contains("after 3 attempts")),
        "{out:?}"
    );
    assert!(seen.compensated.lock().is_empty(), "nothing happened, nothing to undo");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_report_asks_the_probe() {
    let seen = Arc::new(Seen::default());
    let tg = engine(4);
    let hotel = tool("hotel", EffectClass::Reversible, &seen, Some(Probe::Happened(json!({"hold": "probed"}))));
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    let step = ticket.report(CallOutcome::unknown("timed out after sending")).await.unwrap();
    assert!(matches!(step, Step::Acked(Ack::Executed { output, .. }) if *output == json!({"hold": "probed"})));
    assert_eq!(*seen.probes.lock(), 1);

    // The probe says it did not happen: call again (within the attempts).
    let seen = Arc::new(Seen::default());
    let hotel = tool("hotel2", EffectClass::Reversible, &seen, Some(Probe::DidNotHappen));
    let mut ticket = tx.record(&hotel, json!({"id": "W2"}), CallOptions::default()).await.unwrap();
    let step = ticket.report(CallOutcome::unknown("reset")).await.unwrap();
    assert!(matches!(step, Step::Retry { attempt: 2, .. }), "{step:?}");
    let step = ticket.report(CallOutcome::done(json!("second"))).await.unwrap();
    assert!(matches!(step, Step::Acked(Ack::Executed { .. })), "{step:?}");
    tg.check_integrity().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unknown_report_without_probe_aborts_and_compensates_blind() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    let out = aborted(ticket.report(CallOutcome::unknown("the reply was lost")).await.unwrap_err());
    assert_eq!(out.effects[0].tag, Tag::Unresolved, "an unknown outcome is never clean: {out:?}");
    assert_eq!(seen.compensated.lock().len(), 1, "undone blind");
    assert!(matches!(&out.reason, Some(AbortReason::ToolFailed { message, .. }) if message.contains("reply was lost")));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_ticket_is_an_unknown_outcome_settled_by_the_engine() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let tx = tg.begin("a").unwrap();
    let ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    drop(ticket);
    // The abort runs in the engine's own task.
    for _ in 0..100 {
        if tx.state().is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let err = tx.state().unwrap_err();
    assert!(matches!(err, Error::Finished { committed: false, .. }), "{err}");
    assert_eq!(seen.compensated.lock().len(), 1, "compensated blind, as a dropped call");
    tg.check_integrity().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_double_report_or_a_report_of_a_held_ticket_is_refused_and_changes_nothing() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let email = tool("email", EffectClass::Gated, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    ticket.report(CallOutcome::done(json!(1))).await.unwrap();
    let err = ticket.report(CallOutcome::unknown("again")).await.unwrap_err();
    assert!(matches!(&err, Error::TicketMisuse { detail, .. } if detail.contains("already reported")), "{err}");

    let mut held = tx.record(&email, json!({"id": "W2"}), CallOptions::default()).await.unwrap();
    assert!(matches!(held.action(), TicketAction::Queued { .. }));
    assert_eq!(held.ack(), Some(Ack::Queued { effect: held.effect() }));
    let err = held.report(CallOutcome::done(json!(1))).await.unwrap_err();
    assert!(matches!(&err, Error::TicketMisuse { detail, .. } if detail.contains("queued")), "{err}");
    drop(held);

    // Neither refusal touched the transaction: it commits, releasing the held effect once.
    assert_eq!(tx.state().unwrap(), TxState::Open);
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed && out.is_clean(), "{out:?}");
    assert_eq!(seen.released.lock().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_ticket_reported_to_another_transaction_is_refused() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let (t1, t2) = (tg.begin("a").unwrap(), tg.begin("b").unwrap());
    let mut ticket = t1.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    let err = t2.report(&mut ticket, CallOutcome::done(json!(1))).await.unwrap_err();
    assert!(matches!(&err, Error::TicketMisuse { tx, .. } if *tx == t2.id()), "{err}");
    // Another engine's transaction with the same id.
    let other = engine(4);
    let t1_elsewhere = other.begin("a").unwrap();
    assert_eq!(t1_elsewhere.id(), t1.id());
    let err = t1_elsewhere.report(&mut ticket, CallOutcome::done(json!(1))).await.unwrap_err();
    assert!(matches!(&err, Error::TicketMisuse { detail, .. } if detail.contains("another engine")), "{err}");
    // Still pending: its own transaction takes the report.
    assert!(ticket.pending());
    assert!(matches!(t1.report(&mut ticket, CallOutcome::done(json!(1))).await.unwrap(), Step::Acked(_)));
}

#[tokio::test(start_paused = true)]
async fn a_ticket_is_reported_from_another_task() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
    let email = tool("email", EffectClass::Gated, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
    let step = tokio::spawn(async move { ticket.report(CallOutcome::done(json!({"hold": "H"}))).await }).await.unwrap();
    assert!(matches!(step, Ok(Step::Acked(Ack::Executed { .. }))), "{step:?}");
    tx.record(&email, json!({"id": "W2"}), CallOptions::default()).await.unwrap();
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().committed);
    assert_eq!(*seen.released.lock(), vec![json!({"id": "W2"})], "only the held effect is the engine's to run");
}

#[tokio::test(start_paused = true)]
async fn a_replayed_key_has_nothing_to_run() {
    let (tg, seen) = (engine(4), Arc::new(Seen::default()));
    let hotel = tool("hotel", EffectClass::Idempotent, &seen, None);
    let tx = tg.begin("a").unwrap();
    let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::key("k")).await.unwrap();
    ticket.report(CallOutcome::done(json!("out"))).await.unwrap();
    tx.seal().unwrap();
    tx.commit().await.unwrap();
    let tx = tg.begin("a").unwrap();
    let again = tx.record(&hotel, json!({"id": "W1"}), CallOptions::key("k")).await.unwrap();
    assert!(matches!(again.action(), TicketAction::Replayed { output, .. } if **output == json!("out")));
    assert!(!again.pending());
}

#[tokio::test(start_paused = true)]
async fn an_open_transaction_is_resumed_by_id_after_a_restart() {
    let store: Arc<dyn tidegate_runtime::LedgerStore> = Arc::new(tidegate_runtime::MemoryStore::new());
    let seen = Arc::new(Seen::default());
    let (open, done) = {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
        let tx = tg.begin_with(tidegate_runtime::TxOptions::agent("a").may_touch(["retail:order:*"])).unwrap();
        let mut ticket = tx.record(&hotel, json!({"id": "W1"}), CallOptions::default()).await.unwrap();
        ticket.report(CallOutcome::done(json!({"hold": "H1"}))).await.unwrap();
        let done = tg.begin("b").unwrap();
        done.seal().unwrap();
        done.commit().await.unwrap();
        (tx.id(), done.id())
    };
    let tg = Tidegate::builder().store(store).build().unwrap();
    tg.register(&tool("hotel", EffectClass::Reversible, &seen, None)).unwrap();
    tg.recover_keeping_open().await.unwrap();
    let tx = tg.transaction(open).unwrap();
    assert_eq!((tx.id(), tx.state().unwrap()), (open, TxState::Open));
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed && out.is_clean(), "{out:?}");
    assert!(seen.compensated.lock().is_empty());
    assert!(tg.transaction(done).is_err(), "a settled transaction cannot be resumed");
    assert!(matches!(tg.transaction(open), Err(Error::Finished { committed: true, .. })));
    let never = tidegate_runtime::TxId(open.0 + 1000);
    assert!(matches!(tg.transaction(never), Err(Error::Engine(tidegate_runtime::EngineError::UnknownTx { .. }))));
}

#[tokio::test(start_paused = true)]
async fn a_speculation_group_is_resumed_by_id_after_a_restart() {
    let store: Arc<dyn tidegate_runtime::LedgerStore> = Arc::new(tidegate_runtime::MemoryStore::new());
    let seen = Arc::new(Seen::default());
    let (group, branches) = {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let hotel = tool("hotel", EffectClass::Reversible, &seen, None);
        let spec = tg.speculate(tidegate_runtime::TxOptions::agent("a").may_touch(["retail:order:*"]), 2).unwrap();
        for (b, id) in spec.branches().iter().zip(["W1", "W2"]) {
            b.call(&hotel, json!({"id": id})).await.unwrap();
        }
        (spec.id(), spec.branches().iter().map(|b| b.id()).collect::<Vec<_>>())
    };
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    tg.register(&tool("hotel", EffectClass::Reversible, &seen, None)).unwrap();
    tg.recover_keeping_open().await.unwrap();
    let spec = tg.speculation(group).unwrap();
    assert_eq!(spec.branches().iter().map(|b| b.id()).collect::<Vec<_>>(), branches);
    let out = spec.commit_winner(branches[1]).await.unwrap();
    assert!(out.winner.committed && out.winner.is_clean(), "{out:?}");
    assert_eq!(out.losers.len(), 1);
    assert_eq!(seen.compensated.lock().len(), 1, "the losing branch's call is undone: {:?}", seen.compensated.lock());
    // Settled: no longer resumable; an id never issued neither.
    assert!(matches!(tg.speculation(group), Err(Error::Engine(tidegate_runtime::EngineError::UnknownGroup { .. }))));
    let never = tidegate_runtime::GroupId(group.0 + 1000);
    assert!(matches!(tg.speculation(never), Err(Error::Engine(tidegate_runtime::EngineError::UnknownGroup { .. }))));
}
