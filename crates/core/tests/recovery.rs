//! Replaying the ledger rebuilds the engine's projections, from a full ledger and from every
//! prefix of one (a crash can cut the ledger anywhere between two appends).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tidegate_core::engine::{
    BeginRequest, CHECKPOINT_FORMAT_VERSION, CheckpointError, Decision, ExecResult, Recorded, Replay, Settlement,
};
use tidegate_core::{
    AbortReason, CallOutcome, Core, CoreConfig, EffectClass, EffectDecl, Event, ScopeRegistry, Timestamp, TxId, TxState,
};

const SCOPES: [&str; 5] = ["retail:order:W1", "retail:order:W1:lines", "retail:order:W2", "mail:a@x.io", "kv:n:1"];
const CLASSES: [EffectClass; 5] = [
    EffectClass::Reversible,
    EffectClass::ReversibleWithCost,
    EffectClass::Bufferable,
    EffectClass::Gated,
    EffectClass::Idempotent,
];

fn abort_fully(c: &mut Core, tx: TxId, reason: AbortReason, rng: &mut SmallRng) {
    let Ok(plan) = c.abort(tx, reason) else { return };
    for t in plan.compensations {
        let r = if rng.gen_bool(0.1) { Err("refused".to_owned()) } else { Ok(None) };
        c.compensated(tx, t.effect, r).unwrap();
    }
    c.finish_abort(tx).unwrap();
}

/// Drives a random workload straight on the state machine; returns its ledger.
fn workload(seed: u64) -> (Core, Vec<Event>) {
    workload_observed(seed, |_, _| {})
}

/// [`workload`], calling `after_step` with the engine and the events of each step.
fn workload_observed(seed: u64, mut after_step: impl FnMut(&Core, &[Event])) -> (Core, Vec<Event>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut c = Core::new(CoreConfig::default());
    let mut ledger = Vec::new();
    let mut open: Vec<TxId> = Vec::new();
    let reg = ScopeRegistry::default();
    for step in 0..rng.gen_range(5..60) {
        let now = Timestamp(step * 1_000_000);
        match rng.gen_range(0..10) {
            0..=2 => {
                let may_touch = rng.gen_bool(0.5).then(|| {
                    vec![
                        reg.parse("retail:order").unwrap(),
                        reg.parse("mail:a@x.io").unwrap(),
                        reg.parse("kv:n").unwrap(),
                    ]
                });
                open.push(c.begin(BeginRequest { agent: "a".into(), may_touch, lease: None }, now).unwrap().tx);
            }
            3..=5 if !open.is_empty() => {
                let tx = open[rng.gen_range(0..open.len())];
                let scope = reg.parse(SCOPES[rng.gen_range(0..SCOPES.len())]).unwrap();
                if rng.gen_bool(0.3) {
                    let _ = c.read(tx, &scope, now);
                } else {
                    let class = CLASSES[rng.gen_range(0..CLASSES.len())];
                    let key: Option<Arc<str>> =
                        rng.gen_bool(0.3).then(|| Arc::from(format!("k{}", rng.gen_range(0..4))));
                    // A key is reused with its own arguments (other arguments are refused).
                    let args = match &key {
                        Some(k) => json!(&**k),
                        None => json!(step),
                    };
                    let decl = EffectDecl {
                        tool: "t".into(),
                        class,
                        scopes: vec![scope],
                        key,
                        call_id: None,
                        args: Arc::new(args),
                        compensable: rng.gen_bool(0.8),
                    };
                    if let Ok(Recorded::Execute(e)) = c.record_effect(tx, decl, now) {
                        // Sometimes the "crash" leaves the call in flight forever.
                        if rng.gen_bool(0.9) {
                            let r = if rng.gen_bool(0.1) {
                                if rng.gen_bool(0.5) {
                                    CallOutcome::unknown("down")
                                } else {
                                    CallOutcome::not_applied("down", false)
                                }
                            } else {
                                CallOutcome::done(json!("ok"))
                            };
                            if let Ok(ExecResult::Aborted(plan)) = c.executed(tx, e, r) {
                                for t in plan.compensations {
                                    c.compensated(tx, t.effect, Ok(None)).unwrap();
                                }
                                c.finish_abort(tx).unwrap();
                            }
                        }
                    }
                }
            }
            6..=8 if !open.is_empty() => {
                let tx = open[rng.gen_range(0..open.len())];
                if c.state(tx) == Ok(TxState::Open) && c.seal(tx, now).is_ok() {
                    c.request_commit(tx).unwrap();
                }
                if c.state(tx) == Ok(TxState::Waiting) {
                    match c.try_commit(tx, now).unwrap() {
                        Decision::Wait => {}
                        Decision::Abort(plan) => {
                            for t in plan.compensations {
                                c.compensated(tx, t.effect, Ok(None)).unwrap();
                            }
                            c.finish_abort(tx).unwrap();
                        }
                        Decision::Commit(plan) => {
                            for r in plan.releases {
                                c.release_started(tx, r.effect).unwrap();
                                let res = if rng.gen_bool(0.1) {
                                    CallOutcome::not_applied("bounce", false)
                                } else {
                                    CallOutcome::done(json!(null))
                                };
                                let failed = res.output().is_none();
                                c.release_done(tx, r.effect, res).unwrap();
                                if failed {
                                    break;
                                }
                            }
                            if let Settlement::Abort(plan) = c.finish_commit(tx).unwrap() {
                                for t in plan.compensations {
                                    c.compensated(tx, t.effect, Ok(None)).unwrap();
                                }
                                c.finish_abort(tx).unwrap();
                            }
                        }
                    }
                }
            }
            _ if !open.is_empty() => {
                let tx = open[rng.gen_range(0..open.len())];
                if matches!(c.state(tx), Ok(TxState::Open | TxState::Sealed | TxState::Waiting)) {
                    abort_fully(&mut c, tx, AbortReason::Explicit { reason: "x".into() }, &mut rng);
                }
            }
            _ => {}
        }
        let from = ledger.len();
        ledger.extend(c.take_events());
        let _ = c.take_actions().count();
        after_step(&c, &ledger[from..]);
    }
    (c, ledger)
}

