//! Failover between real `tidegate serve` nodes on one PostgreSQL (issue 29, "How it is
//! checked"): three nodes share the database at `TIDEGATE_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`; each seed makes and drops its own database, and
//! the test fails without the server). 64 clients run transactions on one tenant: begin, a
//! client-executed reversible effect (the client makes the call itself, to the sink), a held
//! effect released by a webhook at commit, then commit, or abort one time in eight. A client
//! sends to the node it last heard serves the tenant: a node that does not answers `503` with
//! the owner's address. A plan with a deadline is open throughout.
//!
//! At seeded moments the tenant's owner is SIGKILLed; another node takes the tenant when the
//! owner's lease runs out, and the killed node comes back under a new id. Then the owner is
//! SIGSTOPped until the tenant moved, and SIGCONTed: it must not append (the database refuses
//! its token) and must send clients on. At the end the history checker (`history.rs`) reads the
//! clients' histories, the exported ledger and the sink's log: no acknowledged commit or abort
//! lost, no transaction decided twice, no effect under two keys, no release without a commit,
//! no compensation without an abort and none missing; the plan's compensation fired once on
//! the new owner; `tidegate ledger verify` is clean. The time from each kill to the first
//! commit acknowledged by the new owner is printed.
//!
//! Seeds: `TIDEGATE_FAILOVER_SEEDS=N` runs seeds 1..=N (default 2; the soak command,
//! `scripts/soak-cluster.sh`, runs 20), `TIDEGATE_FAILOVER_SEED=S` one seed;
//! `TIDEGATE_FAILOVER_KILLS` kills per seed (default 2); `TIDEGATE_FAILOVER_LEASE_MS` the
//! nodes' ownership lease (default 1500).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::Sink;
use crate::history::{self, Op, Seen, Want};

const CLIENTS: usize = 64;
const TENANT: &str = "acme";
const TX_LEASE_MS: u64 = 5_000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn admin_url() -> String {
    std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs blocking database work on a plain thread (the blocking client drives a runtime of
/// its own, which must not run on a runtime's thread).
fn admin(sql: String) {
    let url = admin_url();
    std::thread::spawn(move || {
        let mut pg = postgres::Client::connect(&url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("PostgreSQL is required at {url} (TIDEGATE_PG_URL): {e}"));
        pg.batch_execute(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    })
    .join()
    .expect("admin thread");
}

struct Node {
    id: String,
    child: Child,
    base: String,
}

/// Starts `tidegate serve --node-id ID` on the shared database.
async fn start(
    bin: &Path,
    url: &str,
    id: &str,
    log_dir: &Path,
    lease_ms: u64,
    bootstrap: bool,
) -> (Node, Option<String>) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join(format!("{id}.log")))
        .expect("node log");
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--store", url, "--node-id", id])
        .env("RUST_LOG", std::env::var("TIDEGATE_FAILOVER_LOG").unwrap_or_else(|_| "warn,tower_http=off".into()))
        .env("TIDEGATE_SERVER_OWNERSHIP_LEASE_MS", lease_ms.to_string())
        .env("TIDEGATE_SERVER_SHUTDOWN_DRAIN_MS", "2000")
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true);
    if bootstrap {
        cmd.args(["--bootstrap-tenant", TENANT]);
    }
    let mut child = cmd.spawn().expect("spawn tidegate serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut key = None;
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(k) = line.strip_prefix(&format!("tenant={TENANT} role=admin key=")) {
            key = Some(k.to_owned());
        } else if let Some(a) = line.strip_prefix("listening on ") {
            return (Node { id: id.to_owned(), child, base: format!("http://{a}") }, key);
        }
    }
    let text = std::fs::read_to_string(log_dir.join(format!("{id}.log"))).unwrap_or_default();
    panic!("node {id} did not start ({:?}); its log:\n{text}", child.wait().await);
}

