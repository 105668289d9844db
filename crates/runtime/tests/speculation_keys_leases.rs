//! Speculation groups, idempotency keys, leases, first-committer-wins and plain threads.

mod common;

use std::time::Duration;

use common::World;
use serde_json::json;
use tidegate_runtime::{
    AbortReason, Ack, CommitOptions, Disposition, EffectClass, EngineError, Error, Ordering, Tag, Tidegate, TxOptions,
};

fn engine() -> Tidegate {
    Tidegate::in_memory().expect("engine")
}

#[tokio::test]
async fn the_winning_branch_commits_and_losers_leave_no_residue() {
    let (tg, w) = (engine(), World::new());
    let book = w.tool("book", EffectClass::Reversible, "travel:hotel");
    let stage = w.tool("stage", EffectClass::Bufferable, "kv:plan");
    let send = w.tool("send", EffectClass::Gated, "mail");
    let pay = w.tool("pay", EffectClass::Idempotent, "retail:payment");
    let spec = tg.speculate(TxOptions::agent("planner"), 4).unwrap();
    let epochs: Vec<_> = spec.branches().iter().map(|b| b.epoch()).collect();
    assert!(epochs.windows(2).all(|p| p[0] == p[1]), "branches share one epoch");
    for (i, b) in spec.branches().iter().enumerate() {
        let id = format!("b{i}");
        b.call(&book, json!({"id": id})).await.unwrap();
        b.call(&stage, json!({"id": id})).await.unwrap();
        b.call(&send, json!({"id": format!("{id}@x")})).await.unwrap();
        b.call(&pay, json!({"id": id})).await.unwrap();
        b.seal().unwrap();
    }
    let winner = spec.branches()[2].id();
    let out = spec.commit_winner(winner).await.unwrap();
    assert!(out.winner.committed && out.winner.is_clean());
    assert_eq!(out.losers.len(), 3);
    for l in &out.losers {
        assert!(matches!(l.reason, Some(AbortReason::LostBranch { winner: w2 }) if w2 == winner));
    }
    assert_eq!(w.count("send", "fire"), 1, "only the winner's gated effect fires");
    assert_eq!(w.count("stage", "apply"), 1, "only the winner's staged effect applies");
    assert_eq!(w.count("book", "compensate"), 3, "every loser's reversible effect is undone");
    assert!(w.hits().iter().filter(|h| h.what == "fire" || h.what == "apply").all(|h| h.args.contains("b2")));
    // Idempotent effects without a compensation handler still compensate when one exists.
    assert_eq!(w.count("pay", "compensate"), 3);
    tg.check_integrity().unwrap();
}

#[tokio::test]
async fn a_group_commit_without_a_chosen_winner_is_refused() {
    let tg = engine();
    let spec = tg.speculate(TxOptions::agent("p"), 2).unwrap();
    let err = spec.commit().await.unwrap_err();
    assert!(matches!(err, Error::Engine(EngineError::NoWinner { .. })), "{err}");
    let b = &spec.branches()[0];
    b.seal().unwrap();
    let err = b.commit().await.unwrap_err();
    assert!(matches!(err, Error::Engine(EngineError::BranchOfGroup { .. })), "a branch cannot commit alone: {err}");
    let stranger = tg.begin("x").unwrap();
    let err = spec.choose(stranger.id()).await.unwrap_err();
    assert!(matches!(err, Error::Engine(EngineError::NotInGroup { .. })), "{err}");
    assert_eq!(spec.abort("give up").await.unwrap().len(), 2);
}

#[tokio::test]
async fn later_transactions_wait_for_the_whole_group() {
    let (tg, w) = (engine(), World::new());
    let send = w.tool("send", EffectClass::Gated, "retail:order");
    let spec = tg.speculate(TxOptions::agent("p").may_touch(["retail:order:W1"]), 2).unwrap();
    let later = tg.begin_with(TxOptions::agent("l").may_touch(["retail:order:W1"])).unwrap();
    later.call(&send, json!({"id": "W1"})).await.unwrap();
    later.seal().unwrap();
    let h = tokio::spawn(async move { later.commit().await });
    for b in spec.branches() {
        b.call(&send, json!({"id": "W1"})).await.unwrap();
        b.seal().unwrap();
    }
    tokio::task::yield_now().await;
    assert!(!h.is_finished());
    spec.commit_winner(spec.branches()[0].id()).await.unwrap();
    h.await.unwrap().unwrap();
    assert_eq!(w.count("send", "fire"), 2);
}