/// `v` with every object's keys sorted, whatever map type serde_json was built with.
fn canonical(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        Value::Object(m) => {
            let sorted: std::collections::BTreeMap<String, Value> =
                m.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        other => other,
    }
}

/// An engine state (the checkpoint form) without what the ledger does not record: lease
/// renewals (`leases`, each transaction's `lease_until`), begin times, the waiting set and a
/// requested commit (`waiting` is `sealed` in the ledger), and replay's own order checks
/// (`guard`). docs/engine.md ("One apply path") lists the same.
fn ledger_part(mut v: serde_json::Value) -> serde_json::Value {
    let top = v.as_object_mut().unwrap();
    for k in ["leases", "waiting", "guard"] {
        top.remove(k);
    }
    for t in top.get_mut("txs").unwrap().as_object_mut().unwrap().values_mut() {
        let t = t.as_object_mut().unwrap();
        t.remove("lease_until");
        t.remove("began");
        if t.get("state") == Some(&json!("waiting")) {
            t.insert("state".into(), json!("sealed"));
        }
    }
    canonical(v)
}

/// Live transitions and replay run the same apply (engine/apply.rs): after every step of a
/// random workload, the live engine's state equals the replay of the ledger it wrote so far,
/// field by field (not only the counters a recovery looks at), and both continue alike.
#[test]
fn live_state_equals_the_replay_of_its_ledger() {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let mut compared = 0u64;
    for seed in 0..600 {
        let mut replay = Replay::new(cfg.clone(), reg.clone());
        let mut step = 0;
        let (live, ledger) = workload_observed(seed, |live, events| {
            step += 1;
            for e in events {
                replay.apply(e).unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            }
            let live_state = ledger_part(serde_json::to_value(live).unwrap());
            let replayed = ledger_part(replay.state().unwrap());
            if live_state != replayed {
                let (a, b) = (live_state.to_string(), replayed.to_string());
                let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                let from = at.saturating_sub(300);
                panic!(
                    "seed {seed} step {step}: live state differs from the replay of its ledger at byte {at}:\n live:   \
                     ...{}\n replay: ...{}",
                    &a[from..(at + 200).min(a.len())],
                    &b[from..(at + 200).min(b.len())]
                );
            }
            compared += 1;
        });
        let (mut rebuilt, rec) = Core::recover(cfg.clone(), reg.clone(), ledger.iter().cloned(), Timestamp(0)).unwrap();
        rebuilt.check_integrity().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(rec.events as usize, ledger.len());
        // Allocators continue where the live engine would.
        let mut live = live;
        let x = live.begin(BeginRequest::default(), Timestamp(0)).unwrap();
        let y = rebuilt.begin(BeginRequest::default(), Timestamp(0)).unwrap();
        assert_eq!((x.tx, x.epoch), (y.tx, y.epoch), "seed {seed}");
    }
    assert!(compared > 5_000, "too few states compared: {compared}");
}

