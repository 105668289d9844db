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

#[test]
fn the_plots_draw_one_line_per_granularity_with_an_interval_per_point() {
    let row = |gran: &str, x: u32, y: f64, ci: f64| {
        serde_json::json!({"granularity": gran, "si": x, "ri": x, "rate_end": y, "rate_end_ci95": ci,
            "rate_arrival": y, "rate_arrival_ci95": ci})
    };
    let result = serde_json::json!({
        "buffered_rate_vs_si": [row("field", 2, 0.7, 0.02), row("field", 5, 0.55, 0.02), row("table", 2, 0.95, 0.01)],
        "buffered_rate_vs_ri": [row("field", 5, 0.3, f64::NAN), row("table", 25, 0.9, 0.01)],
    });
    let plots = tidegate_review::plot::plots(&result);
    assert_eq!(plots.len(), 2);
    let (name, svg) = &plots[0];
    assert_eq!(name, "review-rate-vs-si.svg");
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"), "{svg}");
    assert_eq!(svg.matches("<polyline").count(), 2, "field and table");
    assert_eq!(svg.matches("<circle").count(), 3, "one point per row");
    assert!(svg.contains("field: x=5 y=0.550 ± 0.020"), "{svg}");
    assert!(!svg.contains("NaN") && !plots[1].1.contains("NaN"), "a missing interval draws none");
    assert!(!svg.contains("<script") && !svg.contains("href"), "self-contained");
}
