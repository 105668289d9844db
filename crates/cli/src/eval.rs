//! `tidegate bench contention|speculation|irreversible|recovery|stress|annotations|all`: the
//! evaluation harness of `tidegate-eval`, next to the engine micro-benchmarks. The harness is
//! compiled in only with the cargo feature `eval` (it needs tokio's `test-util` for its
//! virtual clock); without it the workload subcommands are not listed by `tidegate bench
//! --help` (only what this binary can run is), and called anyway they say how to get them.

use std::path::PathBuf;

#[cfg(feature = "eval")]
use anyhow::Context;
#[cfg(feature = "eval")]
use tidegate_eval::{Config, Env, WORKLOADS};

/// `tidegate bench ...`: the engine benchmarks and the evaluation workloads.
#[derive(Debug, clap::Subcommand)]
#[cfg_attr(not(feature = "eval"), allow(dead_code))]
pub enum BenchCmd {
    #[command(flatten)]
    Engine(crate::bench::Which),
    /// Cancel-vs-modify on one order, disjoint orders, wait scaling (Tables 1 and 10).
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    Contention(EvalArgs),
    /// K speculative branches over four sinks: residue and latency (Tables 12 and 17).
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    Speculation(EvalArgs),
    /// Irreversible sends under five abort sources, with the valid-send control (Tables 2, 15).
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    Irreversible(EvalArgs),
    /// F1-F5 at three rates, bursts, compensation-failure audit (Tables 9, 7, 16).
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    Recovery(EvalArgs),
    /// The combined stress run (Table 3).
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    Stress(EvalArgs),
    /// Adapter annotation errors and scope aliasing (Tables 21 and 20).
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    Annotations(EvalArgs),
    /// Every evaluation workload.
    #[cfg_attr(not(feature = "eval"), command(hide = true))]
    All(EvalArgs),
}

/// Options of every evaluation workload.
#[derive(Debug, clap::Args)]
#[cfg_attr(not(feature = "eval"), allow(dead_code))]
pub struct EvalArgs {
    /// Reduced trials (`all --quick` finishes in under two minutes).
    #[arg(long)]
    quick: bool,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Where to write the CSV tables (default: the results directory).
    #[arg(long, value_name = "DIR")]
    csv: Option<PathBuf>,
    /// Write SVG plots into DIR.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Where to write JSON and CSV results (default: a `tidegate-bench-SEED` directory under
    /// the system temp dir).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Base seed of the fault injector and think times.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Trials per cell (overrides the workload's default).
    #[arg(long)]
    trials: Option<u64>,
    /// Run think times on the wall clock instead of the virtual clock.
    #[arg(long)]
    wall: bool,
}

/// Runs a `tidegate bench` subcommand.
#[cfg(not(feature = "eval"))]
pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Engine(which) => crate::bench::run(which),
        _ => anyhow::bail!(
            "this tidegate was built without the evaluation harness (cargo feature `eval`); \
             build it with `cargo build --release -p tidegate --features eval`"
        ),
    }
}

/// Runs a `tidegate bench` subcommand.
#[cfg(feature = "eval")]
pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    let (names, args): (Vec<&str>, EvalArgs) = match cmd {
        BenchCmd::Engine(which) => return crate::bench::run(which),
        BenchCmd::Contention(a) => (vec!["contention"], a),
        BenchCmd::Speculation(a) => (vec!["speculation"], a),
        BenchCmd::Irreversible(a) => (vec!["irreversible"], a),
        BenchCmd::Recovery(a) => (vec!["recovery"], a),
        BenchCmd::Stress(a) => (vec!["stress"], a),
        BenchCmd::Annotations(a) => (vec!["annotations"], a),
        BenchCmd::All(a) => (WORKLOADS.to_vec(), a),
    };
    if args.trials == Some(0) {
        anyhow::bail!("invalid `--trials` = 0: expected at least one trial per cell");
    }
    let cfg = Config { quick: args.quick, seed: args.seed, trials: args.trials, wall: args.wall, progress: true };
    let env = Env::new(cfg).context("start the evaluation harness (mail server, sinks)")?;
    let out = args.out.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("tidegate-bench-{}", args.seed)));
    std::fs::create_dir_all(&out).with_context(|| format!("create the results directory {}", out.display()))?;
    let csv_dir = args.csv.clone().unwrap_or_else(|| out.clone());
    let started = std::time::Instant::now();
    let mut reports = Vec::new();
    for name in names {
        let report = tidegate_eval::run(&env, name).with_context(|| format!("workload `{name}`"))?;
        let json_path = out.join(format!("{name}.json"));
        std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("write {}", json_path.display()))?;
        report.write_csv(&csv_dir).with_context(|| format!("write CSV into {}", csv_dir.display()))?;
        if let Some(dir) = &args.plot {
            report.write_svg(dir).with_context(|| format!("write plots into {}", dir.display()))?;
        }
        if !args.json {
            println!("{}", report.render());
        }
        reports.push(report);
    }
    env.progress.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!(
            "results: {} (JSON), {} (CSV){}; {:.1} s",
            out.display(),
            csv_dir.display(),
            args.plot.as_ref().map(|p| format!(", {} (SVG)", p.display())).unwrap_or_default(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
