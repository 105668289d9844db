//! Isolation of eager effects of concurrent transactions (issue 10 item 1, docs/engine.md).
//!
//! A tiny world of cells and reversible "set" tools whose compensation restores the value
//! before the set, driven through the state machine exactly as the runtime drives it.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use tidegate_core::engine::{AbortPlan, BeginRequest, Decision, ExecResult, Recorded, Replay, Settlement};
use tidegate_core::{
    AbortReason, Action, CallOutcome, Core, CoreConfig, EffectClass, EffectDecl, EffectId, EngineError, Event, Level,
    Ordering, Timestamp, TxId,
};

const NOW: Timestamp = Timestamp(0);

/// Cells, and for each executed set the value it replaced.
#[derive(Default)]
struct World {
    cells: HashMap<String, i64>,
    undo: HashMap<(TxId, EffectId), (String, i64)>,
}

struct Bench {
    core: Core,
    world: World,
}

impl Bench {
    fn new(cfg: CoreConfig) -> Bench {
        Bench { core: Core::new(cfg), world: World::default() }
    }

    fn begin(&mut self, scopes: &[&str]) -> TxId {
        let may_touch = Some(scopes.iter().map(|s| self.core.scopes().parse(s).unwrap()).collect());
        self.core.begin(BeginRequest { agent: "a".into(), may_touch, lease: None }, NOW).unwrap().tx
    }

    fn read(&mut self, tx: TxId, cell: &str) -> Result<i64, EngineError> {
        let s = self.core.scopes().parse(cell).unwrap();
        self.core.read(tx, &s, NOW)?;
        Ok(self.world.cells.get(cell).copied().unwrap_or(0))
    }

    fn decl(&self, cell: &str, class: EffectClass, v: i64) -> EffectDecl {
        EffectDecl {
            tool: "set".into(),
            class,
            scopes: vec![self.core.scopes().parse(cell).unwrap()],
            key: None,
            args: Arc::new(json!({"cell": cell, "v": v})),
            compensable: true,
            call_id: None,
        }
    }

    /// A reversible set of `cell` to `v`, executed now.
    fn set(&mut self, tx: TxId, cell: &str, v: i64) -> Result<(), EngineError> {
        match self.core.record_effect(tx, self.decl(cell, EffectClass::Reversible, v), NOW)? {
            Recorded::Execute(e) => {
                let old = self.world.cells.insert(cell.to_owned(), v).unwrap_or(0);
                self.world.undo.insert((tx, e), (cell.to_owned(), old));
                assert!(matches!(self.core.executed(tx, e, CallOutcome::done(json!(old))).unwrap(), ExecResult::Done));
                Ok(())
            }
            other => panic!("{other:?}"),
        }
    }

    /// A held (bufferable) set, applied at commit.
    fn stage(&mut self, tx: TxId, cell: &str, v: i64) -> Result<(), EngineError> {
        self.core.record_effect(tx, self.decl(cell, EffectClass::Bufferable, v), NOW).map(|_| ())
    }

    fn run_abort(&mut self, plan: AbortPlan) {
        for c in plan.compensations {
            let (cell, old) = self.world.undo.remove(&(plan.tx, c.effect)).unwrap();
            self.world.cells.insert(cell, old);
            self.core.compensated(plan.tx, c.effect, Ok(None)).unwrap();
        }
        self.core.finish_abort(plan.tx).unwrap();
    }

    fn abort(&mut self, tx: TxId) {
        let plan = self.core.abort(tx, AbortReason::Explicit { reason: "t1 gives up".into() }).unwrap();
        self.run_abort(plan);
    }

    /// Runs the aborts the engine decided on its own (a refused touch).
    fn drain(&mut self) {
        let actions: Vec<Action> = self.core.take_actions().collect();
        for a in actions {
            if let Action::RunAbort(plan) = a {
                self.run_abort(plan);
            }
        }
    }

    fn seal_and_request(&mut self, tx: TxId) {
        self.core.seal(tx, NOW).unwrap();
        self.core.request_commit(tx).unwrap();
    }

