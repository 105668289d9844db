//! The manager on a small bank schema (SQLite): holds, materialisation, both strategies,
//! cascades, granularity, validation errors, and rebuilding from the decision log.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use serde_json::json;
use tidegate_review::{
    Decision, DecisionLog, Error, FileLog, Granularity, Manager, MemoryLog, Options, Record, Request, SqliteDatabase,
    Status, Strategy, TemplateSet,
};

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS payment (order_id BIGINT PRIMARY KEY, amount BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS shipment (order_id BIGINT PRIMARY KEY);";

fn templates() -> TemplateSet {
    TemplateSet::from_toml(include_str!("bank.toml")).unwrap()
}

fn bank(strategy: Strategy, granularity: Granularity) -> Manager {
    let mut db = SqliteDatabase::memory().unwrap();
    tidegate_review::Database::batch(&mut db, SCHEMA).unwrap();
    tidegate_review::Database::batch(&mut db, "INSERT INTO account VALUES (1, 50), (2, 50)").unwrap();
    Manager::open(templates(), Box::new(db), Box::new(MemoryLog::new()), Options { strategy, granularity }).unwrap()
}

fn req(t: &str, params: serde_json::Value, suspicious: bool) -> Request {
    Request { template: t.into(), params, sender: if suspicious { "llm".into() } else { "alice".into() }, suspicious }
}

fn balance(m: &mut Manager, id: i64) -> i64 {
    let rows = m
        .database()
        .query("SELECT balance FROM account WHERE id = ?1", &[tidegate_review::value::SqlValue::Int(id)])
        .unwrap();
    rows[0][0].1.as_i64().unwrap()
}

#[test]
fn a_decrement_waits_for_a_buffered_decrement_of_the_same_field_only() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Field);
    let s = m.request(req("withdraw", json!({"id": 1, "amount": 40}), true)).unwrap();
    assert_eq!(m.status(s).unwrap().status, Status::AwaitingReview);
    let held = m.request(req("withdraw", json!({"id": 1, "amount": 20}), false)).unwrap();
    assert_eq!(m.status(held).unwrap().status, Status::Held);
    assert_eq!(m.status(held).unwrap().waits_for, vec![s]);
    assert_eq!(m.status(s).unwrap().waited_by, vec![held]);
    let other_row = m.request(req("withdraw", json!({"id": 2, "amount": 20}), false)).unwrap();
    assert_eq!(m.status(other_row).unwrap().status, Status::Committed);
    // An increment never breaks a lower bound, but running it before the held withdrawal
    // could change that one's outcome: it keeps its arrival order (issue 27 item 5).
    let inc = m.request(req("deposit", json!({"id": 1, "amount": 5}), false)).unwrap();
    assert_eq!(m.status(inc).unwrap().waits_for, vec![held], "held behind the held withdrawal only");
    assert_eq!(balance(&mut m, 1), 50);
    assert_eq!(m.review(s, Decision::Remove, "rita").unwrap(), Status::Removed);
    assert_eq!(m.status(held).unwrap().status, Status::Committed, "released when what it waited for was removed");
    assert_eq!(m.status(inc).unwrap().status, Status::Committed);
    assert_eq!(balance(&mut m, 1), 35);
    m.check_integrity().unwrap();
}

#[test]
fn table_granularity_holds_every_write_to_the_same_table() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Table);
    m.request(req("withdraw", json!({"id": 1, "amount": 40}), true)).unwrap();
    let other_row = m.request(req("withdraw", json!({"id": 2, "amount": 20}), false)).unwrap();
    assert_eq!(m.status(other_row).unwrap().status, Status::Held);
    let other_table = m.request(req("pay", json!({"order_id": 1, "amount": 20}), false)).unwrap();
    assert_eq!(m.status(other_table).unwrap().status, Status::Committed);
}

#[test]
fn accepted_suspicious_transaction_executes_and_releases_what_waited() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Field);
    let s = m.request(req("withdraw", json!({"id": 1, "amount": 40}), true)).unwrap();
    let held = m.request(req("withdraw", json!({"id": 1, "amount": 20}), false)).unwrap();
    assert_eq!(m.review(s, Decision::Accept, "rita").unwrap(), Status::Committed);
    // 50 - 40 = 10, so the held withdrawal of 20 is refused by the database's CHECK.
    let v = m.status(held).unwrap();
    assert_eq!(v.status, Status::Failed);
    assert!(v.error.unwrap().contains("CHECK"));
    assert_eq!(balance(&mut m, 1), 10);
}

