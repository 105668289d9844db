//! Replay refuses impossible histories (issue 11): a ledger that was edited, reordered,
//! duplicated, renumbered or forged is refused with an error naming the LSN and the rule it
//! breaks, never replayed into a state the engine can never be in (a duplicated `begin` hung
//! the next run), and never wraps a counter.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tidegate_core::engine::{
    AbortPlan, BeginRequest, Decision, ExecResult, Recorded, RecoverError, Recovery, Replay, ReplayRule, Settlement,
};
use tidegate_core::{
    AbortReason, CallOutcome, Core, CoreConfig, EffectClass, EffectDecl, EngineError, Epoch, Event, GroupId,
    ScopeRegistry, Timestamp, TxId, TxState,
};

fn reg() -> ScopeRegistry {
    ScopeRegistry::default()
}

fn recover(events: &[Event]) -> Result<(Core, Recovery), RecoverError> {
    Core::recover(CoreConfig::default(), reg(), events.iter().cloned(), Timestamp(0))
}

fn refused(events: &[Event]) -> RecoverError {
    match recover(events) {
        Ok(_) => panic!("an impossible ledger was accepted: {events:#?}"),
        Err(e) => e,
    }
}

fn decl(tool: &str, class: EffectClass, scope: &str, key: Option<&str>) -> EffectDecl {
    EffectDecl {
        tool: tool.into(),
        class,
        scopes: vec![reg().parse(scope).unwrap()],
        key: key.map(Arc::from),
        args: Arc::new(json!({"to": scope})),
        compensable: true,
        call_id: None,
    }
}

fn run_abort(c: &mut Core, plan: AbortPlan) {
    for t in plan.compensations {
        c.compensated(plan.tx, t.effect, Ok(None)).unwrap();
    }
    c.finish_abort(plan.tx).unwrap();
}

/// Commits `tx` (sealed already or open), releasing everything it holds.
fn commit(c: &mut Core, tx: TxId, now: Timestamp) {
    if c.state(tx).unwrap() == TxState::Open {
        c.seal(tx, now).unwrap();
    }
    c.request_commit(tx).unwrap();
    match c.try_commit(tx, now).unwrap() {
        Decision::Commit(plan) => {
            for r in plan.releases {
                c.release_started(tx, r.effect).unwrap();
                c.release_done(tx, r.effect, CallOutcome::done(json!("sent"))).unwrap();
            }
            assert!(matches!(c.finish_commit(tx).unwrap(), Settlement::Committed(_)));
        }
        other => panic!("{tx} could not commit: {other:?}"),
    }
}

/// A small valid ledger: tx-1 (declared) reads, runs an eager effect and holds a gated one,
/// commits; tx-2 (undeclared) runs an eager effect and aborts.
fn small_ledger() -> Vec<Event> {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(1);
    let s = reg().parse("kv:x").unwrap();
    let a = c.begin(BeginRequest { agent: "a".into(), may_touch: Some(vec![s.clone()]), lease: None }, now).unwrap();
    c.read(a.tx, &s, now).unwrap();
    let Recorded::Execute(e) = c.record_effect(a.tx, decl("set", EffectClass::Reversible, "kv:x", None), now).unwrap()
    else {
        panic!()
    };
    c.executed(a.tx, e, CallOutcome::done(json!(1))).unwrap();
    c.record_effect(a.tx, decl("mail", EffectClass::Gated, "kv:x", Some("k1")), now).unwrap();
    commit(&mut c, a.tx, now);
    let b = c.begin(BeginRequest::default(), now).unwrap();
    let Recorded::Execute(e) = c.record_effect(b.tx, decl("set", EffectClass::Reversible, "kv:y", None), now).unwrap()
    else {
        panic!()
    };
    c.executed(b.tx, e, CallOutcome::done(json!(2))).unwrap();
    let plan = c.abort(b.tx, AbortReason::Explicit { reason: "x".into() }).unwrap();
    run_abort(&mut c, plan);
    c.take_events().collect()
}

fn pos(events: &[Event], f: impl Fn(&Event) -> bool) -> usize {
    events.iter().position(f).unwrap()
}

fn assert_rule(err: &RecoverError, rule: ReplayRule, lsn: usize) {
    assert_eq!((err.rule, err.lsn), (rule, lsn as u64), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("LSN {lsn}")) && msg.contains(rule.as_str()), "{msg}");
    assert!(!err.retryable());
}

#[test]
fn the_small_ledger_replays() {
    let (core, rec) = recover(&small_ledger()).unwrap();
    core.check_integrity().unwrap();
    assert_eq!(rec.unfinished, 0);
}

/// Regression (issue 11, finding 2): a copied `begin` row passed `verify` and hung the next run.
#[test]
fn duplicate_begin_is_refused() {
    let mut l = small_ledger();
    let b = pos(&l, |e| matches!(e, Event::Begin { .. }));
    l.insert(b + 1, l[b].clone());
    assert_rule(&refused(&l), ReplayRule::DuplicateBegin, b + 2);
    // The same begin again after the transaction settled: an id used twice.
    let mut l = small_ledger();
    let b = pos(&l, |e| matches!(e, Event::Begin { .. }));
    let begin = l[b].clone();
    l.push(begin);
    let n = l.len();
    assert_rule(&refused(&l), ReplayRule::TxIdNotIncreasing, n);
}

