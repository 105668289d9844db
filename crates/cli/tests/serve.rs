//! The real `tidegate serve` binary: SIGTERM drains and closes cleanly, SIGKILL loses nothing
//! acknowledged, and every restart recovers; the ledger verifies clean afterwards.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

mod common;
use common::sink;

fn cli(args: &[&str], dir: &std::path::Path) -> String {
    let out = Command::new(BIN).args(args).arg("--data-dir").arg(dir).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

struct Server {
    child: Child,
    base: String,
}

fn start(dir: &std::path::Path) -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    Server { child, base: format!("http://{addr}") }
}

fn call(base: &str, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let req = ureq::request(method, &format!("{base}{path}")).set("Authorization", &format!("Bearer {key}"));
    let r = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    match r {
        Ok(resp) => (resp.status(), resp.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let ok = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
    for _ in 0..200 {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("the server did not stop within 10 s of SIGTERM");
}

#[test]
fn sigterm_and_sigkill_lose_no_acknowledged_commit_and_the_ledger_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cli(&["tenant", "create", "acme"], d);
    let key = cli(&["key", "create", "--tenant", "acme", "--role", "admin"], d).trim().to_owned();
    let (hook, seen) = sink();

    let mut s = start(d);
    let (st, _) = call(&s.base, &key, "PUT", "/v1/capabilities/hook", Some(json!({"kind": "webhook", "url": hook})));
    assert_eq!(st, 201);
    let (st, _) = call(
        &s.base,
        &key,
        "PUT",
        "/v1/tools/notify",
        Some(json!({"class": "gated", "scopes": ["kv:n:{id}"], "call": "hook"})),
    );
    assert_eq!(st, 201);
    let mut committed = Vec::new();
    let one_round = |s: &Server, committed: &mut Vec<String>, from: usize| {
        for i in from..from + 10 {
            let (st, b) = call(
                &s.base,
                &key,
                "POST",
                "/v1/calls",
                Some(json!({"tool": "notify", "args": {"id": i}, "key": format!("n-{i}")})),
            );
            assert_eq!((st, b["transaction"]["state"].as_str()), (200, Some("committed")), "{b}");
            committed.push(b["transaction"]["id"].as_str().unwrap().to_owned());
        }
    };
    one_round(&s, &mut committed, 0);
    let (_, open) =
        call(&s.base, &key, "POST", "/v1/transactions", Some(json!({"may_touch": ["kv:open"], "lease_ms": 600000})));
    let open = open["id"].as_str().unwrap().to_owned();
    let status = sigterm(&mut s.child);
    assert!(status.success(), "SIGTERM exits cleanly: {status:?}");

    // Restart after SIGTERM, then SIGKILL right after more acknowledged commits.
    let mut s = start(d);
    one_round(&s, &mut committed, 10);
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    let mut s = start(d);
    for tx in &committed {
        let (st, b) = call(&s.base, &key, "GET", &format!("/v1/transactions/{tx}"), None);
        assert_eq!((st, b["state"].as_str()), (200, Some("committed")), "{tx} after restarts: {b}");
    }
    let (_, b) = call(&s.base, &key, "GET", &format!("/v1/transactions/{open}"), None);
    assert_eq!(b["state"], "open", "kept open for its lease: {b}");
    let (_, ready) = call(&s.base, &key, "GET", "/readyz", None);
    assert_eq!(ready["failed"], 0, "{ready}");
    let status = sigterm(&mut s.child);
    assert!(status.success());

    let seen = seen.lock().unwrap();
    for i in 0..20 {
        assert_eq!(seen.get(&format!("n-{i}")), Some(&1), "release n-{i} reached the sink exactly once: {seen:?}");
    }
    let out = Command::new(BIN).args(["ledger", "verify", "--data-dir"]).arg(d.join("tenants/acme")).output().unwrap();
    assert!(
        out.status.success(),
        "ledger verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
