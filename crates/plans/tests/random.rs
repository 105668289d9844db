//! The randomized test of issue 15 on virtual time: plans with random steps, failures,
//! signals, verdicts, deadlines, cascades, owner choices and executor crashes at seeded points
//! (rebuild from the log). Checked against a world whose own record is the ground truth: zero
//! missed compensations, zero duplicates (by idempotency key), every unwind LIFO, no
//! compensation of a never-externalised effect, every stuck plan queued, and the rebuilt
//! executor equal to the live one. `TIDEGATE_PLAN_SEEDS` sets the number of seeds (default
//! 300); a failure names its seed (`TIDEGATE_PLAN_SEED=<n>` runs that one alone).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::{BTreeMap, HashMap, HashSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tidegate_plans::{
    Action, CallOutcome, Choice, Compensated, Descriptor, Entry, Executor, Observation, Outcome, PlanError, PlanFact,
    PlanId, Predicate, Status, StuckReason, TxId, Verdict,
};

const TENANT: &str = "acme";

#[derive(Debug, Clone)]
enum Ev {
    Open { idx: usize, deadline: Option<u64>, limit: u32 },
    Arm { idx: usize, target: usize },
    Begin { idx: usize, tx: TxId },
    Record { tx: TxId, effect: u32, held: bool, descriptor: bool },
    Executed { tx: TxId, effect: u32 },
    Failed { tx: TxId, effect: u32, unknown: bool, happened: bool },
    Released { tx: TxId, effect: u32, ok: bool, unknown: bool, happened: bool },
    Settle { tx: TxId, committed: bool },
    Verdict { idx: usize, tx: TxId, effect: u32, block: bool },
    Commit { idx: usize },
    Signal { idx: usize },
}

fn fkey(tx: TxId, e: u32) -> String {
    format!("k{tx}.{e}")
}

#[derive(Default)]
struct World {
    applied_fwd: HashSet<String>,
    comp_count: HashMap<String, u32>,
    /// (plan, seq, key) in the order compensations took effect.
    comp_order: Vec<(PlanId, u32, String)>,
    refused_once: HashSet<String>,
    errors: Vec<String>,
}

struct Sim {
    seed: u64,
    rng: SmallRng,
    log: Vec<Entry>,
    exec: Executor,
    world: World,
    now: u64,
    crashes: u32,
    crash_p: f64,
    /// The latest checkpoint: the log length it covers and the executor's snapshot there.
    checkpoint: Option<(usize, Vec<u8>)>,
    restored: u32,
}

impl Sim {
    fn push(&mut self, e: Entry) {
        // Plan records round-trip through their JSON form, as the ledger keeps them.
        let e = match e {
            Entry::Plan(f) => Entry::Plan(PlanFact::decode(&f.encode()).unwrap()),
            e => e,
        };
        self.log.push(e);
    }

    fn cmd(
        &mut self,
        f: impl FnOnce(&mut Executor, u64) -> Result<PlanFact, PlanError>,
    ) -> Result<PlanFact, PlanError> {
        let now = self.now;
        let fact = f(&mut self.exec, now)?;
        self.push(Entry::Plan(fact.clone()));
        self.maybe_checkpoint();
        Ok(fact)
    }

    fn observe(&mut self, o: Observation) {
        self.exec.observe(&o);
        self.push(Entry::Engine(o));
        self.maybe_checkpoint();
    }

    /// Sometimes stores a checkpoint; called only where the executor is exactly the fold of
    /// the log (never between a decision and the append of its facts).
    fn maybe_checkpoint(&mut self) {
        if self.rng.gen_bool(0.05) {
            self.checkpoint = Some((self.log.len(), self.exec.snapshot().unwrap()));
        }
    }

    /// The executor a restart builds: from the checkpoint plus the log after it when there
    /// is one (and the coin says so), else from the whole log.
    fn rebuilt(&mut self) -> Executor {
        let from = match &self.checkpoint {
            Some((at, bytes)) if self.rng.gen_bool(0.7) => {
                self.restored += 1;
                Some((*at, Executor::restore(TENANT, bytes).unwrap()))
            }
            _ => None,
        };
        let (at, mut exec) = from.unwrap_or_else(|| (0, Executor::new(TENANT)));
        for e in &self.log[at..] {
            exec.apply(e).unwrap();
        }
        exec
    }

