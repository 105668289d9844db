//! `tidegate bench cluster`: several `tidegate serve` nodes on one PostgreSQL, on loopback
//! (docs/deployment.md, "Benchmark").
//!
//! The workload is `bench serve`'s: begin, a client-executed reversible effect (ticket, the
//! client's own call, its result), a held effect released by a webhook at commit, seal and
//! commit; per-client scopes. Tenants are spread over the nodes by the nodes themselves (each
//! takes its fair share of the tenants nobody serves); each client works on one tenant and
//! sends to whichever node serves it, following the `503`s that name the owner's address.
//!
//! Measured in one run, each on a fresh database (made next to the `--postgres` URL's and
//! dropped after): 1, 2 and 3 nodes; the same workload on one node on the embedded SQLite
//! store; and failover: under the 3-node load the owner of one tenant is SIGKILLed, and the
//! time from the kill to the first commit of that tenant acknowledged by its new owner is
//! reported beside the lease. Every node, the database, the clients and the webhook receiver
//! share this machine: the figures are of the whole loop on one host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_service::auth::Role;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::bench::{BenchError, Receiver, percentile};

/// Options of a run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The `tidegate` binary the nodes run (`serve`).
    pub binary: PathBuf,
    /// A PostgreSQL URL whose server the run makes its databases on (the role must be allowed
    /// to create databases).
    pub postgres: String,
    /// Seconds per measurement.
    pub seconds: f64,
    /// Concurrent clients.
    pub clients: usize,
    /// Node counts to measure.
    pub nodes: Vec<usize>,
    /// Tenants, spread over the nodes.
    pub tenants: usize,
    /// The nodes' ownership lease, milliseconds.
    pub lease_ms: u64,
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterMeasurement {
    /// `postgres` or `sqlite`.
    pub store: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Transactions committed.
    pub committed: u64,
    /// Transactions that failed or aborted.
    pub failed: u64,
    /// Committed transactions per second.
    pub tx_per_s: f64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Tenants each node served during the run, by node id.
    pub tenants_per_node: BTreeMap<String, usize>,
}

struct Node {
    id: String,
    child: Child,
    base: String,
}

impl Node {
    async fn start(bin: &Path, store: &str, id: &str, lease_ms: u64, log: &Path) -> Result<Node, BenchError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| BenchError::Io { op: "opening a node's log", source })?;
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--store", store, "--node-id", id])
            .env("RUST_LOG", "warn,tower_http=off")
            .env("TIDEGATE_SERVER_OWNERSHIP_LEASE_MS", lease_ms.to_string())
            .env("TIDEGATE_SERVER_SHUTDOWN_DRAIN_MS", "2000")
            .env("TIDEGATE_LIMITS_MAX_CONCURRENT_PER_TENANT", "4096")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BenchError::Io { op: "starting a node", source })?;
        let stdout = child.stdout.take().ok_or_else(|| BenchError::Http { step: "node stdout", detail: id.into() })?;
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(a) = line.strip_prefix("listening on ") {
                return Ok(Node { id: id.to_owned(), child, base: format!("http://{a}") });
            }
        }
        Err(BenchError::Http { step: "starting a node", detail: format!("{id} exited: {:?}", child.wait().await) })
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
        }
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
        }
    }
}

/// Runs blocking database work on a plain thread (the blocking client drives a runtime of its
/// own).
async fn admin(url: &str, sql: String) -> Result<(), BenchError> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || -> Result<(), String> {
            let mut pg = postgres::Client::connect(&url, postgres::NoTls).map_err(|e| format!("{url}: {e}"))?;
            pg.batch_execute(&sql).map_err(|e| format!("{sql}: {e}"))
        })
        .join()
        .unwrap_or_else(|_| Err("the database thread panicked".into()))
    })
    .await
    .map_err(|e| BenchError::Http { step: "database", detail: e.to_string() })?
    .map_err(|detail| BenchError::Http { step: "database", detail })
}