#[tokio::test]
async fn a_retried_call_returns_the_recorded_outcome_instead_of_running_again() {
    let (tg, w) = (engine(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let tx = tg.begin("a").unwrap();
    // A retry names the same call (its call id); without one, every call is a new call.
    let id = || tidegate_runtime::CallOptions::call_id("call-1");
    let first = tx.call_with(&hotel, json!({"id": "H"}), id()).await.unwrap();
    let again = tx.call_with(&hotel, json!({"id": "H"}), id()).await.unwrap();
    assert!(matches!(again, Ack::Replayed { .. }));
    assert_eq!(first.output(), again.output());
    assert_eq!(first.effect(), again.effect(), "the retry is the first call");
    assert_eq!(w.count("hotel", "exec"), 1);
    // Another call id is a different call.
    tx.call_with(&hotel, json!({"id": "H2"}), tidegate_runtime::CallOptions::call_id("call-2")).await.unwrap();
    assert_eq!(w.count("hotel", "exec"), 2);
}

#[tokio::test]
async fn adapter_keys_deduplicate_across_transactions_and_free_up_after_a_clean_abort() {
    let (tg, w) = (engine(), World::new());
    let base = w.tool("charge", EffectClass::Reversible, "retail:payment");
    let opts = |k: &str| tidegate_runtime::CallOptions::key(k);
    let t1 = tg.begin("a").unwrap();
    t1.call_with(&base, json!({"id": "P"}), opts("charge-42")).await.unwrap();
    let t2 = tg.begin("b").unwrap();
    let err = t2.call_with(&base, json!({"id": "P"}), opts("charge-42")).await.unwrap_err();
    assert!(matches!(err, Error::Engine(EngineError::KeyInUse { .. })) && err.retryable(), "{err}");
    t1.seal().unwrap();
    t1.commit().await.unwrap();
    let ack = t2.call_with(&base, json!({"id": "P"}), opts("charge-42")).await.unwrap();
    assert!(matches!(ack, Ack::Replayed { .. }), "a committed key replays");
    assert_eq!(w.count("charge", "exec"), 1);
    t2.abort("x").await.unwrap();

    let t3 = tg.begin("c").unwrap();
    t3.call_with(&base, json!({"id": "Q"}), opts("charge-43")).await.unwrap();
    t3.abort("x").await.unwrap();
    let t4 = tg.begin("d").unwrap();
    let ack = t4.call_with(&base, json!({"id": "Q"}), opts("charge-43")).await.unwrap();
    assert!(matches!(ack, Ack::Executed { .. }), "a cleanly compensated key may run again");
    assert_eq!(w.count("charge", "exec"), 3, "charge-42 once, charge-43 twice");
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_aborts_a_hung_transaction_and_unblocks_waiters() {
    let (tg, w) = (Tidegate::builder().lease(Duration::from_secs(10)).build().unwrap(), World::new());
    let hotel = w.tool("hotel", EffectClass::Reversible, "travel:hotel");
    let hung = tg.begin("hung").unwrap();
    hung.call(&hotel, json!({"id": "H"})).await.unwrap();
    let later = tg.begin_with(TxOptions::agent("l").may_touch(["travel:hotel:H2"])).unwrap();
    later.call(&hotel, json!({"id": "H2"})).await.unwrap();
    later.seal().unwrap();
    let start = tokio::time::Instant::now();
    let out = later.commit().await.unwrap();
    assert!(out.committed);
    assert!(start.elapsed() >= Duration::from_secs(9), "waited for the lease: {:?}", start.elapsed());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(w.count("hotel", "compensate"), 1, "the hung transaction's effect was compensated");
    let err = hung.seal().unwrap_err();
    assert!(
        matches!(&err, Error::Finished { committed: false, reason: Some(AbortReason::LeaseExpired), .. }),
        "the error says the lease expired: {err}"
    );
    assert!(err.retryable() && err.to_string().contains("lease expired"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_commit_wait_can_time_out() {
    let (tg, w) = (engine(), World::new());
    let send = w.tool("send", EffectClass::Gated, "mail");
    let _blocker = tg.begin_with(TxOptions::agent("b").may_touch(["mail:x@y"])).unwrap();
    let tx = tg.begin_with(TxOptions::agent("a").may_touch(["mail:x@y"])).unwrap();
    tx.call(&send, json!({"id": "x@y"})).await.unwrap();
    tx.seal().unwrap();
    let err = tx.commit_with(CommitOptions { wait_timeout: Some(Duration::from_secs(2)) }).await.unwrap_err();
    assert_eq!(err.abort_reason().map(AbortReason::kind), Some("wait_timeout"));
    assert!(err.retryable());
    assert_eq!(w.count("send", "fire"), 0);
}

#[tokio::test]
async fn first_committer_wins_lets_later_commit_first_and_aborts_the_stale_earlier() {
    let tg = Tidegate::builder().ordering(Ordering::FirstCommitterWins).build().unwrap();
    let w = World::new();
    let modify = w.tool("modify", EffectClass::Gated, "retail:order");
    let early = tg.begin_with(TxOptions::agent("e").may_touch(["retail:order:W1"])).unwrap();
    let late = tg.begin_with(TxOptions::agent("l").may_touch(["retail:order:W1"])).unwrap();
    early.read("retail:order:W1").unwrap();
    late.read("retail:order:W1").unwrap();
    early.call(&modify, json!({"id": "W1", "by": "early"})).await.unwrap();
    late.call(&modify, json!({"id": "W1", "by": "late"})).await.unwrap();
    late.seal().unwrap();
    assert!(late.commit().await.unwrap().committed, "no wait behind the earlier epoch");
    early.seal().unwrap();
    let err = early.commit().await.unwrap_err();
    assert_eq!(err.abort_reason().map(AbortReason::kind), Some("stale_read"));
    assert_eq!(w.count("modify", "fire"), 1);
}

#[test]
fn plain_threads_share_one_engine() {
    let tg = Tidegate::in_memory().unwrap();
    let w = World::new();
    let send = w.tool("send", EffectClass::Gated, "retail:order");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (tg, send) = (tg.clone(), send.clone());
            std::thread::spawn(move || {
                for i in 0..50 {
                    let id = format!("T{t}-{}", i % 3);
                    let tx = tg
                        .begin_with(TxOptions::agent(format!("t{t}")).may_touch([format!("retail:order:{id}")]))
                        .unwrap();
                    tx.read(&format!("retail:order:{id}")).unwrap();
                    tx.call_blocking(&send, json!({"id": id})).unwrap();
                    tx.seal().unwrap();
                    let out = tx.commit_blocking().unwrap();
                    assert!(out.committed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(w.count("send", "fire"), 400);
    assert_eq!(tg.stats().committed, 400);
    assert_eq!(tg.stats().unfinished, 0);
    tg.check_integrity().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_agents_on_one_order_never_lose_an_update() {
    // Each agent reads a counter's version, then writes; the engine must serialise them so
    // that every committed writer saw the previous committed write.
    let tg = engine();
    let w = World::new();
    let bump = w.tool("bump", EffectClass::Bufferable, "retail:order");
    let mut handles = Vec::new();
    for a in 0..8 {
        let (tg, bump) = (tg.clone(), bump.clone());
        handles.push(tokio::spawn(async move {
            let mut commits = 0;
            for _ in 0..20 {
                let res = tg
                    .run(TxOptions::agent(format!("a{a}")).may_touch(["retail:order:W1"]), |tx| {
                        let bump = bump.clone();
                        async move {
                            let v = tx.read("retail:order:W1")?.version;
                            tokio::task::yield_now().await;
                            tx.call(&bump, json!({"id": "W1", "seen": v.0})).await?;
                            Ok(v)
                        }
                    })
                    .await;
                if res.is_ok() {
                    commits += 1;
                }
            }
            commits
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    // Every applied write saw a distinct version: no two committed writers read the same one.
    let seen: Vec<u64> = w
        .hits()
        .iter()
        .map(|h| serde_json::from_str::<serde_json::Value>(&h.args).unwrap()["seen"].as_u64().unwrap())
        .collect();
    let mut uniq = seen.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), seen.len(), "two commits read the same version: a lost update");
    assert_eq!(seen.len(), total);
    assert!(total > 100, "most runs commit within the retry budget: {total}");
    let _ = (Tag::Clean, Disposition::Applied);
    tg.check_integrity().unwrap();
}

// Regression: renewals used the engine's lease instead of the transaction's own override,
// so a transaction begun with a one-hour lease was reaped after 30 s of idleness.
#[tokio::test(start_paused = true)]
async fn a_lease_override_is_kept_when_the_lease_renews() {
    let tg = Tidegate::builder().lease(Duration::from_secs(30)).build().unwrap();
    let tx = tg.begin_with(TxOptions::agent("reviewer").lease(Duration::from_secs(3600))).unwrap();
    tokio::time::sleep(Duration::from_secs(3500)).await;
    tx.read("retail:order:W1").unwrap();
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert_eq!(tg.reap().await.unwrap(), 0);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(tg.reap().await.unwrap(), 1);
}

// Regression: a committer registered its waiter after the lock that parked it was released,
// so a wake in between was lost and the commit slept forever.
#[test]
fn a_wake_between_parking_and_waiting_is_not_lost() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let tg = Tidegate::in_memory().unwrap();
        for i in 0..3_000 {
            let a = tg.begin_with(TxOptions::agent("a").may_touch(["retail:order:W1"])).unwrap();
            let b = tg.begin_with(TxOptions::agent("b").may_touch(["retail:order:W1"])).unwrap();
            a.seal().unwrap();
            b.seal().unwrap();
            let later = tokio::spawn(async move { b.commit().await });
            let earlier = tokio::spawn(async move { a.commit().await });
            earlier.await.unwrap().unwrap();
            let done = tokio::time::timeout(Duration::from_secs(5), later).await;
            assert!(done.is_ok(), "iteration {i}: the later commit never woke up");
        }
    });
}

/// The losers of a commit settle in branch order. Runs of losers with nothing to compensate
/// (they only held effects) settle together in one transition, and a loser with a
/// compensation between them still settles in its place, after its compensation ran. A
/// reopen replays the same: every branch is settled, only the winner committed.
#[tokio::test]
async fn losers_settle_in_branch_order_whether_or_not_they_compensate() {
    use std::sync::Arc;

    use tidegate_core::Event;
    use tidegate_storage::{LedgerStore, MemoryStore};

    let w = World::new();
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let book = w.tool("book", EffectClass::Reversible, "travel:hotel");
    let send = w.tool("send", EffectClass::Gated, "mail");
    let spec = tg.speculate(TxOptions::agent("planner"), 7).unwrap();
    // Branches 2 and 5 executed a reversible call (their abort compensates it); the others
    // only queued a gated one. Branch 0 wins.
    let compensating = [2usize, 5];
    for (i, b) in spec.branches().iter().enumerate() {
        if compensating.contains(&i) {
            b.call(&book, json!({"id": format!("b{i}")})).await.unwrap();
        }
        b.call(&send, json!({"id": format!("b{i}@x")})).await.unwrap();
        b.seal().unwrap();
    }
    let ids: Vec<_> = spec.branches().iter().map(|b| b.id()).collect();
    let out = spec.commit_winner(ids[0]).await.unwrap();
    assert!(out.winner.committed);
    let losers: Vec<_> = out.losers.iter().map(|o| o.tx).collect();
    assert_eq!(losers, ids[1..], "the losers' outcomes come in branch order");
    assert!(out.losers.iter().all(|o| !o.committed && o.is_clean()), "{:?}", out.losers);
    assert_eq!(w.count("book", "compensate"), compensating.len());
    assert_eq!(w.count("send", "fire"), 1, "only the winner's gated call was sent");

    // In the ledger: every loser settles before the winner, in branch order, and each
    // compensating loser's compensation comes before its own settlement.
    let mut settled = Vec::new();
    let mut compensated_before = Vec::new();
    store
        .scan(1, &mut |_, e| {
            match e {
                Event::Settled { tx, .. } => settled.push(*tx),
                Event::Compensated { tx, .. } => compensated_before.push((*tx, settled.len())),
                _ => {}
            }
            true
        })
        .unwrap();
    let mut expected = ids[1..].to_vec();
    expected.push(ids[0]);
    assert_eq!(settled, expected);
    for (tx, settled_so_far) in compensated_before {
        let place = ids[1..].iter().position(|l| *l == tx).expect("a loser compensated");
        assert_eq!(settled_so_far, place, "{tx} compensated right before its own settlement");
    }
    let before = tg.stats();
    assert_eq!((before.committed, before.aborted, before.unfinished), (1, 6, 0));
    drop(tg);

    let reopened = Tidegate::builder().store(Arc::new(MemoryStore::from_events(store.events()))).build().unwrap();
    let after = reopened.stats();
    assert_eq!((after.committed, after.aborted, after.unfinished), (1, 6, 0), "the replay settles the same");
}