    /// Tries to decide; `Some(true)` committed, `Some(false)` aborted, `None` waits.
    fn decide(&mut self, tx: TxId) -> Option<bool> {
        match self.core.try_commit(tx, NOW).unwrap() {
            Decision::Wait => None,
            Decision::Abort(plan) => {
                self.run_abort(plan);
                Some(false)
            }
            Decision::Commit(plan) => {
                for r in plan.releases {
                    self.core.release_started(tx, r.effect).unwrap();
                    let v = r.args["v"].as_i64().unwrap();
                    self.world.cells.insert(r.args["cell"].as_str().unwrap().to_owned(), v);
                    self.core.release_done(tx, r.effect, CallOutcome::done(json!("ok"))).unwrap();
                }
                assert!(matches!(self.core.finish_commit(tx).unwrap(), Settlement::Committed(_)));
                Some(true)
            }
        }
    }

    fn x(&self) -> i64 {
        self.world.cells.get("kv:x").copied().unwrap_or(0)
    }
}

fn lock_conflict(r: Result<impl std::fmt::Debug, EngineError>, tx: TxId) {
    match r {
        Err(e @ EngineError::LockConflict { .. }) => {
            assert!(e.retryable(), "{e}");
            assert!(matches!(e, EngineError::LockConflict { tx: t, .. } if t == tx));
        }
        other => panic!("expected a lock conflict for {tx}, got {other:?}"),
    }
}

/// Regression (issue 10 item 1): T1 < T2 both declare X. T1 sets X = 1 (reversible). T2 reads
/// the world (sees 1), sets X = 2, seals and commits, so it waits for T1. T1 aborts and its
/// compensation puts back 0; T2 committed and the world ended at 0: a lost update, and T2
/// committed a plan built on a value that never committed. Now T2's read of T1's uncommitted
/// write is refused (T2 aborts, retryable), and so is a blind second write; retried after T1
/// settles, T2 commits and the world holds its value.
#[test]
fn t1_t2_set_x_lost_update() {
    let mut b = Bench::new(CoreConfig::default());
    let t1 = b.begin(&["kv:x"]);
    let t2 = b.begin(&["kv:x"]);
    b.set(t1, "kv:x", 1).unwrap();
    lock_conflict(b.read(t2, "kv:x"), t2);
    b.drain();
    assert!(b.core.state(t2).is_err(), "t2 was aborted and settled");
    // A blind write (no read) is refused too: the second writer dies.
    let t3 = b.begin(&["kv:x"]);
    lock_conflict(b.set(t3, "kv:x", 2), t3);
    b.drain();
    b.abort(t1);
    assert_eq!(b.x(), 0, "t1's compensation restored X");
    // The retry, after t1 settled.
    let t4 = b.begin(&["kv:x"]);
    assert_eq!(b.read(t4, "kv:x").unwrap(), 0);
    b.set(t4, "kv:x", 2).unwrap();
    b.seal_and_request(t4);
    assert_eq!(b.decide(t4), Some(true));
    assert_eq!(b.x(), 2, "no lost update");
    b.core.check_integrity().unwrap();
}

/// The same race when T2's read came before T1's write: T2's read was clean, but T1's
/// compensation writes X again; the compensation gives X a fresh version, so T2 (which waits
/// for T1) cannot commit on the read, and T2's own set is refused as a second writer.
#[test]
fn a_compensation_advances_the_version_of_its_scope() {
    let mut b = Bench::new(CoreConfig::default());
    let t1 = b.begin(&["kv:x"]);
    let t2 = b.begin(&["kv:x", "kv:y"]);
    assert_eq!(b.read(t2, "kv:x").unwrap(), 0);
    b.set(t1, "kv:x", 1).unwrap();
    let s = b.core.scopes().parse("kv:x").unwrap();
    let before = b.core.version(&s);
    b.stage(t2, "kv:y", 5).unwrap();
    b.seal_and_request(t2);
    assert_eq!(b.decide(t2), None, "t2 waits for t1");
    b.abort(t1);
    assert!(b.core.version(&s) > before, "the compensation gave X a fresh version");
    let woken: Vec<Action> = b.core.take_actions().collect();
    assert!(woken.iter().any(|a| matches!(a, Action::Wake(w) if *w == t2)));
    assert_eq!(b.decide(t2), Some(false), "t2's read of X is stale");
    b.core.check_integrity().unwrap();
}