/// A fresh database next to `admin_url`'s; returns its URL.
async fn fresh_database(admin_url: &str, name: &str) -> Result<String, BenchError> {
    admin(admin_url, format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    admin(admin_url, format!("CREATE DATABASE {name}")).await?;
    let (prefix, _) =
        admin_url.split('?').next().and_then(|u| u.rsplit_once('/')).ok_or_else(|| BenchError::Http {
            step: "--postgres",
            detail: format!("{admin_url}: not postgres://…/DB"),
        })?;
    Ok(format!("{prefix}/{name}"))
}

/// Creates the tenants and an admin key each in the store's catalog.
async fn tenants(store: &str, n: usize) -> Result<Vec<(String, String)>, BenchError> {
    let store: tidegate_runtime::StoreUrl =
        store.parse().map_err(|e| BenchError::Http { step: "store URL", detail: format!("{e}") })?;
    tokio::task::spawn_blocking(move || -> Result<Vec<(String, String)>, String> {
        let catalog: Box<dyn tidegate_service::catalog::Catalog> = match &store {
            tidegate_runtime::StoreUrl::Postgres { url, .. } => {
                Box::new(tidegate_service::catalog_postgres::PgCatalog::open(url).map_err(|e| e.to_string())?)
            }
            tidegate_runtime::StoreUrl::Sqlite(dir) => {
                Box::new(tidegate_service::catalog::SqliteCatalog::open(dir).map_err(|e| e.to_string())?)
            }
            other => return Err(format!("{other}: not a shared store")),
        };
        (0..n)
            .map(|i| {
                let name = format!("t{i}");
                catalog.create_tenant(&name).map_err(|e| e.to_string())?;
                let (key, _) =
                    catalog.create_key(&name, Role::Admin, Some("bench cluster")).map_err(|e| e.to_string())?;
                Ok((name, key.key))
            })
            .collect()
    })
    .await
    .map_err(|e| BenchError::Http { step: "catalog", detail: e.to_string() })?
    .map_err(|detail| BenchError::Http { step: "catalog", detail })
}

/// Where each tenant is served now (`GET /v1/cluster` through any node, following `503`s).
async fn owners(
    http: &reqwest::Client,
    nodes: &[Node],
    keys: &[(String, String)],
) -> Result<BTreeMap<String, String>, BenchError> {
    let mut out = BTreeMap::new();
    for (name, key) in keys {
        let mut base = nodes[0].base.clone();
        for _ in 0..50 {
            let r = http.get(format!("{base}/v1/cluster")).bearer_auth(key).send().await;
            let Ok(r) = r else { break };
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            if status == 200 {
                out.insert(name.clone(), v["node"].as_str().unwrap_or_default().to_owned());
                break;
            }
            if let Some(a) = v["owner_address"].as_str() {
                base = a.to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(out)
}

struct Load {
    stop: AtomicBool,
    /// Per tenant: the base URL its clients send to.
    targets: Vec<Mutex<String>>,
    nodes: Mutex<Vec<String>>,
    /// Committed: (tenant, completion instant, latency ms).
    done: Mutex<Vec<(usize, Instant, f64)>>,
    failed: Mutex<u64>,
}

async fn post(http: &reqwest::Client, url: String, key: &str, body: Value) -> Option<(u16, Value)> {
    let r = http.post(url).bearer_auth(key).json(&body).send().await.ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// One client on tenant `t`: transactions until told to stop.
async fn client(c: usize, t: usize, key: String, load: Arc<Load>, http: reqwest::Client) {
    let begin = json!({"agent": format!("c{c}"), "may_touch": [format!("kv:bench:{c}"), format!("mail:bench:{c}")]});
    let args = json!({"c": c});
    let mut next_node = c;
    while !load.stop.load(Ordering::Relaxed) {
        let base = load.targets[t].lock().clone();
        let started = Instant::now();
        let answer = post(&http, format!("{base}/v1/transactions"), &key, begin.clone()).await;
        let tx = match answer {
            Some((201, tx)) => tx,
            Some((503, v)) => {
                if let Some(a) = v["owner_address"].as_str() {
                    *load.targets[t].lock() = a.to_owned();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            _ => {
                // No answer: the node is gone; try another.
                let nodes = load.nodes.lock().clone();
                if !nodes.is_empty() {
                    next_node += 1;
                    *load.targets[t].lock() = nodes[next_node % nodes.len()].clone();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let id = tx["id"].as_str().unwrap_or_default().to_owned();
        let one = async {
            let (st, ticket) = post(
                &http,
                format!("{base}/v1/transactions/{id}/effects"),
                &key,
                json!({"tool": "reserve", "args": args, "execute": "client"}),
            )
            .await?;
            (st == 200).then_some(())?;
            let result_url = ticket["result_url"].as_str()?.to_owned();
            let (st, _) =
                post(&http, format!("{base}{result_url}"), &key, json!({"status": "done", "output": {"reserved": c}}))
                    .await?;
            (st == 200).then_some(())?;
            let (st, _) = post(
                &http,
                format!("{base}/v1/transactions/{id}/effects"),
                &key,
                json!({"tool": "notify", "args": args}),
            )
            .await?;
            (st == 200).then_some(())?;
            let (st, v) =
                post(&http, format!("{base}/v1/transactions/{id}/commit"), &key, json!({"seal": true})).await?;
            (st == 200 && v["outcome"]["committed"] == true).then_some(())
        };
        match one.await {
            Some(()) => load.done.lock().push((t, Instant::now(), started.elapsed().as_secs_f64() * 1e3)),
            None => *load.failed.lock() += 1,
        }
    }
}

/// Defines the workload's capabilities and tools for every tenant (through its owner).
async fn define(
    http: &reqwest::Client,
    bases: &BTreeMap<String, String>,
    keys: &[(String, String)],
    receiver: &str,
) -> Result<(), BenchError> {
    for (name, key) in keys {
        let base = bases.get(name).ok_or_else(|| BenchError::Http { step: "tenant owner", detail: name.clone() })?;
        for (cap, path) in [("bench-reserve", "reserve"), ("bench-undo", "undo"), ("bench-notify", "notify")] {
            let spec = json!({"kind": "webhook", "url": format!("{receiver}/{path}"), "timeout_ms": 10000, "attempts": 3, "backoff_ms": 10});
            let r = http.put(format!("{base}/v1/capabilities/{cap}")).bearer_auth(key).json(&spec).send().await;
            crate::bench::ok_json("defining a capability", r, &[200, 201]).await?;
        }
        for (tool, def) in [
            (
                "reserve",
                json!({"class": "reversible", "scopes": ["kv:bench:{c}"], "call": "bench-reserve", "compensate": "bench-undo"}),
            ),
            ("notify", json!({"class": "gated", "scopes": ["mail:bench:{c}"], "call": "bench-notify"})),
        ] {
            let r = http.put(format!("{base}/v1/tools/{tool}")).bearer_auth(key).json(&def).send().await;
            crate::bench::ok_json("defining a tool", r, &[200, 201]).await?;
        }
    }
    Ok(())
}

/// One measurement on `store` with `n` nodes; with `failover`, also SIGKILLs the owner of
/// tenant `t0` halfway and returns the time to its first commit on the new owner.
async fn measure(
    opts: &ClusterOptions,
    store_kind: &'static str,
    store: &str,
    n: usize,
    receiver: &str,
    logs: &Path,
    failover: bool,
) -> Result<(ClusterMeasurement, Option<Value>), BenchError> {
    // The nodes first (each registers with the cluster before it listens), then the tenants:
    // every node's next round sees them all and takes its share.
    let mut nodes = Vec::new();
    for i in 0..n {
        let id = format!("{store_kind}-{n}-n{i}");
        nodes.push(Node::start(&opts.binary, store, &id, opts.lease_ms, &logs.join(format!("{id}.log"))).await?);
    }
    let keys = tenants(store, opts.tenants).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.clients * 2)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| BenchError::Http { step: "building the client", detail: e.to_string() })?;
    // The nodes spread the tenants among themselves within a few of their rounds.
    let settle = Instant::now() + Duration::from_millis(opts.lease_ms * 3 + 2_000);
    let mut owner = owners(&http, &nodes, &keys).await?;
    while Instant::now() < settle
        && owner.values().collect::<std::collections::BTreeSet<_>>().len() < n.min(opts.tenants)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
        owner = owners(&http, &nodes, &keys).await?;
    }
    let base_of = |id: &str| nodes.iter().find(|x| x.id == id).map(|x| x.base.clone());
    let bases: BTreeMap<String, String> =
        owner.iter().filter_map(|(t, node)| base_of(node).map(|b| (t.clone(), b))).collect();
    define(&http, &bases, &keys, receiver).await?;
    let mut per_node: BTreeMap<String, usize> = nodes.iter().map(|x| (x.id.clone(), 0)).collect();
    for node in owner.values() {
        *per_node.entry(node.clone()).or_default() += 1;
    }
    let load = Arc::new(Load {
        stop: AtomicBool::new(false),
        targets: keys
            .iter()
            .map(|(t, _)| Mutex::new(bases.get(t).cloned().unwrap_or_else(|| nodes[0].base.clone())))
            .collect(),
        nodes: Mutex::new(nodes.iter().map(|x| x.base.clone()).collect()),
        done: Mutex::new(Vec::new()),
        failed: Mutex::new(0),
    });
    let start = Instant::now();
    let handles: Vec<_> = (0..opts.clients)
        .map(|c| tokio::spawn(client(c, c % keys.len(), keys[c % keys.len()].1.clone(), load.clone(), http.clone())))
        .collect();
    let mut fail = None;
    let secs = Duration::from_secs_f64(opts.seconds);
    if failover && n > 1 {
        tokio::time::sleep(secs / 2).await;
        let victim = owner.get("t0").cloned().unwrap_or_default();
        if let Some(i) = nodes.iter().position(|x| x.id == victim) {
            let mut dead = nodes.remove(i);
            let _ = dead.child.start_kill();
            let _ = dead.child.wait().await;
            let killed = Instant::now();
            load.nodes.lock().retain(|b| *b != dead.base);
            let until = killed + Duration::from_millis(opts.lease_ms + 30_000);
            let first = loop {
                let first =
                    load.done.lock().iter().filter(|(t, at, _)| *t == 0 && *at > killed).map(|(_, at, _)| *at).min();
                if let Some(at) = first {
                    break Some(at.duration_since(killed));
                }
                if Instant::now() > until {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            fail = Some(json!({
                "killed": victim,
                "lease_ms": opts.lease_ms,
                "failover_ms": first.map(|d| d.as_millis() as u64),
                "goal_ms": opts.lease_ms + 2_000,
            }));
        }
        tokio::time::sleep(secs / 2).await;
    } else {
        tokio::time::sleep(secs).await;
    }
    load.stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    for x in nodes {
        x.stop().await;
    }
    let mut lat: Vec<f64> = load.done.lock().iter().map(|(_, _, l)| *l).collect();
    lat.sort_by(f64::total_cmp);
    let failed = *load.failed.lock();
    Ok((
        ClusterMeasurement {
            store: store_kind,
            nodes: n,
            clients: opts.clients,
            committed: lat.len() as u64,
            failed,
            tx_per_s: (lat.len() as f64 / elapsed.max(1e-9) * 10.0).round() / 10.0,
            p50_ms: percentile(&lat, 0.50),
            p99_ms: percentile(&lat, 0.99),
            tenants_per_node: per_node,
        },
        fail,
    ))
}

/// Runs every measurement; returns the report.
pub async fn run(opts: &ClusterOptions) -> Result<Value, BenchError> {
    let receiver = Receiver::start().await?;
    let logs = std::env::temp_dir().join(format!("tidegate-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&logs).map_err(|source| BenchError::Io { op: "creating the log directory", source })?;
    let mut out = Vec::new();
    let mut failover = Value::Null;
    let pid = std::process::id();
    for &n in &opts.nodes {
        let name = format!("tidegate_bench_cluster_{pid}_{n}");
        let url = fresh_database(&opts.postgres, &name).await?;
        let (m, _) = measure(opts, "postgres", &url, n, &receiver.url, &logs, false).await?;
        out.push(m);
        admin(&opts.postgres, format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    }
    // The same workload on one node on the embedded store.
    let dir = logs.join("sqlite");
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Io { op: "creating the data directory", source })?;
    let (m, _) = measure(opts, "sqlite", &dir.display().to_string(), 1, &receiver.url, &logs, false).await?;
    out.push(m);
    // Failover under the largest cluster's load.
    if let Some(&n) = opts.nodes.iter().filter(|n| **n > 1).max() {
        let name = format!("tidegate_bench_cluster_{pid}_failover");
        let url = fresh_database(&opts.postgres, &name).await?;
        let (_, f) = measure(opts, "postgres", &url, n, &receiver.url, &logs, true).await?;
        failover = f.unwrap_or(Value::Null);
        admin(&opts.postgres, format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    }
    // `TIDEGATE_BENCH_KEEP_LOGS=1` keeps the nodes' logs.
    if std::env::var_os("TIDEGATE_BENCH_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        eprintln!("node logs in {}", logs.display());
    }
    let tx = |store: &str, n: usize| out.iter().find(|m| m.store == store && m.nodes == n).map(|m| m.tx_per_s);
    let ratio = match (tx("postgres", 1), tx("sqlite", 1)) {
        (Some(p), Some(s)) if s > 0.0 => json!((p / s * 1000.0).round() / 1000.0),
        _ => Value::Null,
    };
    Ok(json!({
        "bench": "cluster",
        "workload": "begin + client-executed reversible effect (ticket + result over HTTP) + gated effect released by a webhook + seal + commit; per-client scopes; clients spread over the tenants, each sending to its tenant's owner",
        "seconds_per_measurement": opts.seconds,
        "tenants": opts.tenants,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "measurements": out,
        "postgres_1_node_over_sqlite": ratio,
        "failover": failover,
    }))
}
