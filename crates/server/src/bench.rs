//! `tidegate bench serve`: the server's throughput and latency on loopback against the same
//! workload run in-process (docs/server.md, "Benchmark").
//!
//! One transaction is: begin (may-touch two scopes of the client's own), one reversible
//! effect, one gated effect released at commit by a webhook, seal and commit, in two forms:
//!
//! - `steps`: the reversible effect is client-executed (the two-step protocol: a ticket, the
//!   client's own call, its result), so a server transaction is five API requests (begin,
//!   ticket, result, gated effect, commit) and one webhook request (the release).
//!   In-process, the reversible effect runs in the caller (a closure): one webhook request.
//! - `batch`: the whole transaction is one request (`POST /v1/batches`) and the server runs
//!   the reversible effect through its webhook capability: one API request and two webhook
//!   requests. In-process, the reversible tool POSTs to the same receiver: two webhook
//!   requests.
//!
//! Both sides share the machine with the webhook receiver and, over HTTP, with the clients:
//! the figures are of the whole loop on one host.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidegate_runtime::{Compensation, EffectClass, Tidegate, Tool, ToolError, TxOptions};

use crate::AppState;
use crate::config::Config;
use tidegate_service::auth::Role;

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The server failed to start or stop.
    #[error(transparent)]
    Server(#[from] crate::error::ServerError),
    /// The in-process engine refused something.
    #[error("in-process engine: {0}")]
    Engine(#[from] tidegate_runtime::Error),
    /// An HTTP request of the setup failed.
    #[error("{step}: {detail}")]
    Http {
        /// What was being done.
        step: &'static str,
        /// The transport error or the response.
        detail: String,
    },
    /// Local I/O (listener, data directory).
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Where the ledger lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// In memory.
    Memory,
    /// The embedded SQLite ledger in a data directory.
    Durable,
    /// Whatever the server driven with `--against` runs on.
    External,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Durable => "durable",
            StoreKind::External => "external",
        }
    }
}

/// How a transaction is sent (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Five API requests, the reversible effect client-executed.
    Steps,
    /// One API request (`POST /v1/batches`), the reversible effect run by a webhook.
    Batch,
}

impl Form {
    /// Its name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Form::Steps => "steps",
            Form::Batch => "batch",
        }
    }
}

/// Options of a run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Seconds per measurement (each of clients × stores × {server, in-process}).
    pub seconds: f64,
    /// Concurrent clients to measure at.
    pub clients: Vec<usize>,
    /// Stores to measure on.
    pub stores: Vec<StoreKind>,
    /// Forms of the transaction to measure.
    pub forms: Vec<Form>,
    /// Parent of the durable stores' data directories (default: a temporary directory,
    /// removed afterwards).
    pub data_dir: Option<PathBuf>,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            seconds: 3.0,
            clients: vec![1, 64],
            stores: vec![StoreKind::Memory, StoreKind::Durable],
            forms: vec![Form::Steps, Form::Batch],
            data_dir: None,
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measurement {
    /// `server` (HTTP on loopback) or `in_process`.
    pub mode: &'static str,
    /// `steps` or `batch` (module docs).
    pub form: &'static str,
    /// `memory` or `durable`.
    pub store: &'static str,
    /// Concurrent clients.
    pub clients: usize,
    /// Transactions committed.
    pub committed: u64,
    /// Transactions that failed or aborted (counted, not timed).
    pub failed: u64,
    /// Committed transactions per second.
    pub tx_per_s: f64,
    /// Median latency of a committed transaction, begin to settled commit, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
}

/// A webhook receiver that answers every POST at once with `{}`.
pub(crate) struct Receiver {
    pub(crate) url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    pub(crate) async fn start() -> Result<Receiver, BenchError> {
        let app = axum::Router::new().route("/{*path}", axum::routing::post(|| async { axum::Json(json!({})) }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| BenchError::Io { op: "binding the webhook receiver", source })?;
        let addr = listener.local_addr().map_err(|source| BenchError::Io { op: "receiver address", source })?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Receiver { url: format!("http://{addr}"), stop: Some(tx) })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    (sorted[i.min(sorted.len() - 1)] * 1000.0).round() / 1000.0
}

fn measurement(
    mode: &'static str,
    form: Form,
    store: StoreKind,
    clients: usize,
    mut lat: Vec<f64>,
    failed: u64,
    elapsed: f64,
) -> Measurement {
    lat.sort_by(f64::total_cmp);
    Measurement {
        mode,
        form: form.name(),
        store: store.name(),
        clients,
        committed: lat.len() as u64,
        failed,
        tx_per_s: (lat.len() as f64 / elapsed.max(1e-9) * 10.0).round() / 10.0,
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
    }
}

pub(crate) async fn ok_json(
    step: &'static str,
    r: Result<reqwest::Response, reqwest::Error>,
    expect: &[u16],
) -> Result<Value, BenchError> {
    let r = r.map_err(|e| BenchError::Http { step, detail: e.to_string() })?;
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if expect.contains(&status) { Ok(v) } else { Err(BenchError::Http { step, detail: format!("HTTP {status}: {v}") }) }
}

/// When a run's clients stop.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// At this instant (the timed measurements).
    At(Instant),
    /// After this many transactions per client, successful or not (a fixed amount of work
    /// for instruction counters).
    After(u64),
}

