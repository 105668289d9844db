//! The review middleware over HTTP (`/v1/review`) and its decision log in the tenant's ledger:
//! roles, problem documents, the queue, cascades, and a restart that rebuilds the manager from
//! the ledger without executing anything again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tidegate_review::value::{Dialect, Row, SqlValue};
use tidegate_review::{Database, Decision, Manager, Options, Request, SqliteDatabase, Status, TemplateSet};
use tidegate_service::review::{LedgerLog, STREAM};

use crate::common::Harness;
use crate::review_security::PgScene;

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

fn quick(c: &mut tidegate_server::config::Config) {
    c.server.shutdown_drain_ms = 300;
}

async fn request(h: &Harness, key: &str, template: &str, params: Value, suspicious: bool) -> Value {
    let r = h
        .req(
            "POST",
            "/v1/review/transactions",
            Some(key),
            Some(json!({"template": template, "params": params, "sender": "llm-7", "suspicious": suspicious})),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body
}

fn account(dir: &std::path::Path, id: i64) -> i64 {
    let c = rusqlite::Connection::open(dir.join("tenants/acme/review.db")).unwrap();
    c.query_row("SELECT balance FROM account WHERE id = ?1", [id], |r| r.get(0)).unwrap()
}

fn count(dir: &std::path::Path, table: &str) -> i64 {
    let c = rusqlite::Connection::open(dir.join("tenants/acme/review.db")).unwrap();
    c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_over_http_survives_a_restart_and_removal_names_its_cascade() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (_, k) = h.tenant("acme");
    let body = json!({"set": bank(), "schema": SCHEMA});
    let r = h.req("POST", "/v1/review/templates", Some(&k.reviewer), Some(body.clone())).await;
    assert_eq!((r.status, r.body["code"].as_str()), (403, Some("forbidden")), "reviewers do not register: {r:?}");
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(body.clone())).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body["templates"], json!(["withdraw", "pay", "ship"]));
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": bank()}))).await;
    assert_eq!((r.status, r.body["added"].as_bool()), (200, Some(false)), "{r:?}");

    let sus = request(&h, &k.agent, "withdraw", json!({"id": 1, "amount": 70}), true).await;
    assert_eq!(sus["status"], "awaiting_review");
    let s_id = sus["id"].as_str().unwrap().to_owned();
    let held = request(&h, &k.agent, "withdraw", json!({"id": 1, "amount": 20}), false).await;
    assert_eq!((held["status"].as_str(), &held["waits_for"]), (Some("held"), &json!([s_id])));
    let plain = request(&h, &k.agent, "withdraw", json!({"id": 2, "amount": 5}), false).await;
    assert_eq!(plain["status"], "committed", "another row does not wait");
    let pay = request(&h, &k.agent, "pay", json!({"order_id": 9, "amount": 5}), true).await;
    let p_id = pay["id"].as_str().unwrap().to_owned();
    let ship = request(&h, &k.agent, "ship", json!({"order_id": 9}), false).await;
    let ship_id = ship["id"].as_str().unwrap().to_owned();
    assert_eq!(ship["status"], "held");

    let r = h.req("GET", "/v1/review/queue", Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["total"].as_u64(), r.body["reviewable"].as_u64()), (200, Some(4), Some(2)), "{r:?}");
    let q = r.body["data"].as_array().unwrap();
    assert_eq!(q[0]["sql"], json!(["UPDATE account SET balance = balance - :amount WHERE id = :id"]));
    assert_eq!((q[0]["sender"].as_str(), &q[0]["params"]), (Some("llm-7"), &json!({"id": 1, "amount": 70})));
    assert_eq!(q[0]["waited_by"], json!([held["id"]]));
    let p = q.iter().find(|t| t["id"] == p_id.as_str()).unwrap();
    assert_eq!(p["removal_cascade"], json!([ship_id]), "removing the payment would take the shipment");

    let r = h.req("POST", &format!("/v1/review/transactions/{s_id}/accept"), Some(&k.agent), None).await;
    assert_eq!(r.status, 403, "agents do not review: {r:?}");
    let r = h.req("POST", &format!("/v1/review/transactions/{s_id}/accept"), Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["transaction"]["status"].as_str()), (200, Some("committed")), "{r:?}");
    let r = h.req("POST", &format!("/v1/review/transactions/{s_id}/remove"), Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("not_reviewable")), "{r:?}");
    assert!(
        r.body["detail"].as_str().unwrap().contains(&format!("transaction {s_id} ")),
        "names the id as given: {r:?}"
    );
    let r =
        h.req("GET", &format!("/v1/review/transactions/{}", held["id"].as_str().unwrap()), Some(&k.agent), None).await;
    assert_eq!(r.body["status"], "committed", "released when what it waited for was accepted: {r:?}");
    let dir = h.stop().await.unwrap();
    assert_eq!(account(dir.path(), 1), 10);
    let rows_before = (account(dir.path(), 1), account(dir.path(), 2), count(dir.path(), "payment"));

    // Restart: the manager comes back from the ledger; nothing runs twice.
    let h = Harness::durable(dir, quick).await;
    let r = h.req("GET", &format!("/v1/review/transactions/{ship_id}"), Some(&k.reviewer), None).await;
    assert_eq!((r.body["status"].as_str(), &r.body["waits_for"]), (Some("held"), &json!([p_id])), "{r:?}");
    let r = h.req("GET", "/v1/review/queue", Some(&k.reviewer), None).await;
    assert_eq!(r.body["total"], 2, "{r:?}");
    let r = h.req("POST", &format!("/v1/review/transactions/{p_id}/remove"), Some(&k.reviewer), None).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!((r.body["transaction"]["status"].as_str(), &r.body["cascaded"]), (Some("removed"), &json!([ship_id])));
    let r = h.req("GET", &format!("/v1/review/transactions/{ship_id}"), Some(&k.agent), None).await;
    assert_eq!((r.body["status"].as_str(), r.body["cascaded_from"].as_str()), (Some("removed"), Some(p_id.as_str())));
    let r = h.req("GET", "/v1/ledger/events", Some(&k.reviewer), None).await;
    let ext = r.body["data"].as_array().unwrap().iter().filter(|e| e["event"] == "extension").count();
    assert!(ext >= 8, "the decision log is in the ledger: {ext} extension records");
    let dir = h.stop().await.unwrap();
    assert_eq!((account(dir.path(), 1), account(dir.path(), 2), count(dir.path(), "payment")), rows_before);
    assert_eq!(count(dir.path(), "shipment"), 0, "the removed payment's shipment never ran");
    let store = tidegate_sqlite::SqliteStore::open(dir.path().join("tenants/acme")).unwrap();
    assert!(store.verify().unwrap().rows > 0, "the ledger verifies clean");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_review_requests_are_problems_naming_the_field() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let r =
        h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": bank(), "schema": SCHEMA}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let cases = [
        (json!({"template": "withdraw", "params": {"id": 1}}), "params.amount", "missing"),
        (json!({"template": "withdrew", "params": {}}), "template", "withdrew"),
        (json!({"template": "withdraw", "params": [1]}), "params", "[1]"),
        (
            json!({"template": "withdraw", "params": {"id": 1, "amount": 1}, "sender": "x".repeat(201)}),
            "sender",
            "xxxx",
        ),
    ];
    for (body, field, value) in cases {
        let r = h.req("POST", "/v1/review/transactions", Some(&k.agent), Some(body.clone())).await;
        assert_eq!((r.status, r.body["field"].as_str()), (400, Some(field)), "{body}: {r:?}");
        assert!(r.body["value"].as_str().unwrap().contains(value), "{body}: {r:?}");
        assert!(r.content_type().starts_with("application/problem+json"), "{r:?}");
    }
    let mut bad = bank();
    bad["templates"][0]["steps"][0]["statements"][0]["sql"] =
        json!("UPDATE account SET balance = :amout WHERE id = :id");
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": bad.clone()}))).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("set.templates[0]")), "a changed definition: {r:?}");
    assert!(r.body["expected"].as_str().unwrap().contains("unchanged"), "{r:?}");
    bad["templates"][0]["name"] = json!("withdraw2");
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": bad}))).await;
    assert_eq!(
        (r.status, r.body["field"].as_str()),
        (400, Some("set.templates[\"withdraw2\"].steps[0].statements[0].sql")),
        "{r:?}"
    );
    assert!(r.body["value"].as_str().unwrap().contains(":amout"), "{r:?}");
    let mut bad = bank();
    bad["templates"][0]["writes"][0]["kind"] = json!("explode");
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": bad}))).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("set.templates[0].writes[0].kind")), "{r:?}");
    let r = h.req("GET", "/v1/review/transactions/rv_nope_1", Some(&k.agent), None).await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = h
        .req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": {}, "schema": "CREATE TABLE ("})))
        .await;
    assert_eq!((r.status, r.body["code"].as_str()), (422, Some("database_refused")), "{r:?}");
    h.stop().await;
}

