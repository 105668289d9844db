//! `tidegate bench detect`: throughput and memory of the anomaly detectors on generated traces.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};
use tidegate_detect::{ReadOptions, check, generate_trace, read_path};

/// Peak resident set size of this process, in bytes (Linux; `None` elsewhere).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Current resident set size, in bytes.
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak-RSS counter (Linux ≥ 4.0); returns whether it worked.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn write_trace(n: usize, seed: u64, path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for line in generate_trace(n, seed) {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn one(n: usize, seed: u64, dir: &Path) -> anyhow::Result<Value> {
    let path: PathBuf = dir.join(format!("tidegate-bench-detect-{n}-{}.jsonl", std::process::id()));
    write_trace(n, seed, &path)?;
    let file_bytes = std::fs::metadata(&path)?.len();
    let base = rss().unwrap_or(0);
    let reset = reset_peak();
    let t0 = Instant::now();
    let trace = read_path(&path, &ReadOptions::default()).with_context(|| format!("read {}", path.display()))?;
    let read_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let report = check(&trace);
    let check_s = t1.elapsed().as_secs_f64();
    let peak = peak_rss().unwrap_or(0);
    let heap = trace.heap_bytes();
    drop(trace);
    std::fs::remove_file(&path).ok();
    let a = &report.anomalies;
    // The peak above the resident size before reading: what reading and checking needed.
    let used = peak.saturating_sub(base);
    Ok(json!({
        "records": n,
        "file_bytes": file_bytes,
        "records_per_s": (n as f64 / check_s).round() as u64,
        "records_per_s_with_parse": (n as f64 / (read_s + check_s)).round() as u64,
        // Issue 31's measure: reading the file, parsing, detecting and classifying.
        "records_per_s_end_to_end": (n as f64 / (read_s + check_s)).round() as u64,
        "read_s": (read_s * 1000.0).round() / 1000.0,
        "check_s": (check_s * 1000.0).round() / 1000.0,
        "trace_heap_bytes": heap,
        "peak_rss_above_start_bytes": if reset { Some(used) } else { None },
        "peak_memory_ratio_to_file": if reset { Some((used as f64 / file_bytes as f64 * 100.0).round() / 100.0) } else { None },
        "level": report.level.to_string(),
        "anomalies": {"A1": a.a1, "A2": a.a2, "A3": a.a3, "A4": a.a4, "A6": a.a6},
        "cycles": report.cycles,
    }))
}

pub fn run(as_json: bool, sizes: &[usize], seed: u64) -> anyhow::Result<()> {
    let dir = std::env::temp_dir();
    let mut runs = Vec::new();
    for &n in sizes {
        runs.push(one(n, seed, &dir)?);
    }
    // Scaling: time per record at the largest size over time per record at the smallest.
    let per = |v: &Value| v["records"].as_f64().unwrap_or(1.0) / v["records_per_s"].as_f64().unwrap_or(1.0);
    let scaling = match (runs.first(), runs.last()) {
        (Some(a), Some(b)) if runs.len() > 1 => {
            let n_ratio = b["records"].as_f64().unwrap_or(1.0) / a["records"].as_f64().unwrap_or(1.0);
            Some(((per(b) / per(a)) / n_ratio * 100.0).round() / 100.0)
        }
        _ => None,
    };
    let largest = runs.last().cloned().unwrap_or(Value::Null);
    let out = json!({
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "records_per_s": largest["records_per_s"],
        "records_per_s_end_to_end": largest["records_per_s_end_to_end"],
        "records": largest["records"],
        "peak_memory_ratio_to_file": largest["peak_memory_ratio_to_file"],
        "time_per_record_growth": scaling,
        "runs": runs,
    });
    if as_json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "tidegate bench detect ({} build): all detectors + classification + cycles",
        out["profile"].as_str().unwrap_or("?")
    );
    println!(
        "  {:>9} {:>12} {:>14} {:>10} {:>18} {:>8} {:>12} {:>7}",
        "records", "file MB", "records/s", "check s", "end-to-end rec/s", "read s", "peak/file", "level"
    );
    for r in &out["runs"].as_array().cloned().unwrap_or_default() {
        println!(
            "  {:>9} {:>12.1} {:>14} {:>10} {:>18} {:>8} {:>12} {:>7}",
            r["records"],
            r["file_bytes"].as_f64().unwrap_or(0.0) / 1e6,
            r["records_per_s"],
            r["check_s"],
            r["records_per_s_end_to_end"],
            r["read_s"],
            r["peak_memory_ratio_to_file"],
            r["level"].as_str().unwrap_or("?")
        );
    }
    if let Some(s) = scaling {
        println!("  time per record at the largest size / at the smallest, per size ratio: {s} (1.0 = linear)");
    }
    Ok(())
}
