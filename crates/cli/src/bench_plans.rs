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
    /// Plans (one step, one held registration, one deadline each) run through the engine for
    /// the engine-level reopen (checkpoint + tail, executor start); 0 skips it. The ledger is
    /// in memory, so the figure excludes reading the checkpoint from disk.
    #[arg(long, default_value_t = 100_000)]
    engine_plans: u64,
}

/// Runs the benchmark and prints it.
pub fn run(a: Args) -> anyhow::Result<()> {
    if a.held == 0 || a.fire == 0 {
        anyhow::bail!("`--held` and `--fire` must be at least 1");
    }
    let cfg = BenchConfig { held: a.held, fire: a.fire, ..BenchConfig::default() };
    let mut out = run_bench(&cfg).map_err(|e| anyhow::anyhow!("bench plans: {e}"))?;
    if a.engine_plans > 0 {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        out["engine_reopen"] = rt.block_on(engine_reopen(a.engine_plans))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let f = |k: &str| out[k].as_f64().unwrap_or(f64::NAN);
    println!("held registrations        {}", out["held_registrations"]);
    println!("armed deadlines           {}", out["armed_deadlines"]);
    println!("reopen (snapshot restore) {:.3} s", f("reopen_s"));
    println!("rebuild from the log      {:.3} s", f("rebuild_from_log_s"));
    if let Some(e) = out.get("engine_reopen") {
        println!(
            "engine reopen             {:.3} s with {} plans held (checkpoint + tail, executor started)",
            e["reopen_s"].as_f64().unwrap_or(f64::NAN),
            e["plans"]
        );
    }
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

/// Runs `n` plans through an engine on an in-memory ledger (each: open with a deadline a day
/// out, one step with one reversible call carrying a descriptor, committed; the plan stays
/// open, so its registration is held and its deadline armed), checkpoints, and times a new
/// engine's open and recovery on the same ledger until its executor has started.
async fn engine_reopen(n: u64) -> anyhow::Result<serde_json::Value> {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use tidegate_runtime::{
        CallOptions, Compensation, Descriptor, EffectClass, LedgerStore, MemoryStore, PlanOptions, Tidegate, Tool,
        TxOptions,
    };
    let book = Tool::builder("book", EffectClass::Reversible)
        .scope(|a| format!("bench:room:{}", a["n"]))
        .key(|a| format!("book-{}", a["n"]))
        .call(|a| async move { Ok(serde_json::json!({"id": a["n"]})) })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()?;
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder().store(store.clone()).build()?;
    tg.register(&book)?;
    tg.recover().await?;
    let started = Instant::now();
    let workers = 16u64;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (tg, book) = (tg.clone(), book.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < n {
                let plan = tg.plan(PlanOptions::owner("bench").deadline(Duration::from_secs(86_400))).await?;
                let tx = plan.begin(TxOptions::agent("bench").may_touch([format!("bench:room:{i}")])).await?;
                let d = Descriptor::new("cancel", serde_json::json!({"booking": {"$output": "/id"}}));
                tx.call_with(&book, serde_json::json!({"n": i}), CallOptions::compensate(d)).await?;
                tx.seal()?;
                tx.commit().await?;
                i += workers;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let build_s = started.elapsed().as_secs_f64();
    let tg2 = tg.clone();
    let ck = tokio::task::spawn_blocking(move || tg2.checkpoint_now()).await??;
    tg.stop();
    drop(tg);
    let ledger = MemoryStore::from_events(store.events()).with_checkpoint(store.checkpoint()?);
    drop(store);
    let events = ledger.last_lsn();
    let t = Instant::now();
    let tg = Tidegate::builder().store(Arc::new(ledger)).build()?;
    let open_s = t.elapsed().as_secs_f64();
    tg.recover().await?;
    tg.stuck_plans().await?; // the executor is running
    let reopen_s = t.elapsed().as_secs_f64();
    let report = tg.open_report().clone();
    let plans = tg.plan_list().await?;
    let held: usize = plans.iter().map(|p| p.held).sum();
    if plans.len() as u64 != n || held as u64 != n {
        anyhow::bail!("after the reopen {} plans hold {held} registrations; expected {n} each", plans.len());
    }
    tg.stop();
    Ok(serde_json::json!({
        "plans": n,
        "held_registrations": held,
        "ledger_events": events,
        "checkpoint_bytes": ck.bytes,
        "checkpoint_s": ck.micros as f64 / 1e6,
        "build_s": build_s,
        "open_s": open_s,
        "reopen_s": reopen_s,
        "plans_from_checkpoint": report.plans_from_checkpoint,
        "replayed_events": report.replayed_events,
        "note": "in-memory ledger; reopen_s = engine build (checkpoint load: engine state + plans section) + recover + executor start",
    }))
}