/// Runs the server on `dir` (or in memory) and `clients` HTTP clients for `secs`.
async fn server_run(
    form: Form,
    store: StoreKind,
    dir: Option<&Path>,
    clients: usize,
    secs: f64,
    receiver: &Receiver,
) -> Result<Measurement, BenchError> {
    let mut cfg = Config::default();
    match dir {
        Some(d) => cfg.server.data_dir = Some(d.to_owned()),
        None => cfg.server.memory = true,
    }
    cfg.server.shutdown_drain_ms = 5_000;
    cfg.limits.max_concurrent_per_tenant = cfg.limits.max_concurrent_per_tenant.max(4 * clients);
    let state = AppState::open(cfg).await?;
    state.catalog().create_tenant("bench")?;
    let (key, _) = state.catalog().create_key("bench", Role::Admin, Some("bench serve"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|source| BenchError::Io { op: "binding the server", source })?;
    let addr = listener.local_addr().map_err(|source| BenchError::Io { op: "server address", source })?;
    let app = crate::api::app(state.clone(), axum::Router::new());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let server = tokio::spawn(async move {
        crate::serve(st, listener, app, async move {
            let _ = stop_rx.await;
        })
        .await
    });
    let base = format!("http://{addr}");
    let http = client(clients)?;
    define(&http, &base, &key.key, receiver).await?;
    let start = Instant::now();
    let stop = Stop::At(start + Duration::from_secs_f64(secs));
    let (lat, failed) = drive(form, &http, &base, &key.key, clients, stop).await;
    let elapsed = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(());
    if let Ok(r) = server.await {
        r?;
    }
    Ok(measurement("server", form, store, clients, lat, failed, elapsed))
}

/// Drives a server that runs elsewhere on this host (`tidegate bench serve --against URL`):
/// defines (replacing any of the same names) the benchmark's tools `reserve` and `notify` and
/// capabilities `bench-reserve` and `bench-notify` in the key's tenant, pointing at this
/// process's receiver on 127.0.0.1, runs exactly `transactions` transactions per client, one
/// after another, and removes the four definitions again. Use a scratch tenant. The store is
/// the server's (`external` in the measurement). `scripts/instructions.sh` uses it to count
/// the server's instructions per transaction in a process of its own.
pub async fn against(
    form: Form,
    base: &str,
    key: &str,
    clients: usize,
    transactions: u64,
) -> Result<Measurement, BenchError> {
    let receiver = Receiver::start().await?;
    let base = base.trim_end_matches('/');
    let http = client(clients)?;
    define(&http, base, key, &receiver).await?;
    let start = Instant::now();
    let (lat, failed) = drive(form, &http, base, key, clients, Stop::After(transactions)).await;
    let elapsed = start.elapsed().as_secs_f64();
    // Left behind, they would point at a receiver that is gone.
    for path in ["tools/reserve", "tools/notify", "capabilities/bench-reserve", "capabilities/bench-notify"] {
        let r = http.delete(format!("{base}/v1/{path}")).bearer_auth(key).send().await;
        let r = r.map_err(|e| BenchError::Http { step: "removing a definition", detail: e.to_string() })?;
        if !r.status().is_success() {
            return Err(BenchError::Http {
                step: "removing a definition",
                detail: format!("{path}: HTTP {}", r.status()),
            });
        }
    }
    Ok(measurement("server", form, StoreKind::External, clients, lat, failed, elapsed))
}

fn client(clients: usize) -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(clients * 2)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| BenchError::Http { step: "building the client", detail: e.to_string() })
}

