//! Crash test under load (issue 14, "How it is checked"): the real `tidegate serve` binary on a
//! durable data directory is SIGKILLed at seeded moments while 64 concurrent HTTP clients run
//! transactions of begin + a reversible effect + a gated effect (both dispatched to a webhook
//! sink started here, whose append-only log is the ground truth) + commit, or an abort now
//! and then. After each kill the server is restarted on the same directory and the load goes
//! on. At the end: every acknowledged commit is committed in the ledger and its held effect
//! reached the sink; no effect reached the sink under two different keys; no held effect of
//! an aborted transaction was released; `tidegate ledger verify` is clean.
//!
//! Seeds: `TIDEGATE_CRASH_SEEDS=N` runs seeds 1..=N (default 2), `TIDEGATE_CRASH_SEED=S` one
//! seed; `TIDEGATE_CRASH_KILLS` kills per seed (default 2); `TIDEGATE_CRASH_LEASE_MS` the
//! transactions' lease (default 5000). The binary: `TIDEGATE_BIN`, else
//! `target/debug/tidegate` of this workspace (`cargo test --workspace` builds it; with
//! `cargo test -p tidegate-server` alone build it first with `cargo build -p tidegate`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::Sink;

const CLIENTS: usize = 64;
const TENANT: &str = "crash";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `tidegate` binary, if it was built.
pub(crate) fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIDEGATE_BIN") {
        return Some(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let p = target.join("debug/tidegate");
    p.exists().then_some(p)
}

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: String,
    pub(crate) key: Option<String>,
}

/// Starts `tidegate serve` on `dir`, listening on `listen`; returns once it printed its
/// address (and the bootstrap key, the first time).
pub(crate) async fn start(bin: &Path, dir: &Path, listen: &str) -> Server {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("server.log")).expect("server log");
    let mut last_err = String::new();
    // The previous process's port may linger for a moment after SIGKILL.
    for _ in 0..50 {
        let mut child = Command::new(bin)
            .args(["serve", "--data-dir"])
            .arg(dir)
            .args(["--listen", listen, "--bootstrap-tenant", TENANT])
            .env("RUST_LOG", "warn")
            .env("TIDEGATE_SERVER_SHUTDOWN_DRAIN_MS", "2000")
            .stdout(Stdio::piped())
            .stderr(log.try_clone().expect("log handle"))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn tidegate serve");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut key = None;
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(k) = line.strip_prefix(&format!("tenant={TENANT} role=admin key=")) {
                key = Some(k.to_owned());
            } else if let Some(a) = line.strip_prefix("listening on ") {
                return Server { child, addr: a.to_owned(), key };
            }
        }
        last_err = format!("exited with {:?}", child.wait().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    panic!("tidegate serve did not start ({last_err}); its log:\n{text}");
}

struct Shared {
    base: RwLock<String>,
    /// Lease of every transaction, milliseconds.
    lease_ms: u64,
    key: String,
    stop: AtomicBool,
    /// Acknowledged commits: transaction id → the operation id in its arguments.
    acked: Mutex<BTreeMap<String, String>>,
    /// Aborts the clients asked for and saw settle.
    aborted: Mutex<Vec<String>>,
}

async fn send(
    http: &reqwest::Client,
    s: &Shared,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> Option<(u16, Value)> {
    let url = format!("{}{path}", s.base.read());
    let r = http.request(method, url).bearer_auth(&s.key).json(&body).send().await.ok()?;
    let status = r.status().as_u16();
    let v = r.json::<Value>().await.unwrap_or(Value::Null);
    Some((status, v))
}

/// One client: transactions until told to stop. Any transport error (the server is down)
/// abandons the transaction; its lease ends it.
async fn client(c: usize, seed: u64, s: Arc<Shared>) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().expect("client");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + c as u64);
    let mut n = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        n += 1;
        let op = format!("s{seed}-c{c}-{n}");
        let Some((201, tx)) = send(
            &http,
            &s,
            reqwest::Method::POST,
            "/v1/transactions",
            json!({"agent": format!("c{c}"), "lease_ms": s.lease_ms, "may_touch": [format!("kv:crash:{c}"), format!("mail:crash:{c}")]}),
        )
        .await
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let id = tx["id"].as_str().unwrap_or_default().to_owned();
        let args = json!({"client": c, "op": op});
        let mut ok = true;
        for tool in ["reserve", "notify"] {
            let r = send(
                &http,
                &s,
                reqwest::Method::POST,
                &format!("/v1/transactions/{id}/effects"),
                json!({"tool": tool, "args": args}),
            )
            .await;
            if !matches!(r, Some((200, _))) {
                ok = false;
                break;
            }
        }
        if !ok {
            continue;
        }
        if rng.gen_ratio(1, 8) {
            if let Some((200, v)) = send(
                &http,
                &s,
                reqwest::Method::POST,
                &format!("/v1/transactions/{id}/abort"),
                json!({"wait_ms": 10000}),
            )
            .await
                && v["state"] == "aborted"
            {
                s.aborted.lock().push(id);
            }
            continue;
        }
        if let Some((200, v)) = send(
            &http,
            &s,
            reqwest::Method::POST,
            &format!("/v1/transactions/{id}/commit"),
            json!({"seal": true, "wait_ms": 10000}),
        )
        .await
            && v["outcome"]["committed"] == true
        {
            s.acked.lock().insert(id, op);
        }
    }
}