#[test]
fn every_prefix_of_a_ledger_recovers_consistently() {
    for seed in 0..300 {
        let (_, ledger) = workload(seed);
        for cut in 0..=ledger.len() {
            let (core, rec) = Core::recover(
                CoreConfig::default(),
                ScopeRegistry::default(),
                ledger[..cut].iter().cloned(),
                Timestamp(0),
            )
            .unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            core.check_integrity().unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            for tx in &rec.committing {
                let plan = core.resume_commit(*tx).unwrap();
                // Never re-fire a release whose outcome is unknown: if one was started but not
                // recorded, nothing more is released.
                let started_unfinished = ledger[..cut].iter().any(|e| matches!(e, Event::ReleaseStarted { tx: t, effect } if t == tx
                    && !ledger[..cut].iter().any(|f| matches!(f, Event::Released { tx: u, effect: g, .. } if u == tx && g == effect))));
                if started_unfinished {
                    assert!(plan.releases.is_empty(), "seed {seed} cut {cut}: would re-fire an in-doubt release");
                }
            }
            for d in &rec.in_doubt {
                assert!(ledger[..cut].iter().any(
                    |e| matches!(e, Event::EffectRecorded { tx, effect, .. } if *tx == d.tx && *effect == d.effect)
                ));
                assert!(!ledger[..cut].iter().any(
                    |e| matches!(e, Event::EffectExecuted { tx, effect, .. } if *tx == d.tx && *effect == d.effect)
                ));
            }
            for tx in &rec.aborting {
                core.resume_abort(*tx).unwrap();
            }
        }
    }
}

#[test]
fn leases_that_ended_while_down_abort_on_recovery() {
    let mut c = Core::new(CoreConfig::default());
    let t = c.begin(BeginRequest::default(), Timestamp(0)).unwrap().tx;
    let ledger: Vec<Event> = c.take_events().collect();
    let far = Timestamp(3600 * 1_000_000_000);
    let (core, rec) = Core::recover(CoreConfig::default(), ScopeRegistry::default(), ledger, far).unwrap();
    assert_eq!(rec.expired, vec![t]);
    assert_eq!(core.state(t).unwrap(), TxState::Aborting);
}

/// What a recovery classified, in a comparable form.
fn summary(core: &Core, rec: &tidegate_core::engine::Recovery) -> String {
    let in_doubt: Vec<_> = rec.in_doubt.iter().map(|d| (d.tx, d.effect)).collect();
    let s = core.stats();
    format!(
        "in_doubt {in_doubt:?} committing {:?} aborting {:?} expired {:?} open {:?} unfinished {} stats {:?}",
        rec.committing, rec.aborting, rec.expired, rec.open, rec.unfinished, s
    )
}