/// A database that counts the statements run through it.
struct Counting {
    inner: SqliteDatabase,
    statements: Arc<AtomicUsize>,
}

impl Database for Counting {
    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }
    fn batch(&mut self, sql: &str) -> tidegate_review::Result<()> {
        self.inner.batch(sql)
    }
    fn begin(&mut self) -> tidegate_review::Result<()> {
        self.statements.fetch_add(1, Ordering::SeqCst);
        self.inner.begin()
    }
    fn commit(&mut self) -> tidegate_review::Result<()> {
        self.inner.commit()
    }
    fn rollback(&mut self) -> tidegate_review::Result<()> {
        self.inner.rollback()
    }
    fn query(&mut self, sql: &str, params: &[SqlValue]) -> tidegate_review::Result<Vec<Row>> {
        self.inner.query(sql, params)
    }
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> tidegate_review::Result<u64> {
        self.statements.fetch_add(1, Ordering::SeqCst);
        self.inner.execute(sql, params)
    }
}

/// Step 1 of the design: the manager's decision log in a Tidegate ledger. The engine is
/// dropped without closing (a kill), reopened on the same ledger directory, and the manager
/// rebuilt from it has the same buffer, graph and statuses, and runs no SQL while rebuilding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_over_a_ledger_log_is_rebuilt_after_a_kill_without_running_sql() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    tokio::task::spawn_blocking(move || {
        let open = |statements: &Arc<AtomicUsize>| {
            let store = Arc::new(tidegate_sqlite::SqliteStore::open(root.join("ledger")).unwrap());
            let engine = tidegate_runtime::Tidegate::builder().store(store).build().unwrap();
            let db = Counting {
                inner: SqliteDatabase::open(&root.join("bank.db")).unwrap(),
                statements: statements.clone(),
            };
            let m = Manager::open(
                TemplateSet::default(),
                Box::new(db),
                Box::new(LedgerLog::new(engine.clone(), STREAM)),
                Options::default(),
            )
            .unwrap();
            (engine, m)
        };
        let before = Arc::new(AtomicUsize::new(0));
        let (engine, mut m) = open(&before);
        let set: TemplateSet = serde_json::from_value(bank()).unwrap();
        m.register(set, Some(SCHEMA.into())).unwrap();
        let req = |t: &str, params: Value, suspicious: bool| Request {
            template: t.into(),
            params,
            sender: "llm".into(),
            suspicious,
        };
        let a = m.request(req("withdraw", json!({"id": 1, "amount": 30}), true)).unwrap();
        let b = m.request(req("withdraw", json!({"id": 1, "amount": 30}), false)).unwrap();
        let c = m.request(req("pay", json!({"order_id": 1, "amount": 3}), true)).unwrap();
        let d = m.request(req("ship", json!({"order_id": 1}), false)).unwrap();
        let e = m.request(req("withdraw", json!({"id": 2, "amount": 1}), true)).unwrap();
        m.review(e, Decision::Accept, "rita").unwrap();
        let ran = before.load(Ordering::SeqCst);
        assert!(ran > 0);
        let views: Vec<_> = [a, b, c, d, e].iter().map(|id| m.status(*id).unwrap()).collect();
        assert_eq!(views[1].status, Status::Held);
        assert_eq!(views[4].status, Status::Committed);
        let records = engine.extension_records(STREAM).unwrap().len();
        assert!(records >= 8, "{records} records in the ledger");
        // A kill: nothing is closed or flushed beyond what each durable append did.
        drop(m);
        drop(engine);

        let after = Arc::new(AtomicUsize::new(0));
        let (engine, mut m) = open(&after);
        assert_eq!(after.load(Ordering::SeqCst), 0, "rebuilding ran no SQL");
        let again: Vec<_> = [a, b, c, d, e].iter().map(|id| m.status(*id).unwrap()).collect();
        assert_eq!(again, views, "the same buffer, graph and statuses");
        assert_eq!(m.queue().len(), 4);
        m.check_integrity().unwrap();
        assert_eq!(engine.extension_records(STREAM).unwrap().len(), records, "a rebuild appends nothing");
        m.review(c, Decision::Remove, "rita").unwrap();
        assert_eq!(m.cascaded(c), vec![d]);
        m.review(a, Decision::Accept, "rita").unwrap();
        assert_eq!(m.status(b).unwrap().status, Status::Committed);
        let rows = m.database().query("SELECT balance FROM account WHERE id = 1", &[]).unwrap();
        assert_eq!(rows[0][0].1, SqlValue::Int(40), "each withdrawal ran exactly once");
        engine.check_integrity().unwrap();
    })
    .await
    .unwrap();
}

