//! The qualitative results the paper reports and the mechanisms imply, checked on quick runs.
//! Every number comes from the sinks after the mechanism ran; none is decided by a mode name.
#![allow(clippy::unwrap_used)] // tests unwrap by design

use serde_json::Value;
use tidegate_eval::fault::{FaultClass, FaultProfile};
use tidegate_eval::mech::tcc::Wiring;
use tidegate_eval::workloads::{contention, recovery, stress};
use tidegate_eval::{Config, Env, Mode};

fn env(trials: u64) -> Env {
    Env::new(Config { trials: Some(trials), ..Config::quick() }).unwrap()
}

fn cell_for<'a>(cells: &'a [Value], mode: &str) -> &'a Value {
    cells.iter().find(|c| c["mode"] == mode).unwrap_or_else(|| panic!("no cell for {mode}"))
}

#[test]
fn forced_overlap_breaks_per_call_lock_and_no_tx_but_not_tidegate_or_workflow_lock() {
    let env = env(12);
    let run = |m: Mode, n: usize, overlap: bool| contention::cell(&env, m, n, overlap, 12, (50, 150)).unwrap().unwrap();
    for m in [Mode::TX_FULL, Mode::TX_FCW, Mode::WorkflowLock, Mode::Occ] {
        let c = run(m, 4, true);
        assert_eq!(c.violations, 0, "{} committed stale writes: {c:?}", m.name());
        assert_eq!(c.committed, c.tasks, "{} must finish every task: {c:?}", m.name());
    }
    for m in [Mode::PerCallLock, Mode::NoTx] {
        let c = run(m, 4, true);
        assert!(c.violations > 0 && c.runs_violating == c.runs, "{} should race: {c:?}", m.name());
    }
    // Tidegate and OCC pay for safety with re-plans, not with locks.
    assert!(run(Mode::Occ, 4, true).rejections > 0);
    assert!(run(Mode::TX_FULL, 4, true).rejections > 0);
}

#[test]
fn workflow_lock_waits_on_disjoint_orders_and_tidegate_does_not() {
    let env = env(5);
    for n in [2, 4, 8] {
        let wl = contention::cell(&env, Mode::WorkflowLock, n, false, 5, (50, 150)).unwrap().unwrap();
        let tx = contention::cell(&env, Mode::TX_FULL, n, false, 5, (50, 150)).unwrap().unwrap();
        assert_eq!((wl.violations, tx.violations), (0, 0));
        assert!(wl.wait_ms > 0.0, "a global lock serialises disjoint work: {wl:?}");
        assert_eq!(tx.wait_ms, 0.0, "declared disjoint scopes never wait: {tx:?}");
    }
    // Wait under the global lock grows with the number of agents.
    let w4 = contention::cell(&env, Mode::WorkflowLock, 4, false, 3, (50, 50)).unwrap().unwrap();
    let w16 = contention::cell(&env, Mode::WorkflowLock, 16, false, 3, (50, 50)).unwrap().unwrap();
    assert!(w16.wait_per_task() > 3.0 * w4.wait_per_task(), "{w4:?} {w16:?}");
}

#[test]
fn irreversible_sends_leak_from_saga_and_misclassification_but_never_from_tidegate() {
    let env = env(6);
    let r = tidegate_eval::run(&env, "irreversible").unwrap();
    let per = |mode: &str| -> Vec<u64> {
        cell_for(&r.cells, mode)["per_source"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["leaks"].as_u64().unwrap())
            .collect()
    };
    for c in &r.cells {
        assert_eq!(c["valid_delivered"], c["valid_trials"], "positive control: {c}");
    }
    assert_eq!(per("Tx-Full"), [0, 0, 0, 0, 0]);
    assert_eq!(cell_for(&r.cells, "Tx-Full")["duplicates"], 0);
    assert_eq!(per("Mutex+WAL+Rollback"), [0, 0, 0, 0, 0]);
    // Every abort source in this workflow comes after the send: compensation cannot un-send.
    assert!(per("Saga-Compensation").iter().all(|&k| k == 6), "{:?}", per("Saga-Compensation"));
    assert!(per("No-Tx").iter().all(|&k| k == 6));
    assert!(per("Tx-MisclassifiedIrreversible").iter().sum::<u64>() > 0);
    // A fully wired TCC holds sends until confirm, but has no read validation.
    let tcc = per("TCC-Confirm");
    assert_eq!((tcc[0], tcc[1], tcc[3], tcc[4]), (0, 0, 0, 0));
    assert_eq!(tcc[2], 6, "stale plans are confirmed: {tcc:?}");
}