/// Regression (issue 10 item 1, the read-only variant): read-only transactions committed torn
/// or uncommitted values when the writers were reversible (27 of 250 races). A read of a
/// scope with another transaction's uncommitted eager write is refused; a read made before
/// that write is stale once the writer settles either way.
#[test]
fn read_only_transactions_never_commit_torn_or_uncommitted_values() {
    for writer_commits in [false, true] {
        let mut b = Bench::new(CoreConfig::default());
        let w = b.begin(&["kv:x", "kv:y"]);
        let r = b.begin(&["kv:x", "kv:y"]);
        // r reads X before w writes: clean.
        assert_eq!(b.read(r, "kv:x").unwrap(), 0);
        b.set(w, "kv:x", 1).unwrap();
        b.set(w, "kv:y", 1).unwrap();
        // Reading Y now would read w's uncommitted write: refused.
        let r2 = b.begin(&["kv:y"]);
        lock_conflict(b.read(r2, "kv:y"), r2);
        b.drain();
        // r reads Y only after w settled.
        if writer_commits {
            b.seal_and_request(w);
            assert_eq!(b.decide(w), Some(true));
        } else {
            b.abort(w);
        }
        assert_eq!(b.read(r, "kv:y").unwrap(), if writer_commits { 1 } else { 0 });
        b.seal_and_request(r);
        assert_eq!(b.decide(r), Some(false), "r's earlier read of X is stale (writer committed: {writer_commits})");
        b.core.check_integrity().unwrap();
    }
}

/// An older reader cannot read a younger transaction's uncommitted write either (it would not
/// wait for it: the younger one waits for the older).
#[test]
fn an_older_reader_of_a_younger_uncommitted_write_is_refused() {
    let mut b = Bench::new(CoreConfig::default());
    let old = b.begin(&["kv:x"]);
    let young = b.begin(&["kv:z"]);
    let young2 = b.begin(&["kv:x"]);
    b.set(young2, "kv:x", 3).unwrap();
    lock_conflict(b.read(old, "kv:x"), old);
    b.drain();
    // Disjoint scopes are unaffected.
    b.set(young, "kv:z", 1).unwrap();
    b.seal_and_request(young);
    assert_eq!(b.decide(young), Some(true));
    b.core.check_integrity().unwrap();
}

/// A held write of an older transaction would be released before a younger writer settles,
/// and the younger writer's compensation would then overwrite it: whichever comes second is
/// refused.
#[test]
fn held_and_eager_writes_of_concurrent_transactions_do_not_interleave() {
    // Older held write first, younger eager write second: the eager one is refused.
    let mut b = Bench::new(CoreConfig::default());
    let old = b.begin(&["kv:x"]);
    let young = b.begin(&["kv:x"]);
    b.stage(old, "kv:x", 7).unwrap();
    lock_conflict(b.set(young, "kv:x", 9), young);
    b.drain();
    b.seal_and_request(old);
    assert_eq!(b.decide(old), Some(true));
    assert_eq!(b.x(), 7);
    // Younger eager write first, older held write second: the held one is refused.
    let mut b = Bench::new(CoreConfig::default());
    let old = b.begin(&["kv:x"]);
    let young = b.begin(&["kv:x"]);
    b.set(young, "kv:x", 9).unwrap();
    lock_conflict(b.stage(old, "kv:x", 7), old);
    b.drain();
    b.abort(young);
    assert_eq!(b.x(), 0);
    // An older eager write and a younger held write: the held one is released after the
    // older settles, so both are allowed.
    let mut b = Bench::new(CoreConfig::default());
    let old = b.begin(&["kv:x"]);
    let young = b.begin(&["kv:x"]);
    b.set(old, "kv:x", 1).unwrap();
    b.stage(young, "kv:x", 2).unwrap();
    b.seal_and_request(young);
    assert_eq!(b.decide(young), None, "the younger waits for the older");
    b.seal_and_request(old);
    assert_eq!(b.decide(old), Some(true));
    let _ = b.core.take_actions().count();
    assert_eq!(b.decide(young), Some(true));
    assert_eq!(b.x(), 2);
    b.core.check_integrity().unwrap();
}