#[test]
fn compensating_strategy_holds_a_decrement_that_would_break_the_removal() {
    // The document's Figure 1: a suspicious deposit is executed; a withdrawal that needs it
    // is held, so removing the deposit can never drive the balance below zero.
    let mut m = bank(Strategy::BufferCompensating, Granularity::Field);
    let dep = m.request(req("deposit", json!({"id": 1, "amount": 10}), true)).unwrap();
    assert_eq!(m.status(dep).unwrap().status, Status::ExecutedAwaitingReview);
    assert_eq!(balance(&mut m, 1), 60);
    let w = m.request(req("withdraw", json!({"id": 1, "amount": 60}), false)).unwrap();
    assert_eq!(m.status(w).unwrap().status, Status::Held);
    // Behind the held withdrawal, in arrival order (issue 27 item 5).
    let d2 = m.request(req("deposit", json!({"id": 1, "amount": 1}), false)).unwrap();
    assert_eq!(m.status(d2).unwrap().waits_for, vec![w]);
    assert_eq!(m.review(dep, Decision::Remove, "rita").unwrap(), Status::Removed);
    assert_eq!(balance(&mut m, 1), 51, "compensated by the inverse delta, keeping the later deposit");
    assert_eq!(m.status(w).unwrap().status, Status::Failed, "the database refuses 50 - 60 (arrival order)");
    assert_eq!(m.status(d2).unwrap().status, Status::Committed);
    assert_eq!(m.stats().refused_removals, 0);
}

#[test]
fn compensating_a_set_restores_the_old_value_and_holds_later_writes_of_the_field() {
    let mut m = bank(Strategy::BufferCompensating, Granularity::Field);
    let s = m.request(req("set_balance", json!({"id": 1, "balance": 7}), true)).unwrap();
    let d = m.request(req("deposit", json!({"id": 1, "amount": 3}), false)).unwrap();
    assert_eq!(m.status(d).unwrap().status, Status::Held, "a deposit would be lost by restoring 50");
    m.review(s, Decision::Remove, "rita").unwrap();
    assert_eq!(balance(&mut m, 1), 53);
}

#[test]
fn removing_a_payment_removes_the_shipment_that_builds_on_it() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Field);
    let pay = m.request(req("pay", json!({"order_id": 9, "amount": 5}), true)).unwrap();
    let ship = m.request(req("ship", json!({"order_id": 9}), false)).unwrap();
    let other = m.request(req("ship", json!({"order_id": 8}), false)).unwrap();
    assert_eq!(m.status(ship).unwrap().status, Status::Held);
    assert_eq!(m.status(other).unwrap().status, Status::Committed);
    m.review(pay, Decision::Remove, "rita").unwrap();
    let v = m.status(ship).unwrap();
    assert_eq!((v.status, v.cascaded_from), (Status::Removed, Some(pay)));
    assert_eq!(m.stats().cascaded, 1);
}

#[test]
fn reviews_of_unknown_final_or_unsuspicious_transactions_are_refused() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Field);
    let plain = m.request(req("deposit", json!({"id": 1, "amount": 1}), false)).unwrap();
    assert!(matches!(m.review(plain, Decision::Remove, "r"), Err(Error::Review { .. })));
    assert!(matches!(m.review(999, Decision::Remove, "r"), Err(Error::UnknownTx(999))));
    let s = m.request(req("deposit", json!({"id": 1, "amount": 1}), true)).unwrap();
    m.review(s, Decision::Accept, "r").unwrap();
    assert!(matches!(m.review(s, Decision::Remove, "r"), Err(Error::Review { .. })));
}

