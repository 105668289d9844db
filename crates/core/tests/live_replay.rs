//! One apply path (docs/engine.md): a live engine's state equals the replay of the ledger it
//! wrote, after every step of random interleaved work (calls left in flight across steps,
//! releases spread over steps, compensations in any order, late results, speculation groups,
//! registry changes, lease expiry), at several levels and orderings.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tidegate_core::engine::{
    AbortPlan, BeginRequest, CompensationTask, Decision, ExecResult, Recorded, ReleaseTask, Replay, Settlement,
};
use tidegate_core::{
    AbortReason, Action, CallOutcome, Core, CoreConfig, EffectClass, EffectDecl, EffectId, Event, GroupId, Isolation,
    Level, Ordering, ScopeRegistry, Timestamp, TxId, TxState,
};

const SCOPES: [&str; 5] = ["retail:order:W1", "retail:order:W1:lines", "retail:order:W2", "mail:a@x.io", "kv:n:1"];
const CLASSES: [EffectClass; 5] = [
    EffectClass::Reversible,
    EffectClass::ReversibleWithCost,
    EffectClass::Bufferable,
    EffectClass::Gated,
    EffectClass::Idempotent,
];
const TOOLS: [&str; 2] = ["t", "u"];

fn config(seed: u64) -> CoreConfig {
    let mut cfg = CoreConfig { lease: Duration::from_secs(5), ..CoreConfig::default() };
    match seed % 6 {
        0 => {}
        1 => cfg.level = Level::L2,
        2 => cfg.level = Level::L0,
        3 => cfg.isolation = Isolation::Pessimistic,
        4 => cfg.isolation = Isolation::SnapshotIsolation,
        _ => cfg.ordering = Ordering::FirstCommitterWins,
    }
    cfg
}

/// The work the driver still has to report, as a runtime would.
#[derive(Default)]
struct Pending {
    in_flight: Vec<(TxId, EffectId)>,
    /// Aborts deciding or decided, with the compensations not yet reported.
    aborts: BTreeMap<TxId, VecDeque<CompensationTask>>,
    /// Commits decided, with the releases not yet reported and the one started.
    commits: BTreeMap<TxId, (VecDeque<ReleaseTask>, Option<EffectId>)>,
    late: Vec<CompensationTask>,
    groups: Vec<GroupId>,
}

impl Pending {
    fn abort_plan(&mut self, plan: AbortPlan) {
        self.aborts.insert(plan.tx, plan.compensations.into());
    }
}

fn outcome(rng: &mut SmallRng) -> CallOutcome {
    match rng.gen_range(0..10) {
        0 => CallOutcome::unknown("lost"),
        1 => CallOutcome::not_applied("refused", rng.gen_bool(0.5)),
        _ => CallOutcome::done(json!(rng.gen_range(0..100))),
    }
}