    fn rebuild(&mut self) {
        self.crashes += 1;
        let mut exec = self.rebuilt();
        let f = exec.start().unwrap();
        self.exec = exec;
        self.push(Entry::Plan(f));
        self.maybe_checkpoint();
    }

    fn crash(&mut self) -> bool {
        self.rng.gen_bool(self.crash_p)
    }

    fn pump(&mut self) {
        for _ in 0..10_000 {
            let d = self.exec.decide(self.now);
            if d.facts.is_empty() && d.actions.is_empty() {
                self.maybe_checkpoint();
                return;
            }
            if self.crash() {
                // Crash before the decision was durable: it never happened.
                self.rebuild();
                continue;
            }
            for f in d.facts {
                self.push(Entry::Plan(f));
            }
            for a in d.actions {
                if self.crash() {
                    self.rebuild();
                    break;
                }
                let r = self.run(&a);
                if self.crash() {
                    // The dispatch happened; its result was never recorded.
                    self.rebuild();
                    break;
                }
                let f = a.result_fact(r);
                self.exec.apply_fact(&f).unwrap();
                self.push(Entry::Plan(f));
            }
        }
        panic!("seed {}: the executor did not settle within 10,000 decisions", self.seed);
    }

    fn run(&mut self, a: &Action) -> CallOutcome {
        let req = a.request().clone();
        let key = req.key.to_string();
        let unknown = self.rng.gen_bool(0.05);
        match a {
            Action::Compensate { plan, seq, .. } => {
                let want = key.trim_end_matches("#compensate").to_owned();
                if req.args.get("booking") != Some(&Value::String(want.clone())) {
                    self.world
                        .errors
                        .push(format!("compensation {} got args {} (expected booking {want})", req.key, req.args));
                }
                if self.rng.gen_bool(0.05) && self.world.refused_once.insert(key.clone()) {
                    return CallOutcome::not_applied("503 before processing", false);
                }
                let apply = !unknown || self.rng.gen_bool(0.5);
                if apply {
                    *self.world.comp_count.entry(key.clone()).or_default() += 1;
                    self.world.comp_order.push((*plan, *seq, key.clone()));
                }
                if unknown { CallOutcome::unknown("timed out") } else { CallOutcome::done(json!({"undone": key})) }
            }
            Action::ProbeForward { .. } if unknown => CallOutcome::unknown("probe timed out"),
            Action::ProbeForward { .. } => {
                if self.world.applied_fwd.contains(&key) {
                    CallOutcome::done(json!({"id": key}))
                } else {
                    CallOutcome::not_applied("no such call", false)
                }
            }
            Action::ProbeCompensation { .. } if unknown => CallOutcome::unknown("probe timed out"),
            Action::ProbeCompensation { .. } => {
                if self.world.comp_count.get(&key).copied().unwrap_or(0) > 0 {
                    CallOutcome::done(Value::Null)
                } else {
                    CallOutcome::not_applied("no such compensation", false)
                }
            }
        }
    }
}

/// What the test knows about one plan, independently of the executor.
#[derive(Default, Clone)]
struct PlanTruth {
    id: Option<PlanId>,
    /// Registered effects in registration order: (tx, effect, descriptor, held).
    regs: Vec<(TxId, u32, bool, bool)>,
    blocked: HashSet<(TxId, u32)>,
    committed: bool,
    accepted: bool,
}

