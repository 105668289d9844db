//! The removal promise over HTTP (issue 27 items 1–6, docs/review.md "Dependency rules that
//! keep a removal traceless"): an accepted removal can always be carried out, leaves no trace,
//! and loses no other transaction's effect. Each test runs its scenario on the embedded SQLite
//! database and on PostgreSQL (a database and a CREATEROLE admin role of the test's own, made
//! by the superuser at `TIDEGATE_PG_URL`; the PostgreSQL half is skipped with a message when
//! no server answers), for each strategy and granularity the item names.

use serde_json::{Value, json};
use tidegate_review::value::SqlValue;
use tidegate_review::{Granularity, PgDatabase, Strategy};
use tidegate_server::config::{ReviewSection, ReviewTenant};

use crate::common::{Harness, Keys};
use crate::review_security::PgScene;

/// A bank with loyalty points, a transfer log referencing accounts, and loans repaid only
/// after they are opened.
fn world() -> Value {
    json!({
        "tables": {
            "account": {"primary_key": ["id"]},
            "transfer_log": {"primary_key": ["seq"]},
            "loan": {"primary_key": ["id"]}
        },
        "invariants": [
            {"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0},
            {"kind": "check", "table": "loan", "column": "amount", "op": ">=", "value": 0},
            {"kind": "foreign_key", "table": "transfer_log", "column": "to_id", "parent_table": "account", "parent_column": "id"},
            {"kind": "process_order", "first": "open_loan", "then": "repay_loan", "on": [["id", "id"]]}
        ],
        "templates": [
            {"name": "open_account", "params": ["id"], "types": {"id": "integer"},
             "steps": [{"statements": [{"sql": "INSERT INTO account (id, balance, points) VALUES (:id, 0, 0)"}]}],
             "writes": [{"table": "account", "kind": "insert", "row": {"id": "id"}}]},
            {"name": "close_account", "params": ["id"],
             "steps": [{"statements": [{"sql": "DELETE FROM account WHERE id = :id"}]}],
             "writes": [{"table": "account", "kind": "delete", "row": {"id": "id"}}]},
            {"name": "deposit", "params": ["id", "amount"], "types": {"amount": "integer"},
             "steps": [{"statements": [
                {"sql": "SELECT id AS found FROM account WHERE id = :id", "bind": true},
                {"sql": "UPDATE account SET balance = balance + :amount WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "balance", "kind": "increment", "row": {"id": "id"}}]},
            {"name": "withdraw", "params": ["id", "amount"], "types": {"amount": "integer"},
             "steps": [{"statements": [
                {"sql": "SELECT id AS found FROM account WHERE id = :id", "bind": true},
                {"sql": "UPDATE account SET balance = balance - :amount WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "balance", "kind": "decrement", "row": {"id": "id"}}]},
            {"name": "set_balance", "params": ["id", "balance"], "types": {"id": "integer", "balance": "integer"},
             "steps": [{"statements": [{"sql": "UPDATE account SET balance = :balance WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "balance", "kind": "set", "row": {"id": "id"}}]},
            {"name": "earn_points", "params": ["id", "points"],
             "steps": [{"statements": [{"sql": "UPDATE account SET points = points + :points WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "points", "kind": "increment", "row": {"id": "id"}}]},
            {"name": "expire_points", "params": ["id"],
             "steps": [{"statements": [{"sql": "UPDATE account SET points = 0 WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "points", "kind": "set", "row": {"id": "id"}}]},
            {"name": "transfer", "params": ["from", "to", "amount"],
             "steps": [{"statements": [
                {"sql": "SELECT id AS dest FROM account WHERE id = :to", "bind": true},
                {"sql": "UPDATE account SET balance = balance - :amount WHERE id = :from"},
                {"sql": "UPDATE account SET balance = balance + :amount WHERE id = :to"},
                {"sql": "INSERT INTO transfer_log (from_id, to_id, amount) VALUES (:from, :to, :amount)"}]}],
             "writes": [
                {"table": "account", "column": "balance", "kind": "decrement", "row": {"id": "from"}},
                {"table": "account", "column": "balance", "kind": "increment", "row": {"id": "to"}},
                {"table": "transfer_log", "kind": "insert", "row": {"to_id": "to", "from_id": "from"}}]},
            {"name": "open_loan", "params": ["id"],
             "steps": [{"statements": [{"sql": "INSERT INTO loan (id, amount) VALUES (:id, 100)"}]}],
             "writes": [{"table": "loan", "kind": "insert", "row": {"id": "id"}}]},
            {"name": "repay_loan", "params": ["id", "amount"],
             "steps": [{"statements": [
                {"sql": "SELECT id AS found FROM loan WHERE id = :id", "bind": true},
                {"sql": "UPDATE loan SET amount = amount - :amount WHERE id = :id"}]}],
             "writes": [{"table": "loan", "column": "amount", "kind": "decrement", "row": {"id": "id"}}]}
        ]
    })
}

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, \
    balance INTEGER NOT NULL CHECK (balance >= 0), points INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS transfer_log (seq INTEGER PRIMARY KEY, from_id INTEGER NOT NULL, \
    to_id INTEGER NOT NULL REFERENCES account (id), amount INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS loan (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL CHECK (amount >= 0));
INSERT OR IGNORE INTO account VALUES (1, 500, 0), (2, 500, 0), (3, 0, 0), (4, 0, 0);";

const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, \
    balance BIGINT NOT NULL CHECK (balance >= 0), points BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS transfer_log (seq BIGSERIAL PRIMARY KEY, from_id BIGINT NOT NULL, \
    to_id BIGINT NOT NULL REFERENCES account (id), amount BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS loan (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL CHECK (amount >= 0));
INSERT INTO account VALUES (1, 500, 0), (2, 500, 0), (3, 0, 0), (4, 0, 0) ON CONFLICT DO NOTHING;";

/// One server with a tenant per (strategy, granularity), on SQLite files or on PostgreSQL.
struct Scene {
    h: Harness,
    pg: Option<PgScene>,
    tenants: Vec<(String, Keys, Strategy, Granularity)>,
}

const SQLITE: bool = false;
const POSTGRES: bool = true;

impl Scene {
    /// `None` when PostgreSQL is asked for and none answers (with a message).
    async fn new(postgres: bool, tag: &str, cases: &[(Strategy, Granularity)]) -> Option<Scene> {
        let pg = if postgres { Some(PgScene::new(tag).await?) } else { None };
        let admin = pg.as_ref().map(|p| p.admin_url());
        let names: Vec<String> = (0..cases.len()).map(|i| format!("{tag}-{i}")).collect();
        let spec: Vec<(String, Strategy, Granularity)> =
            names.iter().zip(cases).map(|(n, (s, g))| (n.clone(), *s, *g)).collect();
        let adjust = move |c: &mut tidegate_server::config::Config| {
            c.server.shutdown_drain_ms = 300;
            if let Some(url) = &admin {
                c.review.database = url.clone();
            }
            for (n, s, g) in &spec {
                c.review.tenants.insert(
                    n.clone(),
                    ReviewTenant {
                        database: admin.clone().unwrap_or_default(),
                        strategy: Some(*s),
                        granularity: Some(*g),
                        schema: None,
                    },
                );
            }
        };
        let h = Harness::durable(tempfile::tempdir().unwrap(), adjust).await;
        let schema = if postgres { PG_SCHEMA } else { SQLITE_SCHEMA };
        let mut tenants = Vec::new();
        for (n, (s, g)) in names.iter().zip(cases) {
            let (_, k) = h.tenant(n);
            let r = h
                .req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": world(), "schema": schema})))
                .await;
            assert_eq!(r.status, 201, "{r:?}");
            tenants.push((n.clone(), k, *s, *g));
        }
        Some(Scene { h, pg, tenants })
    }

    /// A single number from the tenant's database (`None` when there is no row).
    async fn read(&self, tenant: &str, sql: &str) -> Option<i64> {
        let sql = sql.to_owned();
        match &self.pg {
            None => {
                let path = self.h.dir.as_ref().unwrap().path().join(format!("tenants/{tenant}/review.db"));
                let c = rusqlite::Connection::open(path).unwrap();
                c.query_row(&sql, [], |r| r.get::<_, i64>(0)).ok()
            }
            Some(p) => {
                let (url, schema) = (p.superuser_url(), ReviewSection::default().pg_schema(tenant).unwrap());
                tokio::task::spawn_blocking(move || {
                    let mut db = PgDatabase::connect(&url, Some(&schema)).unwrap();
                    let rows = tidegate_review::Database::query(&mut db, &sql, &[]).unwrap();
                    rows.first().and_then(|r| match &r[0].1 {
                        SqlValue::Int(i) => Some(*i),
                        other => other.as_i64(),
                    })
                })
                .await
                .unwrap()
            }
        }
    }

    async fn finish(self) {
        self.h.stop().await;
        if let Some(p) = self.pg {
            p.drop_all().await;
        }
    }
}

/// Requests `template` with `params`; returns the transaction's view.
async fn ask(h: &Harness, k: &Keys, template: &str, params: Value, suspicious: bool) -> Value {
    let body = json!({"template": template, "params": params, "sender": "llm-7", "suspicious": suspicious});
    let r = h.req("POST", "/v1/review/transactions", Some(&k.agent), Some(body)).await;
    assert_eq!(r.status, 201, "{template} {r:?}");
    r.body
}

/// Removes `tx`; the removal must answer `removed`. Returns the response body.
async fn remove(h: &Harness, k: &Keys, tx: &Value) -> Value {
    let id = tx["id"].as_str().unwrap();
    let r = h.req("POST", &format!("/v1/review/transactions/{id}/remove"), Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["transaction"]["status"].as_str()), (200, Some("removed")), "{r:?}");
    r.body
}

async fn status(h: &Harness, k: &Keys, tx: &Value) -> Value {
    let id = tx["id"].as_str().unwrap();
    let r = h.req("GET", &format!("/v1/review/transactions/{id}"), Some(&k.agent), None).await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

use Granularity::{Column, Field, Row, Table};
use Strategy::{BufferCompensating as Bc, BufferSuspicious as Bs};

/// Item 1: a delete of a row waits for a buffered write of that row, so removing the deposit
/// is carried out (it was `compensation_failed`: the compensation found its row gone).
async fn removal_is_refused_when_a_delete_follows_a_compensated_write(postgres: bool) {
    let Some(s) = Scene::new(postgres, "item1", &[(Bc, Field), (Bc, Row), (Bc, Column), (Bc, Table)]).await else {
        return;
    };
    for (t, k, _, g) in &s.tenants {
        let ctx = format!("{t} ({g:?}, postgres {postgres})");
        assert_eq!(ask(&s.h, k, "open_account", json!({"id": 9}), false).await["status"], "committed", "{ctx}");
        let dep = ask(&s.h, k, "deposit", json!({"id": 9, "amount": 100}), true).await;
        assert_eq!(dep["status"], "executed_awaiting_review", "{ctx}");
        let close = ask(&s.h, k, "close_account", json!({"id": 9}), false).await;
        assert_eq!((close["status"].as_str(), &close["waits_for"]), (Some("held"), &json!([dep["id"]])), "{ctx}");
        let r = remove(&s.h, k, &dep).await;
        assert_eq!(r["cascaded"], json!([]), "{ctx}");
        assert_eq!(status(&s.h, k, &close).await["status"], "committed", "{ctx}: the held delete ran");
        assert_eq!(s.read(t, "SELECT COUNT(*) FROM account WHERE id = 9").await, Some(0), "{ctx}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item1_removal_is_refused_when_a_delete_follows_a_compensated_write_sqlite() {
    removal_is_refused_when_a_delete_follows_a_compensated_write(SQLITE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item1_removal_is_refused_when_a_delete_follows_a_compensated_write_postgres() {
    removal_is_refused_when_a_delete_follows_a_compensated_write(POSTGRES).await;
}

/// Item 2: a set after a buffered increment waits for it, so removing the increment leaves
/// the set's value (it left -40: the inverse delta ran after the set).
async fn removal_leaves_a_trace_after_a_set(postgres: bool) {
    let cases = [(Bc, Field), (Bc, Row), (Bc, Column), (Bs, Field)];
    let Some(s) = Scene::new(postgres, "item2", &cases).await else { return };
    for (t, k, st, g) in &s.tenants {
        let ctx = format!("{t} ({st:?}, {g:?}, postgres {postgres})");
        let earn = ask(&s.h, k, "earn_points", json!({"id": 1, "points": 40}), true).await;
        let expire = ask(&s.h, k, "expire_points", json!({"id": 1}), false).await;
        assert_eq!((expire["status"].as_str(), &expire["waits_for"]), (Some("held"), &json!([earn["id"]])), "{ctx}");
        remove(&s.h, k, &earn).await;
        assert_eq!(status(&s.h, k, &expire).await["status"], "committed", "{ctx}");
        assert_eq!(s.read(t, "SELECT points FROM account WHERE id = 1").await, Some(0), "{ctx}: as if never earned");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item2_removal_leaves_a_trace_after_a_set_sqlite() {
    removal_leaves_a_trace_after_a_set(SQLITE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item2_removal_leaves_a_trace_after_a_set_postgres() {
    removal_leaves_a_trace_after_a_set(POSTGRES).await;
}

/// Item 3: under buffer-compensating a transaction held behind an executed one's compensation
/// never saw its effect: removing the closure releases the transfer, which commits on the
/// restored account (it was removed, `cascaded_from` the closure). Under buffer-suspicious
/// the transfer is held too (its log row references the account the closure would delete)
/// and commits the same way.
async fn cascade_goes_the_wrong_way_under_compensation(postgres: bool) {
    let Some(s) = Scene::new(postgres, "item3", &[(Bc, Field), (Bs, Field)]).await else { return };
    for (t, k, st, _) in &s.tenants {
        let ctx = format!("{t} ({st:?}, postgres {postgres})");
        let close = ask(&s.h, k, "close_account", json!({"id": 4}), true).await;
        let transfer = ask(&s.h, k, "transfer", json!({"from": 1, "to": 4, "amount": 10}), false).await;
        let expect = if *st == Bc { "executed_awaiting_review" } else { "awaiting_review" };
        assert_eq!(close["status"], expect, "{ctx}");
        assert_eq!(
            (transfer["status"].as_str(), &transfer["waits_for"]),
            (Some("held"), &json!([close["id"]])),
            "{ctx}"
        );
        let r = remove(&s.h, k, &close).await;
        assert_eq!(r["cascaded"], json!([]), "{ctx}: the transfer did not build on the closure");
        let v = status(&s.h, k, &transfer).await;
        assert_eq!((v["status"].as_str(), &v["cascaded_from"]), (Some("committed"), &Value::Null), "{ctx}");
        assert_eq!(s.read(t, "SELECT balance FROM account WHERE id = 4").await, Some(10), "{ctx}");
        assert_eq!(s.read(t, "SELECT balance FROM account WHERE id = 1").await, Some(490), "{ctx}");
        assert_eq!(s.read(t, "SELECT COUNT(*) FROM transfer_log WHERE to_id = 4").await, Some(1), "{ctx}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item3_cascade_goes_the_wrong_way_under_compensation_sqlite() {
    cascade_goes_the_wrong_way_under_compensation(SQLITE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item3_cascade_goes_the_wrong_way_under_compensation_postgres() {
    cascade_goes_the_wrong_way_under_compensation(POSTGRES).await;
}

/// Item 4: at column granularity a removal cascades only to what presupposes its effect:
/// removing `open_loan(1)` no longer takes `repay_loan(5)` along.
async fn removal_cascades_to_other_rows(postgres: bool) {
    let Some(s) = Scene::new(postgres, "item4", &[(Bs, Column), (Bc, Column)]).await else { return };
    for (t, k, st, _) in &s.tenants {
        let ctx = format!("{t} ({st:?}, postgres {postgres})");
        assert_eq!(ask(&s.h, k, "open_loan", json!({"id": 5}), false).await["status"], "committed", "{ctx}");
        let one = ask(&s.h, k, "open_loan", json!({"id": 1}), true).await;
        let repay = ask(&s.h, k, "repay_loan", json!({"id": 5, "amount": 50}), false).await;
        assert_eq!(repay["status"], "held", "{ctx}: column granularity cannot tell the loans apart");
        let mine = ask(&s.h, k, "repay_loan", json!({"id": 1, "amount": 30}), false).await;
        let r = remove(&s.h, k, &one).await;
        assert_eq!(r["cascaded"], json!([mine["id"]]), "{ctx}: only loan 1's repayment presupposed it");
        assert_eq!(status(&s.h, k, &repay).await["status"], "committed", "{ctx}");
        assert_eq!(s.read(t, "SELECT amount FROM loan WHERE id = 5").await, Some(50), "{ctx}");
        assert_eq!(s.read(t, "SELECT COUNT(*) FROM loan WHERE id = 1").await, Some(0), "{ctx}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item4_removal_cascades_to_other_rows_sqlite() {
    removal_cascades_to_other_rows(SQLITE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item4_removal_cascades_to_other_rows_postgres() {
    removal_cascades_to_other_rows(POSTGRES).await;
}

/// Item 5: held transactions are released in arrival order: withdraw 40, withdraw 70 (refused:
/// 60 left), deposit 30, where they ran as 40, 30, 70.
async fn held_transactions_are_released_in_arrival_order(postgres: bool) {
    let cases = [(Bs, Field), (Bc, Field), (Bs, Row), (Bc, Column)];
    let Some(s) = Scene::new(postgres, "item5", &cases).await else { return };
    for (t, k, st, g) in &s.tenants {
        let ctx = format!("{t} ({st:?}, {g:?}, postgres {postgres})");
        ask(&s.h, k, "set_balance", json!({"id": 3, "balance": 100}), false).await;
        let sus = ask(&s.h, k, "set_balance", json!({"id": 3, "balance": 50}), true).await;
        let w40 = ask(&s.h, k, "withdraw", json!({"id": 3, "amount": 40}), false).await;
        let w70 = ask(&s.h, k, "withdraw", json!({"id": 3, "amount": 70}), false).await;
        let d30 = ask(&s.h, k, "deposit", json!({"id": 3, "amount": 30}), false).await;
        for x in [&w40, &w70, &d30] {
            assert_eq!(x["status"], "held", "{ctx}: {x}");
        }
        remove(&s.h, k, &sus).await;
        let mut got = Vec::new();
        for x in [&w40, &w70, &d30] {
            got.push(status(&s.h, k, x).await["status"].clone());
        }
        assert_eq!(got, vec![json!("committed"), json!("failed"), json!("committed")], "{ctx}");
        assert_eq!(s.read(t, "SELECT balance FROM account WHERE id = 3").await, Some(90), "{ctx}");
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item5_held_transactions_are_released_in_arrival_order_sqlite() {
    held_transactions_are_released_in_arrival_order(SQLITE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item5_held_transactions_are_released_in_arrival_order_postgres() {
    held_transactions_are_released_in_arrival_order(POSTGRES).await;
}

/// Item 6: `"1"` and `1` name the same row in dependency checks (SQLite coerces one into the
/// other), and a declared type is checked at the request with a 400 naming the parameter.
async fn parameter_json_type_bypasses_the_dependency_check(postgres: bool) {
    let Some(s) = Scene::new(postgres, "item6", &[(Bc, Field)]).await else { return };
    let (t, k, _, _) = &s.tenants[0];
    let dep = ask(&s.h, k, "deposit", json!({"id": 1, "amount": 100}), true).await;
    if !postgres {
        // PostgreSQL refuses a text for a BIGINT itself; SQLite coerces it.
        let w = ask(&s.h, k, "withdraw", json!({"id": "1", "amount": 550}), false).await;
        assert_eq!((w["status"].as_str(), &w["waits_for"]), (Some("held"), &json!([dep["id"]])), "{w}");
        remove(&s.h, k, &dep).await;
        let v = status(&s.h, k, &w).await;
        assert_eq!(v["status"], "failed", "500 cannot pay 550: {v}");
    } else {
        remove(&s.h, k, &dep).await;
    }
    assert_eq!(s.read(t, "SELECT balance FROM account WHERE id = 1").await, Some(500));
    for (template, params, field, value, expected) in [
        ("set_balance", json!({"id": "3", "balance": 1}), "params.id", "\"3\"", "integer"),
        ("deposit", json!({"id": 1, "amount": "5"}), "params.amount", "\"5\"", "integer"),
        ("set_balance", json!({"id": 3, "balance": 1.5}), "params.balance", "1.5", "integer"),
        ("open_account", json!({"id": true}), "params.id", "true", "integer"),
    ] {
        let body = json!({"template": template, "params": params});
        let r = s.h.req("POST", "/v1/review/transactions", Some(&k.agent), Some(body)).await;
        assert_eq!((r.status, r.body["field"].as_str()), (400, Some(field)), "{r:?}");
        assert_eq!(r.body["value"].as_str(), Some(value), "{r:?}");
        assert!(r.body["expected"].as_str().unwrap().contains(expected), "{r:?}");
    }
    let bad = json!({"set": {"templates": [{"name": "typo", "params": ["id"], "types": {"idd": "integer"},
        "steps": [{"statements": [{"sql": "SELECT 1 AS one"}]}]}]}});
    let r = s.h.req("POST", "/v1/review/templates", Some(&k.operator), Some(bad)).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("set.templates[\"typo\"].types.idd")), "{r:?}");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item6_parameter_json_type_bypasses_the_dependency_check_sqlite() {
    parameter_json_type_bypasses_the_dependency_check(SQLITE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_item6_parameter_json_type_bypasses_the_dependency_check_postgres() {
    parameter_json_type_bypasses_the_dependency_check(POSTGRES).await;
}