#[test]
fn losing_branches_leave_no_residue_under_tidegate_in_any_sink() {
    let env = env(4);
    let r = tidegate_eval::run(&env, "speculation").unwrap();
    let tx = cell_for(&r.cells, "Tx-Full");
    assert_eq!(tx["residue"], serde_json::json!({"buffer": 0, "fs": 0, "db": 0, "mail": 0}));
    assert_eq!(tx["winner_complete"], tx["runs"]);
    let saga = cell_for(&r.cells, "Saga-Compensation");
    assert_eq!(saga["residue"]["mail"], saga["losing_branches"], "compensation cannot un-send");
    assert_eq!(saga["residue"]["db"], 0);
    let dbonly = cell_for(&r.cells, "TCC-Confirm (DB-only wiring)");
    assert_eq!(dbonly["residue"]["mail"], dbonly["losing_branches"]);
    assert_eq!(cell_for(&r.cells, "Tx-MisclassifiedIrreversible")["residue"]["mail"], tx["losing_branches"]);
}

#[test]
fn stress_without_faults_is_clean_for_tidegate_and_racy_for_per_call_locks() {
    let env = env(8);
    let none = FaultProfile::none();
    let tx = stress::cell(&env, Mode::TX_FULL, "none", &none, 8).unwrap().unwrap();
    assert_eq!((tx.clean, tx.violations, tx.stale, tx.leaks, tx.duplicates), (8, 0, 0, 0, 0), "{tx:?}");
    let pcl = stress::cell(&env, Mode::PerCallLock, "none", &none, 8).unwrap().unwrap();
    assert!(pcl.stale > 0, "{pcl:?}");
}

#[test]
fn stress_under_mixed_faults_never_leaks_or_duplicates_under_tidegate() {
    let env = env(10);
    let mixed = FaultProfile::mixed(0.3);
    let tx = stress::cell(&env, Mode::TX_FULL, "mixed p=0.3", &mixed, 10).unwrap().unwrap();
    assert_eq!((tx.violations, tx.stale, tx.leaks, tx.duplicates), (0, 0, 0, 0), "{tx:?}");
    let f4 = FaultProfile::bernoulli(0.3, &[FaultClass::F4]);
    let tx4 = stress::cell(&env, Mode::TX_FULL, "F4-only p=0.3", &f4, 10).unwrap().unwrap();
    assert_eq!(tx4.clean, tx4.runs, "idempotency keys absorb duplicate delivery: {tx4:?}");
    let notx = stress::cell(&env, Mode::NoTx, "F4-only p=0.3", &f4, 10).unwrap().unwrap();
    assert!(notx.duplicates > 0, "{notx:?}");
}

#[test]
fn duplicate_delivery_is_absorbed_by_keys_and_residue_tags_match_the_sinks() {
    let env = env(10);
    let f4 = FaultProfile::bernoulli(0.3, &[FaultClass::F4]);
    let tx = recovery::clean_success(&env, Mode::TX_FULL, "f4", &f4, 10).unwrap().unwrap();
    assert_eq!(tx.k, tx.n, "{tx:?}");
    let tcc = recovery::clean_success(&env, Mode::Tcc(Wiring::Full), "f4", &f4, 10).unwrap().unwrap();
    assert_eq!(tcc.k, tcc.n, "confirm is idempotent per reservation: {tcc:?}");
    let notx = recovery::clean_success(&env, Mode::NoTx, "f4", &f4, 10).unwrap().unwrap();
    assert!(notx.k < notx.n, "unkeyed duplicates: {notx:?}");
    let (gt, classified, mismatch) = recovery::classification(&env, Mode::TX_FULL, 0.3, 40).unwrap().unwrap();
    assert_eq!(mismatch, 0, "gt {gt} classified {classified}");
}

