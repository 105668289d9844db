//! `tidegate bench review`: the review middleware's benchmark (the logic lives in
//! `tidegate_review::bench`; this prints it).

use tidegate_review::bench::{Config, run as run_bench};

/// Options of `tidegate bench review`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Trials per buffered-rate cell.
    #[arg(long, default_value_t = 5)]
    trials: u32,
    /// Requests per buffered-rate trial.
    #[arg(long, default_value_t = 500)]
    transactions: u32,
    /// Requests per throughput run (SQLite; a quarter on PostgreSQL).
    #[arg(long, default_value_t = 2000)]
    perf_transactions: u32,
    /// Base seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Also measure on PostgreSQL at this URL (e.g. postgres://postgres@127.0.0.1:5432/test);
    /// default: the environment variable TIDEGATE_PG_URL, if set.
    #[arg(long)]
    pg_url: Option<String>,
    /// Also write SVG plots of the buffered rate (with 95% confidence intervals) into DIR.
    #[arg(long, value_name = "DIR")]
    svg: Option<std::path::PathBuf>,
}

/// Runs the benchmark and prints it.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.trials == 0 || a.transactions == 0 || a.perf_transactions < 2 {
        anyhow::bail!("`--trials` and `--transactions` must be at least 1 and `--perf-transactions` at least 2");
    }
    let cfg = Config {
        trials: a.trials,
        transactions: a.transactions,
        perf_transactions: a.perf_transactions,
        seed: a.seed,
        pg_url: a.pg_url.or_else(|| std::env::var("TIDEGATE_PG_URL").ok()),
        ..Config::default()
    };
    let out = run_bench(&cfg, &mut |line| eprintln!("done: {line}"))?;
    if let Some(dir) = &a.svg {
        std::fs::create_dir_all(dir)?;
        for (name, svg) in tidegate_review::plot::plots(&out) {
            let path = dir.join(name);
            std::fs::write(&path, svg)?;
            eprintln!("wrote {}", path.display());
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "buffered rate (buffer-suspicious, TPC-C standard mix, {} requests, {} trials, 95% CI)",
        a.transactions, a.trials
    );
    println!("{:>4} {:>5} {:>7} {:>18} {:>18} {:>12}", "SI", "RI", "gran", "rate_end", "rate_arrival", "mean_buffer");
    for row in out["buffered_rate_vs_si"].as_array().into_iter().chain(out["buffered_rate_vs_ri"].as_array()).flatten()
    {
        println!(
            "{:>4} {:>5} {:>7} {:>9.3} ± {:<6.3} {:>9.3} ± {:<6.3} {:>12.1}",
            row["si"],
            row["ri"].to_string().trim_matches('"'),
            row["granularity"].as_str().unwrap_or(""),
            row["rate_end"].as_f64().unwrap_or(f64::NAN),
            row["rate_end_ci95"].as_f64().unwrap_or(f64::NAN),
            row["rate_arrival"].as_f64().unwrap_or(f64::NAN),
            row["rate_arrival_ci95"].as_f64().unwrap_or(f64::NAN),
            row["mean_buffer"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!("\nthroughput and latency");
    for row in out["throughput"].as_array().into_iter().flatten() {
        println!(
            "{:<12} {:<40} {:>9.0} tx/s  p50 {:>7.0} us  p99 {:>7.0} us",
            row["database"].as_str().unwrap_or(""),
            row["mode"].as_str().unwrap_or(""),
            row["tx_per_s"].as_f64().unwrap_or(f64::NAN),
            row["p50_us"].as_f64().unwrap_or(f64::NAN),
            row["p99_us"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!("\nevery request suspicious and removed");
    for row in out["double_execution"].as_array().into_iter().flatten() {
        println!(
            "{:<12} {:<20} {:>5.2} database transactions/request  {:>7.3} ms/request",
            row["database"].as_str().unwrap_or(""),
            row["strategy"].as_str().unwrap_or(""),
            row["database_transactions_per_request"].as_f64().unwrap_or(f64::NAN),
            row["ms_per_request"].as_f64().unwrap_or(f64::NAN),
        );
    }
    Ok(())
}