#[test]
fn checkpoint_plus_tail_recovers_exactly_what_the_full_ledger_recovers() {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let mut spanning = 0;
    for seed in 0..400 {
        let (_, ledger) = workload(seed);
        let mut full = Replay::new(cfg.clone(), reg.clone());
        for e in &ledger {
            full.apply(e).unwrap();
        }
        let want = full.state().unwrap();
        let (want_core, want_rec) = full.finish(Timestamp(30_000_000_000));
        let want_summary = summary(&want_core, &want_rec);
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
        let mut cuts = vec![0, ledger.len()];
        cuts.extend((0..4).map(|_| rng.gen_range(0..=ledger.len())));
        for cut in cuts {
            let mut head = Replay::new(cfg.clone(), reg.clone());
            for e in &ledger[..cut] {
                head.apply(e).unwrap();
            }
            if head.unfinished() > 0 && cut < ledger.len() {
                spanning += 1;
            }
            let bytes = head.checkpoint().unwrap();
            let mut r = Replay::load(cfg.clone(), reg.clone(), cut as u64, &bytes)
                .unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            assert_eq!(r.state().unwrap(), head.state().unwrap(), "seed {seed} cut {cut}: checkpoint round trip");
            assert_eq!(r.lsn(), cut as u64);
            for e in &ledger[cut..] {
                r.apply(e).unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            }
            assert_eq!(r.state().unwrap(), want, "seed {seed} cut {cut}: checkpoint + tail differs from full replay");
            let (core, rec) = r.finish(Timestamp(30_000_000_000));
            core.check_integrity().unwrap_or_else(|e| panic!("seed {seed} cut {cut}: {e}"));
            assert_eq!(rec.events as usize, ledger.len() - cut, "seed {seed} cut {cut}: only the tail is replayed");
            assert_eq!(summary(&core, &rec), want_summary, "seed {seed} cut {cut}: recovery differs");
        }
    }
    assert!(spanning > 100, "too few checkpoints with unfinished transactions spanning them: {spanning}");
}

#[test]
fn damaged_or_mismatched_checkpoints_are_refused_as_corrupt() {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let (_, ledger) = workload(7);
    let mut r = Replay::new(cfg.clone(), reg.clone());
    for e in &ledger {
        r.apply(e).unwrap();
    }
    let lsn = ledger.len() as u64;
    let good = r.checkpoint().unwrap();
    assert!(Replay::load(cfg.clone(), reg.clone(), lsn, &good).is_ok());
    let corrupt = |bytes: &[u8], at: u64| match Replay::load(cfg.clone(), reg.clone(), at, bytes) {
        Err(CheckpointError::Corrupt { .. }) => {}
        other => panic!("expected Corrupt, got {:?}", other.map(|r| r.lsn())),
    };
    corrupt(&good, lsn + 1); // the store's LSN and the header disagree
    corrupt(&good[..good.len() - 1], lsn); // truncated
    corrupt(b"", lsn);
    corrupt(b"not a checkpoint", lsn);
    let mut flipped = good.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 0x01; // a flipped bit inside the state
    corrupt(&flipped, lsn);
}

/// Sections (another projection's bytes at the same LSN) round-trip, are checked one by one,
/// and leave the engine state readable; a damaged section or a length that disagrees with the
/// header makes the whole checkpoint unusable (the caller replays everything).
#[test]
fn checkpoint_sections_round_trip_and_damage_in_one_is_refused() {
    use tidegate_core::engine::checkpoint_sections;
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let (_, ledger) = workload(11);
    let mut r = Replay::new(cfg.clone(), reg.clone());
    for e in &ledger {
        r.apply(e).unwrap();
    }
    let lsn = ledger.len() as u64;
    let bytes = r.checkpoint_with(&[("plans", &b"exec state"[..]), ("empty", &b""[..])]).unwrap();
    let loaded = Replay::load(cfg.clone(), reg.clone(), lsn, &bytes).unwrap();
    assert_eq!(loaded.state().unwrap(), r.state().unwrap());
    let got = checkpoint_sections(lsn, &bytes).unwrap();
    assert_eq!(got, vec![("plans".to_owned(), &b"exec state"[..]), ("empty".to_owned(), &b""[..])]);
    // Without sections the list is empty (and the bytes are those of `checkpoint`).
    assert_eq!(checkpoint_sections(lsn, &r.checkpoint().unwrap()).unwrap(), Vec::<(String, &[u8])>::new());
    let corrupt = |b: &[u8]| {
        assert!(matches!(checkpoint_sections(lsn, b), Err(CheckpointError::Corrupt { .. })));
        assert!(matches!(Replay::load(cfg.clone(), reg.clone(), lsn, b), Err(CheckpointError::Corrupt { .. })));
    };
    let mut flipped = bytes.clone();
    let at = flipped.len() - 3; // inside the `plans` section
    flipped[at] ^= 0x20;
    corrupt(&flipped);
    corrupt(&bytes[..bytes.len() - 1]);
    let mut longer = bytes.clone();
    longer.push(b'x');
    corrupt(&longer);
}