enum Logs {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl Logs {
    fn path(&self) -> &Path {
        match self {
            Logs::Temp(t) => t.path(),
            Logs::Kept(p) => p,
        }
    }
}

struct Shared {
    /// Where the clients think the tenant is served.
    target: RwLock<String>,
    /// Every node that should be up.
    nodes: RwLock<Vec<String>>,
    /// Which of them to try next when the target does not answer.
    next: std::sync::atomic::AtomicUsize,
    key: String,
    stop: AtomicBool,
    history: Mutex<Vec<Op>>,
    started: Instant,
    sink: String,
}

impl Shared {
    /// Follows a `503` that names where the tenant is served, or, with no answer at all, tries
    /// another node.
    fn redirect(&self, answer: Option<&(u16, Value)>) {
        if let Some((503, v)) = answer
            && let Some(addr) = v["owner_address"].as_str()
        {
            *self.target.write() = addr.to_owned();
            return;
        }
        if answer.is_none() {
            let nodes = self.nodes.read();
            if !nodes.is_empty() {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % nodes.len();
                *self.target.write() = nodes[i].clone();
            }
        }
    }
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> Option<(u16, Value)> {
    let r = http.request(method, format!("{base}{path}")).bearer_auth(key).json(&body).send().await.ok()?;
    let status = r.status().as_u16();
    Some((status, r.json::<Value>().await.unwrap_or(Value::Null)))
}

/// One client: transactions until told to stop, each recorded in the history once its begin
/// was acknowledged.
async fn client(c: usize, seed: u64, s: Arc<Shared>) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("client");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + c as u64);
    let mut n = 0u64;
    let post = reqwest::Method::POST;
    while !s.stop.load(Ordering::Relaxed) {
        let base = s.target.read().clone();
        let begin = json!({"agent": format!("c{c}"), "lease_ms": TX_LEASE_MS, "may_touch": [format!("kv:fo:{c}"), format!("mail:fo:{c}")]});
        let answer = send(&http, &base, &s.key, post.clone(), "/v1/transactions", begin).await;
        let Some((201, tx)) = answer else {
            s.redirect(answer.as_ref());
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        n += 1;
        let op = format!("s{seed}-c{c}-{n}");
        let id = tx["id"].as_str().unwrap_or_default().to_owned();
        let want = if rng.gen_ratio(1, 8) { Want::Abort } else { Want::Commit };
        let seen = run_tx(&http, &base, &s, &id, c, &op, want).await;
        if seen == Seen::Unknown {
            s.redirect(None);
        }
        let done_ms = u64::try_from(s.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        s.history.lock().push(Op { op, tx: id, want, seen, done_ms });
    }
}

/// The rest of one transaction after its begin; what the client saw.
async fn run_tx(http: &reqwest::Client, base: &str, s: &Shared, id: &str, c: usize, op: &str, want: Want) -> Seen {
    let post = reqwest::Method::POST;
    let args = json!({"client": c, "op": op});
    // The client-executed reversible effect: a ticket, the call made here, its result.
    let Some((200, ticket)) = send(
        http,
        base,
        &s.key,
        post.clone(),
        &format!("/v1/transactions/{id}/effects"),
        json!({"tool": "reserve", "args": args, "execute": "client"}),
    )
    .await
    else {
        return Seen::Unknown;
    };
    let effect_key = ticket["effect"]["key"].as_str().unwrap_or_default().to_owned();
    let called = http
        .post(format!("{}/reserve/client", s.sink))
        .header("Idempotency-Key", &effect_key)
        .json(&json!({"args": args}))
        .send()
        .await;
    if !called.is_ok_and(|r| r.status().is_success()) {
        return Seen::Unknown;
    }
    let result_url = ticket["result_url"].as_str().unwrap_or_default().to_owned();
    if !matches!(
        send(http, base, &s.key, post.clone(), &result_url, json!({"status": "done", "output": {"reserved": op}}))
            .await,
        Some((200, _))
    ) {
        return Seen::Unknown;
    }
    // The held effect, released at commit by the webhook.
    if !matches!(
        send(
            http,
            base,
            &s.key,
            post.clone(),
            &format!("/v1/transactions/{id}/effects"),
            json!({"tool": "notify", "args": args})
        )
        .await,
        Some((200, _))
    ) {
        return Seen::Unknown;
    }
    match want {
        Want::Abort => {
            match send(http, base, &s.key, post, &format!("/v1/transactions/{id}/abort"), json!({"wait_ms": 4000}))
                .await
            {
                Some((200, v)) if v["state"] == "aborted" => Seen::Aborted,
                _ => Seen::Unknown,
            }
        }
        Want::Commit => {
            match send(
                http,
                base,
                &s.key,
                post,
                &format!("/v1/transactions/{id}/commit"),
                json!({"seal": true, "wait_ms": 4000}),
            )
            .await
            {
                Some((200, v)) if v["outcome"]["committed"] == true => Seen::Committed,
                Some((200, v)) if v["outcome"]["committed"] == false => Seen::Aborted,
                _ => Seen::Unknown,
            }
        }
    }
}

/// GET through whichever node serves the tenant, following `503`s (up to `patience`).
async fn get(http: &reqwest::Client, s: &Shared, path: &str, patience: Duration) -> Value {
    let until = Instant::now() + patience;
    loop {
        let base = s.target.read().clone();
        let answer = send(http, &base, &s.key, reqwest::Method::GET, path, Value::Null).await;
        if let Some((200, v)) = &answer {
            return v.clone();
        }
        assert!(Instant::now() < until, "GET {path}: no node answered it: {answer:?}");
        s.redirect(answer.as_ref());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put(http: &reqwest::Client, base: &str, key: &str, path: &str, body: Value) {
    let r = http.put(format!("{base}{path}")).bearer_auth(key).json(&body).send().await.expect("PUT");
    assert!(r.status().is_success(), "PUT {path}: {}", r.status());
}

/// The node holding the tenant now, by the cluster view (asked through the owner).
async fn owner(http: &reqwest::Client, s: &Shared) -> String {
    let v = get(http, s, "/v1/cluster", Duration::from_secs(30)).await;
    v["stream"]["owner"].as_str().unwrap_or_default().to_owned()
}

/// Every node's log, for a failure message.
fn logs_of(dir: &Path) -> String {
    let mut out = String::new();
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    entries.sort();
    for p in entries {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        out.push_str(&format!("--- {} (last {} lines)\n", p.display(), tail.len()));
        for l in tail.into_iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill").success();
    assert!(ok, "kill {sig} {pid}");
}

async fn run_seed(bin: &Path, seed: u64, kills: u64, lease_ms: u64) {
    let name = format!("tidegate_failover_{}_{seed}", std::process::id());
    admin(format!("DROP DATABASE IF EXISTS {name}"));
    admin(format!("CREATE DATABASE {name}"));
    let admin_base = admin_url();
    let url = format!("{}/{name}", admin_base.rsplit_once('/').expect("a database URL").0);
    let logs = tempfile::tempdir().expect("tempdir");
    // `TIDEGATE_FAILOVER_KEEP_LOGS=1` keeps the nodes' logs (the directory is printed).
    let logs = if std::env::var_os("TIDEGATE_FAILOVER_KEEP_LOGS").is_some() {
        let kept = logs.keep();
        eprintln!("seed {seed}: node logs in {}", kept.display());
        Logs::Kept(kept)
    } else {
        Logs::Temp(logs)
    };
    let sink = Sink::start().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let (n0, key) = start(bin, &url, "n0", logs.path(), lease_ms, true).await;
    let key = key.expect("the first node prints the bootstrap key");
    // Short: a stopped node does not answer, and the controller moves on to another.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().expect("http");
    for (cap, path) in [
        ("res-call", "reserve/call"),
        ("res-undo", "reserve/undo"),
        ("notify-call", "notify/call"),
        ("book-call", "book/call"),
        ("book-cancel", "book/cancel"),
    ] {
        let spec = json!({"kind": "webhook", "url": format!("{}/{path}", sink.url()), "timeout_ms": 3000, "attempts": 4, "backoff_ms": 20});
        put(&http, &n0.base, &key, &format!("/v1/capabilities/{cap}"), spec).await;
    }
    put(
        &http,
        &n0.base,
        &key,
        "/v1/tools/reserve",
        json!({"class": "reversible", "scopes": ["kv:fo:{client}"], "call": "res-call", "compensate": "res-undo"}),
    )
    .await;
    put(
        &http,
        &n0.base,
        &key,
        "/v1/tools/notify",
        json!({"class": "gated", "scopes": ["mail:fo:{client}"], "call": "notify-call"}),
    )
    .await;
    put(
        &http,
        &n0.base,
        &key,
        "/v1/tools/book",
        json!({"class": "reversible", "scopes": ["trip:{item}"], "call": "book-call"}),
    )
    .await;
    let mut nodes = vec![n0];
    for i in 1..3 {
        nodes.push(start(bin, &url, &format!("n{i}"), logs.path(), lease_ms, false).await.0);
    }
    let shared = Arc::new(Shared {
        target: RwLock::new(nodes[0].base.clone()),
        nodes: RwLock::new(nodes.iter().map(|n| n.base.clone()).collect()),
        key: key.clone(),
        next: std::sync::atomic::AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        history: Mutex::new(Vec::new()),
        started: Instant::now(),
        sink: sink.url(),
    });

    // A plan whose deadline comes after the kills: its compensation must fire once, on
    // whichever node holds the tenant then.
    let deadline_ms = 4_000 + kills * (lease_ms + 2_000);
    let plan = send(
        &http,
        &nodes[0].base,
        &key,
        reqwest::Method::POST,
        "/v1/plans",
        json!({"owner": "planner", "deadline_in_ms": deadline_ms}),
    )
    .await;
    let plan = match plan {
        Some((201, v)) => v["id"].as_str().expect("plan id").to_owned(),
        other => panic!("open a plan: {other:?}"),
    };
    let step = send(
        &http,
        &nodes[0].base,
        &key,
        reqwest::Method::POST,
        "/v1/transactions",
        json!({"agent": "planner", "plan": plan, "may_touch": ["trip:hotel"]}),
    )
    .await;
    let step = step.and_then(|(st, v)| (st == 201).then_some(v)).expect("plan step");
    let step = step["id"].as_str().expect("step id").to_owned();
    let effect = json!({"tool": "book", "args": {"item": "hotel", "op": "plan-hotel"}, "compensate": {"capability": "book-cancel", "args": {"item": "hotel", "op": "plan-hotel"}}});
    let r =
        send(&http, &nodes[0].base, &key, reqwest::Method::POST, &format!("/v1/transactions/{step}/effects"), effect)
            .await;
    assert!(matches!(r, Some((200, _))), "plan step effect: {r:?}");
    let r = send(
        &http,
        &nodes[0].base,
        &key,
        reqwest::Method::POST,
        &format!("/v1/transactions/{step}/commit"),
        json!({"seal": true, "wait_ms": 2500}),
    )
    .await;
    assert!(matches!(&r, Some((200, v)) if v["outcome"]["committed"] == true), "plan step commit: {r:?}");

    let clients: Vec<_> = (0..CLIENTS).map(|c| tokio::spawn(client(c, seed, shared.clone()))).collect();
    let mut failovers = Vec::new();
    let mut restarts = 0;
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2000))).await;
        let victim = owner(&http, &shared).await;
        let i = nodes
            .iter()
            .position(|n| n.id == victim)
            .unwrap_or_else(|| panic!("owner {victim} is not a node of this run"));
        let before = shared.history.lock().iter().filter(|o| o.seen == Seen::Committed).count();
        nodes[i].child.start_kill().expect("SIGKILL");
        let _ = nodes[i].child.wait().await;
        let killed_ms = u64::try_from(shared.started.elapsed().as_millis()).unwrap_or(0);
        let dead = nodes.remove(i);
        shared.nodes.write().retain(|b| *b != dead.base);
        // The first commit acknowledged after the kill was served by the new owner.
        let until = Instant::now() + Duration::from_secs(30);
        let first = loop {
            let first = {
                let h = shared.history.lock();
                h.iter().filter(|o| o.seen == Seen::Committed && o.done_ms > killed_ms).map(|o| o.done_ms).min()
            };
            if let Some(t) = first {
                break t;
            }
            assert!(
                Instant::now() < until,
                "seed {seed}: no commit within 30 s of killing {victim}; target {}; logs:\n{}",
                shared.target.read(),
                logs_of(logs.path())
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        failovers.push(first - killed_ms);
        eprintln!(
            "seed {seed} kill {k}: SIGKILL {victim} after {} acknowledged commits; first commit on the new owner {} ms later (lease {lease_ms} ms)",
            before,
            first - killed_ms
        );
        // The killed node comes back under a new id.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..1000))).await;
        restarts += 1;
        let (n, _) = start(bin, &url, &format!("n{}", 2 + restarts), logs.path(), lease_ms, false).await;
        shared.nodes.write().push(n.base.clone());
        nodes.push(n);
    }

    // Fencing: the owner stops (SIGSTOP) while clients keep going; the tenant moves; the old
    // owner resumes (SIGCONT) and must send clients on, never append.
    let victim = owner(&http, &shared).await;
    let i = nodes.iter().position(|n| n.id == victim).expect("owner is a node");
    let pid = nodes[i].child.id().expect("pid");
    signal(pid, "-STOP");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = owner(&http, &shared).await;
        if now != victim && !now.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "seed {seed}: the tenant never left the stopped node {victim}");
    }
    signal(pid, "-CONT");
    let stale = nodes[i].base.clone();
    let until = Instant::now() + Duration::from_secs(15);
    let sent_on = loop {
        let r = send(&http, &stale, &key, reqwest::Method::POST, "/v1/transactions", json!({"agent": "stale"})).await;
        match &r {
            Some((503, v)) if v["owner"].as_str().is_some_and(|o| o != victim) => break v.clone(),
            // The resumed node's first write meets the fence; it drops the tenant.
            Some((st, v)) => assert!(*st == 503 || *st == 201, "the resumed node answered {st}: {v}"),
            None => {}
        }
        assert!(Instant::now() < until, "seed {seed}: the resumed node {victim} still serves the tenant: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("seed {seed}: the resumed node {victim} sends clients to {}", sent_on["owner"]);

    tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1000))).await;
    shared.stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client task");
    }

    // Orphaned transactions end with their leases; the plan's deadline passes.
    let wait = Duration::from_millis(TX_LEASE_MS + 30_000);
    let until = Instant::now() + wait;
    loop {
        let v = get(&http, &shared, "/v1/transactions?state=unfinished&limit=500", wait).await;
        if v["data"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        assert!(Instant::now() < until, "seed {seed}: still unfinished: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let until = Instant::now() + Duration::from_millis(deadline_ms + 30_000);
    loop {
        let p = get(&http, &shared, &format!("/v1/plans/{plan}"), Duration::from_secs(30)).await;
        if p["state"] != "open" && !sink.on("book/cancel").is_empty() {
            break;
        }
        assert!(Instant::now() < until, "seed {seed}: the plan's deadline never fired: {p}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Stop every node cleanly, then read the ledger.
    for n in &mut nodes {
        signal(n.child.id().expect("pid"), "-TERM");
    }
    for n in &mut nodes {
        let exit = tokio::time::timeout(Duration::from_secs(30), n.child.wait())
            .await
            .expect("exit after SIGTERM")
            .expect("wait");
        let log = std::fs::read_to_string(logs.path().join(format!("{}.log", n.id))).unwrap_or_default();
        assert!(exit.success(), "seed {seed}: node {} did not stop cleanly ({exit}); its log:\n{log}", n.id);
    }
    let out = Command::new(bin)
        .args(["ledger", "export", "--store", &url, "--stream", TENANT])
        .output()
        .await
        .expect("export");
    assert!(out.status.success(), "ledger export: {}", String::from_utf8_lossy(&out.stderr));
    let ledger: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event per line"))
        .collect();
    let history = shared.history.lock().clone();
    let deliveries = sink.deliveries();
    let report = history::check(&history, &ledger, &deliveries, "reserve/client", "reserve/undo", "notify/call");
    assert!(report.acked_commits > 0, "seed {seed}: the load acknowledged no commit");
    assert_eq!(report.violations(), 0, "seed {seed}: the history check failed: {report:#?}");
    let cancels: BTreeMap<String, usize> =
        sink.on("book/cancel").iter().filter(|d| d.applied).fold(BTreeMap::new(), |mut m, d| {
            *m.entry(d.key.clone()).or_default() += 1;
            m
        });
    assert_eq!(cancels.len(), 1, "seed {seed}: the plan's one compensation fired under one key: {cancels:?}");
    let out = Command::new(bin)
        .args(["ledger", "verify", "--store", &url, "--stream", TENANT])
        .output()
        .await
        .expect("verify");
    assert!(
        out.status.success(),
        "seed {seed}: ledger verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "seed {seed}: {} operations: {} acknowledged commits, {} acknowledged aborts, {} unknown; {} decisions, {} releases, {} compensations in the ledger; \
         {} sink deliveries; failover {:?} ms; history check clean, ledger verified",
        report.ops,
        report.acked_commits,
        report.acked_aborts,
        report.unknown,
        report.decisions,
        report.releases,
        report.compensations,
        deliveries.len(),
        failovers
    );
    drop(nodes);
    admin(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
}

fn seeds() -> Vec<u64> {
    match std::env::var("TIDEGATE_FAILOVER_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(s) => vec![s],
        None => (1..=env_u64("TIDEGATE_FAILOVER_SEEDS", 2)).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_under_64_clients_lose_nothing_when_owners_are_killed_and_paused() {
    let bin: PathBuf = crate::crash::binary().expect("the tidegate binary (cargo build -p tidegate, or TIDEGATE_BIN)");
    for seed in seeds() {
        run_seed(&bin, seed, env_u64("TIDEGATE_FAILOVER_KILLS", 2), env_u64("TIDEGATE_FAILOVER_LEASE_MS", 1_500)).await;
    }
}