/// One random step on the live engine.
fn step(c: &mut Core, p: &mut Pending, rng: &mut SmallRng, now: &mut Timestamp) {
    let reg = ScopeRegistry::default();
    let unfinished = |c: &Core, states: &[TxState]| -> Vec<TxId> {
        (1..200).map(TxId).filter(|t| c.state(*t).is_ok_and(|s| states.contains(&s))).collect()
    };
    *now = Timestamp(now.0 + rng.gen_range(0..400_000_000));
    match rng.gen_range(0..15) {
        0 | 1 => {
            let may_touch = rng.gen_bool(0.6).then(|| {
                vec![reg.parse("retail:order").unwrap(), reg.parse("mail:a@x.io").unwrap(), reg.parse("kv:n").unwrap()]
            });
            c.begin(BeginRequest { agent: "a".into(), may_touch, lease: None }, *now).unwrap();
        }
        2 => {
            let may_touch = rng.gen_bool(0.5).then(|| vec![reg.parse("retail:order").unwrap()]);
            let g = c.begin_group("g".into(), rng.gen_range(1..4), may_touch, *now).unwrap();
            p.groups.push(g.group);
        }
        3..=5 => {
            let Some(&tx) = unfinished(c, &[TxState::Open]).choose(rng) else { return };
            let scope = reg.parse(SCOPES[rng.gen_range(0..SCOPES.len())]).unwrap();
            if rng.gen_bool(0.35) {
                let _ = c.read(tx, &scope, *now);
                return;
            }
            let key: Option<Arc<str>> = rng.gen_bool(0.3).then(|| Arc::from(format!("k{}", rng.gen_range(0..4))));
            let tool = TOOLS[rng.gen_range(0..TOOLS.len())];
            let args = match &key {
                Some(k) => json!([tool, &**k]),
                None => json!(rng.gen_range(0..1000)),
            };
            let decl = EffectDecl {
                tool: tool.into(),
                class: CLASSES[rng.gen_range(0..CLASSES.len())],
                scopes: vec![scope],
                key,
                call_id: None,
                args: Arc::new(args),
                compensable: rng.gen_bool(0.8),
            };
            if let Ok(Recorded::Execute(e)) = c.record_effect(tx, decl, *now) {
                p.in_flight.push((tx, e));
            }
        }
        6 => {
            if p.in_flight.is_empty() {
                return;
            }
            let (tx, e) = p.in_flight.swap_remove(rng.gen_range(0..p.in_flight.len()));
            match c.executed(tx, e, outcome(rng)) {
                Ok(ExecResult::Aborted(plan)) => p.abort_plan(plan),
                Ok(ExecResult::Late(task)) => p.late.push(task),
                _ => {}
            }
        }
        7 => {
            let Some(&tx) = unfinished(c, &[TxState::Open]).choose(rng) else { return };
            if c.seal(tx, *now).is_ok() {
                let _ = c.request_commit(tx);
            }
        }
        8 => {
            let Some(&tx) = unfinished(c, &[TxState::Waiting]).choose(rng) else { return };
            match c.try_commit(tx, *now) {
                Ok(Decision::Commit(plan)) => {
                    p.commits.insert(tx, (plan.releases.into(), None));
                }
                Ok(Decision::Abort(plan)) => p.abort_plan(plan),
                _ => {}
            }
        }
        9 => {
            let Some((&tx, _)) = p.commits.iter().nth(rng.gen_range(0..p.commits.len().max(1))) else { return };
            let (queue, started) = p.commits.get_mut(&tx).unwrap();
            let mut done = false;
            match (*started, queue.front()) {
                (None, Some(r)) => {
                    c.release_started(tx, r.effect).unwrap();
                    *started = Some(r.effect);
                }
                (Some(e), _) => {
                    let r = outcome(rng);
                    let failed = r.output().is_none();
                    c.release_done(tx, e, r).unwrap();
                    queue.pop_front();
                    *started = None;
                    done = failed;
                }
                (None, None) => done = true,
            }
            if done {
                p.commits.remove(&tx);
                if let Settlement::Abort(plan) = c.finish_commit(tx).unwrap() {
                    p.abort_plan(plan);
                }
            }
        }
        10 => {
            let Some((&tx, _)) = p.aborts.iter().nth(rng.gen_range(0..p.aborts.len().max(1))) else { return };
            let queue = p.aborts.get_mut(&tx).unwrap();
            match queue.pop_front() {
                Some(task) => {
                    let r = match rng.gen_range(0..8) {
                        0 => Err("refused".to_owned()),
                        1 => Ok(Some("a fee".to_owned())),
                        _ => Ok(None),
                    };
                    c.compensated(tx, task.effect, r).unwrap();
                }
                None => {
                    p.aborts.remove(&tx);
                    c.finish_abort(tx).unwrap();
                }
            }
        }
        11 => {
            let Some(&tx) = unfinished(c, &[TxState::Open, TxState::Sealed, TxState::Waiting]).choose(rng) else {
                return;
            };
            if let Ok(plan) = c.abort(tx, AbortReason::Explicit { reason: "x".into() }) {
                p.abort_plan(plan);
            }
        }
        12 => {
            let Some(&g) = p.groups.choose(rng) else { return };
            let Ok(branches) = c.branches(g) else { return };
            let live: Vec<TxId> =
                branches.into_iter().filter(|b| matches!(c.state(*b), Ok(TxState::Open | TxState::Sealed))).collect();
            if let Some(&w) = live.choose(rng)
                && let Ok(plans) = c.choose_winner(g, w)
            {
                for plan in plans {
                    p.abort_plan(plan);
                }
            }
        }
        13 => {
            let tool: Arc<str> = TOOLS[rng.gen_range(0..TOOLS.len())].into();
            if rng.gen_bool(0.7) {
                c.define_tool(&tool).unwrap();
            } else {
                c.remove_tool(&tool).unwrap();
            }
        }
        _ => {
            if rng.gen_bool(0.5) && !p.late.is_empty() {
                let task = p.late.swap_remove(rng.gen_range(0..p.late.len()));
                let r = if rng.gen_bool(0.2) { Err("refused".to_owned()) } else { Ok(None) };
                c.late_compensated(task.tx, task.effect, r, task.blind);
            } else {
                *now = Timestamp(now.0 + 6_000_000_000);
                c.expire_leases(*now);
            }
        }
    }
    for a in c.take_actions().collect::<Vec<_>>() {
        if let Action::RunAbort(plan) = a {
            p.abort_plan(plan);
        }
    }
}

