//! The real `tidegate serve` with a PostgreSQL review tenant (issue 27 item 7): SIGTERM exits
//! 0, and the restarted server has every review transaction as it was, with the rows in
//! PostgreSQL. The superuser at `TIDEGATE_PG_URL` (default
//! postgres://postgres@127.0.0.1:5432/test) only sets up a database and an admin role of the
//! test's own and reads the rows back; skipped with a message when no server answers.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tidegate_review::value::SqlValue;
use tidegate_review::{Database, PgDatabase};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

fn super_url() -> String {
    std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database and an admin role (CREATEROLE, owner of the database) of the test's own, dropped
/// with the tenant roles granted on it when the value is dropped.
struct Scene {
    database: String,
    admin: String,
    host_port: String,
}

impl Scene {
    fn new() -> Option<Scene> {
        let mut su = match PgDatabase::connect(&super_url(), None) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("SKIPPED: no PostgreSQL at {} ({e}); set TIDEGATE_PG_URL to run this test", super_url());
                return None;
            }
        };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let unique = format!("{}_{}", std::process::id(), nanos % 1_000_000_000_000);
        let (database, admin) = (format!("tg_cli_{unique}"), format!("tg_cli_admin_{unique}"));
        su.batch(&format!("CREATE ROLE {admin} LOGIN CREATEROLE")).unwrap();
        su.batch(&format!("CREATE DATABASE {database} OWNER {admin}")).unwrap();
        let host_port = super_url().split_once('@').unwrap().1.split('/').next().unwrap().to_owned();
        Some(Scene { database, admin, host_port })
    }

    fn admin_url(&self) -> String {
        format!("postgres://{}@{}/{}", self.admin, self.host_port, self.database)
    }

    fn superuser(&self) -> PgDatabase {
        let user = super_url().split_once('@').unwrap().0.to_owned();
        PgDatabase::connect(&format!("{user}@{}/{}", self.host_port, self.database), None).unwrap()
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let Ok(mut su) = PgDatabase::connect(&super_url(), None) else { return };
        let roles = su
            .query(
                &format!(
                    "SELECT r.rolname::text AS r FROM pg_database d, aclexplode(d.datacl) a \
                     JOIN pg_roles r ON r.oid = a.grantee WHERE d.datname = '{}' AND r.rolname LIKE 'tgr\\_%'",
                    self.database
                ),
                &[],
            )
            .unwrap_or_default();
        let _ = su.batch(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database));
        for r in roles {
            if let SqlValue::Text(r) = &r[0].1 {
                let _ = su.batch(&format!("DROP ROLE IF EXISTS {r}"));
            }
        }
        let _ = su.batch(&format!("DROP ROLE IF EXISTS {}", self.admin));
    }
}

fn cli(args: &[&str], dir: &std::path::Path) -> String {
    let out = Command::new(BIN).args(args).arg("--data-dir").arg(dir).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

struct Server {
    child: Child,
    base: String,
}

fn start(dir: &std::path::Path, review_db: &str) -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .env("TIDEGATE_REVIEW_DATABASE", review_db)
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
    for _ in 0..400 {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("the server did not stop within 20 s of SIGTERM");
}

/// Issue 27 item 7: every server with a PostgreSQL review tenant exited 101 on SIGTERM
/// ("Cannot start a runtime from within a runtime"). Twice: after the first requests, and
/// after a restart that only read (a reopened tenant closed with no new event failed its
/// close).
#[test]
fn sigterm_with_a_postgres_review_tenant_exits_zero_and_loses_nothing() {
    let Some(scene) = Scene::new() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cli(&["tenant", "create", "acme"], d);
    let key = |role: &str| cli(&["key", "create", "--tenant", "acme", "--role", role], d).trim().to_owned();
    let (operator, agent, reviewer) = (key("operator"), key("agent"), key("reviewer"));
    let set = json!({
        "tables": {"account": {"primary_key": ["id"]}},
        "invariants": [{"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0}],
        "templates": [{"name": "withdraw", "params": ["id", "amount"],
            "steps": [{"statements": [{"sql": "UPDATE account SET balance = balance - :amount WHERE id = :id"}]}],
            "writes": [{"table": "account", "column": "balance", "kind": "decrement", "row": {"id": "id"}}]}]
    });
    let schema =
        "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL CHECK (balance >= 0));
        INSERT INTO account VALUES (1, 100), (2, 100) ON CONFLICT DO NOTHING;";

    let mut s = start(d, &scene.admin_url());
    let (st, b) = call(&s.base, &operator, "POST", "/v1/review/templates", Some(json!({"set": set, "schema": schema})));
    assert_eq!(st, 201, "{b}");
    let mut ids = Vec::new();
    for (id, amount, suspicious) in [(1, 30, true), (1, 20, false), (2, 5, false), (2, 7, true)] {
        let body = json!({"template": "withdraw", "params": {"id": id, "amount": amount}, "suspicious": suspicious});
        let (st, b) = call(&s.base, &agent, "POST", "/v1/review/transactions", Some(body));
        assert_eq!(st, 201, "{b}");
        ids.push(b["id"].as_str().unwrap().to_owned());
    }
    let (st, b) = call(&s.base, &reviewer, "POST", &format!("/v1/review/transactions/{}/accept", ids[0]), None);
    assert_eq!((st, b["transaction"]["status"].as_str()), (200, Some("committed")), "{b}");
    let views: Vec<Value> =
        ids.iter().map(|id| call(&s.base, &agent, "GET", &format!("/v1/review/transactions/{id}"), None).1).collect();
    assert_eq!(views[1]["status"], "committed", "released by the acceptance: {}", views[1]);
    assert_eq!(views[3]["status"], "awaiting_review");
    let status = sigterm(&mut s.child);
    assert!(status.success(), "SIGTERM exits 0: {status:?}");

    for round in 0..2 {
        let mut s = start(d, &scene.admin_url());
        for (id, before) in ids.iter().zip(&views) {
            let (st, now) = call(&s.base, &agent, "GET", &format!("/v1/review/transactions/{id}"), None);
            assert_eq!((st, &now), (200, before), "round {round}: {id} after the restart");
        }
        let status = sigterm(&mut s.child);
        assert!(status.success(), "round {round}: SIGTERM after a restart exits 0: {status:?}");
    }
    let out = Command::new(BIN).args(["ledger", "verify", "--data-dir"]).arg(d.join("tenants/acme")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let schema = tidegate_server::config::ReviewSection::default().pg_schema("acme").unwrap();
    let rows = scene.superuser().query(&format!("SELECT id, balance FROM {schema}.account ORDER BY id"), &[]).unwrap();
    let got: Vec<(SqlValue, SqlValue)> = rows.into_iter().map(|r| (r[0].1.clone(), r[1].1.clone())).collect();
    // Account 1: the accepted withdrawal and the one held behind it; account 2: the plain one
    // (the suspicious one still awaits review).
    assert_eq!(got, vec![(SqlValue::Int(1), SqlValue::Int(50)), (SqlValue::Int(2), SqlValue::Int(95))]);
}
