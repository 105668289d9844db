//! The benchmark runs end to end at a tiny size and reports every part (figures are not
//! asserted: they are measured by `tidegate bench review` in release builds).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_review::bench::{Config, mean_ci, run};
use tidegate_review::tpcc::Scale;

#[test]
fn the_benchmark_reports_every_cell_and_no_refused_removal() {
    let cfg = Config {
        trials: 2,
        transactions: 30,
        perf_transactions: 20,
        scale: Scale { warehouses: 1, districts: 2, customers: 6, items: 20 },
        seed: 1,
        pg_url: None,
    };
    let out = run(&cfg, &mut |_| {}).unwrap();
    assert_eq!(out["buffered_rate_vs_si"].as_array().unwrap().len(), 8);
    assert_eq!(out["buffered_rate_vs_ri"].as_array().unwrap().len(), 10);
    for row in out["buffered_rate_vs_si"].as_array().unwrap() {
        let r = row["rate_arrival"].as_f64().unwrap();
        let si = row["si"].as_f64().unwrap();
        assert!(r + 1e-9 >= 1.0 / si - 1.0 / 30.0 && r <= 1.0, "every suspicious request is buffered: {row}");
    }
    assert_eq!(out["throughput"].as_array().unwrap().len(), 4);
    for row in out["double_execution"].as_array().unwrap() {
        assert_eq!(row["refused_removals"], 0);
    }
}

#[test]
fn confidence_intervals_use_student_t() {
    let (m, ci) = mean_ci(&[1.0, 3.0]);
    assert_eq!(m, 2.0);
    assert!((ci - 12.706 * (2.0f64 / 2.0).sqrt()).abs() < 1e-9);
    assert!(mean_ci(&[5.0]).1.is_nan());
}
