//! `tidegate review` against a real `tidegate serve --memory`: templates registered from a
//! file, requests (suspicious, held, a bad parameter), the queue, accept, a removal refused
//! without `--yes` and then carried out with its cascade, and status, checking what each
//! command prints and its exit code.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS payment (order_id INTEGER PRIMARY KEY, amount INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS shipment (order_id INTEGER PRIMARY KEY);
INSERT OR IGNORE INTO account VALUES (1, 100), (2, 100);";

/// A bank: balances stay >= 0; an order ships only after it is paid.
fn bank() -> Value {
    json!({
        "tables": {
            "account": {"primary_key": ["id"]},
            "payment": {"primary_key": ["order_id"]},
            "shipment": {"primary_key": ["order_id"]}
        },
        "invariants": [
            {"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0},
            {"kind": "process_order", "first": "pay", "then": "ship", "on": [["order_id", "order_id"]]}
        ],
        "templates": [
            {"name": "withdraw", "params": ["id", "amount"],
             "steps": [{"statements": [{"sql": "UPDATE account SET balance = balance - :amount WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "balance", "kind": "decrement", "row": {"id": "id"}}]},
            {"name": "pay", "params": ["order_id", "amount"],
             "steps": [{"statements": [{"sql": "INSERT INTO payment (order_id, amount) VALUES (:order_id, :amount)"}]}],
             "writes": [{"table": "payment", "kind": "insert", "row": {"order_id": "order_id"}}]},
            {"name": "ship", "params": ["order_id"],
             "steps": [{"statements": [{"sql": "INSERT INTO shipment (order_id) VALUES (:order_id)"}]}],
             "writes": [{"table": "shipment", "kind": "insert", "row": {"order_id": "order_id"}}]}
        ]
    })
}

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

/// A key of `role` for the tenant, made through the admin API.
fn key(s: &Server, role: &str) -> String {
    let resp = ureq::post(&format!("{}/v1/keys", s.base))
        .set("Authorization", &format!("Bearer {}", s.admin))
        .send_json(json!({"role": role}))
        .unwrap();
    resp.into_json::<Value>().unwrap()["key"].as_str().unwrap().to_owned()
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `tidegate review ARGS` with the server's URL and `key` in the environment.
fn review(s: &Server, key: &str, args: &[&str]) -> Out {
    let out = Command::new(BIN)
        .arg("review")
        .args(args)
        .env("TIDEGATE_URL", &s.base)
        .env("TIDEGATE_API_KEY", key)
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// As [`review`], asserting success; returns standard output.
fn ok(s: &Server, key: &str, args: &[&str]) -> String {
    let o = review(s, key, args);
    assert_eq!(o.code, 0, "{args:?} failed: {}{}", o.stdout, o.stderr);
    o.stdout
}

/// As [`review`], asserting a non-zero exit with one line on standard error containing every
/// one of `needles`, and nothing on standard output.
fn refused(s: &Server, key: &str, args: &[&str], needles: &[&str]) -> String {
    let o = review(s, key, args);
    assert_ne!(o.code, 0, "{args:?} should fail: {}", o.stdout);
    assert_eq!(o.stdout, "", "{args:?}");
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{args:?}: one line: {:?}", o.stderr);
    for n in needles {
        assert!(o.stderr.contains(n), "{args:?}: {n:?} not in {:?}", o.stderr);
    }
    o.stderr
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

fn status_of(s: &Server, key: &str, id: &str) -> Value {
    serde_json::from_str(&ok(s, key, &["status", id, "--json"])).unwrap()
}

#[test]
fn the_review_cli_requests_queues_accepts_and_removes_with_its_cascade() {
    let s = start();
    let (agent, reviewer) = (key(&s, "agent"), key(&s, "reviewer"));
    let dir = tempfile::tempdir().unwrap();
    let set = write(dir.path(), "bank.json", &bank().to_string());
    let schema = write(dir.path(), "bank.sql", SCHEMA);

    // Templates: a reviewer may not register; the operator's first registration adds them, the
    // second changes nothing.
    refused(&s, &reviewer, &["templates", "register", &set, "--schema", &schema], &["HTTP 403", "forbidden"]);
    assert_eq!(
        ok(&s, &s.admin, &["templates", "register", &set, "--schema", &schema]),
        "registered: withdraw, pay, ship\n"
    );
    assert_eq!(ok(&s, &s.admin, &["templates", "register", &set]), "unchanged: withdraw, pay, ship\n");
    let mut changed = bank();
    changed["templates"][0]["steps"][0]["statements"][0]["sql"] =
        json!("UPDATE account SET balance = 0 WHERE id = :id");
    let changed = write(dir.path(), "changed.json", &changed.to_string());
    refused(&s, &s.admin, &["templates", "register", &changed], &["HTTP 400", "`set.templates[0]`", "unchanged"]);
    let list = ok(&s, &agent, &["templates", "list"]);
    assert!(list.starts_with("strategy buffer_suspicious, granularity field\n"), "{list}");
    let broken = write(dir.path(), "broken.json", r#"{"templates": [{"name": "x", "params": [], "steps": "no"}]}"#);
    let e = review(&s, &s.admin, &["templates", "register", &broken]);
    assert!(e.code != 0 && e.stderr.contains("broken.json"), "a bad file is refused before sending: {}", e.stderr);

    // Requests: a suspicious withdrawal, one of the same row held behind it, another row that
    // runs at once, a suspicious payment and the shipment that must follow it.
    let sus = ok(
        &s,
        &agent,
        &[
            "request",
            "--template",
            "withdraw",
            "--param",
            "id=1",
            "--param",
            "amount=70",
            "--suspicious",
            "--sender",
            "llm-7",
            "-q",
        ],
    );
    let sus = sus.trim().to_owned();
    assert!(sus.starts_with("rv_") && !sus.contains(' '), "-q prints only the id: {sus:?}");
    let held = ok(&s, &agent, &["request", "--template", "withdraw", "--params", r#"{"id": 1, "amount": 20}"#]);
    let first = held.lines().next().unwrap();
    assert!(first.ends_with("  held"), "{held}");
    assert!(held.contains(&format!("waits for      {sus}")), "{held}");
    assert!(held.contains("sql            UPDATE account SET balance = balance - :amount WHERE id = :id"), "{held}");
    let held = first.split_whitespace().next().unwrap().to_owned();
    let plain = ok(&s, &agent, &["request", "--template", "withdraw", "--param", "id=2", "--param", "amount=5"]);
    assert!(plain.lines().next().unwrap().ends_with("  committed"), "another row does not wait: {plain}");
    let pay: Value = serde_json::from_str(&ok(
        &s,
        &agent,
        &["request", "--template", "pay", "--param", "order_id=9", "--param", "amount=5", "--suspicious", "--json"],
    ))
    .unwrap();
    assert_eq!(pay["status"], "awaiting_review", "{pay}");
    assert!(pay["sender"].as_str().unwrap().starts_with("key_"), "the sender defaults to the key: {pay}");
    let pay = pay["id"].as_str().unwrap().to_owned();
    let ship = ok(&s, &agent, &["request", "--template", "ship", "--param", "order_id=9", "-q"]).trim().to_owned();
    assert_eq!(status_of(&s, &agent, &ship)["status"], "held");

    // Bad input: the server's problem as one line naming the field; a local mistake before
    // anything is sent.
    refused(
        &s,
        &agent,
        &["request", "--template", "withdraw", "--param", "id=1"],
        &["HTTP 400", "invalid_field", "params.amount"],
    );
    refused(
        &s,
        &agent,
        &["request", "--template", "withdrew", "--param", "id=1"],
        &["HTTP 400", "`template`", "withdrew"],
    );
    let o = review(&s, &agent, &["request", "--template", "withdraw", "--param", "amount"]);
    assert!(o.code != 0 && o.stderr.contains("`amount` has no `=`"), "{}", o.stderr);
    refused(
        &s,
        &agent,
        &["request", "--template", "withdraw", "--param", "id=1", "--params", r#"{"id": 3}"#],
        &["--param `id`", "more than once"],
    );

    // The queue: four not final, two of them awaiting review.
    let q = ok(&s, &reviewer, &["queue"]);
    let lines: Vec<&str> = q.lines().collect();
    assert_eq!(lines[0], "4 in the buffer, 2 awaiting review", "{q}");
    assert_eq!(lines.len(), 5, "{q}");
    assert!(lines[1].starts_with(&format!("{sus}  awaiting_review")), "oldest first: {q}");
    assert!(lines[1].contains(r#"withdraw  {"amount":70,"id":1}  from llm-7"#), "{q}");
    assert!(lines[1].contains(&format!("[waited by {held}]")), "{q}");
    let qj: Value = serde_json::from_str(&ok(&s, &reviewer, &["queue", "--json"])).unwrap();
    assert_eq!((qj["total"].as_u64(), qj["reviewable"].as_u64()), (Some(4), Some(2)));

    // Accept: agents may not; a reviewer's acceptance releases the held withdrawal.
    refused(&s, &agent, &["accept", &sus], &["HTTP 403", "forbidden"]);
    assert_eq!(ok(&s, &reviewer, &["accept", &sus]), format!("accepted {sus}: now committed\n"));
    assert_eq!(status_of(&s, &agent, &held)["status"], "committed", "released by the acceptance");
    refused(&s, &reviewer, &["accept", &sus], &["HTTP 409", "not_reviewable", &sus, "already final"]);

    // Remove: refused without --yes, naming the cascade and changing nothing; then done.
    let e = refused(&s, &reviewer, &["remove", &pay], &["--yes", &ship]);
    assert!(e.contains("would also remove 1"), "{e}");
    assert_eq!(status_of(&s, &reviewer, &pay)["status"], "awaiting_review", "nothing removed without --yes");
    let shown = ok(&s, &reviewer, &["status", &pay]);
    assert!(shown.contains(&format!("removal takes  {ship}")), "{shown}");
    assert!(shown.lines().next().unwrap().ends_with("(suspicious, reviewable)"), "{shown}");
    assert_eq!(
        ok(&s, &reviewer, &["remove", &pay, "--yes"]),
        format!("removed {pay}: now removed; cascaded to 1 ({ship})\n")
    );
    let sh = status_of(&s, &reviewer, &ship);
    assert_eq!((sh["status"].as_str(), sh["cascaded_from"].as_str()), (Some("removed"), Some(pay.as_str())));
    refused(&s, &reviewer, &["remove", &pay, "--yes"], &["HTTP 409", "not_reviewable"]);
    let q = ok(&s, &reviewer, &["queue"]);
    assert_eq!(q, "0 in the buffer, 0 awaiting review\n");

    // Status of what does not exist, and connection settings.
    refused(&s, &reviewer, &["status", "rv_zz_99"], &["HTTP 404", "not_found", "rv_zz_99"]);
    refused(&s, &reviewer, &["status", "../keys"], &["invalid id"]);
    refused(&s, "not-a-key", &["queue"], &["HTTP 401"]);
    let o = Command::new(BIN)
        .args(["review", "queue", "--url", &s.base, "--api-key", &reviewer])
        .env_remove("TIDEGATE_URL")
        .env_remove("TIDEGATE_API_KEY")
        .output()
        .unwrap();
    assert!(o.status.success(), "flags instead of the environment: {}", String::from_utf8_lossy(&o.stderr));
    let o =
        Command::new(BIN).args(["review", "queue", "--url", &s.base]).env_remove("TIDEGATE_API_KEY").output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("TIDEGATE_API_KEY"));
    refused(
        &s,
        &reviewer,
        &["queue", "--url", "http://127.0.0.1:1"],
        &["cannot reach the server at http://127.0.0.1:1"],
    );
}