#[test]
fn bad_requests_and_templates_name_the_field() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Field);
    let e = m.request(req("deposit", json!({"id": 1}), false)).unwrap_err().to_string();
    assert!(e.contains("`amount`") && e.contains("missing"), "{e}");
    let e = m.request(req("nope", json!({}), false)).unwrap_err().to_string();
    assert!(e.contains("\"nope\""), "{e}");
    let bad = include_str!("bank.toml").replace("balance + :amount", "balance + :amout");
    let e = TemplateSet::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("steps[0].statements[0].sql") && e.contains(":amout"), "{e}");
    let bad = include_str!("bank.toml").replace("op = \">=\"", "op = \">>\"");
    assert!(TemplateSet::from_toml(&bad).is_err());
    let bad = include_str!("bank.toml").replace("table = \"shipment\", kind", "table = \"shipments\", kind");
    let e = TemplateSet::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("writes[0].table") && e.contains("shipments"), "{e}");
}

#[test]
fn the_manager_is_rebuilt_from_its_file_log() {
    let dir = tempfile::tempdir().unwrap();
    let dbp = dir.path().join("bank.db");
    let logp = dir.path().join("decisions.jsonl");
    let open = || {
        let mut db = SqliteDatabase::open(&dbp).unwrap();
        tidegate_review::Database::batch(&mut db, SCHEMA).unwrap();
        let log = FileLog::open(&logp, false).unwrap();
        Manager::open(
            templates(),
            Box::new(db),
            Box::new(log),
            Options { strategy: Strategy::BufferCompensating, granularity: Granularity::Field },
        )
        .unwrap()
    };
    let (dep, w);
    {
        let mut m = open();
        tidegate_review::Database::batch(m.database(), "INSERT INTO account VALUES (1, 50)").unwrap();
        dep = m.request(req("deposit", json!({"id": 1, "amount": 10}), true)).unwrap();
        w = m.request(req("withdraw", json!({"id": 1, "amount": 60}), false)).unwrap();
    }
    let mut m = open();
    assert_eq!(m.status(dep).unwrap().status, Status::ExecutedAwaitingReview);
    assert_eq!(m.status(w).unwrap().waits_for, vec![dep]);
    assert_eq!(m.reviewable(), vec![dep]);
    m.check_integrity().unwrap();
    m.review(dep, Decision::Accept, "rita").unwrap();
    assert_eq!(m.status(w).unwrap().status, Status::Committed);
    assert_eq!(balance(&mut m, 1), 0);
    let next = m.request(req("deposit", json!({"id": 1, "amount": 1}), false)).unwrap();
    assert!(next > w, "ids continue after the rebuild");
}

#[test]
fn an_execution_whose_outcome_was_not_logged_is_not_repeated() {
    // The crash window: the database committed the execution, the log append did not happen.
    let dir = tempfile::tempdir().unwrap();
    let dbp = dir.path().join("bank.db");
    let log = MemoryLog::new();
    let opts = Options { strategy: Strategy::BufferCompensating, granularity: Granularity::Field };
    let dep = {
        let mut db = SqliteDatabase::open(&dbp).unwrap();
        tidegate_review::Database::batch(&mut db, SCHEMA).unwrap();
        tidegate_review::Database::batch(&mut db, "INSERT INTO account VALUES (1, 50)").unwrap();
        let mut m = Manager::open(templates(), Box::new(db), Box::new(log.clone()), opts).unwrap();
        m.request(req("deposit", json!({"id": 1, "amount": 10}), true)).unwrap()
    };
    let mut cut = MemoryLog::new();
    for r in log.read_all().unwrap() {
        if !matches!(r, Record::Executed { .. }) {
            cut.append(&r).unwrap();
        }
    }
    let db = SqliteDatabase::open(&dbp).unwrap();
    let mut m = Manager::open(templates(), Box::new(db), Box::new(cut.clone()), opts).unwrap();
    assert_eq!(balance(&mut m, 1), 60, "executed once");
    assert_eq!(m.status(dep).unwrap().status, Status::ExecutedAwaitingReview);
    m.review(dep, Decision::Remove, "rita").unwrap();
    assert_eq!(balance(&mut m, 1), 50, "the compensation recorded in the marker was used");
    assert!(
        cut.read_all().unwrap().iter().any(|r| matches!(r, Record::Executed { .. })),
        "the settled outcome is logged"
    );
}