/// The benchmark's two capabilities (webhooks to `receiver`) and tools, as a tenant's admin
/// defines them.
async fn define(http: &reqwest::Client, base: &str, key: &str, receiver: &Receiver) -> Result<(), BenchError> {
    for (cap, path) in [("bench-reserve", "reserve"), ("bench-notify", "notify")] {
        let spec = json!({"kind": "webhook", "url": format!("{}/{path}", receiver.url), "timeout_ms": 10000, "attempts": 3, "backoff_ms": 10});
        let r = http.put(format!("{base}/v1/capabilities/{cap}")).bearer_auth(key).json(&spec).send().await;
        ok_json("defining a capability", r, &[200, 201]).await?;
    }
    for (tool, def) in [
        ("reserve", json!({"class": "reversible", "scopes": ["kv:bench:{c}"], "call": "bench-reserve"})),
        ("notify", json!({"class": "gated", "scopes": ["mail:bench:{c}"], "call": "bench-notify"})),
    ] {
        let r = http.put(format!("{base}/v1/tools/{tool}")).bearer_auth(key).json(&def).send().await;
        ok_json("defining a tool", r, &[200, 201]).await?;
    }
    Ok(())
}

/// `clients` concurrent HTTP clients, each running transactions of `form` until `stop`:
/// the latencies of the committed ones (ms) and the count of the others.
async fn drive(
    form: Form,
    http: &reqwest::Client,
    base: &str,
    key: &str,
    clients: usize,
    stop: Stop,
) -> (Vec<f64>, u64) {
    let mut handles = Vec::new();
    for c in 0..clients {
        let (http, base, key) = (http.clone(), base.to_owned(), key.to_owned());
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failed = 0u64;
            let begin =
                json!({"agent": format!("c{c}"), "may_touch": [format!("kv:bench:{c}"), format!("mail:bench:{c}")]});
            let args = json!({"c": c});
            let batch = json!({"agent": format!("c{c}"), "effects": [
                {"tool": "reserve", "args": args}, {"tool": "notify", "args": args}]});
            let mut done = 0u64;
            while match stop {
                Stop::At(deadline) => Instant::now() < deadline,
                Stop::After(n) => done < n,
            } {
                done += 1;
                let t = Instant::now();
                let one = async {
                    if form == Form::Batch {
                        let r = http.post(format!("{base}/v1/batches")).bearer_auth(&key).json(&batch).send().await;
                        let v = ok_json("batch", r, &[200]).await?;
                        return Ok(v["transaction"]["outcome"]["committed"] == true);
                    }
                    let r = http.post(format!("{base}/v1/transactions")).bearer_auth(&key).json(&begin).send().await;
                    let tx = ok_json("begin", r, &[201]).await?;
                    let id = tx["id"].as_str().unwrap_or_default();
                    // The reversible effect: a ticket, the client's own call (nothing to do
                    // here), its result.
                    let r = http
                        .post(format!("{base}/v1/transactions/{id}/effects"))
                        .bearer_auth(&key)
                        .json(&json!({"tool": "reserve", "args": args, "execute": "client"}))
                        .send()
                        .await;
                    let ticket = ok_json("ticket", r, &[200]).await?;
                    let result_url = ticket["result_url"].as_str().unwrap_or_default();
                    let r = http
                        .post(format!("{base}{result_url}"))
                        .bearer_auth(&key)
                        .json(&json!({"status": "done", "output": {"reserved": c}}))
                        .send()
                        .await;
                    ok_json("result", r, &[200]).await?;
                    let r = http
                        .post(format!("{base}/v1/transactions/{id}/effects"))
                        .bearer_auth(&key)
                        .json(&json!({"tool": "notify", "args": args}))
                        .send()
                        .await;
                    ok_json("effect", r, &[200]).await?;
                    let r = http
                        .post(format!("{base}/v1/transactions/{id}/commit"))
                        .bearer_auth(&key)
                        .json(&json!({"seal": true}))
                        .send()
                        .await;
                    let v = ok_json("commit", r, &[200]).await?;
                    Ok::<bool, BenchError>(v["outcome"]["committed"] == true)
                };
                match one.await {
                    Ok(true) => lat.push(t.elapsed().as_secs_f64() * 1e3),
                    _ => failed += 1,
                }
            }
            (lat, failed)
        }));
    }
    let mut lat = Vec::new();
    let mut failed = 0;
    for h in handles {
        if let Ok((l, f)) = h.await {
            lat.extend(l);
            failed += f;
        }
    }
    (lat, failed)
}

/// The in-process tools' webhook call: POST the arguments, a 2xx's JSON is the output.
async fn post_webhook(http: reqwest::Client, url: String, args: Arc<Value>) -> Result<Value, ToolError> {
    let r = http.post(&url).json(&*args).send().await.map_err(|e| ToolError::unknown(e.to_string()))?;
    if r.status().is_success() {
        Ok(r.json::<Value>().await.unwrap_or(Value::Null))
    } else {
        Err(ToolError::failed(format!("HTTP {}", r.status())))
    }
}

