//! `tidegate ledger`: inspect, verify, export and summarise the embedded ledger.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Context;
use tidegate_core::engine::Replay;
use tidegate_core::{CoreConfig, Event, ScopeRegistry, Timestamp, TxId};
use tidegate_sqlite::SqliteStore;
use tidegate_storage::{LedgerStore, Lsn, wire};

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
    /// Check the ledger (every row, the hash chain, the high-water mark) and the projections
    /// rebuilt from it. Read-only; exits non-zero when anything is wrong.
    Verify {
        #[command(flatten)]
        dir: DataDir,
        /// A ledger stream in PostgreSQL instead of the data directory: `postgres://…` (with
        /// `--stream`). Read-only: the stream's owner keeps writing.
        #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
        store: Option<String>,
        /// The PostgreSQL stream to verify (a tenant's name; default `default`).
        #[arg(long, requires = "store", default_value = "default")]
        stream: String,
    },
    /// Copy the ledger into a new data directory DEST with SQLite's online backup API (a
    /// consistent copy, also while an engine is writing), then verify the copy.
    Backup {
        #[command(flatten)]
        dir: DataDir,
        /// The new data directory (must not hold a ledger).
        dest: std::path::PathBuf,
    },
    /// Every event as JSON Lines (`{"lsn": n, ...event}`).
    Export {
        #[command(flatten)]
        dir: DataDir,
        /// A ledger stream in PostgreSQL instead of the data directory: `postgres://…` (with
        /// `--stream`). Read-only: the stream's owner keeps writing.
        #[arg(long, value_name = "URL", conflicts_with = "data_dir")]
        store: Option<String>,
        /// The PostgreSQL stream to export (a tenant's name; default `default`).
        #[arg(long, requires = "store", default_value = "default")]
        stream: String,
        /// JSON Lines (the only format).
        #[arg(long, default_value_t = true)]
        jsonl: bool,
    },
    /// Counts of events, transactions and outcomes.
    Stats {
        #[command(flatten)]
        dir: DataDir,
    },
    /// Store a checkpoint of the projections at the ledger's end now, so that the next open
    /// replays nothing (the engine also takes them every 200 000 events and on a clean close).
    Checkpoint {
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
    let body = wire::to_value(e).unwrap_or_else(|err| serde_json::json!({ "event": "?", "error": err.to_string() }));
    let kind = body["event"].as_str().unwrap_or("?").to_owned();
    let mut rest = body;
    if let Some(o) = rest.as_object_mut() {
        o.remove("event");
        o.remove("tx");
    }
    format!("  {lsn:>8}  {kind:<16} {rest}")
}

