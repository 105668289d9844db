//! The story test of issue 15 ("How it is checked", first item), with real processes: the
//! `tidegate serve` binary on a data directory, a webhook sink on 127.0.0.1 started here (its
//! append-only log is the ground truth), and an agent that is a process of its own (a Python
//! script using only `urllib`) which runs a three-step plan whose steps book through the sink,
//! and exits. The server is SIGKILLed once and restarted on the same directory before the
//! plan's deadline; when the deadline passes, the restarted server's plan executor fires the
//! three compensations, each exactly once, last-in-first-out.
//!
//! The binary: `TIDEGATE_BIN`, else `target/debug/tidegate` (build it with
//! `cargo build -p tidegate` before `cargo test -p tidegate-server`).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Command;

use crate::common::Sink;

/// The agent: opens a plan with a deadline, runs three steps (each one transaction with one
/// booking whose compensation descriptor cancels it by the receipt the booking returned),
/// prints the plan id and exits without committing the plan.
const AGENT: &str = r#"
import json, sys, urllib.request
base, key, deadline_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())
plan = call("POST", "/v1/plans", {"owner": "travel-agent", "deadline_in_ms": deadline_ms})
for step in ["flight", "hotel", "car"]:
    tx = call("POST", "/v1/transactions", {"agent": "travel-agent", "plan": plan["id"],
        "may_touch": ["travel:booking:" + step]})
    call("POST", "/v1/transactions/%s/effects" % tx["id"], {"tool": "book", "args": {"item": step},
        "compensate": {"capability": "book-cancel",
                       "args": {"item": step, "receipt": {"$output": "/receipt"}}}})
    out = call("POST", "/v1/transactions/%s/commit" % tx["id"], {"seal": True, "wait_ms": 10000})
    assert out["outcome"]["committed"], out
print(plan["id"])
"#;

async fn put(http: &reqwest::Client, base: &str, key: &str, path: &str, body: Value) {
    let r = http.put(format!("{base}{path}")).bearer_auth(key).json(&body).send().await.expect("PUT");
    assert!(r.status().is_success(), "PUT {path}: {}", r.status());
}

async fn get(http: &reqwest::Client, base: &str, key: &str, path: &str) -> Value {
    let r = http.get(format!("{base}{path}")).bearer_auth(key).send().await.expect("GET");
    let status = r.status();
    let text = r.text().await.expect("body");
    assert!(status.is_success(), "GET {path}: {status} {text}");
    serde_json::from_str(&text).expect("JSON")
}

fn python() -> Option<&'static str> {
    ["python3", "python"]
        .into_iter()
        .find(|p| std::process::Command::new(p).arg("--version").output().map(|o| o.status.success()).unwrap_or(false))
}

async fn run_agent(py: &str, dir: &Path, base: &str, key: &str, deadline_ms: u64) -> String {
    let script = dir.join("agent.py");
    std::fs::write(&script, AGENT).expect("agent script");
    let out = Command::new(py)
        .arg(&script)
        .args([base, key, &deadline_ms.to_string()])
        .output()
        .await
        .expect("run the agent process");
    assert!(
        out.status.success(),
        "the agent failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_process_plan_is_unwound_after_its_deadline_by_a_restarted_server_exactly_once_lifo() {
    let Some(bin) = crate::crash::binary() else {
        eprintln!("skipped: no tidegate binary (set TIDEGATE_BIN or `cargo build -p tidegate`)");
        return;
    };
    let Some(py) = python() else {
        eprintln!("skipped: no python3 for the agent process");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = Sink::start().await;
    let mut server = crate::crash::start(&bin, dir.path(), "127.0.0.1:0").await;
    let base = format!("http://{}", server.addr);
    let key = server.key.clone().expect("the first start prints the bootstrap key");
    let http = reqwest::Client::new();
    for (name, path) in [("book-call", "book/call"), ("book-undo", "book/undo"), ("book-cancel", "book/cancel")] {
        let spec = json!({"kind": "webhook", "url": format!("{}/{path}", sink.url()), "timeout_ms": 5000, "attempts": 4, "backoff_ms": 20});
        put(&http, &base, &key, &format!("/v1/capabilities/{name}"), spec).await;
    }
    put(
        &http,
        &base,
        &key,
        "/v1/tools/book",
        json!({"class": "reversible", "scopes": ["travel:booking:{item}"], "call": "book-call", "compensate": "book-undo"}),
    )
    .await;

    let deadline_ms = 8_000;
    let opened = std::time::Instant::now();
    let plan = run_agent(py, dir.path(), &base, &key, deadline_ms).await;
    assert!(plan.starts_with("plan_"), "{plan}");
    let bookings: Vec<String> = sink.on("book/call").iter().map(|d| d.key.clone()).collect();
    assert_eq!(bookings.len(), 3, "three bookings reached the sink: {bookings:?}");
    let held = get(&http, &base, &key, &format!("/v1/plans/{plan}")).await;
    assert_eq!(held["state"], "open", "{held}");
    assert_eq!(held["held"], 3, "{held}");
    let seqs: Vec<u64> = held["registrations"].as_array().unwrap().iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![2, 1, 0], "held compensations listed in unwind order: {held}");
    assert_eq!(held["triggers"][0]["kind"], "deadline");
    assert_eq!(held["triggers"][0]["value"], "unknown");
    assert!(
        opened.elapsed() < Duration::from_millis(deadline_ms - 2_000),
        "the agent took too long for the deadline to come after the restart"
    );
    assert!(sink.on("book/cancel").is_empty(), "nothing compensated before the deadline");

    // The agent is gone; the server dies and comes back before the deadline.
    server.child.start_kill().expect("SIGKILL");
    let _ = server.child.wait().await;
    server = crate::crash::start(&bin, dir.path(), &server.addr).await;
    let base = format!("http://{}", server.addr);

    for _ in 0..400 {
        if sink.on("book/cancel").len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(opened.elapsed() >= Duration::from_millis(deadline_ms), "not before the deadline");
    // A little longer: a duplicate would show up now.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let cancels = sink.on("book/cancel");
    let items: Vec<&str> = cancels.iter().map(|d| d.body["args"]["item"].as_str().unwrap_or("?")).collect();
    assert_eq!(items, vec!["car", "hotel", "flight"], "each compensation once, last-in-first-out: {cancels:?}");
    let keys: std::collections::BTreeSet<&str> = cancels.iter().map(|d| d.key.as_str()).collect();
    assert_eq!(keys.len(), 3, "three distinct compensation keys");
    for (d, booking) in cancels.iter().zip(bookings.iter().rev()) {
        assert_eq!(d.operation, "compensate");
        assert_eq!(d.key, format!("{booking}#compensate"));
        assert_eq!(d.body["args"]["receipt"].as_str(), Some(booking.as_str()), "the $output reference: {d:?}");
    }
    assert!(sink.on("book/undo").is_empty(), "the steps committed: their own compensations never ran");
    let mut ended = Value::Null;
    for _ in 0..100 {
        ended = get(&http, &base, &key, &format!("/v1/plans/{plan}")).await;
        if ended["state"] == "unwound" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ended["state"], "unwound", "{ended}");
    assert_eq!(ended["failure"]["cause"]["kind"], "deadline", "{ended}");
    server.child.start_kill().expect("stop");
    let _ = server.child.wait().await;
}