/// Under first-committer-wins nothing waits in epoch order, so the rules hold in both
/// directions; at L0 (no isolation, the baseline) nothing is refused and the lost update of
/// the issue still happens.
#[test]
fn first_committer_wins_is_isolated_and_l0_is_the_baseline() {
    let mut b = Bench::new(CoreConfig { ordering: Ordering::FirstCommitterWins, ..CoreConfig::default() });
    let t1 = b.begin(&["kv:x"]);
    let t2 = b.begin(&["kv:x"]);
    b.stage(t2, "kv:x", 5).unwrap();
    lock_conflict(b.set(t1, "kv:x", 1), t1);
    b.drain();

    let mut b = Bench::new(CoreConfig { level: Level::L0, ..CoreConfig::default() });
    let t1 = b.begin(&["kv:x"]);
    let t2 = b.begin(&["kv:x"]);
    b.set(t1, "kv:x", 1).unwrap();
    assert_eq!(b.read(t2, "kv:x").unwrap(), 1);
    b.set(t2, "kv:x", 2).unwrap();
    b.seal_and_request(t2);
    assert_eq!(b.decide(t2), Some(true), "L0 never waits");
    b.abort(t1);
    assert_eq!(b.x(), 0, "the L0 baseline keeps the lost update");
}

/// Branches of one speculation group share an epoch and are exempt from each other: they are
/// alternatives of one plan over the same resources, and the losers are aborted (and their
/// compensations run) before the winner commits.
#[test]
fn speculation_branches_are_exempt_from_each_other() {
    let mut b = Bench::new(CoreConfig::default());
    let g = b.core.begin_group("planner".into(), 2, None, NOW).unwrap();
    let (a, c) = (g.branches[0], g.branches[1]);
    b.set(a, "kv:x", 1).unwrap();
    b.set(c, "kv:h", 2).unwrap();
    assert_eq!(b.read(c, "kv:x").unwrap(), 1, "a sibling's write is readable");
    // Another transaction is not exempt.
    let other = b.begin(&["kv:x"]);
    lock_conflict(b.read(other, "kv:x"), other);
    b.drain();
    for plan in b.core.choose_winner(g.group, a).unwrap() {
        b.run_abort(plan);
    }
    b.seal_and_request(a);
    assert_eq!(b.decide(a), Some(true));
    assert_eq!(b.x(), 1);
    assert!(b.core.state(c).is_err(), "the losing branch settled");
    b.core.check_integrity().unwrap();
}

/// Dirty marks are kept at L1 and above only (nothing reads them below), and a checkpoint
/// crosses levels either way: one written at L1 with an unsettled eager write loads at L0
/// without its marks, one written at L0 loads at L1 with them rebuilt. Either way the loaded
/// engine passes its integrity check (which compares the marks with the transactions).
#[test]
fn dirty_marks_follow_the_level_across_checkpoints() {
    for (from, to) in [(Level::L1, Level::L0), (Level::L0, Level::L1)] {
        let cfg = |level| CoreConfig { level, ..CoreConfig::default() };
        let mut b = Bench::new(cfg(from));
        let t1 = b.begin(&["kv:x"]);
        b.set(t1, "kv:x", 1).unwrap();
        b.core.check_integrity().unwrap();
        let events: Vec<Event> = b.core.take_events().collect();
        let mut replay = Replay::new(cfg(from), b.core.scopes().clone());
        for e in &events {
            replay.apply(e).unwrap();
        }
        let bytes = replay.checkpoint().unwrap();
        let loaded = Replay::load(cfg(to), b.core.scopes().clone(), replay.lsn(), &bytes);
        assert!(loaded.is_ok(), "{from:?} -> {to:?}: {:?}", loaded.err());
        // The marks' effect: at L1 a second writer of x is refused while t1 is unsettled.
        let mut b = Bench { core: loaded.unwrap().finish(NOW).0, world: b.world };
        b.core.check_integrity().unwrap();
        let t2 = b.begin(&["kv:x"]);
        let second = b.set(t2, "kv:x", 2);
        if to == Level::L1 { lock_conflict(second, t2) } else { second.unwrap() }
    }
}
