//! `tidegate ledger`: inspect, verify, export and summarise the embedded ledger.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Context;
use tidegate_core::{Core, CoreConfig, Event, ScopeRegistry, Timestamp, TxId};
use tidegate_storage::{LedgerStore, Lsn};

use crate::data_dir::DataDir;

/// Ledger subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// A readable timeline of one transaction, or of the last N.
    Inspect {
        #[command(flatten)]
        dir: DataDir,
        /// The transaction (number, or `tx-N`).
        #[arg(long, conflicts_with = "last")]
        tx: Option<String>,
        /// The last N transactions (default 5).
        #[arg(long)]
        last: Option<usize>,
    },
    /// Check the ledger and the projections rebuilt from it.
    Verify {
        #[command(flatten)]
        dir: DataDir,
    },
    /// Every event as JSON Lines (`{"lsn": n, ...event}`).
    Export {
        #[command(flatten)]
        dir: DataDir,
        /// JSON Lines (the only format).
        #[arg(long, default_value_t = true)]
        jsonl: bool,
    },
    /// Counts of events, transactions and outcomes.
    Stats {
        #[command(flatten)]
        dir: DataDir,
    },
}

fn all(store: &dyn LedgerStore) -> anyhow::Result<Vec<(Lsn, Event)>> {
    let mut out = Vec::new();
    store.scan(1, &mut |lsn, e| {
        out.push((lsn, e.clone()));
        true
    })?;
    Ok(out)
}

fn parse_tx(s: &str) -> anyhow::Result<TxId> {
    let n = s.strip_prefix("tx-").unwrap_or(s);
    n.parse::<u64>().map(TxId).with_context(|| format!("invalid --tx `{s}`: expected a number or tx-N"))
}

fn line(lsn: Lsn, e: &Event) -> String {
    let body = serde_json::to_value(e).unwrap_or_default();
    let kind = body["event"].as_str().unwrap_or("?").to_owned();
    let mut rest = body;
    if let Some(o) = rest.as_object_mut() {
        o.remove("event");
        o.remove("tx");
    }
    format!("  {lsn:>8}  {kind:<16} {rest}")
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Inspect { dir, tx, last } => {
            let store = dir.open()?;
            let events = all(&*store)?;
            let wanted: Vec<TxId> = match tx {
                Some(t) => vec![parse_tx(&t)?],
                None => {
                    let mut seen: Vec<TxId> = Vec::new();
                    for (_, e) in events.iter().rev() {
                        if let Event::Begin { tx, .. } = e {
                            seen.push(*tx);
                            if seen.len() == last.unwrap_or(5) {
                                break;
                            }
                        }
                    }
                    seen.reverse();
                    seen
                }
            };
            let mut out = std::io::stdout().lock();
            for t in wanted {
                let mine: Vec<_> = events.iter().filter(|(_, e)| e.tx() == t).collect();
                if mine.is_empty() {
                    writeln!(out, "{t}: no events in this ledger")?;
                    continue;
                }
                writeln!(out, "{t}:")?;
                for (lsn, e) in mine {
                    writeln!(out, "{}", line(*lsn, e))?;
                }
            }
            Ok(())
        }
        Cmd::Verify { dir } => {
            let store = dir.open()?;
            println!("{}", store.open_report());
            let rows = store.verify()?;
            let events = all(&*store)?;
            let (core, rec) = Core::recover(
                CoreConfig::default(),
                ScopeRegistry::default(),
                events.into_iter().map(|(_, e)| e),
                Timestamp(0),
            )
            .map_err(|e| anyhow::anyhow!("the ledger does not replay: {e}"))?;
            core.check_integrity().map_err(|e| anyhow::anyhow!("rebuilt projections are inconsistent: {e}"))?;
            println!(
                "ok: {rows} events verified; replay rebuilt {} unfinished transaction(s), {} in-doubt call(s), {} commit(s) and {} abort(s) to resume",
                rec.unfinished,
                rec.in_doubt.len(),
                rec.committing.len(),
                rec.aborting.len()
            );
            Ok(())
        }
        Cmd::Export { dir, .. } => {
            let store = dir.open()?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut err = None;
            store.scan(1, &mut |lsn, e| {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("lsn".into(), lsn.into());
                }
                if let Err(e) = writeln!(out, "{v}") {
                    err = Some(e);
                    return false;
                }
                true
            })?;
            if let Some(e) = err {
                return Err(e.into());
            }
            out.flush()?;
            Ok(())
        }
        Cmd::Stats { dir } => {
            let store = dir.open()?;
            let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
            let (mut txs, mut committed, mut aborted, mut last) = (0u64, 0u64, 0u64, 0);
            store.scan(1, &mut |lsn, e| {
                last = lsn;
                let v = serde_json::to_value(e).unwrap_or_default();
                *kinds.entry(v["event"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
                match e {
                    Event::Begin { .. } => txs += 1,
                    Event::Settled { committed: true, .. } => committed += 1,
                    Event::Settled { committed: false, .. } => aborted += 1,
                    _ => {}
                }
                true
            })?;
            println!("ledger {}", dir.path()?.display());
            println!("  events        {last}");
            println!(
                "  transactions  {txs} ({committed} committed, {aborted} aborted, {} unfinished)",
                txs - committed - aborted
            );
            for (k, n) in kinds {
                println!("    {k:<16} {n}");
            }
            Ok(())
        }
    }
}