#[test]
fn event_for_finished_tx_is_refused() {
    let mut l = small_ledger();
    let s = pos(&l, |e| matches!(e, Event::Settled { .. }));
    let tx = l[s].tx();
    l.insert(s + 1, Event::Sealed { tx });
    assert_rule(&refused(&l), ReplayRule::FinishedTx, s + 2);
    let mut l = small_ledger();
    l.push(Event::Read { tx, scope: "kv:x".into(), version: tidegate_core::Version(0) });
    let n = l.len();
    assert_rule(&refused(&l), ReplayRule::FinishedTx, n);
}

#[test]
fn event_for_unknown_tx_is_refused() {
    let mut l = small_ledger();
    l.insert(3, Event::Sealed { tx: TxId(99) });
    assert_rule(&refused(&l), ReplayRule::UnknownTx, 4);
}

#[test]
fn epoch_goes_backwards_is_refused() {
    let mut l = small_ledger();
    let second = l.iter().enumerate().filter(|(_, e)| matches!(e, Event::Begin { .. })).nth(1).unwrap().0;
    if let Event::Begin { epoch, .. } = &mut l[second] {
        *epoch = Epoch(1);
    }
    assert_rule(&refused(&l), ReplayRule::EpochNotIncreasing, second + 1);
}

#[test]
fn tx_id_goes_backwards_is_refused() {
    let mut l = small_ledger();
    // Renumber the second transaction to an id below the first one's.
    let second = l.iter().enumerate().filter(|(_, e)| matches!(e, Event::Begin { .. })).nth(1).unwrap().0;
    if let Event::Begin { tx, .. } = &mut l[second] {
        *tx = TxId(0);
    }
    assert_rule(&refused(&l), ReplayRule::TxIdNotIncreasing, second + 1);
}

#[test]
fn commit_stamp_goes_backwards_is_refused() {
    let mut l = small_ledger();
    let d = pos(&l, |e| matches!(e, Event::Decided { commit: true, .. }));
    // A second, later commit decision at the same stamp.
    let stamp = match &l[d] {
        Event::Decided { stamp, .. } => stamp.unwrap(),
        _ => unreachable!(),
    };
    let t = TxId(3);
    l.push(Event::Begin {
        tx: t,
        epoch: Epoch(3),
        agent: "a".into(),
        group: None,
        may_touch: Some(vec![]),
        lease_until: Timestamp(9),
    });
    l.push(Event::Sealed { tx: t });
    l.push(Event::Decided { tx: t, commit: true, stamp: Some(stamp), reason: None, at: None });
    let n = l.len();
    assert_rule(&refused(&l), ReplayRule::StampNotIncreasing, n);
}

#[test]
fn read_of_a_version_above_every_stamp_is_refused() {
    let mut l = small_ledger();
    let r = pos(&l, |e| matches!(e, Event::Read { .. }));
    if let Event::Read { version, .. } = &mut l[r] {
        *version = tidegate_core::Version(7);
    }
    assert_rule(&refused(&l), ReplayRule::StampNotIncreasing, r + 1);
}

fn begin_at(tx: u64, epoch: u64) -> Event {
    Event::Begin {
        tx: TxId(tx),
        epoch: Epoch(epoch),
        agent: "a".into(),
        group: None,
        may_touch: None,
        lease_until: Timestamp(1),
    }
}

#[test]
fn u64_max_stamp_is_refused() {
    let l = vec![
        begin_at(1, 1),
        Event::Sealed { tx: TxId(1) },
        Event::Decided { tx: TxId(1), commit: true, stamp: Some(u64::MAX), reason: None, at: None },
    ];
    assert_rule(&refused(&l), ReplayRule::Overflow, 3);
}

#[test]
fn u64_max_tx_id_and_epoch_are_refused() {
    assert_rule(&refused(&[begin_at(u64::MAX, 1)]), ReplayRule::Overflow, 1);
    assert_rule(&refused(&[begin_at(1, u64::MAX)]), ReplayRule::Overflow, 1);
    let mut g = begin_at(1, 1);
    if let Event::Begin { group, .. } = &mut g {
        *group = Some(GroupId(u64::MAX));
    }
    assert_rule(&refused(&[g]), ReplayRule::Overflow, 1);
}

#[test]
fn u64_max_registry_version_is_refused() {
    let l = [Event::ToolChanged { tool: "t".into(), version: u64::MAX, present: true }];
    assert_rule(&refused(&l), ReplayRule::Overflow, 1);
    let l = [
        Event::ToolChanged { tool: "t".into(), version: 5, present: true },
        Event::ToolChanged { tool: "t".into(), version: 5, present: false },
    ];
    assert_rule(&refused(&l), ReplayRule::StampNotIncreasing, 2);
}