fn script(rng: &mut SmallRng, next_tx: &mut TxId) -> Vec<(u64, Ev)> {
    let n = rng.gen_range(1..=4usize);
    let mut evs = Vec::new();
    for idx in 0..n {
        let mut t = idx as u64 * 3;
        let deadline = rng.gen_bool(0.7).then(|| t + rng.gen_range(30..600));
        let limit = if rng.gen_bool(0.3) { rng.gen_range(0..3) } else { 3 };
        evs.push((t, Ev::Open { idx, deadline, limit }));
        if idx > 0 && rng.gen_bool(0.4) {
            t += 1;
            evs.push((t, Ev::Arm { idx, target: rng.gen_range(0..idx) }));
        }
        let mut effects_so_far = Vec::new();
        for _ in 0..rng.gen_range(1..=4) {
            let tx = *next_tx;
            *next_tx += 1;
            t += rng.gen_range(1..30);
            evs.push((t, Ev::Begin { idx, tx }));
            let mut committed = !rng.gen_bool(0.1);
            let mut held_effects = Vec::new();
            for effect in 0..rng.gen_range(1..=3u32) {
                let held = rng.gen_bool(0.3);
                let descriptor = if held { rng.gen_bool(0.5) } else { rng.gen_bool(0.9) };
                t += rng.gen_range(1..20);
                evs.push((t, Ev::Record { tx, effect, held, descriptor }));
                effects_so_far.push((tx, effect));
                if held {
                    held_effects.push(effect);
                    continue;
                }
                t += rng.gen_range(1..20);
                let roll = rng.gen_range(0..100);
                if roll < 88 {
                    evs.push((t, Ev::Executed { tx, effect }));
                } else {
                    let unknown = roll >= 94;
                    evs.push((t, Ev::Failed { tx, effect, unknown, happened: unknown && rng.gen_bool(0.5) }));
                    committed = false;
                    break;
                }
            }
            if committed {
                for effect in held_effects {
                    t += rng.gen_range(1..10);
                    let roll = rng.gen_range(0..100);
                    let (ok, unknown) = match roll {
                        0..90 => (true, false),
                        90..95 => (false, false),
                        _ => (false, true),
                    };
                    evs.push((
                        t,
                        Ev::Released { tx, effect, ok, unknown, happened: ok || (unknown && rng.gen_bool(0.5)) },
                    ));
                }
            }
            t += rng.gen_range(1..10);
            evs.push((t, Ev::Settle { tx, committed }));
            if rng.gen_bool(0.15) {
                let (vtx, ve) = effects_so_far[rng.gen_range(0..effects_so_far.len())];
                t += rng.gen_range(1..10);
                evs.push((t, Ev::Verdict { idx, tx: vtx, effect: ve, block: rng.gen_bool(0.6) }));
            }
        }
        t += rng.gen_range(1..50);
        match rng.gen_range(0..100) {
            0..55 => evs.push((t, Ev::Commit { idx })),
            55..75 => evs.push((t, Ev::Signal { idx })),
            _ if deadline.is_none() => evs.push((t, Ev::Commit { idx })),
            _ => {}
        }
    }
    evs.sort_by_key(|(t, _)| *t);
    evs
}

