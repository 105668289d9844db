#![allow(clippy::unwrap_used)] // tests unwrap by design

//! The engine's own trace, end to end through the binary: `demo --trace` writes operation
//! records, `check --json` reads them.

use std::process::Command;

fn tidegate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidegate"))
}

#[test]
fn demo_trace_checks_clean_at_l4() {
    let dir = std::env::temp_dir().join(format!("tidegate-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("demo.jsonl");
    let out = tidegate().args(["demo", "--memory", "--trace"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = tidegate().arg("check").arg(&file).arg("--json").arg("--strict").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The demo runs five transactions: three commit, two abort.
    assert_eq!(report["records"], 5, "{report}");
    assert_eq!(report["level"], "L4", "{report}");
    for a in ["A1", "A2", "A3", "A6"] {
        assert_eq!(report["anomalies"][a], 0, "{a}: {report}");
    }
    assert_eq!(report["cycles"], 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_detect_reports_rate_and_memory() {
    let out = tidegate().args(["bench", "detect", "--json", "--sizes", "2000,20000"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"], 20000);
    assert!(v["records_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["runs"].as_array().unwrap().len(), 2);
}
