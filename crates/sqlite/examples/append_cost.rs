//! How long `SqliteStore::append` holds the engine's lock: the engine runs durable
//! transactions on a SQLite ledger wrapped in a store that times every `append` call (the
//! runtime calls it under its core mutex, so this is the store's share of the critical
//! section). Prints one JSON object.
//!
//! ```text
//! cargo run --release -p tidegate-sqlite --example append_cost -- [transactions] [clients]
//! ```
//!
//! Defaults: 20 000 transactions, 64 clients. Each transaction is begin, read, a reversible
//! effect with a small JSON argument, a gated effect, seal, commit (which waits for the ledger).

#![allow(clippy::unwrap_used, clippy::print_stdout)] // a measuring tool, not library code

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_core::{Batch, Event};
use tidegate_runtime::{CheckpointPolicy, Compensation, EffectClass, Tidegate, Tool, ToolError};
use tidegate_sqlite::SqliteStore;
use tidegate_storage::{LedgerStore, Lsn, Ownership, StoreError, StoredCheckpoint};

/// A store that times `append` and forwards everything to the SQLite store.
#[derive(Debug)]
struct Timed {
    inner: SqliteStore,
    /// (ns spent in the call, events in the batch) per non-empty append.
    calls: Mutex<Vec<(u64, usize)>>,
}

impl LedgerStore for Timed {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        let t = Instant::now();
        let r = self.inner.append(batch);
        let ns = t.elapsed().as_nanos() as u64;
        if !batch.is_empty() {
            self.calls.lock().push((ns, batch.len()));
        }
        r
    }
    fn is_durable(&self, lsn: Lsn) -> bool {
        self.inner.is_durable(lsn)
    }
    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        self.inner.wait_durable(lsn)
    }
    fn poll_durable(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        self.inner.poll_durable(lsn, cx)
    }
    fn last_lsn(&self) -> Lsn {
        self.inner.last_lsn()
    }
    fn ownership(&self) -> Ownership {
        self.inner.ownership()
    }
    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        self.inner.scan(from, visit)
    }
    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put_checkpoint(lsn, bytes)
    }
    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.inner.checkpoint()
    }
}

async fn noop(_args: Arc<Value>) -> Result<Value, ToolError> {
    Ok(json!({"ok": true}))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let total: u64 = args.next().map_or(20_000, |a| a.parse().expect("transactions: a number"));
    let clients: u64 = args.next().map_or(64, |a| a.parse().expect("clients: a number"));
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Timed { inner: SqliteStore::open(dir.path()).unwrap(), calls: Mutex::new(Vec::new()) });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let rev = Tool::builder("cost_reversible", EffectClass::Reversible)
        .scope(|a| format!("cost:item:{}", a["item"]))
        .call(noop)
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()
        .unwrap();
    let gated = Tool::builder("cost_gated", EffectClass::Gated)
        .scope(|a| format!("cost:mail:{}", a["item"]))
        .call(noop)
        .build()
        .unwrap();
    let started = Instant::now();
    rt.block_on(async {
        let tg = Tidegate::builder().store(store.clone()).checkpoints(CheckpointPolicy::never()).build().unwrap();
        let mut handles = Vec::new();
        for c in 0..clients {
            let (tg, rev, gated) = (tg.clone(), rev.clone(), gated.clone());
            let n = total / clients + u64::from(c < total % clients);
            handles.push(tokio::spawn(async move {
                for i in 0..n {
                    let item = c * 1_000_000 + i;
                    let args =
                        json!({"item": item, "customer": format!("customer-{c}"), "amount": 1250, "currency": "EUR"});
                    let tx = tg.begin(&format!("agent{c}")).unwrap();
                    tx.read(&format!("cost:item:{item}")).unwrap();
                    tx.call(&rev, args.clone()).await.unwrap();
                    tx.call(&gated, args).await.unwrap();
                    tx.seal().unwrap();
                    tx.commit().await.unwrap();
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let mut calls = std::mem::take(&mut *store.calls.lock());
    let events: usize = calls.iter().map(|c| c.1).sum();
    let total_ns: u64 = calls.iter().map(|c| c.0).sum();
    calls.sort_unstable();
    let pct = |p: f64| calls.get(((calls.len() as f64) * p) as usize).map_or(0, |c| c.0);
    let out = json!({
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "transactions": total,
        "clients": clients,
        "tx_per_s": (total as f64 / secs).round(),
        "appends": calls.len(),
        "events": events,
        "append_ns_median": pct(0.5),
        "append_ns_p99": pct(0.99),
        "append_ns_mean": (total_ns as f64 / calls.len().max(1) as f64).round(),
        "append_ns_per_event": (total_ns as f64 / events.max(1) as f64).round(),
        "append_ms_total": (total_ns as f64 / 1e6).round(),
        "syncs": store.inner.stats().syncs,
    });
    println!("{out}");
}