/// Runs `f` on a superuser's connection to `scene`'s database whose `search_path` is `schema`,
/// off the async runtime (the blocking client runs its own).
async fn on_pg<R: Send + 'static>(
    scene: &PgScene,
    schema: &str,
    f: impl FnOnce(&mut tidegate_review::PgDatabase) -> R + Send + 'static,
) -> Result<R, String> {
    let (url, schema) = (scene.superuser_url(), schema.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut db = tidegate_review::PgDatabase::connect(&url, Some(&schema)).map_err(|e| e.to_string())?;
        Ok(f(&mut db))
    })
    .await
    .unwrap()
}

const PG_SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS payment (order_id BIGINT PRIMARY KEY, amount BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS shipment (order_id BIGINT PRIMARY KEY);
INSERT INTO account VALUES (1, 100), (2, 100) ON CONFLICT DO NOTHING;";

/// The endpoints on PostgreSQL (a database and an admin role of this run's own, made by the
/// superuser at `$TIDEGATE_PG_URL`, default postgres://postgres@127.0.0.1:5432/test; each
/// tenant runs as its own role in its own schema): a held request released by an acceptance,
/// and a removal that cascades to the shipment built on the payment; the rows are read back
/// from PostgreSQL. Skipped with a message when no server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_over_http_on_postgres_accepts_and_removes_with_its_cascade() {
    let Some(scene) = PgScene::new("http").await else { return };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let schema = format!("tg_review_http_{}_{nanos}", std::process::id());
    let own = schema.clone();
    let admin_url = scene.admin_url();
    let h = Harness::memory(move |c| {
        c.review.database = admin_url.clone();
        c.review.tenants.insert(
            "acme".into(),
            tidegate_server::config::ReviewTenant { database: admin_url, schema: Some(own), ..Default::default() },
        );
    })
    .await;
    let (_, k) = h.tenant("acme");
    let r = h
        .req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": bank(), "schema": PG_SCHEMA})))
        .await;
    assert_eq!(r.status, 201, "{r:?}");

    let sus = request(&h, &k.agent, "withdraw", json!({"id": 1, "amount": 70}), true).await;
    let s_id = sus["id"].as_str().unwrap().to_owned();
    let held = request(&h, &k.agent, "withdraw", json!({"id": 1, "amount": 20}), false).await;
    assert_eq!((held["status"].as_str(), &held["waits_for"]), (Some("held"), &json!([s_id])));
    let pay = request(&h, &k.agent, "pay", json!({"order_id": 9, "amount": 5}), true).await;
    let p_id = pay["id"].as_str().unwrap().to_owned();
    let ship = request(&h, &k.agent, "ship", json!({"order_id": 9}), false).await;
    assert_eq!((ship["status"].as_str(), &ship["waits_for"]), (Some("held"), &json!([p_id])));
    let bad = h
        .req(
            "POST",
            "/v1/review/transactions",
            Some(&k.agent),
            Some(json!({"template": "withdraw", "params": {"id": 1}})),
        )
        .await;
    assert_eq!((bad.status, bad.body["field"].as_str()), (400, Some("params.amount")), "{bad:?}");

    let r = h.req("POST", &format!("/v1/review/transactions/{s_id}/accept"), Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["transaction"]["status"].as_str()), (200, Some("committed")), "{r:?}");
    let r =
        h.req("GET", &format!("/v1/review/transactions/{}", held["id"].as_str().unwrap()), Some(&k.agent), None).await;
    assert_eq!(r.body["status"], "committed", "released by the acceptance: {r:?}");
    let r = h.req("POST", &format!("/v1/review/transactions/{p_id}/remove"), Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["transaction"]["status"].as_str()), (200, Some("removed")), "{r:?}");
    assert_eq!(r.body["cascaded"], json!([ship["id"]]), "{r:?}");
    let r = h.req("GET", "/v1/review/queue", Some(&k.reviewer), None).await;
    assert_eq!(r.body["total"], 0, "{r:?}");

    // A second tenant on the same database, with no schema configured, gets a schema of its
    // own (derived from its name): its tables are not the first tenant's.
    let beta = format!("beta-{}", nanos % 1_000_000_000);
    let (_, kb) = h.tenant(&beta);
    let r = h
        .req("POST", "/v1/review/templates", Some(&kb.operator), Some(json!({"set": bank(), "schema": PG_SCHEMA})))
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let w = request(&h, &kb.agent, "withdraw", json!({"id": 1, "amount": 1}), false).await;
    assert_eq!(w["status"], "committed", "{w:?}");
    h.stop().await;
    let beta_schema = tidegate_server::config::ReviewSection::default().pg_schema(&beta).unwrap();
    assert_ne!(beta_schema, schema);
    let beta_balance = on_pg(&scene, &beta_schema, |db| {
        db.query("SELECT balance FROM account WHERE id = 1", &[]).unwrap()[0][0].1.clone()
    })
    .await
    .unwrap();
    let drop_beta = beta_schema.clone();
    on_pg(&scene, &beta_schema, move |db| db.drop_schema(&drop_beta).unwrap()).await.unwrap();
    assert_eq!(beta_balance, SqlValue::Int(99), "the second tenant's withdrawal ran on its own table");

    let (balance, payments, shipments, markers) = on_pg(&scene, &schema, |db| {
        let one = |db: &mut tidegate_review::PgDatabase, sql: &str| db.query(sql, &[]).unwrap()[0][0].1.clone();
        (
            one(db, "SELECT balance FROM account WHERE id = 1"),
            one(db, "SELECT COUNT(*) FROM payment"),
            one(db, "SELECT COUNT(*) FROM shipment"),
            one(db, "SELECT COUNT(*) FROM tidegate_review_applied"),
        )
    })
    .await
    .unwrap();
    let drop_schema = schema.clone();
    on_pg(&scene, &schema, move |db| db.drop_schema(&drop_schema).unwrap()).await.unwrap();
    scene.drop_all().await;
    assert_eq!(balance, SqlValue::Int(10), "both withdrawals ran exactly once");
    assert_eq!(
        (payments, shipments),
        (SqlValue::Int(0), SqlValue::Int(0)),
        "the removed payment and its shipment never ran"
    );
    assert!(matches!(markers, SqlValue::Int(n) if n >= 2), "the marker table is in this run's schema: {markers:?}");
}
