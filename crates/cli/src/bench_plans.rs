//! `tidegate bench plans`: the plans executor's benchmark (the logic lives in
//! `tidegate_plans::bench`; this prints it).

use tidegate_plans::bench::{BenchConfig, run as run_bench};

/// Options of `tidegate bench plans`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Held registrations (one plan, step and deadline each) for the reopen and memory figures.
    #[arg(long, default_value_t = 1_000_000)]
    held: u64,
    /// Compensations fired in the throughput run.
    #[arg(long, default_value_t = 200_000)]
    fire: u64,
}

/// Runs the benchmark and prints it.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.held == 0 || a.fire == 0 {
        anyhow::bail!("`--held` and `--fire` must be at least 1");
    }
    let cfg = BenchConfig { held: a.held, fire: a.fire, ..BenchConfig::default() };
    let out = run_bench(&cfg).map_err(|e| anyhow::anyhow!("bench plans: {e}"))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let f = |k: &str| out[k].as_f64().unwrap_or(f64::NAN);
    println!("held registrations        {}", out["held_registrations"]);
    println!("armed deadlines           {}", out["armed_deadlines"]);
    println!("reopen (decode + fold)    {:.3} s", f("reopen_s"));
    println!("RSS per held registration {:.0} bytes", f("rss_bytes_per_held_registration"));
    println!("compensations fired/s     {:.0}", f("compensations_fired_per_s"));
    for row in out["wheel"].as_array().into_iter().flatten() {
        println!(
            "wheel: {:>9} armed  {:>7.1} ns per timer",
            row["armed"],
            row["ns_per_timer"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}
