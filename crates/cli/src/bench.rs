//! `tidegate bench`: in-process micro-benchmarks of the engine.
//!
//! Every figure comes from running the engine: medians over batches measured with the
//! monotonic clock, in whatever build profile the binary was compiled with (report release
//! figures only).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tidegate_runtime::{EffectClass, Tidegate, Tool, TxOptions};
use tidegate_storage::MemoryStore;

/// Which benchmark to run.
#[derive(Debug, clap::Subcommand)]
pub enum Which {
    /// Per-transaction cost, cost after a long history, speculation commit, disjoint waits.
    Micro {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Committed transactions to run before measuring `ns_per_tx_at_1m_history`.
        #[arg(long, default_value_t = 1_000_000)]
        history: u64,
    },
    /// Durable transactions on the embedded ledger against the disk's own fsync rate.
    Durable {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Where to put the ledger (default: a new directory under the system temp dir,
        /// removed afterwards).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
}

pub fn run(which: Which) -> anyhow::Result<()> {
    match which {
        Which::Micro { json, history } => micro(json, history),
        Which::Durable { json, data_dir, seconds } => durable(json, data_dir, seconds),
    }
}

async fn durable_clients(tg: &Tidegate, gated: &Tool, clients: u64, secs: f64) -> anyhow::Result<(f64, Vec<f64>)> {
    let deadline = Instant::now() + std::time::Duration::from_secs_f64(secs);
    let mut handles = Vec::new();
    for c in 0..clients {
        let (tg, gated) = (tg.clone(), gated.clone());
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let scope = format!("bench:mail:{}", 50_000 + c);
            while Instant::now() < deadline {
                let t = Instant::now();
                let tx = tg.begin_with(TxOptions::agent(format!("c{c}")).may_touch([scope.clone()]))?;
                tx.read(&scope)?;
                tx.call(&gated, json!(50_000 + c)).await?;
                tx.seal()?;
                tx.commit().await?;
                lat.push(t.elapsed().as_secs_f64() * 1e3);
            }
            anyhow::Ok(lat)
        }));
    }
    let start = Instant::now();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await??);
    }
    let elapsed = start.elapsed().as_secs_f64().max(secs);
    Ok((all.len() as f64 / elapsed, all))
}