/// The same workload on an in-process engine.
async fn in_process_run(
    form: Form,
    store: StoreKind,
    dir: Option<&Path>,
    clients: usize,
    secs: f64,
    receiver: &Receiver,
) -> Result<Measurement, BenchError> {
    let mut b = Tidegate::builder();
    if let Some(d) = dir {
        let s = tidegate_sqlite::SqliteStore::open(d).map_err(tidegate_runtime::Error::from)?;
        b = b.store(Arc::new(s));
    }
    let tg = b.build()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients * 2)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| BenchError::Http { step: "building the client", detail: e.to_string() })?;
    let reserve_url = (form == Form::Batch).then(|| format!("{}/reserve", receiver.url));
    let reserve_http = http.clone();
    let reserve = Tool::builder("reserve", EffectClass::Reversible)
        .scope(|a: &Value| format!("kv:bench:{}", a["c"]))
        .call(move |a: Arc<Value>| {
            let (http, url) = (reserve_http.clone(), reserve_url.clone());
            async move {
                // `steps`: the caller's own call (nothing to do); `batch`: the webhook.
                match url {
                    Some(url) => post_webhook(http, url, a).await,
                    None => Ok(json!({})),
                }
            }
        })
        .compensate(|_, _| async { Ok(Compensation::clean()) })
        .build()?;
    let url = format!("{}/notify", receiver.url);
    let notify = Tool::builder("notify", EffectClass::Gated)
        .scope(|a: &Value| format!("mail:bench:{}", a["c"]))
        .call(move |a: Arc<Value>| post_webhook(http.clone(), url.clone(), a))
        .build()?;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut handles = Vec::new();
    for c in 0..clients {
        let (tg, reserve, notify) = (tg.clone(), reserve.clone(), notify.clone());
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failed = 0u64;
            let scopes = [format!("kv:bench:{c}"), format!("mail:bench:{c}")];
            while Instant::now() < deadline {
                let t = Instant::now();
                let one = async {
                    let tx = tg.begin_with(TxOptions::agent(format!("c{c}")).may_touch(scopes.clone()))?;
                    tx.call(&reserve, json!({"c": c})).await?;
                    tx.call(&notify, json!({"c": c})).await?;
                    tx.seal()?;
                    tx.commit().await
                };
                match one.await {
                    Ok(o) if o.committed => lat.push(t.elapsed().as_secs_f64() * 1e3),
                    _ => failed += 1,
                }
            }
            (lat, failed)
        }));
    }
    let mut lat = Vec::new();
    let mut failed = 0;
    for h in handles {
        if let Ok((l, f)) = h.await {
            lat.extend(l);
            failed += f;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(tg);
    Ok(measurement("in_process", form, store, clients, lat, failed, elapsed))
}

/// Runs every measurement; returns the report (`measurements`, and per store and client
/// count the server's throughput over the in-process one).
pub async fn run(opts: &BenchOptions) -> Result<Value, BenchError> {
    let (root, temporary) = match &opts.data_dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("tidegate-bench-serve-{}", std::process::id())), true),
    };
    let receiver = Receiver::start().await?;
    let mut out = Vec::new();
    let mut ratios = Vec::new();
    for &form in &opts.forms {
        for &store in &opts.stores {
            for &clients in &opts.clients {
                let mut pair = Vec::new();
                for mode in ["server", "in_process"] {
                    let dir =
                        (store == StoreKind::Durable).then(|| root.join(format!("{}-{mode}-{clients}", form.name())));
                    if let Some(d) = &dir {
                        let _ = std::fs::remove_dir_all(d);
                        std::fs::create_dir_all(d)
                            .map_err(|source| BenchError::Io { op: "creating the data directory", source })?;
                    }
                    let m = if mode == "server" {
                        server_run(form, store, dir.as_deref(), clients, opts.seconds, &receiver).await?
                    } else {
                        in_process_run(form, store, dir.as_deref(), clients, opts.seconds, &receiver).await?
                    };
                    pair.push(m.tx_per_s);
                    out.push(m);
                }
                ratios.push(json!({
                "form": form.name(),
                "store": store.name(),
                "clients": clients,
                "server_over_in_process": if pair[1] > 0.0 { (pair[0] / pair[1] * 1000.0).round() / 1000.0 } else { 0.0 },
            }));
            }
        }
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(json!({
        "bench": "serve",
        "workload": "begin + reversible effect + gated effect released by a webhook + seal + commit; per-client scopes. steps: five API requests, the reversible effect client-executed (ticket + result over HTTP); batch: one API request (POST /v1/batches), the reversible effect run by a webhook",
        "seconds_per_measurement": opts.seconds,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "measurements": out,
        "ratios": ratios,
    }))
}