/// Format 2 checks a BLAKE3 hash; format 1 (an FNV-1a 64 hash) is still read. A header that
/// carries the other format's checksum instead of its own is refused, naming the field, so a
/// checkpoint is never loaded unchecked.
#[test]
fn each_checkpoint_format_requires_its_own_checksum() {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let (_, ledger) = workload(5);
    let mut r = Replay::new(cfg.clone(), reg.clone());
    for e in &ledger {
        r.apply(e).unwrap();
    }
    let lsn = ledger.len() as u64;
    let good = r.checkpoint().unwrap();
    let nl = good.iter().position(|&b| b == b'\n').unwrap();
    let (head, state) = (std::str::from_utf8(&good[..nl]).unwrap(), &good[nl + 1..]);
    assert!(head.contains("\"format\":2") && head.contains(&blake3::hash(state).to_hex().to_string()), "{head}");
    let fnv = {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in state {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{h:016x}")
    };
    let with_head = |format: u32, sum: &str| {
        let h = format!(
            "tidegate-checkpoint {{\"format\":{format},\"ledger_format\":3,\"lsn\":{lsn},\"len\":{},{sum}}}\n",
            state.len()
        );
        [h.into_bytes(), state.to_vec()].concat()
    };
    let v1 = Replay::load(cfg.clone(), reg.clone(), lsn, &with_head(1, &format!("\"fnv1a64\":\"{fnv}\""))).unwrap();
    assert_eq!(v1.state().unwrap(), r.state().unwrap(), "a format 1 checkpoint still loads");
    let refused = |bytes: Vec<u8>, needle: &str| match Replay::load(cfg.clone(), reg.clone(), lsn, &bytes) {
        Err(e @ CheckpointError::Corrupt { .. }) => assert!(e.to_string().contains(needle), "{e}"),
        other => panic!("expected Corrupt naming {needle}, got {:?}", other.map(|r| r.lsn())),
    };
    refused(with_head(2, &format!("\"fnv1a64\":\"{fnv}\"")), "no `blake3` checksum");
    refused(with_head(1, &format!("\"blake3\":\"{}\"", blake3::hash(state).to_hex())), "no `fnv1a64` checksum");
    refused(with_head(1, "\"fnv1a64\":\"0000000000000000\""), "fnv1a64 checksum");
    refused(with_head(2, &format!("\"blake3\":\"{}\"", blake3::hash(b"other").to_hex())), "blake3 checksum");
    refused(with_head(0, &format!("\"fnv1a64\":\"{fnv}\"")), "older than 1");
}

#[test]
fn a_checkpoint_from_a_newer_format_is_refused_with_both_versions() {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let r = Replay::new(cfg.clone(), reg.clone());
    let good = String::from_utf8(r.checkpoint().unwrap()).unwrap();
    let newer = good.replacen(
        &format!("\"format\":{CHECKPOINT_FORMAT_VERSION}"),
        &format!("\"format\":{}", CHECKPOINT_FORMAT_VERSION + 1),
        1,
    );
    match Replay::load(cfg, reg, 0, newer.as_bytes()) {
        Err(e @ CheckpointError::NewerFormat { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("{}", CHECKPOINT_FORMAT_VERSION + 1)) && msg.contains("newer"), "{msg}");
        }
        other => panic!("expected NewerFormat, got {:?}", other.map(|r| r.lsn())),
    }
}