/// Whether `checkpoint` decodes and holds exactly the state `replay` reached at its LSN.
fn compare_checkpoint(
    replay: &Replay,
    checkpoint: Option<&tidegate_storage::StoredCheckpoint>,
    cfg: &CoreConfig,
    reg: &ScopeRegistry,
) -> anyhow::Result<()> {
    let Some(c) = checkpoint else { return Ok(()) };
    let loaded = Replay::load(cfg.clone(), reg.clone(), c.lsn, &c.bytes)
        .map_err(|e| anyhow::anyhow!("the checkpoint does not load: {e}"))?;
    let (want, got) = (replay.state()?, loaded.state()?);
    if want != got {
        anyhow::bail!(
            "the checkpoint at LSN {} differs from the replay of events 1..={}: an open from it would rebuild \
             other projections than a full replay",
            c.lsn,
            c.lsn
        );
    }
    Ok(())
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Inspect { dir, tx, last } => {
            let store = dir.open_read_only()?;
            let events = all(&store)?;
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
        Cmd::Verify { store: Some(url), stream, .. } => {
            let store = tidegate_postgres::PgStore::open_read_only(&url, &stream)
                .with_context(|| format!("opening ledger stream {stream} read-only"))?;
            println!("{}", store.open_report());
            let (rows, acknowledged) = store.verify()?;
            replay_and_check(&store)?;
            println!(
                "ok: {rows} events verified (every row, the hash chain from the stream's start, and the head at LSN \
                 {acknowledged})"
            );
            Ok(())
        }
        Cmd::Verify { dir, .. } => verify(&dir.open_read_only()?),
        Cmd::Backup { dir, dest } => {
            let store = dir.open_read_only()?;
            let r = store.backup(&dest).with_context(|| format!("backing up the ledger into {}", dest.display()))?;
            println!(
                "copied LSN 1..={} ({} bytes) into {} (the source had acknowledged up to LSN {} when the copy began)",
                r.last_lsn,
                r.bytes,
                r.dir.display(),
                r.acknowledged_lsn
            );
            drop(store);
            let copy = SqliteStore::open_read_only(&dest)
                .with_context(|| format!("opening the copy in {} read-only", dest.display()))?;
            verify(&copy)
        }
        Cmd::Checkpoint { dir } => {
            let store = dir.open_existing()?;
            let tg = tidegate_runtime::Tidegate::builder().store(store.clone()).build()?;
            let r = tg.open_report();
            println!(
                "opened: checkpoint {}, replayed {} events in {:.1} ms{}",
                r.checkpoint_lsn.map_or("none".to_owned(), |l| format!("at LSN {l}")),
                r.replayed_events,
                r.micros as f64 / 1e3,
                r.checkpoint_fallback.as_deref().map(|f| format!(" (fallback: {f})")).unwrap_or_default()
            );
            let info = tg.checkpoint_now()?;
            println!("ok: checkpoint at LSN {} ({} bytes) stored in {}", info.lsn, info.bytes, dir.path()?.display());
            Ok(())
        }
        Cmd::Export { dir, store, stream, .. } => {
            let store: Box<dyn LedgerStore> = match store {
                Some(url) => Box::new(
                    tidegate_postgres::PgStore::open_read_only(&url, &stream)
                        .with_context(|| format!("opening ledger stream {stream} read-only"))?,
                ),
                None => Box::new(dir.open_read_only()?),
            };
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut err = None;
            store.scan(1, &mut |lsn, e| {
                let mut v = match wire::to_value(e) {
                    Ok(v) => v,
                    Err(e) => {
                        err = Some(std::io::Error::other(e));
                        return false;
                    }
                };
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
            let store = dir.open_read_only()?;
            let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
            let (mut txs, mut committed, mut aborted, mut last) = (0u64, 0u64, 0u64, 0);
            store.scan(1, &mut |lsn, e| {
                last = lsn;
                let v = wire::to_value(e).unwrap_or_default();
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

/// `tidegate ledger verify` on an open store: the store's own checks, then a replay of every
/// event, the checkpoint compared with the replay at its LSN, and the rebuilt projections'
/// integrity check.
fn verify(store: &SqliteStore) -> anyhow::Result<()> {
    println!("{}", store.open_report());
    let v = store.verify()?;
    replay_and_check(store)?;
    if v.chained {
        println!(
            "ok: {} events verified (every row, the hash chain from the ledger's start, and the high-water mark at \
             LSN {})",
            v.rows, v.acknowledged_lsn
        );
    } else {
        println!(
            "ok: {} events verified (a schema-1 ledger without a hash chain: whether events were lost before this \
             point cannot be proven; the next open for writing upgrades it)",
            v.rows
        );
    }
    Ok(())
}

/// Replays every event of any store, compares the stored checkpoint with the replay at its
/// LSN, and checks the rebuilt projections.
fn replay_and_check(store: &dyn LedgerStore) -> anyhow::Result<()> {
    let (cfg, reg) = (CoreConfig::default(), ScopeRegistry::default());
    // Replay the whole ledger (streamed); at the stored checkpoint's LSN, the replayed
    // state must equal the checkpoint's.
    let checkpoint = store.checkpoint()?;
    let mut replay = Replay::new(cfg.clone(), reg.clone());
    let mut failed = None;
    let mut checked = None;
    if checkpoint.as_ref().is_some_and(|c| c.lsn == 0) {
        checked = Some(compare_checkpoint(&replay, checkpoint.as_ref(), &cfg, &reg));
    }
    store.scan(1, &mut |lsn, e| {
        if let Err(err) = replay.apply(e) {
            failed = Some(err);
            return false;
        }
        if checkpoint.as_ref().is_some_and(|c| c.lsn == lsn) {
            checked = Some(compare_checkpoint(&replay, checkpoint.as_ref(), &cfg, &reg));
        }
        true
    })?;
    if let Some(e) = failed {
        anyhow::bail!("the ledger does not replay: {e}");
    }
    match (&checkpoint, checked) {
        (None, _) => println!("no checkpoint stored (an open replays the whole ledger)"),
        (Some(c), None) => {
            anyhow::bail!("the checkpoint is at LSN {} but the ledger ends at {}", c.lsn, replay.lsn())
        }
        (Some(_), Some(Err(e))) => return Err(e),
        (Some(c), Some(Ok(()))) => println!(
            "ok: checkpoint at LSN {} ({} bytes) equals the replay of events 1..={}",
            c.lsn,
            c.bytes.len(),
            c.lsn
        ),
    }
    let (core, rec) = replay.finish(Timestamp(0));
    core.check_integrity().map_err(|e| anyhow::anyhow!("rebuilt projections are inconsistent: {e}"))?;
    println!(
        "replay rebuilt {} unfinished transaction(s), {} in-doubt call(s), {} commit(s) and {} abort(s) to resume",
        rec.unfinished,
        rec.in_doubt.len(),
        rec.committing.len(),
        rec.aborting.len()
    );
    Ok(())
}