#[test]
fn annotation_errors_fail_the_way_the_paper_says_and_aliases_canonicalise() {
    use tidegate_eval::mech::tidegate::Annotation;
    use tidegate_eval::workloads::annotations;
    let env = env(6);
    let control = annotations::cell(&env, Annotation::Correct, "control", 6).unwrap();
    assert_eq!((control.violations, control.leaks, control.residue), (0, 0, 0));
    let broad = annotations::cell(&env, Annotation::OverBroadScope, "ob", 6).unwrap();
    assert_eq!((broad.violations, broad.leaks), (0, 0));
    assert!(broad.disjoint_wait_ms > 0.0, "over-broad fails closed by waiting: {broad:?}");
    assert!(annotations::cell(&env, Annotation::TooNarrowScope, "tn", 6).unwrap().violations > 0);
    assert!(annotations::cell(&env, Annotation::WrongEffectClass, "wc", 6).unwrap().leaks > 0);
    let nc = annotations::cell(&env, Annotation::MissingCompensation, "nc", 6).unwrap();
    assert!(nc.residue > 0 && nc.alerted == nc.residue, "{nc:?}");
    let r = annotations::run(&env).unwrap();
    let engine = r.cells.iter().find(|c| c["strategy"] == "Tidegate canonical (engine, measured)").unwrap();
    assert_eq!((engine["missed"].as_u64(), engine["false_conflicts"].as_u64()), (Some(0), Some(0)), "{engine}");
    let naive = r.cells.iter().find(|c| c["strategy"] == "Naive string equality").unwrap();
    assert!(naive["missed"].as_u64().unwrap() > 0);
}

#[test]
fn the_same_seed_gives_the_same_results() {
    let env = env(6);
    let mixed = FaultProfile::mixed(0.3);
    let a = stress::cell(&env, Mode::Saga, "mixed", &mixed, 6).unwrap().unwrap();
    let b = stress::cell(&env, Mode::Saga, "mixed", &mixed, 6).unwrap().unwrap();
    assert_eq!(serde_json::to_value(&a).unwrap(), serde_json::to_value(&b).unwrap());
    let t1 = stress::cell(&env, Mode::TX_FULL, "mixed", &mixed, 6).unwrap().unwrap();
    let t2 = stress::cell(&env, Mode::TX_FULL, "mixed", &mixed, 6).unwrap().unwrap();
    assert_eq!(serde_json::to_value(&t1).unwrap(), serde_json::to_value(&t2).unwrap());
}

#[test]
fn every_workload_renders_tables_csv_and_plots() {
    let env = env(2);
    let dir = tempfile::tempdir().unwrap();
    for name in tidegate_eval::WORKLOADS {
        let r = tidegate_eval::run(&env, name).unwrap();
        assert!(!r.tables.is_empty() && r.tables.iter().all(|t| !t.rows.is_empty()), "{name}");
        assert!(r.render().contains("| Mode") || r.render().contains("| Configuration"), "{name}");
        for p in r.write_csv(dir.path()).unwrap() {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(text.lines().count() >= 2);
        }
        for p in r.write_svg(dir.path()).unwrap() {
            assert!(std::fs::read_to_string(p).unwrap().starts_with("<svg"));
        }
    }
    assert!(tidegate_eval::run(&env, "nope").unwrap_err().to_string().contains("unknown workload `nope`"));
}

#[test]
fn levels_l1_and_above_are_safe_and_removing_a_primitive_is_not() {
    use tidegate_eval::mech::tidegate::{TgAblation, TgLevel};
    let env = env(8);
    let overlap = |m: Mode| contention::cell(&env, m, 4, true, 8, (50, 150)).unwrap().unwrap();
    for l in [TgLevel::L1, TgLevel::L1Snapshot, TgLevel::L2, TgLevel::L3] {
        let c = overlap(Mode::tx_level(l));
        assert_eq!((c.violations, c.committed), (0, c.tasks), "{l:?}: {c:?}");
    }
    assert!(overlap(Mode::tx_level(TgLevel::L0)).violations > 0, "L0 checks nothing");
    assert!(overlap(Mode::tx_ablation(TgAblation::NoStaleReadAbort)).violations > 0);
    assert_eq!(overlap(Mode::tx_ablation(TgAblation::NoFrontier)).violations, 0, "stale reads still abort");
    let global = contention::cell(&env, Mode::tx_ablation(TgAblation::GlobalFrontier), 8, false, 8, (50, 150));
    let full = contention::cell(&env, Mode::TX_FULL, 8, false, 8, (50, 150)).unwrap().unwrap();
    assert!(global.unwrap().unwrap().wait_ms > 0.0 && full.wait_ms == 0.0, "one frontier makes disjoint work wait");
    let mixed = FaultProfile::mixed(0.3);
    for l in [TgLevel::L3, TgLevel::Default] {
        let c = stress::cell(&env, Mode::tx_level(l), "mixed p=0.3", &mixed, 8).unwrap().unwrap();
        assert_eq!((c.violations, c.stale, c.leaks, c.duplicates), (0, 0, 0, 0), "{l:?}: {c:?}");
    }
}