/// Regression (issue 11): a checkpoint built from a newer ledger format was refused as
/// "format version 1, newer than 1", naming the checkpoint's own versions.
#[test]
fn a_checkpoint_from_a_newer_ledger_format_names_the_ledger_format_versions() {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    let r = Replay::new(cfg.clone(), reg.clone());
    let good = String::from_utf8(r.checkpoint().unwrap()).unwrap();
    let ledger = tidegate_core::ledger::LEDGER_FORMAT_VERSION;
    let newer = good.replacen(&format!("\"ledger_format\":{ledger}"), &format!("\"ledger_format\":{}", ledger + 7), 1);
    assert_ne!(newer, good, "the header names the ledger format");
    match Replay::load(cfg, reg, 0, newer.as_bytes()) {
        Err(e @ CheckpointError::NewerFormat { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("ledger format version {}, newer than {ledger}", ledger + 7)), "{msg}");
        }
        other => panic!("expected NewerFormat, got {:?}", other.map(|r| r.lsn())),
    }
}

/// Regression: replayed commits kept their lease entries (the live engine drops them at the
/// commit request, which logs nothing), so checkpoints grew with finished history.
#[test]
fn a_checkpoint_does_not_grow_with_finished_history() {
    let reg = ScopeRegistry::default();
    let size_after = |n: u64| {
        let mut c = Core::new(CoreConfig::default());
        let mut r = Replay::new(CoreConfig::default(), reg.clone());
        let s = reg.parse("kv:n:1").unwrap();
        for i in 0..n {
            let now = Timestamp(i);
            let tx = c
                .begin(BeginRequest { agent: "a".into(), may_touch: Some(vec![s.clone()]), lease: None }, now)
                .unwrap()
                .tx;
            c.read(tx, &s, now).unwrap();
            c.seal(tx, now).unwrap();
            c.request_commit(tx).unwrap();
            match c.try_commit(tx, now).unwrap() {
                Decision::Commit(_) => assert!(matches!(c.finish_commit(tx).unwrap(), Settlement::Committed(_))),
                other => panic!("{other:?}"),
            }
            for e in c.take_events() {
                r.apply(&e).unwrap();
            }
        }
        r.checkpoint().unwrap().len()
    };
    let (small, large) = (size_after(100), size_after(5_000));
    assert!(large < small + 64, "checkpoint grew with history: {small} bytes after 100 commits, {large} after 5000");
}

/// Regression: an eager call whose outcome came back unknown while its transaction aborted is
/// compensated blind; when the abort settled before that compensation was reported, replay
/// refused the late `compensated` record as "an event for a finished transaction", so the
/// engine could not reopen a ledger it had written itself.
#[test]
fn a_blind_late_compensation_after_settlement_replays() {
    let reg = ScopeRegistry::default();
    let mut c = Core::new(CoreConfig::default());
    let tx = c.begin(BeginRequest::default(), Timestamp(0)).unwrap().tx;
    let decl = EffectDecl {
        tool: "t".into(),
        class: EffectClass::Reversible,
        scopes: vec![reg.parse("kv:n:1").unwrap()],
        key: None,
        call_id: None,
        args: Arc::new(json!(1)),
        compensable: true,
    };
    let Recorded::Execute(e) = c.record_effect(tx, decl, Timestamp(0)).unwrap() else { panic!("not eager") };
    let plan = c.abort(tx, AbortReason::Explicit { reason: "x".into() }).unwrap();
    assert!(plan.compensations.is_empty(), "the call is still in flight");
    let ExecResult::Late(task) = c.executed(tx, e, CallOutcome::unknown("lost")).unwrap() else {
        panic!("an unknown outcome during the abort is compensated blind")
    };
    assert!(task.blind);
    c.finish_abort(tx).unwrap();
    c.late_compensated(tx, e, Ok(None), true);
    let ledger: Vec<Event> = c.take_events().collect();
    assert!(matches!(ledger.last(), Some(Event::Compensated { .. })), "{ledger:?}");
    let (core, _) = Core::recover(CoreConfig::default(), reg, ledger, Timestamp(0)).unwrap();
    core.check_integrity().unwrap();
}