/// Values just below the end replay, and the live engine then refuses to allocate past them
/// with a clear error instead of wrapping (in release builds `u64::MAX + 1` wrapped to 0).
#[test]
fn values_next_to_u64_max_never_wrap_live() {
    let (mut c, _) = recover(&[begin_at(u64::MAX - 1, 5)]).unwrap();
    let err = c.begin(BeginRequest::default(), Timestamp(0)).unwrap_err();
    assert!(matches!(err, EngineError::Exhausted { counter: "transaction id", .. }), "{err}");
    assert!(err.to_string().contains("u64::MAX") && !err.retryable(), "{err}");
    assert!(c.begin_group("a".into(), 2, None, Timestamp(0)).is_err());

    let (mut c, _) = recover(&[begin_at(1, u64::MAX - 1)]).unwrap();
    let err = c.begin(BeginRequest::default(), Timestamp(0)).unwrap_err();
    assert!(matches!(err, EngineError::Exhausted { counter: "epoch", .. }), "{err}");

    let l = vec![
        begin_at(1, 1),
        Event::Sealed { tx: TxId(1) },
        Event::Decided { tx: TxId(1), commit: true, stamp: Some(u64::MAX - 1), reason: None, at: None },
        Event::Settled { tx: TxId(1), committed: true, effects: vec![] },
        Event::ToolChanged { tool: "t".into(), version: u64::MAX - 1, present: true },
    ];
    let (mut c, _) = recover(&l).unwrap();
    let t = c.begin(BeginRequest::default(), Timestamp(0)).unwrap().tx;
    c.seal(t, Timestamp(0)).unwrap();
    c.request_commit(t).unwrap();
    let err = c.try_commit(t, Timestamp(0)).unwrap_err();
    assert!(matches!(err, EngineError::Exhausted { counter: "commit stamp", .. }), "{err}");
    assert_eq!(c.state(t).unwrap(), TxState::Waiting, "a refused decision changes nothing");
    let err = c.define_tool(&Arc::from("u")).unwrap_err();
    assert!(matches!(err, EngineError::Exhausted { counter: "tool registry version", .. }), "{err}");
}

#[test]
fn transitions_not_allowed_from_the_current_state_are_refused() {
    let l = small_ledger();
    let sealed = pos(&l, |e| matches!(e, Event::Sealed { .. }));
    let tx = l[sealed].tx();
    // A read after seal.
    let mut m = l.clone();
    m.insert(sealed + 1, Event::Read { tx, scope: "kv:x".into(), version: tidegate_core::Version(0) });
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, sealed + 2);
    // Sealed twice.
    let mut m = l.clone();
    m.insert(sealed + 1, Event::Sealed { tx });
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, sealed + 2);
    // Executed twice.
    let x = pos(&l, |e| matches!(e, Event::EffectExecuted { .. }));
    let mut m = l.clone();
    m.insert(x + 1, l[x].clone());
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, x + 2);
    // A release started twice.
    let r = pos(&l, |e| matches!(e, Event::ReleaseStarted { .. }));
    let mut m = l.clone();
    m.insert(r + 2, l[r].clone());
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, r + 3);
    // Settled as aborted while committing.
    let s = pos(&l, |e| matches!(e, Event::Settled { .. }));
    let mut m = l.clone();
    if let Event::Settled { committed, .. } = &mut m[s] {
        *committed = false;
    }
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, s + 1);
    // A compensation of an effect of a committing transaction.
    let mut m = l.clone();
    m.insert(s, Event::Compensated { tx, effect: tidegate_core::EffectId(0), residue: None, error: None });
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, s + 1);
    // Decided twice.
    let d = pos(&l, |e| matches!(e, Event::Decided { .. }));
    let mut m = l.clone();
    let Event::Decided { stamp: Some(stamp), .. } = l[d] else { panic!() };
    m.insert(d + 1, Event::Decided { tx, commit: true, stamp: Some(stamp + 1), reason: None, at: None });
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, d + 2);
    // An abort after something was released is not a retraction.
    let rel = pos(&l, |e| matches!(e, Event::Released { .. }));
    let mut m = l.clone();
    m.insert(rel + 1, Event::Decided { tx, commit: false, stamp: None, reason: None, at: None });
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, rel + 2);
    // A seal with a call in flight.
    let mut m = l.clone();
    m.remove(x);
    assert_rule(&refused(&m), ReplayRule::IllegalTransition, sealed);
}

#[test]
fn effects_out_of_issuance_order_and_reads_outside_may_touch_are_refused() {
    let l = small_ledger();
    let r = pos(&l, |e| matches!(e, Event::EffectRecorded { .. }));
    let mut m = l.clone();
    if let Event::EffectRecorded { effect, .. } = &mut m[r] {
        *effect = tidegate_core::EffectId(3);
    }
    assert_rule(&refused(&m), ReplayRule::EffectOrder, r + 1);
    let read = pos(&l, |e| matches!(e, Event::Read { .. }));
    let mut m = l.clone();
    if let Event::Read { scope, .. } = &mut m[read] {
        *scope = "kv:elsewhere".into();
    }
    assert_rule(&refused(&m), ReplayRule::BadScope, read + 1);
    let mut m = l.clone();
    if let Event::Read { scope, .. } = &mut m[read] {
        *scope = "no type".into();
    }
    assert_rule(&refused(&m), ReplayRule::BadScope, read + 1);
}