fn run_seed(seed: u64) -> Result<(u32, u32, Vec<Outcome>, usize), String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut next_tx = 1;
    let mut events: BTreeMap<(u64, u64), Ev> = BTreeMap::new();
    for (i, (t, e)) in script(&mut rng, &mut next_tx).into_iter().enumerate() {
        events.insert((t, i as u64), e);
    }
    let mut order = 1_000_000u64;
    let crash_p = [0.0, 0.02, 0.1][seed as usize % 3];
    let mut sim = Sim {
        seed,
        rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9),
        log: Vec::new(),
        exec: Executor::new(TENANT),
        world: World::default(),
        now: 0,
        crashes: 0,
        crash_p,
        checkpoint: None,
        restored: 0,
    };
    let f = sim.exec.start().unwrap();
    sim.push(Entry::Plan(f));
    let mut truth: Vec<PlanTruth> = vec![PlanTruth::default(); 4];
    let mut tx_plan: HashMap<TxId, usize> = HashMap::new();
    let mut tx_committed: HashMap<TxId, bool> = HashMap::new();
    let mut stuck_seen: HashSet<PlanId> = HashSet::new();
    let mut gated_out: HashMap<usize, bool> = HashMap::new();

    for tick in 0..20_000u32 {
        sim.now += sim.rng.gen_range(1..20);
        let due: Vec<_> = events.range(..(sim.now + 1, 0)).map(|(k, _)| *k).collect();
        for k in due {
            let ev = events.remove(&k).unwrap();
            let now = sim.now;
            let mut later = |ev: Ev, delay: u64, events: &mut BTreeMap<(u64, u64), Ev>| {
                order += 1;
                events.insert((now + delay, order), ev);
            };
            match ev {
                Ev::Open { idx, deadline, limit } => {
                    let f =
                        sim.cmd(|e, now| e.open(TENANT, &format!("owner{idx}"), deadline, Some(limit), now)).unwrap();
                    let PlanFact::PlanOpened { plan, .. } = f else { unreachable!() };
                    truth[idx].id = Some(plan);
                }
                Ev::Arm { idx, target } => {
                    if let (Some(p), Some(t)) = (truth[idx].id, truth[target].id) {
                        let pred = Predicate::Compensated(Compensated { tenant: None, plan: t, seq: None });
                        let _ = sim.cmd(|e, _| e.arm(p, pred));
                    }
                }
                Ev::Begin { idx, tx } => {
                    let p = truth[idx].id.unwrap();
                    if sim.cmd(|e, _| e.begin_step(p, tx)).is_ok() {
                        tx_plan.insert(tx, idx);
                    }
                }
                Ev::Record { tx, effect, held, descriptor } => {
                    let desc = descriptor.then(|| Descriptor {
                        capability: "undo".into(),
                        args: json!({"booking": {"$output": "/id"}, "why": {"$literal": {"$output": "kept"}}}),
                        key: None,
                        probe: Some("undo.probe".into()),
                        forward_probe: Some("fwd.probe".into()),
                    });
                    if let Some(&idx) = tx_plan.get(&tx) {
                        let ended =
                            matches!(sim.exec.plan(truth[idx].id.unwrap()).map(|v| v.status), Some(Status::Ended(_)));
                        if !ended {
                            truth[idx].regs.push((tx, effect, descriptor, held));
                        }
                    }
                    let key = fkey(tx, effect);
                    sim.observe(Observation::EffectRecorded {
                        tx,
                        effect,
                        tool: if held { "hold".into() } else { "book".into() },
                        held,
                        key,
                        args: json!({"n": effect}),
                        descriptor: desc,
                        scopes: vec![format!("world:{tx}:{effect}")],
                    });
                }
                Ev::Executed { tx, effect } => {
                    sim.world.applied_fwd.insert(fkey(tx, effect));
                    sim.observe(Observation::EffectExecuted { tx, effect, output: json!({"id": fkey(tx, effect)}) });
                }
                Ev::Failed { tx, effect, unknown, happened } => {
                    if happened {
                        sim.world.applied_fwd.insert(fkey(tx, effect));
                    }
                    sim.observe(Observation::EffectFailed { tx, effect, unknown });
                }
                Ev::Released { tx, effect, ok, unknown, happened } => {
                    if happened {
                        sim.world.applied_fwd.insert(fkey(tx, effect));
                    }
                    if ok && let Some(&idx) = tx_plan.get(&tx) {
                        let gated = truth[idx].regs.iter().any(|r| r.0 == tx && r.1 == effect && !r.2);
                        if gated {
                            gated_out.insert(idx, true);
                        }
                    }
                    sim.observe(Observation::Released {
                        tx,
                        effect,
                        ok,
                        unknown,
                        output: ok.then(|| json!({"id": fkey(tx, effect)})),
                    });
                }
                Ev::Settle { tx, committed } => {
                    tx_committed.insert(tx, committed);
                    sim.observe(Observation::Settled {
                        tx,
                        committed,
                        tags: vec![],
                        scopes: vec![format!("s:{tx}")],
                        at_ms: sim.now,
                    });
                }
                Ev::Verdict { idx, tx, effect, block } => {
                    let p = truth[idx].id.unwrap();
                    let v = if block { Verdict::Block } else { Verdict::Allow };
                    if sim.cmd(|e, now| e.verdict(p, tx, effect, v, now)).is_ok() && block {
                        truth[idx].blocked.insert((tx, effect));
                    }
                }
                Ev::Commit { idx } => {
                    let p = truth[idx].id.unwrap();
                    match sim.cmd(|e, now| e.commit(p, now)) {
                        Ok(_) => truth[idx].committed = true,
                        Err(PlanError::StepUnsettled { .. }) => later(Ev::Commit { idx }, 5, &mut events),
                        Err(PlanError::WrongState { state, .. })
                            if state.starts_with("compensating") || state == "stuck" =>
                        {
                            later(Ev::Commit { idx }, 5, &mut events)
                        }
                        Err(_) => {}
                    }
                }
                Ev::Signal { idx } => {
                    let p = truth[idx].id.unwrap();
                    if let Err(PlanError::WrongState { state, .. }) = sim.cmd(|e, now| e.signal(p, "visa refused", now))
                        && state == "stuck"
                    {
                        later(Ev::Signal { idx }, 5, &mut events);
                    }
                }
            }
        }
        sim.pump();

        // Every plan the executor shows stuck is in the queue, and the queue holds nothing else.
        let views = sim.exec.plans();
        let stuck: HashMap<PlanId, StuckReason> = sim.exec.stuck().into_iter().collect();
        for v in &views {
            let is_stuck = matches!(v.status, Status::Stuck { .. });
            if is_stuck != stuck.contains_key(&v.plan) {
                return Err(format!(
                    "plan {} is {:?} but the stuck queue says {}",
                    v.plan,
                    v.status,
                    stuck.contains_key(&v.plan)
                ));
            }
        }
        // The owner answers stuck plans after a while.
        for (plan, reason) in stuck {
            stuck_seen.insert(plan);
            if !sim.rng.gen_bool(0.3) {
                continue;
            }
            let idx = truth.iter().position(|t| t.id == Some(plan)).unwrap();
            let choice = match reason {
                StuckReason::Irreversible { .. } | StuckReason::CascadeLimit { .. } => {
                    [Choice::Accept, Choice::Unwind, Choice::Unwind, Choice::Retry][sim.rng.gen_range(0..4)]
                }
                _ => Choice::Retry,
            };
            sim.cmd(|e, now| e.resolve(plan, choice, now)).unwrap();
            match choice {
                Choice::Accept => truth[idx].accepted = true,
                Choice::Retry
                    if matches!(reason, StuckReason::Irreversible { .. } | StuckReason::CascadeLimit { .. }) =>
                {
                    order += 1;
                    let ev = if sim.rng.gen_bool(0.5) { Ev::Commit { idx } } else { Ev::Signal { idx } };
                    events.insert((sim.now + 10, order), ev);
                }
                _ => {}
            }
        }
        sim.pump();
        let all_ended = sim.exec.plans().iter().all(|v| matches!(v.status, Status::Ended(_)));
        if events.is_empty() && all_ended {
            let _ = tick;
            let outcomes = sim
                .exec
                .plans()
                .iter()
                .filter_map(|v| if let Status::Ended(o) = v.status { Some(o) } else { None })
                .collect();
            return check(&sim, &truth, &tx_committed, &stuck_seen, &gated_out)
                .map(|()| (sim.crashes, sim.restored, outcomes, stuck_seen.len()));
        }
    }
    if std::env::var("TIDEGATE_PLAN_DUMP").is_ok() {
        for e in &sim.log {
            eprintln!("{e:?}");
        }
    }
    Err(format!("plans did not all end: {:?}", sim.exec.plans()))
}