/// `v` with every object's keys sorted.
fn canonical(v: Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        Value::Object(m) => {
            let sorted: BTreeMap<String, Value> = m.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        other => other,
    }
}

/// Removes from both states what the ledger does not record (docs/engine.md, "One apply
/// path", invariant 1): lease renewals and begin times, the waiting set and a requested
/// commit, a late compensation running, a winner chosen but not yet committed, and replay's
/// own order checks.
fn without_unlogged(live: &mut Value, replay: &mut Value) {
    for v in [&mut *live, &mut *replay] {
        let top = v.as_object_mut().unwrap();
        for k in ["leases", "waiting", "guard"] {
            top.remove(k);
        }
        for t in top["txs"].as_object_mut().unwrap().values_mut() {
            let t = t.as_object_mut().unwrap();
            t.remove("lease_until");
            t.remove("began");
            if t["state"] == json!("waiting") {
                t.insert("state".into(), json!("sealed"));
            }
        }
    }
    let replay_txs = replay["txs"].clone();
    for (id, t) in live["txs"].as_object_mut().unwrap() {
        for (i, e) in t["effects"].as_array_mut().unwrap().iter_mut().enumerate() {
            if e["status"] == json!("Compensating") {
                e["status"] = replay_txs[id]["effects"][i]["status"].clone();
            }
        }
    }
    let replay_groups = replay["groups"].clone();
    for (id, g) in live["groups"].as_object_mut().unwrap() {
        if replay_groups[id]["winner"].is_null() {
            g["winner"] = Value::Null;
        }
    }
}

#[test]
fn live_state_equals_the_replay_of_its_ledger_under_interleaved_work() {
    let reg = ScopeRegistry::default();
    let (mut compared, mut late, mut groups, mut committing) = (0u64, 0u64, 0u64, 0u64);
    for seed in 0..150 {
        let cfg = config(seed);
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut c = Core::with_scopes(cfg.clone(), reg.clone());
        let mut replay = Replay::new(cfg.clone(), reg.clone());
        let mut p = Pending::default();
        let mut now = Timestamp(0);
        let mut ledger: Vec<Event> = Vec::new();
        for n in 0..rng.gen_range(20..120) {
            step(&mut c, &mut p, &mut rng, &mut now);
            let events: Vec<Event> = c.take_events().collect();
            for e in &events {
                replay.apply(e).unwrap_or_else(|err| {
                    let tx = e.tx();
                    let history: Vec<String> =
                        ledger.iter().chain(&events).filter(|f| f.tx() == tx).map(|f| format!("{f:?}")).collect();
                    panic!("seed {seed} step {n}: the live ledger is refused: {err}\n{}", history.join("\n"))
                });
            }
            ledger.extend(events);
            let mut live_state = canonical(serde_json::to_value(&c).unwrap());
            let mut replayed = replay.state().unwrap();
            without_unlogged(&mut live_state, &mut replayed);
            let (live_state, replayed) = (canonical(live_state), canonical(replayed));
            if live_state != replayed {
                let (a, b) = (live_state.to_string(), replayed.to_string());
                let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                let from = at.saturating_sub(300);
                panic!(
                    "seed {seed} step {n}: live state differs from the replay of its ledger at byte {at}:\n live:   \
                     ...{}\n replay: ...{}",
                    &a[from..(at + 200).min(a.len())],
                    &b[from..(at + 200).min(b.len())]
                );
            }
            compared += 1;
            late += u64::from(!p.late.is_empty());
            committing += u64::from(!p.commits.is_empty());
            groups += u64::from(live_state["groups"].as_object().is_some_and(|g| !g.is_empty()));
        }
        let (core, _) = Core::recover(cfg, reg.clone(), ledger, now).unwrap();
        core.check_integrity().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    eprintln!(
        "states compared {compared}, with a late compensation {late}, a commit releasing {committing}, a group {groups}"
    );
    // The interleavings the comparison is for did occur.
    assert!(compared > 5_000, "states compared: {compared}");
    assert!(late > 25, "steps with a late compensation running: {late}");
    assert!(committing > 500, "steps with a commit releasing: {committing}");
    assert!(groups > 500, "steps with a speculation group: {groups}");
}