async fn get(http: &reqwest::Client, base: &str, key: &str, path: &str) -> Value {
    let r = http.get(format!("{base}{path}")).bearer_auth(key).send().await.expect("GET");
    let status = r.status();
    let text = r.text().await.expect("body");
    assert!(status.is_success(), "GET {path}: {status} {text}");
    serde_json::from_str(&text).expect("JSON")
}

async fn put(http: &reqwest::Client, base: &str, key: &str, path: &str, body: Value) {
    let r = http.put(format!("{base}{path}")).bearer_auth(key).json(&body).send().await.expect("PUT");
    assert!(r.status().is_success(), "PUT {path}: {}", r.status());
}

async fn run_seed(bin: &Path, seed: u64, kills: u64, lease_ms: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = Sink::start().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut server = start(bin, dir.path(), "127.0.0.1:0").await;
    let base = format!("http://{}", server.addr);
    let key = server.key.clone().expect("the first start prints the bootstrap key");
    let http = reqwest::Client::new();
    for (name, path) in [("res-call", "reserve/call"), ("res-undo", "reserve/undo"), ("notify-call", "notify/call")] {
        let spec = json!({"kind": "webhook", "url": format!("{}/{path}", sink.url()), "timeout_ms": 5000, "attempts": 4, "backoff_ms": 20});
        put(&http, &base, &key, &format!("/v1/capabilities/{name}"), spec).await;
    }
    put(
        &http,
        &base,
        &key,
        "/v1/tools/reserve",
        json!({"class": "reversible", "scopes": ["kv:crash:{client}"], "call": "res-call", "compensate": "res-undo"}),
    )
    .await;
    put(
        &http,
        &base,
        &key,
        "/v1/tools/notify",
        json!({"class": "gated", "scopes": ["mail:crash:{client}"], "call": "notify-call"}),
    )
    .await;

    let shared = Arc::new(Shared {
        base: RwLock::new(base.clone()),
        lease_ms,
        key: key.clone(),
        stop: AtomicBool::new(false),
        acked: Mutex::new(BTreeMap::new()),
        aborted: Mutex::new(Vec::new()),
    });
    let clients: Vec<_> = (0..CLIENTS).map(|c| tokio::spawn(client(c, seed, shared.clone()))).collect();
    for _ in 0..kills {
        let before = shared.acked.lock().len();
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
        server.child.start_kill().expect("SIGKILL");
        let _ = server.child.wait().await;
        eprintln!("seed {seed}: SIGKILL after {} more acknowledged commits", shared.acked.lock().len() - before);
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..300))).await;
        server = start(bin, dir.path(), &server.addr).await;
        *shared.base.write() = format!("http://{}", server.addr);
    }
    tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1000))).await;
    shared.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client task");
    }
    let base = shared.base.read().clone();
    let acked = shared.acked.lock().clone();
    assert!(!acked.is_empty(), "seed {seed}: the load acknowledged no commit at all");

    // Transactions orphaned by the kills end with their leases; wait for every one to settle.
    let mut unfinished = Value::Null;
    for _ in 0..(300 + lease_ms / 100) {
        unfinished = get(&http, &base, &key, "/v1/transactions?state=unfinished&limit=500").await;
        if unfinished["data"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(unfinished["data"].as_array().is_some_and(Vec::is_empty), "seed {seed}: still unfinished: {unfinished}");

    // Every acknowledged commit is committed in the ledger.
    for id in acked.keys() {
        let v = get(&http, &base, &key, &format!("/v1/transactions/{id}")).await;
        assert_eq!(v["state"], "committed", "seed {seed}: acknowledged commit {id} is {}", v["state"]);
    }
    let aborted = shared.aborted.lock().clone();
    for id in &aborted {
        let v = get(&http, &base, &key, &format!("/v1/transactions/{id}")).await;
        assert_eq!(v["state"], "aborted", "seed {seed}: {id}");
    }

    // The sink's log: one key per effect, held effects released only for committed
    // transactions, and every acknowledged commit's held effect released.
    let deliveries = sink.deliveries();
    let mut keys: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut released: BTreeSet<String> = BTreeSet::new();
    for d in &deliveries {
        let op = d.body["args"]["op"].as_str().unwrap_or_default().to_owned();
        keys.entry((d.path.clone(), op.clone())).or_default().insert(d.key.clone());
        if d.path == "notify/call" && d.applied {
            released.insert(op);
        }
    }
    for ((path, op), ks) in &keys {
        assert_eq!(ks.len(), 1, "seed {seed}: {path} of {op} delivered under different keys: {ks:?}");
    }
    for (id, op) in &acked {
        assert!(
            released.contains(op),
            "seed {seed}: the held effect of acknowledged commit {id} ({op}) never reached the sink"
        );
    }
    let mut states: BTreeMap<String, String> = BTreeMap::new();
    for d in deliveries.iter().filter(|d| d.path == "notify/call") {
        let tx = d.key.split(':').next().unwrap_or_default().to_owned();
        if !states.contains_key(&tx) {
            let v = get(&http, &base, &key, &format!("/v1/transactions/{tx}")).await;
            states.insert(tx.clone(), v["state"].as_str().unwrap_or_default().to_owned());
        }
        assert_eq!(
            states[&tx], "committed",
            "seed {seed}: held effect {} released for a transaction that did not commit",
            d.key
        );
    }
    // Every compensation undid an executed call of an aborted transaction.
    for d in deliveries.iter().filter(|d| d.path == "reserve/undo") {
        let tx = d.key.split(':').next().unwrap_or_default();
        let v = get(&http, &base, &key, &format!("/v1/transactions/{tx}")).await;
        assert_eq!(v["state"], "aborted", "seed {seed}: compensation {} for a transaction that did not abort", d.key);
    }

    // Graceful stop, then the ledger verifies clean.
    let pid = server.child.id().expect("pid");
    let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await.expect("kill -TERM");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), server.child.wait()).await.expect("exit after SIGTERM");
    let exit = exit.expect("wait");
    assert!(
        exit.success(),
        "seed {seed}: tidegate serve failed to shut down cleanly ({exit}); its log:\n{}",
        std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
    );
    for tenant in std::fs::read_dir(dir.path().join("tenants")).expect("tenants dir") {
        let tenant = tenant.expect("entry").path();
        let out =
            Command::new(bin).args(["ledger", "verify", "--data-dir"]).arg(&tenant).output().await.expect("verify");
        assert!(
            out.status.success(),
            "seed {seed}: ledger verify of {} failed:\n{}{}",
            tenant.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!(
        "seed {seed}: {} acknowledged commits, {} aborts, {} sink deliveries, ledger verified",
        acked.len(),
        aborted.len(),
        deliveries.len()
    );
}

fn seeds() -> Vec<u64> {
    match std::env::var("TIDEGATE_CRASH_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(s) => vec![s],
        None => (1..=env_u64("TIDEGATE_CRASH_SEEDS", 2)).collect(),
    }
}

/// Leases of 5 s: the transactions a kill orphans outlive the next start's recovery of their
/// in-flight effects (see the ignored test below for what shorter ones find).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_64_client_load_loses_no_acknowledged_commit_and_delivers_each_effect_under_one_key() {
    let Some(bin) = binary() else {
        eprintln!("skipped: no tidegate binary (set TIDEGATE_BIN or `cargo build -p tidegate`)");
        return;
    };
    for seed in seeds() {
        run_seed(&bin, seed, env_u64("TIDEGATE_CRASH_KILLS", 2), env_u64("TIDEGATE_CRASH_LEASE_MS", 5_000)).await;
    }
}

/// Regression (found by this crash test with 1 s leases): an orphaned transaction whose
/// reversible effect was in flight at the kill is aborted by its lease at the next start, and
/// recovery then reported the in-flight effect's unknown outcome for the settled transaction.
/// Replay refused that late record, so the tenant could not be opened again. Replay now
/// accepts a late result (and the blind compensation of an unknown one) as the live engine
/// records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_finding_recovery_of_an_in_flight_effect_races_the_lease_expiry_abort() {
    let Some(bin) = binary() else {
        eprintln!("skipped: no tidegate binary (set TIDEGATE_BIN or `cargo build -p tidegate`)");
        return;
    };
    for seed in seeds() {
        run_seed(&bin, seed, 3, 1_000).await;
    }
}
