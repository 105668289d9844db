//! `tidegate plans` against a real `tidegate serve --memory`: a plan opened over the API is
//! listed and shown (its deadline trigger unknown), signalled (it fails and, with nothing held,
//! is unwound at once), a resolve of a plan that is not stuck is refused in one line, and the
//! stuck queue is empty. Also over the API: a reversible effect in a plan step without a
//! descriptor is refused naming the tool, and a trigger naming another tenant is refused.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

/// The server process, killed when the test ends (also on a failed assertion).
struct Server {
    child: Child,
    base: String,
    admin: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--memory", "--listen", "127.0.0.1:0", "--bootstrap-tenant", "acme"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut admin, mut base) = (None, None);
    while base.is_none() {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the server stopped before listening");
        if let Some(rest) = line.trim().strip_prefix("tenant=acme role=admin key=") {
            admin = Some(rest.to_owned());
        } else if let Some(addr) = line.trim().strip_prefix("listening on ") {
            base = Some(format!("http://{addr}"));
        }
    }
    Server { child, base: base.unwrap(), admin: admin.expect("the bootstrap key is printed before listening") }
}

fn api(s: &Server, method: &str, path: &str, body: Value) -> (u16, Value) {
    let r = ureq::request(method, &format!("{}{path}", s.base))
        .set("Authorization", &format!("Bearer {}", s.admin))
        .send_json(body);
    match r {
        Ok(resp) => (resp.status(), resp.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn plans(s: &Server, args: &[&str]) -> Out {
    let out = Command::new(BIN)
        .arg("plans")
        .args(args)
        .env("TIDEGATE_URL", &s.base)
        .env("TIDEGATE_API_KEY", &s.admin)
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(s: &Server, args: &[&str]) -> String {
    let o = plans(s, args);
    assert_eq!(o.code, 0, "{args:?} failed: {}{}", o.stdout, o.stderr);
    o.stdout
}

#[test]
fn the_plans_cli_lists_shows_signals_and_refuses_what_the_server_refuses() {
    let s = start();
    assert_eq!(ok(&s, &["list"]), "no plans\n");
    let (code, plan) = api(&s, "POST", "/v1/plans", json!({"owner": "ops", "deadline_in_ms": 3_600_000}));
    assert_eq!(code, 201, "{plan}");
    let id = plan["id"].as_str().unwrap().to_owned();
    let list = ok(&s, &["list"]);
    assert!(list.starts_with(&format!("{id}  open  owner=ops  steps=0  held=0 deadline_ms=")), "{list}");
    let shown = ok(&s, &["show", &id]);
    assert!(shown.contains("deadline = unknown"), "{shown}");
    let json: Value = serde_json::from_str(&ok(&s, &["show", &id, "--json"])).unwrap();
    assert_eq!(json["triggers"][0]["value"], "unknown");

    // A reversible effect in a step without a descriptor is refused, naming the tool.
    assert_eq!(api(&s, "PUT", "/v1/capabilities/q", json!({"kind": "worker"})).0, 201);
    let tool = json!({"class": "reversible", "scopes": ["kv:x:{id}"], "call": "q", "compensate": "q"});
    assert_eq!(api(&s, "PUT", "/v1/tools/book", tool).0, 201);
    let (code, tx) = api(&s, "POST", "/v1/transactions", json!({"plan": id, "may_touch": ["kv:x:1"]}));
    assert_eq!(code, 201, "{tx}");
    let tx = tx["id"].as_str().unwrap().to_owned();
    let (code, p) =
        api(&s, "POST", &format!("/v1/transactions/{tx}/effects"), json!({"tool": "book", "args": {"id": "1"}}));
    assert_eq!((code, p["code"].as_str()), (400, Some("missing_descriptor")), "{p}");
    assert!(p["detail"].as_str().unwrap().contains("`book`"), "{p}");
    assert_eq!(p["field"], "compensate");
    // A trigger naming another tenant is refused.
    let pred = json!({"predicate": {"tagged": {"tenant": "globex", "tx": 1, "effect": 0, "tag": "leaked"}}});
    let (code, p) = api(&s, "POST", &format!("/v1/plans/{id}/triggers"), pred);
    assert_eq!((code, p["code"].as_str()), (400, Some("cross_tenant")), "{p}");
    api(&s, "POST", &format!("/v1/transactions/{tx}/abort"), json!({"wait_ms": 5000}));

    // Resolving a plan that is not stuck is refused in one line.
    let o = plans(&s, &["resolve", &id, "--choice", "accept"]);
    assert_ne!(o.code, 0);
    assert_eq!(o.stdout, "");
    assert!(o.stderr.contains("HTTP 409 wrong_state") && o.stderr.contains("stuck"), "{}", o.stderr);
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
    let o = plans(&s, &["show", "tx_1"]);
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("invalid plan id `tx_1`"), "{}", o.stderr);

    // A signal fails the plan; with nothing held it ends unwound.
    let line = ok(&s, &["signal", &id, "--reason", "visa refused"]);
    assert!(line.starts_with(&id), "{line}");
    let mut state = String::new();
    for _ in 0..100 {
        let v: Value = serde_json::from_str(&ok(&s, &["show", &id, "--json"])).unwrap();
        state = v["state"].as_str().unwrap().to_owned();
        if state == "unwound" {
            assert_eq!(v["failure"]["cause"]["kind"], "signal", "{v}");
            assert_eq!(v["failure"]["cause"]["reason"], "visa refused", "{v}");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(state, "unwound");
    assert_eq!(ok(&s, &["list", "--stuck"]), "no stuck plans\n");
}
