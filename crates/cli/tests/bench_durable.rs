//! `tidegate bench durable`: the checkpoint share is measured over pairs of runs, and bad
//! pair counts are refused by name.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

#[test]
fn the_checkpoint_share_is_the_median_of_its_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "durable", "--json", "--seconds", "0.2", "--checkpoint-pairs", "3", "--checkpoint-every", "50"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pairs: Vec<f64> =
        v["checkpoint_cost_64_pairs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(pairs.len(), 3, "{v}");
    // Each share is 1 - with/without of two runs that both committed something.
    for p in &pairs {
        assert!(p.is_finite() && *p < 1.0, "share {p} in {v}");
    }
    let mut sorted = pairs.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(v["checkpoint_cost_64"].as_f64().unwrap(), sorted[1], "{v}");
    assert!(v["durable_tx_per_s_64"].as_f64().unwrap() > 0.0, "{v}");
    // The pairs' ledgers are kept in the given directory, one per run.
    for name in ["ledger-64-pair-0-with", "ledger-64-pair-0-without", "ledger-64-pair-2-with"] {
        assert!(dir.path().join(name).is_dir(), "{name} missing");
    }
}

#[test]
fn a_pair_count_out_of_range_is_refused_by_name() {
    for bad in ["0", "21", "x"] {
        let out = Command::new(BIN).args(["bench", "durable", "--checkpoint-pairs", bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "--checkpoint-pairs {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--checkpoint-pairs") && err.contains(bad), "{err}");
    }
}