fn check(
    sim: &Sim,
    truth: &[PlanTruth],
    tx_committed: &HashMap<TxId, bool>,
    stuck_seen: &HashSet<PlanId>,
    gated_out: &HashMap<usize, bool>,
) -> Result<(), String> {
    let w = &sim.world;
    if let Some(e) = w.errors.first() {
        return Err(e.clone());
    }
    for (key, n) in &w.comp_count {
        if *n > 1 {
            return Err(format!("compensation {key} took effect {n} times"));
        }
        let fwd = key.trim_end_matches("#compensate");
        if !w.applied_fwd.contains(fwd) {
            return Err(format!("compensation {key} of a forward effect that never happened"));
        }
    }
    for (idx, t) in truth.iter().enumerate() {
        let Some(plan) = t.id else { continue };
        let view = sim.exec.plan(plan).unwrap();
        let ended = match view.status {
            Status::Ended(o) => o,
            s => return Err(format!("plan {plan} did not end: {s:?}")),
        };
        if t.committed != (ended == Outcome::Committed) || t.accepted != (ended == Outcome::Accepted) {
            return Err(format!("plan {plan} ended {ended:?}; committed {} accepted {}", t.committed, t.accepted));
        }
        for &(tx, e, desc, _) in &t.regs {
            let key = format!("{}#compensate", fkey(tx, e));
            let n = w.comp_count.get(&key).copied().unwrap_or(0);
            let required = desc && tx_committed.get(&tx) == Some(&true) && w.applied_fwd.contains(&fkey(tx, e));
            if !desc && n > 0 {
                return Err(format!("plan {plan}: a non-compensable effect {tx}/{e} was compensated"));
            }
            if tx_committed.get(&tx) != Some(&true) && n > 0 {
                return Err(format!("plan {plan}: effect {tx}/{e} of an aborted step was compensated by the plan"));
            }
            match ended {
                Outcome::Unwound if required && n != 1 => {
                    return Err(format!("plan {plan} unwound but missed the compensation of {tx}/{e}"));
                }
                Outcome::Committed if n > 0 && !t.blocked.contains(&(tx, e)) => {
                    return Err(format!("plan {plan} committed but {tx}/{e} was compensated without a block verdict"));
                }
                _ => {}
            }
        }
        // LIFO: the unwind's compensations (verdict ones aside) in decreasing registration order.
        let seqs: Vec<u32> = w
            .comp_order
            .iter()
            .filter(|(p, seq, _)| {
                *p == plan && {
                    let (tx, e, ..) = t.regs[*seq as usize];
                    !t.blocked.contains(&(tx, e))
                }
            })
            .map(|(_, s, _)| *s)
            .collect();
        if seqs.windows(2).any(|w| w[0] <= w[1]) {
            return Err(format!("plan {plan}: unwind not last-in-first-out: {seqs:?}"));
        }
        // A plan that failed after an irreversible effect left went through the stuck queue.
        if ended != Outcome::Committed && gated_out.get(&idx) == Some(&true) && !stuck_seen.contains(&plan) {
            return Err(format!(
                "plan {plan} failed holding a fired irreversible effect but was never queued as stuck"
            ));
        }
    }
    // Rebuilding from the log gives the same plans.
    let mut rebuilt = Executor::new(TENANT);
    for e in &sim.log {
        rebuilt.apply(e).map_err(|e| format!("rebuild refused the log: {e}"))?;
    }
    if rebuilt.plans() != sim.exec.plans() || rebuilt.stuck() != sim.exec.stuck() || rebuilt.held() != sim.exec.held() {
        return Err("the executor rebuilt from the log differs from the live one".into());
    }
    // So does the last checkpoint plus the log after it, and a snapshot of the live one.
    if let Some((at, bytes)) = &sim.checkpoint {
        let mut r = Executor::restore(TENANT, bytes).map_err(|e| format!("restore refused a snapshot: {e}"))?;
        for e in &sim.log[*at..] {
            r.apply(e).map_err(|e| format!("the tail after a checkpoint was refused: {e}"))?;
        }
        if r.plans() != sim.exec.plans() || r.stuck() != sim.exec.stuck() || r.held() != sim.exec.held() {
            return Err(format!("checkpoint (log entry {at}) + tail differs from the live executor"));
        }
    }
    let copy = Executor::restore(TENANT, &sim.exec.snapshot().map_err(|e| e.to_string())?)
        .map_err(|e| format!("restore refused a snapshot: {e}"))?;
    for p in sim.exec.plans() {
        if copy.detail(p.plan, sim.now) != sim.exec.detail(p.plan, sim.now) {
            return Err(format!("plan {}: the snapshot's detail differs from the live executor's", p.plan));
        }
    }
    if copy.next_deadline() != sim.exec.next_deadline() || copy.armed_timers() != sim.exec.armed_timers() {
        return Err("the snapshot's timers differ from the live executor's".into());
    }
    Ok(())
}