#[test]
fn a_second_branch_of_a_group_to_commit_is_refused() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let g = c.begin_group("a".into(), 2, None, now).unwrap();
    c.choose_winner(g.group, g.branches[0]).unwrap().into_iter().for_each(|p| run_abort(&mut c, p));
    commit(&mut c, g.branches[0], now);
    let mut l: Vec<Event> = c.take_events().collect();
    recover(&l).unwrap();
    // Forge: the loser also seals and commits instead of aborting.
    let loser = g.branches[1];
    let d = pos(&l, |e| matches!(e, Event::Decided { tx, .. } if *tx == loser));
    l.truncate(d);
    l.push(Event::Sealed { tx: loser });
    l.push(Event::Decided { tx: loser, commit: true, stamp: Some(1), reason: None, at: None });
    l.push(Event::Sealed { tx: g.branches[0] });
    l.push(Event::Decided { tx: g.branches[0], commit: true, stamp: Some(2), reason: None, at: None });
    let n = l.len();
    assert_rule(&refused(&l), ReplayRule::IllegalTransition, n);
    // A branch begun after other events joins a group that is no longer being begun.
    let mut l: Vec<Event> = {
        let mut c = Core::new(CoreConfig::default());
        let g = c.begin_group("a".into(), 1, None, now).unwrap();
        c.seal(g.branches[0], now).unwrap();
        c.take_events().collect()
    };
    l.push(Event::Begin {
        tx: TxId(2),
        epoch: Epoch(1),
        agent: "a".into(),
        group: Some(GroupId(1)),
        may_touch: None,
        lease_until: Timestamp(0),
    });
    assert_rule(&refused(&l), ReplayRule::GroupOrder, 3);
}

/// A call in flight when its transaction aborted returns after the settlement: its executed
/// record and its compensation come for a finished transaction and replay (they used to be
/// refused as events for a transaction "not open at this point").
#[test]
fn late_results_after_settlement_replay() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    let Recorded::Execute(e) =
        c.record_effect(t, decl("set", EffectClass::Reversible, "kv:x", Some("k")), now).unwrap()
    else {
        panic!()
    };
    let plan = c.abort(t, AbortReason::Explicit { reason: "x".into() }).unwrap();
    run_abort(&mut c, plan);
    let ExecResult::Late(task) = c.executed(t, e, CallOutcome::done(json!(1))).unwrap() else { panic!() };
    c.late_compensated(t, task.effect, Ok(None), false);
    let l: Vec<Event> = c.take_events().collect();
    let (mut rebuilt, _) = recover(&l).unwrap();
    rebuilt.check_integrity().unwrap();
    assert_eq!(rebuilt.stats().keys, c.stats().keys, "the clean late compensation freed the key on replay too");
    // The key can be used again, as it can live.
    let t2 = rebuilt.begin(BeginRequest::default(), now).unwrap().tx;
    rebuilt.record_effect(t2, decl("set", EffectClass::Reversible, "kv:x", Some("k")), now).unwrap();
    // The late result twice is one too many.
    let x = pos(&l, |ev| matches!(ev, Event::EffectExecuted { .. }));
    let mut m = l.clone();
    m.insert(x + 1, l[x].clone());
    assert_rule(&refused(&m), ReplayRule::FinishedTx, x + 2);
}

// ---------------------------------------------------------------------------------------
// Randomized: mutated ledgers are refused or replay to a consistent, live state.
// ---------------------------------------------------------------------------------------

const SCOPES: [&str; 4] = ["kv:a", "kv:a:1", "kv:b", "mail:x"];
const CLASSES: [EffectClass; 4] =
    [EffectClass::Reversible, EffectClass::Bufferable, EffectClass::Gated, EffectClass::Idempotent];

