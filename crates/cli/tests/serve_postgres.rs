//! Real `tidegate serve` nodes on one PostgreSQL (`TIDEGATE_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; the test makes its own database and fails without
//! the server): the catalog, the tenants' ledgers and state are shared; a tenant is served by
//! the node holding its lease, another node answers `503 tenant_unavailable` naming the owner
//! until the lease runs out, then takes the tenant on demand after the owner is SIGKILLed;
//! every acknowledged commit is there, no gated effect reached its webhook twice, and the
//! stream verifies.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

mod common;
use common::sink;

struct Node {
    child: Child,
    base: String,
    /// What the node printed after its address (the bootstrap key, if any).
    lines: Vec<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(url: &str, node: &str, bootstrap: bool) -> Node {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--store", url, "--node-id", node])
        .env("RUST_LOG", "warn")
        .env("TIDEGATE_SERVER_OWNERSHIP_LEASE_MS", "1500")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if bootstrap {
        cmd.args(["--bootstrap-tenant", "acme"]);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    let base = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "node {node} exited before listening");
        if let Some(addr) = line.trim().strip_prefix("listening on ") {
            break format!("http://{addr}");
        }
        lines.push(line.trim().to_owned());
    };
    Node { child, base, lines }
}

fn call(base: &str, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value, Option<String>) {
    let req = ureq::request(method, &format!("{base}{path}")).set("Authorization", &format!("Bearer {key}"));
    let r = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    match r {
        Ok(resp) => (resp.status(), resp.into_json().unwrap_or(Value::Null), None),
        Err(ureq::Error::Status(code, resp)) => {
            let retry = resp.header("retry-after").map(str::to_owned);
            (code, resp.into_json().unwrap_or(Value::Null), retry)
        }
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

#[test]
fn nodes_share_one_postgres_and_a_tenant_moves_when_its_owner_dies() {
    let admin = std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let name = format!("tidegate_cluster_{}", std::process::id());
    let mut pg = postgres::Client::connect(&admin, postgres::NoTls)
        .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin} (TIDEGATE_PG_URL): {e}"));
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    pg.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    let (hook, seen) = sink();

    // Node a creates the tenant (in the shared catalog) and serves it.
    let mut a = start(&url, "node-a", true);
    let key = a
        .lines
        .iter()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("key=")).map(str::to_owned))
        .unwrap_or_else(|| panic!("no bootstrap key in {:?}", a.lines));
    let (st, _, _) = call(&a.base, &key, "PUT", "/v1/capabilities/hook", Some(json!({"kind": "webhook", "url": hook})));
    assert_eq!(st, 201);
    let tool = json!({"class": "gated", "scopes": ["kv:n:{id}"], "call": "hook"});
    assert_eq!(call(&a.base, &key, "PUT", "/v1/tools/notify", Some(tool)).0, 201);
    let mut committed = Vec::new();
    let round = |base: &str, committed: &mut Vec<String>, from: usize| {
        for i in from..from + 10 {
            let body = json!({"tool": "notify", "args": {"id": i}, "key": format!("n-{i}")});
            let (st, b, _) = call(base, &key, "POST", "/v1/calls", Some(body));
            assert_eq!((st, b["transaction"]["state"].as_str()), (200, Some("committed")), "{b}");
            committed.push(b["transaction"]["id"].as_str().unwrap().to_owned());
        }
    };
    round(&a.base, &mut committed, 0);

    // Node b shares the catalog (the key authenticates there) but not the tenant: a holds it.
    let b = start(&url, "node-b", false);
    let (st, body, retry) = call(&b.base, &key, "GET", &format!("/v1/transactions/{}", committed[0]), None);
    assert_eq!((st, body["code"].as_str()), (503, Some("tenant_unavailable")), "{body}");
    assert!(body["detail"].as_str().unwrap_or("").contains("node-a"), "names the owner: {body}");
    assert_eq!(body["owner"], "node-a", "{body}");
    assert_eq!(body["owner_address"].as_str(), Some(a.base.as_str()), "says where to go: {body}");
    assert!(retry.is_some(), "says when to come back");

    // Node a dies. Once its lease ran out, node b takes the tenant on the next request.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let killed = Instant::now();
    let served = loop {
        let (st, body, _) = call(&b.base, &key, "GET", &format!("/v1/transactions/{}", committed[0]), None);
        if st == 200 {
            break body;
        }
        assert_eq!(st, 503, "{body}");
        assert!(killed.elapsed() < Duration::from_secs(20), "node b never took the tenant: {body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let failover = killed.elapsed();
    assert_eq!(served["state"], "committed");
    eprintln!("failover: node b served the tenant {} ms after node a was killed", failover.as_millis());
    for tx in &committed {
        let (st, b2, _) = call(&b.base, &key, "GET", &format!("/v1/transactions/{tx}"), None);
        assert_eq!((st, b2["state"].as_str()), (200, Some("committed")), "{tx} on node b: {b2}");
    }
    round(&b.base, &mut committed, 10);
    let (st, view, _) = call(&b.base, &key, "GET", "/v1/cluster", None);
    assert_eq!(st, 200, "{view}");
    assert_eq!(
        (view["node"].as_str(), view["shared"].as_bool(), view["serving_here"].as_bool()),
        (Some("node-b"), Some(true), Some(true)),
        "{view}"
    );
    assert_eq!(view["stream"]["owner"], "node-b", "{view}");
    assert!(view["stream"]["token"].as_u64() >= Some(2), "a took token 1, b a larger one: {view}");
    assert_eq!(view["stream"]["owner_address"].as_str(), Some(b.base.as_str()), "{view}");
    let nodes = view["nodes"].as_array().unwrap();
    let me = nodes.iter().find(|n| n["id"] == "node-b").unwrap_or_else(|| panic!("node-b listed: {view}"));
    assert_eq!((me["live"].as_bool(), me["tenants"].as_u64()), (Some(true), Some(1)), "{view}");
    assert_eq!(me["address"].as_str(), Some(b.base.as_str()), "{view}");
    for n in nodes.iter().filter(|n| n["id"] != "node-b") {
        assert_eq!(
            (n["id"].as_str(), n["tenants"].as_u64()),
            (Some("node-a"), Some(0)),
            "the dead node holds nothing: {view}"
        );
    }

    // A drain: SIGTERM ends node b's leases, so node c serves at once, well within the lease.
    let c = start(&url, "node-c", false);
    let mut b = b;
    assert!(Command::new("kill").args(["-TERM", &b.child.id().to_string()]).status().unwrap().success());
    assert!(b.child.wait().unwrap().success(), "SIGTERM stops node b cleanly");
    let stopped = Instant::now();
    // Node b's release notified node c's registry, which read the cluster again at once.
    let body = loop {
        let (st, body, _) = call(&c.base, &key, "GET", &format!("/v1/transactions/{}", committed[19]), None);
        if st == 200 {
            break body;
        }
        assert!(stopped.elapsed() < Duration::from_millis(1_500), "node c waited for a lease b had ended: {body}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(body["state"], "committed", "{body}");
    eprintln!("drain: node c served {} ms after node b stopped", stopped.elapsed().as_millis());
    drop(c);
    let seen = seen.lock().unwrap();
    for i in 0..20 {
        assert_eq!(seen.get(&format!("n-{i}")), Some(&1), "n-{i} reached the sink exactly once: {seen:?}");
    }
    let out = Command::new(BIN).args(["ledger", "verify", "--store", &url, "--stream", "acme"]).output().unwrap();
    assert!(
        out.status.success(),
        "ledger verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(pg);
    let mut pg = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
    pg.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
}