#[test]
fn a_transaction_released_after_a_held_suspicious_one_respects_its_future_compensation() {
    // Regression (found by the TPC-C randomized test, seed 1012): a held suspicious transaction
    // under buffer-compensating is executed when released, and its compensation is buffered
    // from then on; a transaction held in the same wait must have been checked against that
    // compensation, not only against its forward writes.
    let mut m = bank(Strategy::BufferCompensating, Granularity::Field);
    let a = m.request(req("set_balance", json!({"id": 1, "balance": 7}), true)).unwrap();
    let b = m.request(req("deposit", json!({"id": 1, "amount": 10}), true)).unwrap();
    assert_eq!(m.status(b).unwrap().waits_for, vec![a]);
    let c = m.request(req("withdraw", json!({"id": 1, "amount": 60}), false)).unwrap();
    assert_eq!(m.status(c).unwrap().waits_for, vec![a, b]);
    m.review(a, Decision::Remove, "rita").unwrap();
    assert_eq!(m.status(b).unwrap().status, Status::ExecutedAwaitingReview);
    assert_eq!(m.status(c).unwrap().status, Status::Held);
    assert_eq!(m.review(b, Decision::Remove, "rita").unwrap(), Status::Removed);
    assert_eq!(m.stats().refused_removals, 0);
    assert_eq!(m.status(c).unwrap().status, Status::Failed, "50 - 60 is refused by the database");
}

#[test]
fn a_given_compensation_runs_on_removal_and_a_template_strategy_overrides_the_deployment() {
    let mut m = bank(Strategy::BufferSuspicious, Granularity::Field);
    let b = m.request(req("bonus", json!({"id": 1, "amount": 10}), true)).unwrap();
    assert_eq!(
        m.status(b).unwrap().status,
        Status::ExecutedAwaitingReview,
        "the template asks for buffer-compensating"
    );
    assert_eq!(balance(&mut m, 1), 60);
    let w = m.request(req("withdraw", json!({"id": 1, "amount": 45}), false)).unwrap();
    assert_eq!(m.status(w).unwrap().waits_for, vec![b], "the given compensation decrements: checked as predicted");
    m.review(b, Decision::Remove, "rita").unwrap();
    assert_eq!(balance(&mut m, 1), 5);
    assert_eq!(m.status(w).unwrap().status, Status::Committed);
}

#[test]
fn templates_registered_while_running_come_back_from_the_log_and_conflicts_are_refused() {
    let log = MemoryLog::new();
    let dir = tempfile::tempdir().unwrap();
    let dbp = dir.path().join("bank.db");
    let open = |log: &MemoryLog| {
        let db = SqliteDatabase::open(&dbp).unwrap();
        Manager::open(TemplateSet::default(), Box::new(db), Box::new(log.clone()), Options::default()).unwrap()
    };
    let mut m = open(&log);
    assert!(m.request(req("deposit", json!({"id": 1, "amount": 1}), false)).is_err(), "nothing registered yet");
    assert!(m.register(templates(), Some(format!("{SCHEMA}; INSERT INTO account VALUES (1, 50);"))).unwrap());
    assert!(!m.register(templates(), None).unwrap(), "the same set again adds nothing");
    let mut changed = templates();
    changed.templates[0].steps[0].statements[0].sql =
        "UPDATE account SET balance = balance + 2 * :amount WHERE id = :id".into();
    let e = m.register(changed, None).unwrap_err().to_string();
    assert!(e.contains("templates[0]") && e.contains("deposit"), "{e}");
    let pay = m.request(req("pay", json!({"order_id": 9, "amount": 5}), true)).unwrap();
    let ship = m.request(req("ship", json!({"order_id": 9}), false)).unwrap();
    assert_eq!(m.cascade_preview(pay), vec![ship]);
    assert_eq!(m.queue().iter().map(|v| v.id).collect::<Vec<_>>(), vec![pay, ship]);
    drop(m);
    let writes_before = log.read_all().unwrap().len();
    let mut m = open(&log);
    assert_eq!(log.read_all().unwrap().len(), writes_before, "a rebuild appends nothing");
    assert_eq!(m.status(ship).unwrap().waits_for, vec![pay]);
    assert_eq!(m.review(pay, Decision::Remove, "rita").unwrap(), Status::Removed);
    assert_eq!(m.cascaded(pay), vec![ship]);
    assert_eq!(balance(&mut m, 1), 50, "the schema's rows are there and nothing ran twice");
}