/// A random valid ledger, written by driving the core.
fn workload(seed: u64) -> Vec<Event> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut c = Core::new(CoreConfig::default());
    let mut out = Vec::new();
    let mut open: Vec<TxId> = Vec::new();
    let mut late: Vec<(TxId, tidegate_core::EffectId)> = Vec::new();
    for step in 0..rng.gen_range(20..70u64) {
        let now = Timestamp(step);
        match rng.gen_range(0..12) {
            0..=1 => {
                let may_touch =
                    rng.gen_bool(0.6).then(|| vec![reg().parse("kv:a").unwrap(), reg().parse("mail:x").unwrap()]);
                open.push(c.begin(BeginRequest { agent: "a".into(), may_touch, lease: None }, now).unwrap().tx);
            }
            2 => {
                let g = c.begin_group("g".into(), rng.gen_range(1..4), None, now).unwrap();
                let w = g.branches[rng.gen_range(0..g.branches.len())];
                if rng.gen_bool(0.5) {
                    for p in c.choose_winner(g.group, w).unwrap() {
                        run_abort(&mut c, p);
                    }
                    open.push(w);
                } else {
                    for p in c.abort_group(g.group, AbortReason::Explicit { reason: "g".into() }).unwrap() {
                        run_abort(&mut c, p);
                    }
                }
            }
            3 => {
                let _ = c.define_tool(&Arc::from(format!("t{}", rng.gen_range(0..3))));
            }
            4..=6 if !open.is_empty() => {
                let tx = open[rng.gen_range(0..open.len())];
                let scope = reg().parse(SCOPES[rng.gen_range(0..SCOPES.len())]).unwrap();
                if rng.gen_bool(0.3) {
                    let _ = c.read(tx, &scope, now);
                } else {
                    let key = rng.gen_bool(0.3).then(|| Arc::from(format!("k{}", rng.gen_range(0..3))));
                    let d = EffectDecl {
                        tool: format!("t{}", rng.gen_range(0..3)).into(),
                        class: CLASSES[rng.gen_range(0..CLASSES.len())],
                        scopes: vec![scope],
                        key,
                        args: Arc::new(json!(step)),
                        compensable: rng.gen_bool(0.8),
                        call_id: None,
                    };
                    if let Ok(Recorded::Execute(e)) = c.record_effect(tx, d, now) {
                        if rng.gen_bool(0.85) {
                            let r = if rng.gen_bool(0.1) {
                                if rng.gen_bool(0.5) {
                                    CallOutcome::unknown("down")
                                } else {
                                    CallOutcome::not_applied("down", false)
                                }
                            } else {
                                CallOutcome::done(json!(1))
                            };
                            if let Ok(ExecResult::Aborted(plan)) = c.executed(tx, e, r) {
                                run_abort(&mut c, plan);
                            }
                        } else {
                            late.push((tx, e));
                        }
                    }
                }
            }
            7..=8 if !open.is_empty() => {
                let tx = open[rng.gen_range(0..open.len())];
                if c.state(tx) == Ok(TxState::Open) && c.seal(tx, now).is_ok() {
                    let _ = c.request_commit(tx);
                }
                if c.state(tx) == Ok(TxState::Waiting) {
                    match c.try_commit(tx, now).unwrap() {
                        Decision::Wait => {}
                        Decision::Abort(plan) => run_abort(&mut c, plan),
                        Decision::Commit(plan) => {
                            for r in plan.releases {
                                c.release_started(tx, r.effect).unwrap();
                                let res = if rng.gen_bool(0.1) {
                                    CallOutcome::not_applied("bounce", false)
                                } else {
                                    CallOutcome::done(json!(0))
                                };
                                let failed = !matches!(res, CallOutcome::Done { .. });
                                c.release_done(tx, r.effect, res).unwrap();
                                if failed {
                                    break;
                                }
                            }
                            if let Settlement::Abort(plan) = c.finish_commit(tx).unwrap() {
                                run_abort(&mut c, plan);
                            }
                        }
                    }
                }
            }
            9 if !late.is_empty() => {
                // A call that was left running returns (perhaps after its transaction aborted).
                let (tx, e) = late.swap_remove(rng.gen_range(0..late.len()));
                match c.executed(tx, e, CallOutcome::done(json!("late"))) {
                    Ok(ExecResult::Late(task)) => c.late_compensated(tx, task.effect, Ok(None), false),
                    Ok(ExecResult::Aborted(plan)) => run_abort(&mut c, plan),
                    _ => {}
                }
            }
            _ if !open.is_empty() => {
                let tx = open[rng.gen_range(0..open.len())];
                if matches!(c.state(tx), Ok(TxState::Open | TxState::Sealed | TxState::Waiting))
                    && let Ok(plan) = c.abort(tx, AbortReason::Explicit { reason: "x".into() })
                {
                    run_abort(&mut c, plan);
                }
            }
            _ => {}
        }
        for a in c.take_actions().collect::<Vec<_>>() {
            if let tidegate_core::Action::RunAbort(plan) = a {
                run_abort(&mut c, plan);
            }
        }
        out.extend(c.take_events());
    }
    out
}

/// Finishes every transaction a recovery left, as the runtime would, then checks that a new
/// undeclared transaction commits at once: nothing recovered blocks anything forever.
fn drive_to_quiescence(mut c: Core, rec: Recovery) -> Result<(), String> {
    let fail = |what: &str, e: EngineError| format!("{what}: {e}");
    for d in rec.in_doubt {
        if let ExecResult::Aborted(plan) =
            c.executed(d.tx, d.effect, CallOutcome::unknown("unknown")).map_err(|e| fail("in doubt", e))?
        {
            run_abort(&mut c, plan);
        }
    }
    for tx in rec.committing {
        for r in c.unknown_releases(tx).map_err(|e| fail("unknown releases", e))? {
            c.release_probed(tx, r.effect, CallOutcome::not_applied("probe: no", false))
                .map_err(|e| fail("probe", e))?;
        }
        let plan = c.resume_commit(tx).map_err(|e| fail("resume commit", e))?;
        for r in plan.releases {
            c.release_started(tx, r.effect).map_err(|e| fail("release started", e))?;
            c.release_done(tx, r.effect, CallOutcome::done(json!(0))).map_err(|e| fail("release", e))?;
        }
        if let Settlement::Abort(plan) = c.finish_commit(tx).map_err(|e| fail("finish commit", e))? {
            run_abort(&mut c, plan);
        }
    }
    for tx in rec.aborting {
        let plan = c.resume_abort(tx).map_err(|e| fail("resume abort", e))?;
        run_abort(&mut c, plan);
    }
    for tx in rec.open {
        if matches!(c.state(tx), Ok(TxState::Open | TxState::Sealed))
            && let Ok(plan) = c.abort(tx, AbortReason::LeaseExpired)
        {
            run_abort(&mut c, plan);
        }
    }
    for a in c.take_actions().collect::<Vec<_>>() {
        if let tidegate_core::Action::RunAbort(plan) = a {
            run_abort(&mut c, plan);
        }
    }
    c.check_integrity()?;
    if c.stats().unfinished != 0 {
        return Err(format!("{} transactions left unfinished", c.stats().unfinished));
    }
    // A ledger forged next to u64::MAX may leave no id or stamp to hand out: that is a clear
    // error, not a hang.
    let t = match c.begin(BeginRequest::default(), Timestamp(0)) {
        Ok(b) => b.tx,
        Err(EngineError::Exhausted { .. }) => return Ok(()),
        Err(e) => return Err(fail("begin", e)),
    };
    c.seal(t, Timestamp(0)).map_err(|e| fail("seal", e))?;
    c.request_commit(t).map_err(|e| fail("request commit", e))?;
    match c.try_commit(t, Timestamp(0)) {
        Ok(Decision::Commit(_)) | Err(EngineError::Exhausted { .. }) => Ok(()),
        Err(e) => Err(fail("decide", e)),
        Ok(other) => Err(format!("a new transaction on an idle engine could not commit: {other:?}")),
    }
}