fn durable(as_json: bool, data_dir: Option<std::path::PathBuf>, secs: f64) -> anyhow::Result<()> {
    let (dir, temporary) = match data_dir {
        Some(d) => (d, false),
        None => (std::env::temp_dir().join(format!("tidegate-bench-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir)?;
    let fsync = tidegate_storage::fsync_per_s(&dir, std::time::Duration::from_secs_f64(secs))?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (_, gated) = tools()?;
    let result = rt.block_on(async {
        let mut out = Vec::new();
        for clients in [1u64, 64] {
            let sub = dir.join(format!("ledger-{clients}"));
            let _ = std::fs::remove_dir_all(&sub);
            let store = Arc::new(tidegate_storage::SqliteStore::open(&sub)?);
            let tg = Tidegate::builder().store(store).build()?;
            let (tps, mut lat) = durable_clients(&tg, &gated, clients, secs).await?;
            lat.sort_by(f64::total_cmp);
            let p99 = lat.get(((lat.len() as f64) * 0.99) as usize).copied().unwrap_or(0.0);
            out.push((tps, p99));
        }
        anyhow::Ok(out)
    });
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let r = result?;
    let out = json!({
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "fsync_per_s": fsync.round(),
        "durable_tx_per_s_1": r[0].0.round(),
        "durable_tx_per_s_64": r[1].0.round(),
        "p99_commit_ms_64": (r[1].1 * 100.0).round() / 100.0,
        "ratio_1_to_fsync": (r[0].0 / fsync * 100.0).round() / 100.0,
        "ratio_64_to_fsync": (r[1].0 / fsync * 100.0).round() / 100.0,
        "transaction": "begin, read, one gated effect, seal, commit (SQLite WAL, synchronous=FULL)",
    });
    if as_json {
        println!("{out}");
    } else {
        println!("tidegate bench durable ({} build)", out["profile"].as_str().unwrap_or("?"));
        for k in [
            "fsync_per_s",
            "durable_tx_per_s_1",
            "durable_tx_per_s_64",
            "p99_commit_ms_64",
            "ratio_1_to_fsync",
            "ratio_64_to_fsync",
        ] {
            println!("  {k:<22} {:>12}", out[k]);
        }
    }
    Ok(())
}

async fn noop(_args: Arc<Value>) -> Result<Value, tidegate_runtime::ToolError> {
    Ok(Value::Null)
}

fn tools() -> anyhow::Result<(Tool, Tool)> {
    let rev = Tool::builder("bench_reversible", EffectClass::Reversible)
        .scope(|a| format!("bench:item:{a}"))
        .call(noop)
        .compensate(|_, _| async { Ok(tidegate_runtime::Compensation::clean()) })
        .build()?;
    let gated =
        Tool::builder("bench_gated", EffectClass::Gated).scope(|a| format!("bench:mail:{a}")).call(noop).build()?;
    Ok((rev, gated))
}

/// Scopes drawn from a fixed pool: history grows with transactions, not with resources.
const POOL: u64 = 1024;

async fn one_tx(tg: &Tidegate, rev: &Tool, gated: &Tool, i: u64) -> anyhow::Result<()> {
    let item = i % POOL;
    let tx = tg.begin("bench")?;
    tx.read(SCOPES[item as usize % SCOPES.len()])?;
    tx.call(rev, json!(item)).await?;
    tx.call(gated, json!(item)).await?;
    tx.seal()?;
    tx.commit().await?;
    Ok(())
}

const SCOPES: [&str; 8] = [
    "bench:item:0",
    "bench:item:1",
    "bench:item:2",
    "bench:item:3",
    "bench:item:4",
    "bench:item:5",
    "bench:item:6",
    "bench:item:7",
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// Median ns per transaction over `batches` batches of `size`.
async fn measure_tx(
    tg: &Tidegate,
    rev: &Tool,
    gated: &Tool,
    start: u64,
    batches: u64,
    size: u64,
) -> anyhow::Result<f64> {
    let mut per = Vec::new();
    let mut i = start;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..size {
            one_tx(tg, rev, gated, i).await?;
            i += 1;
        }
        per.push(t.elapsed().as_nanos() as f64 / size as f64);
    }
    Ok(median(per))
}

fn engine() -> anyhow::Result<Tidegate> {
    // The in-memory ledger counts events without keeping them, so a million-transaction
    // history measures the engine, not the growth of a Vec of events.
    Ok(Tidegate::builder().store(Arc::new(MemoryStore::new().retain_events(false))).build()?)
}

fn micro(as_json: bool, history: u64) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (rev, gated) = tools()?;
    let (ns_per_tx, ns_hist, hist_done) = rt.block_on(async {
        let tg = engine()?;
        measure_tx(&tg, &rev, &gated, 0, 20, 1000).await?; // warm-up
        let fresh = measure_tx(&tg, &rev, &gated, 20_000, 200, 1000).await?;
        let tg = engine()?;
        let start = Instant::now();
        for i in 0..history {
            one_tx(&tg, &rev, &gated, i).await?;
        }
        let hist_secs = start.elapsed().as_secs_f64();
        let after = measure_tx(&tg, &rev, &gated, history, 200, 1000).await?;
        anyhow::Ok((fresh, after, (history, hist_secs)))
    })?;

    let notx = rt.block_on(async {
        let mut per = Vec::new();
        for b in 0..200u64 {
            let t = Instant::now();
            for i in 0..1000u64 {
                let item = (b * 1000 + i) % POOL;
                std::hint::black_box(noop(Arc::new(json!(item))).await.ok());
                std::hint::black_box(noop(Arc::new(json!(item))).await.ok());
            }
            per.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
        median(per)
    });

    let spec16 = rt.block_on(async {
        let tg = engine()?;
        let mut per = Vec::new();
        for r in 0..300u64 {
            let spec = tg.speculate(TxOptions::agent("bench"), 16)?;
            for (k, b) in spec.branches().iter().enumerate() {
                b.call(&gated, json!(r * 16 + k as u64)).await?;
                b.seal()?;
            }
            let winner = spec.branches()[(r % 16) as usize].id();
            let t = Instant::now();
            spec.commit_winner(winner).await?;
            per.push(t.elapsed().as_nanos() as f64);
        }
        anyhow::Ok(median(per))
    })?;

    let mt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (disjoint_wait, disjoint_waits, disjoint_commits) = mt.block_on(async {
        let tg = engine()?;
        let mut handles = Vec::new();
        for a in 0..64u64 {
            let (tg, rev, gated) = (tg.clone(), rev.clone(), gated.clone());
            handles.push(tokio::spawn(async move {
                let scope = format!("bench:item:{}", 10_000 + a);
                let mail = format!("bench:mail:{}", 10_000 + a);
                for _ in 0..200 {
                    let tx =
                        tg.begin_with(TxOptions::agent(format!("agent{a}")).may_touch([scope.clone(), mail.clone()]))?;
                    tx.read(&scope)?;
                    tx.call(&rev, json!(10_000 + a)).await?;
                    tx.call(&gated, json!(10_000 + a)).await?;
                    tx.seal()?;
                    tx.commit().await?;
                }
                anyhow::Ok(())
            }));
        }
        for h in handles {
            h.await??;
        }
        let (waits, total) = tg.wait_stats();
        let commits = tg.stats().committed;
        anyhow::Ok((total.as_nanos() as f64 / commits.max(1) as f64, waits, commits))
    })?;

    let out = json!({
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "ns_per_tx": ns_per_tx.round(),
        "ns_per_tx_at_1m_history": ns_hist.round(),
        "history_transactions": hist_done.0,
        "history_build_s": (hist_done.1 * 100.0).round() / 100.0,
        "history_ratio": (ns_hist / ns_per_tx * 100.0).round() / 100.0,
        "spec16_commit_ns": spec16.round(),
        "disjoint_wait_ns_64_agents": disjoint_wait.round(),
        "disjoint_commits": disjoint_commits,
        "disjoint_commits_that_waited": disjoint_waits,
        "notx_ns_per_call": (notx / 2.0).round(),
        "notx_ns_per_tx_equivalent": notx.round(),
    });
    if as_json {
        println!("{out}");
    } else {
        println!("tidegate bench micro ({} build)", out["profile"].as_str().unwrap_or("?"));
        println!("  {:<30} {:>12}", "metric", "value");
        for (k, unit) in [
            ("ns_per_tx", "ns"),
            ("ns_per_tx_at_1m_history", "ns"),
            ("history_transactions", "tx"),
            ("history_ratio", "x"),
            ("spec16_commit_ns", "ns"),
            ("disjoint_wait_ns_64_agents", "ns"),
            ("disjoint_commits_that_waited", ""),
            ("notx_ns_per_call", "ns"),
        ] {
            println!("  {k:<30} {:>12} {unit}", out[k]);
        }
    }
    Ok(())
}
