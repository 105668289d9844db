//! Throughput of reading + checking generated traces.
//!
//! `cargo run --release -p tidegate-detect --example detect_bench -- [MAX_RECORDS]`
//!
//! For 1e5 records and then each power of ten up to MAX_RECORDS (default 1e6): generates a
//! trace into a temporary file, then times reading it (parse + intern) and checking it (all
//! detectors, classification and the cycle check), and prints records/s for both and for the
//! whole pipeline, with the file size and the trace's heap size.

use std::io::Write;
use std::time::Instant;
use tidegate_detect::{ReadOptions, check, generate_trace, read_path};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `--report PATH`: print the human report of a trace (three witnesses per kind).
    if std::env::args().nth(1).as_deref() == Some("--report") {
        let path = std::env::args().nth(2).ok_or("--report needs a path")?;
        print!("{}", check(&read_path(path, &ReadOptions::default())?).human(3));
        return Ok(());
    }
    // `--file PATH`: time an existing trace instead of generated ones.
    if std::env::args().nth(1).as_deref() == Some("--file") {
        let path = std::env::args().nth(2).ok_or("--file needs a path")?;
        return time_file(std::path::Path::new(&path), None);
    }
    // `--generate N PATH`: write a generated trace and stop.
    if std::env::args().nth(1).as_deref() == Some("--generate") {
        let n: usize = std::env::args().nth(2).ok_or("--generate needs N")?.parse()?;
        let path = std::env::args().nth(3).ok_or("--generate needs a path")?;
        return write_trace(n, std::path::Path::new(&path));
    }
    let max: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(1_000_000);
    let mut n = 100_000.min(max);
    loop {
        run(n)?;
        if n >= max {
            break;
        }
        n = (n * 10).min(max);
    }
    Ok(())
}

fn run(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("tidegate-detect-bench-{n}-{}.jsonl", std::process::id()));
    write_trace(n, &path)?;
    time_file(&path, Some(n))?;
    std::fs::remove_file(&path)?;
    Ok(())
}

fn write_trace(n: usize, path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for line in generate_trace(n, 42) {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn time_file(path: &std::path::Path, expected: Option<usize>) -> Result<(), Box<dyn std::error::Error>> {
    let file_bytes = std::fs::metadata(path)?.len();
    let t0 = Instant::now();
    let trace = read_path(path, &ReadOptions::default())?;
    let n = expected.unwrap_or(trace.len());
    let t_read = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let report = check(&trace);
    let t_check = t1.elapsed().as_secs_f64();
    let rate = |secs: f64| n as f64 / secs;
    println!(
        "{n} records ({:.0} MB file, trace heap {:.0} MB): read {:.2}s ({:.0} rec/s), check {:.2}s ({:.0} rec/s), total {:.0} rec/s",
        file_bytes as f64 / 1e6,
        trace.heap_bytes() as f64 / 1e6,
        t_read,
        rate(t_read),
        t_check,
        rate(t_check),
        rate(t_read + t_check)
    );
    let a = &report.anomalies;
    println!(
        "  level {} | A1 {} A2 {} A3 {} A4 {} A6 {} | cycles {} | malformed {}",
        report.level, a.a1, a.a2, a.a3, a.a4, a.a6, report.cycles, report.malformed
    );
    Ok(())
}