fn state_of(events: &[Event]) -> Result<serde_json::Value, RecoverError> {
    let mut r = Replay::new(CoreConfig::default(), reg());
    for e in events {
        r.apply(e)?;
    }
    Ok(r.state().unwrap())
}

/// One mutation of a ledger; `true` if it leaves the ledger unchanged.
fn mutate(l: &mut Vec<Event>, rng: &mut SmallRng) -> (&'static str, bool) {
    let n = l.len();
    let i = rng.gen_range(0..n);
    match rng.gen_range(0..9) {
        0 => {
            let e = l[i].clone();
            let at = rng.gen_range(i..=n);
            l.insert(at, e);
            ("duplicate", false)
        }
        1 => {
            let j = rng.gen_range(0..n);
            l.swap(i, j);
            ("swap", i == j || l[i] == l[j])
        }
        2 => {
            let e = l.remove(i);
            let at = rng.gen_range(0..n);
            l.insert(at, e);
            ("move", at == i)
        }
        3 => {
            l.remove(i);
            ("drop", false)
        }
        4 => {
            // Renumber one event's transaction.
            let to = TxId(rng.gen_range(0..6));
            let same = l[i].tx() == to;
            set_tx(&mut l[i], to);
            ("renumber tx", same || matches!(l[i], Event::ToolChanged { .. }))
        }
        5 => {
            // Renumber every event of one transaction (a consistent renumbering).
            let from = l[i].tx();
            let to = TxId(rng.gen_range(1..12));
            for e in l.iter_mut().filter(|e| e.tx() == from) {
                set_tx(e, to);
            }
            ("renumber all of a tx", from == to || from == TxId(0))
        }
        6 => {
            let bump = |v: u64, rng: &mut SmallRng| {
                if rng.gen_bool(0.5) { v.saturating_sub(rng.gen_range(1..3)) } else { v + rng.gen_range(0..3) }
            };
            let same = match &mut l[i] {
                Event::Begin { epoch, .. } => {
                    let old = *epoch;
                    *epoch = Epoch(bump(epoch.0, rng));
                    old == *epoch
                }
                Event::Decided { stamp: Some(s), .. } => {
                    let old = *s;
                    *s = bump(*s, rng);
                    old == *s
                }
                Event::ToolChanged { version, .. } => {
                    let old = *version;
                    *version = bump(*version, rng);
                    old == *version
                }
                _ => true,
            };
            ("renumber epoch/stamp/version", same)
        }
        7 => {
            let huge = match &mut l[i] {
                Event::Begin { tx, .. } => {
                    *tx = TxId(u64::MAX - rng.gen_range(0..2));
                    true
                }
                Event::Decided { stamp: Some(s), .. } => {
                    *s = u64::MAX - rng.gen_range(0..2);
                    true
                }
                _ => false,
            };
            ("near u64::MAX", !huge)
        }
        _ => {
            let j = rng.gen_range(0..n);
            let e = l[j].clone();
            let same = l[i] == e;
            l[i] = e;
            ("overwrite", same)
        }
    }
}

fn set_tx(e: &mut Event, to: TxId) {
    match e {
        Event::Begin { tx, .. }
        | Event::Read { tx, .. }
        | Event::EffectRecorded { tx, .. }
        | Event::EffectExecuted { tx, .. }
        | Event::EffectFailed { tx, .. }
        | Event::Sealed { tx }
        | Event::Decided { tx, .. }
        | Event::ReleaseStarted { tx, .. }
        | Event::Released { tx, .. }
        | Event::Compensated { tx, .. }
        | Event::Settled { tx, .. } => *tx = to,
        _ => {}
    }
}