#[test]
fn randomized_plans_on_virtual_time() {
    let one: Option<u64> = std::env::var("TIDEGATE_PLAN_SEED").ok().and_then(|s| s.parse().ok());
    let n: u64 = std::env::var("TIDEGATE_PLAN_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4_000);
    let seeds: Vec<u64> = match one {
        Some(s) => vec![s],
        None => (0..n).collect(),
    };
    let started = std::time::Instant::now();
    let (mut crashes, mut restored, mut stuck) = (0u64, 0u64, 0usize);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for seed in seeds.iter().copied() {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(Ok((c, r, o, s))) => {
                crashes += u64::from(c);
                restored += u64::from(r);
                stuck += s;
                for o in o {
                    *outcomes.entry(format!("{o:?}")).or_default() += 1;
                }
            }
            Ok(Err(msg)) => panic!("seed {seed} failed (rerun: TIDEGATE_PLAN_SEED={seed}): {msg}"),
            Err(_) => panic!("seed {seed} panicked (rerun: TIDEGATE_PLAN_SEED={seed})"),
        }
    }
    let plans: usize = outcomes.values().sum();
    eprintln!(
        "{} seeds, {plans} plans {outcomes:?}, {stuck} went through the stuck queue, {crashes} executor crashes ({restored} restarted from a checkpoint), in {:?}",
        seeds.len(),
        started.elapsed()
    );
    if one.is_none() && seeds.len() >= 100 {
        assert!(restored > 0, "no restart used a checkpoint: the snapshot path went untested");
    }
}