/// Every mutated ledger is either refused with an error naming an LSN of the ledger, or
/// replays to a consistent state from which recovery finishes everything and a new
/// transaction commits (no hang); a no-op mutation replays to exactly the original state.
/// `TIDEGATE_REPLAY_MUTATIONS` sets the number of variants (default 600).
#[test]
fn mutated_ledgers_are_refused_or_replay_consistently() {
    let total: usize = std::env::var("TIDEGATE_REPLAY_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let mut rng = SmallRng::seed_from_u64(0x11);
    let (mut refused_n, mut accepted, mut noops) = (0, 0, 0);
    let mut by_rule = std::collections::BTreeMap::<&str, usize>::new();
    let mut variant = 0;
    let mut seed = 0;
    while variant < total {
        seed += 1;
        let original = workload(seed);
        if original.len() < 4 {
            continue;
        }
        let base = state_of(&original).unwrap_or_else(|e| panic!("seed {seed}: the valid ledger was refused: {e}"));
        for _ in 0..12 {
            variant += 1;
            let mut l = original.clone();
            let mut noop = true;
            let mut what = Vec::new();
            for _ in 0..rng.gen_range(1..3) {
                let (w, same) = mutate(&mut l, &mut rng);
                what.push(w);
                noop &= same;
            }
            let ctx = format!("seed {seed} variant {variant} ({what:?})");
            match recover(&l) {
                Err(e) => {
                    assert!(!noop, "{ctx}: a no-op mutation was refused: {e}");
                    assert!(e.lsn >= 1 && e.lsn as usize <= l.len(), "{ctx}: {e}");
                    assert!(e.to_string().contains(&format!("LSN {}", e.lsn)), "{ctx}: {e}");
                    *by_rule.entry(e.rule.as_str()).or_default() += 1;
                    refused_n += 1;
                }
                Ok((core, rec)) => {
                    core.check_integrity().unwrap_or_else(|e| panic!("{ctx}: accepted but inconsistent: {e}"));
                    if noop {
                        assert_eq!(state_of(&l).unwrap(), base, "{ctx}: a no-op mutation changed the state");
                        noops += 1;
                    }
                    drive_to_quiescence(core, rec).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    accepted += 1;
                }
            }
        }
    }
    eprintln!("{variant} variants: {refused_n} refused {by_rule:?}, {accepted} accepted ({noops} no-ops)");
    assert!(refused_n > variant / 3, "most mutations break a rule: {refused_n} of {variant}");
}

/// Valid ledgers themselves are never refused, and every prefix of one replays (a crash can
/// cut the ledger anywhere).
#[test]
fn valid_ledgers_and_their_prefixes_replay() {
    for seed in 0..150 {
        let l = workload(seed);
        for cut in 0..=l.len() {
            let (core, rec) = recover(&l[..cut]).unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            core.check_integrity().unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            drive_to_quiescence(core, rec).unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
        }
    }
}

/// Regression (issue 10 item 6): a 20,000-segment scope overflowed the stack of the scope
/// index. Live parsing refuses it now, but a ledger written before the limits may hold one,
/// and replay accepts logged scopes beyond the live limits: it replays, commits and settles
/// on a small stack.
#[test]
fn a_twenty_thousand_segment_logged_scope_replays_without_stack_overflow() {
    let deep: Arc<str> = format!("fs:/{}", vec!["a"; 20_000].join("/")).into();
    let run = move || {
        let t = TxId(1);
        let l = vec![
            Event::Begin {
                tx: t,
                epoch: Epoch(1),
                agent: "a".into(),
                group: None,
                may_touch: Some(vec![deep.to_string()]),
                lease_until: Timestamp(9),
            },
            Event::Read { tx: t, scope: deep.clone(), version: tidegate_core::Version(0) },
            Event::EffectRecorded {
                tx: t,
                effect: tidegate_core::EffectId(0),
                tool: "w".into(),
                class: EffectClass::Bufferable,
                scopes: vec![deep.clone()],
                key: "w:1:0".into(),
                args: Arc::new(json!(1)),
                compensable: false,
                adapter_key: false,
                compensation: None,
            },
            Event::Sealed { tx: t },
        ];
        let (mut c, rec) = recover(&l).unwrap();
        c.check_integrity().unwrap();
        assert_eq!(rec.open, vec![t]);
        c.request_commit(t).unwrap();
        let Decision::Commit(plan) = c.try_commit(t, Timestamp(0)).unwrap() else { panic!() };
        for r in plan.releases {
            c.release_started(t, r.effect).unwrap();
            c.release_done(t, r.effect, CallOutcome::done(json!(0))).unwrap();
        }
        assert!(matches!(c.finish_commit(t).unwrap(), Settlement::Committed(_)));
        let s = reg().parse_logged(&deep).unwrap();
        assert_eq!(c.version(&s), tidegate_core::Version(1));
        drop(c);
    };
    std::thread::Builder::new().stack_size(512 * 1024).spawn(run).unwrap().join().unwrap();
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A checkpoint written before replay kept its guard and dirty marks still loads: the marks
/// are rebuilt from the transactions, and late records for transactions settled before it
/// are accepted as that build accepted them.
#[test]
fn a_checkpoint_from_before_the_replay_guard_loads_and_accepts_late_records() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    let Recorded::Execute(e) = c.record_effect(t, decl("set", EffectClass::Reversible, "kv:x", None), now).unwrap()
    else {
        panic!()
    };
    let plan = c.abort(t, AbortReason::Explicit { reason: "x".into() }).unwrap();
    run_abort(&mut c, plan);
    let open = c.begin(BeginRequest::default(), now).unwrap().tx;
    c.record_effect(open, decl("set", EffectClass::Reversible, "kv:y", None), now).unwrap();
    let head: Vec<Event> = c.take_events().collect();
    let ExecResult::Late(task) = c.executed(t, e, CallOutcome::done(json!(1))).unwrap() else { panic!() };
    c.late_compensated(t, task.effect, Ok(None), false);
    let tail: Vec<Event> = c.take_events().collect();

    let mut r = Replay::new(CoreConfig::default(), reg());
    for ev in &head {
        r.apply(ev).unwrap();
    }
    let bytes = r.checkpoint().unwrap();
    let nl = bytes.iter().position(|&b| b == b'\n').unwrap();
    let mut state: serde_json::Value = serde_json::from_slice(&bytes[nl + 1..]).unwrap();
    let obj = state.as_object_mut().unwrap();
    assert!(obj.remove("guard").is_some() && obj.remove("dirty").is_some() && obj.remove("dirty_epochs").is_some());
    let state = serde_json::to_vec(&state).unwrap();
    let old = format!(
        "tidegate-checkpoint {{\"format\":1,\"ledger_format\":2,\"lsn\":{},\"len\":{},\"fnv1a64\":\"{:016x}\"}}\n",
        head.len(),
        state.len(),
        fnv1a64(&state)
    );
    let old = [old.into_bytes(), state].concat();
    for bytes in [bytes, old] {
        let mut r = Replay::load(CoreConfig::default(), reg(), head.len() as u64, &bytes).unwrap();
        for ev in &tail {
            r.apply(ev).unwrap();
        }
        let (core, _) = r.finish(Timestamp(0));
        core.check_integrity().unwrap();
    }
}

/// A finished key loaded from a checkpoint (its output kept as JSON text until used) replays
/// the same output on a retry as the live engine and a full replay do, and the checkpoint
/// re-encodes it unchanged.
#[test]
fn a_finished_key_from_a_checkpoint_replays_its_output() {
    let mut c = Core::with_scopes(CoreConfig::default(), reg());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    let Recorded::Execute(e) =
        c.record_effect(t, decl("book", EffectClass::Reversible, "kv:room:7", Some("book-7")), now).unwrap()
    else {
        panic!()
    };
    let out = json!({"id": 7, "rooms": [1, 2, {"deep": "é\"x"}], "ok": true});
    assert!(matches!(c.executed(t, e, CallOutcome::done(out.clone())).unwrap(), ExecResult::Done));
    commit(&mut c, t, now);
    let events: Vec<Event> = c.take_events().collect();
    let mut r = Replay::new(CoreConfig::default(), reg());
    for ev in &events {
        r.apply(ev).unwrap();
    }
    let bytes = r.checkpoint().unwrap();
    let lsn = events.len() as u64;
    let loaded = Replay::load(CoreConfig::default(), reg(), lsn, &bytes).unwrap();
    assert_eq!(loaded.checkpoint().unwrap(), bytes, "the kept text re-encodes unchanged");
    assert_eq!(loaded.state().unwrap(), r.state().unwrap());
    // Format 1 wrote the arguments hash as 16 numbers; format 2 writes hex. Both load.
    let nl = bytes.iter().position(|&b| b == b'\n').unwrap();
    let mut state: serde_json::Value = serde_json::from_slice(&bytes[nl + 1..]).unwrap();
    let used = &mut state["keys"]["book-7"]["used_for"]["args"];
    let hex = used.as_str().unwrap().to_owned();
    assert_eq!(hex.len(), 32, "{hex}");
    *used = json!((0..16).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect::<Vec<u8>>());
    let state = serde_json::to_vec(&state).unwrap();
    let head = format!(
        "tidegate-checkpoint {{\"format\":1,\"ledger_format\":3,\"lsn\":{lsn},\"len\":{},\"fnv1a64\":\"{:016x}\"}}\n",
        state.len(),
        fnv1a64(&state)
    );
    let old = Replay::load(CoreConfig::default(), reg(), lsn, &[head.into_bytes(), state].concat()).unwrap();
    assert_eq!(old.state().unwrap(), r.state().unwrap());
    for core in [c, loaded.finish(now).0, old.finish(now).0] {
        let mut core = core;
        let t2 = core.begin(BeginRequest::default(), now).unwrap().tx;
        match core.record_effect(t2, decl("book", EffectClass::Reversible, "kv:room:7", Some("book-7")), now).unwrap() {
            Recorded::Replay(_, got) => assert_eq!(*got, out),
            other => panic!("expected the key's output to be replayed, got {other:?}"),
        }
        // The same key for other arguments is still refused (the hash survived the load).
        let mut other = decl("book", EffectClass::Reversible, "kv:room:7", Some("book-7"));
        other.args = Arc::new(json!({"to": "elsewhere"}));
        assert!(matches!(core.record_effect(t2, other, now), Err(EngineError::KeyReused { .. })));
    }
}
