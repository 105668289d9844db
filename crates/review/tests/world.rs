//! The removal promise on random sequences that are not TPC-C (issue 27): a bank with loyalty
//! points, VIP accounts, loans, a transfer log, a stock and a member list, with unique,
//! check, counter, conditional, foreign-key and process-order invariants; deletes and sets
//! after buffered increments, keys read from the database (`bind`), a list template, ids sent
//! as numbers or as strings, both strategies, all four granularities, and removals that
//! cascade. After every step:
//!
//! - the database equals a reference replay, on a fresh database, of exactly the transactions
//!   in history (executed and not compensated, in the order they executed), table by table;
//! - every transaction that ran live also runs in the replay;
//! - every removal answered `removed`, no removal was refused, and the graph is consistent;
//! - a removal took along only transactions that presuppose its effect (a repayment of the
//!   loan it opened, a loan or transfer of the account it opened);
//! - non-suspicious transactions whose declared writes may meet ran in arrival order.
//!
//! Sizes: `TIDEGATE_REVIEW_WORLD_SEQUENCES` sequences per (strategy, granularity) (default 120)
//! of `TIDEGATE_REVIEW_WORLD_STEPS` steps (default 40). A failure prints its seed; replay it
//! with `TIDEGATE_REVIEW_SEED=<seed>` (and `TIDEGATE_REVIEW_GRANULARITY=field|row|column|table`
//! for one granularity; `TIDEGATE_REVIEW_DUMP=1` prints the decision log at the failing step). Soak (README "More"):
//! `TIDEGATE_REVIEW_WORLD_SEQUENCES=2000 cargo test --release -p tidegate-review --test world`.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tidegate_review::exec::{self, ExecFailure};
use tidegate_review::value::Row;
use tidegate_review::{
    Database, Decision, Granularity, Manager, MemoryLog, Options, Record, Request, SqliteDatabase, Status, Strategy,
    TemplateSet, Touch, TxView, WriteKind,
};

const SCHEMA: &str = "
CREATE TABLE account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0),
    points INTEGER NOT NULL, vip INTEGER NOT NULL, CHECK (vip = 0 OR balance >= 100));
CREATE TABLE transfer_log (seq INTEGER PRIMARY KEY, from_id INTEGER NOT NULL,
    to_id INTEGER NOT NULL REFERENCES account (id), amount INTEGER NOT NULL);
CREATE TABLE loan (id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL REFERENCES account (id),
    amount INTEGER NOT NULL CHECK (amount >= 0));
CREATE TABLE stock (item INTEGER PRIMARY KEY, qty INTEGER NOT NULL CHECK (qty BETWEEN 0 AND 1000));
CREATE TABLE member (id INTEGER PRIMARY KEY, handle TEXT NOT NULL UNIQUE);
INSERT INTO account VALUES (1, 300, 0, 0), (2, 300, 0, 0), (3, 50, 0, 0), (4, 0, 0, 0);
INSERT INTO stock VALUES (1, 10), (2, 500), (3, 990);
INSERT INTO member VALUES (1, 'ann');";

const TABLES: [&str; 5] = ["account", "transfer_log", "loan", "stock", "member"];

fn world() -> TemplateSet {
    let exists = |table: &str, key: &str, param: &str| json!({"sql": format!("SELECT {key} AS found FROM {table} WHERE {key} = :{param}"), "bind": true});
    let upd = |sql: &str| json!({"sql": sql});
    let w = |table: &str, column: Option<&str>, kind: &str, row: Value| json!({"table": table, "column": column, "kind": kind, "row": row});
    let set = json!({
        "tables": {
            "account": {"primary_key": ["id"]}, "transfer_log": {"primary_key": ["seq"]},
            "loan": {"primary_key": ["id"]}, "stock": {"primary_key": ["item"]}, "member": {"primary_key": ["id"]}
        },
        "invariants": [
            {"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0},
            {"kind": "check", "table": "loan", "column": "amount", "op": ">=", "value": 0},
            {"kind": "counter", "table": "stock", "column": "qty", "min": 0, "max": 1000},
            {"kind": "unique", "table": "member", "columns": ["handle"]},
            {"kind": "conditional", "table": "account", "when_column": "vip", "then_column": "balance", "on": ["id"]},
            {"kind": "foreign_key", "table": "transfer_log", "column": "to_id", "parent_table": "account", "parent_column": "id"},
            {"kind": "foreign_key", "table": "loan", "column": "account_id", "parent_table": "account", "parent_column": "id"},
            {"kind": "process_order", "first": "open_loan", "then": "repay_loan", "on": [["id", "id"]]}
        ],
        "templates": [
            {"name": "open_account", "params": ["id"],
             "steps": [{"statements": [upd("INSERT INTO account VALUES (:id, 0, 0, 0)")]}],
             "writes": [w("account", None, "insert", json!({"id": "id"}))]},
            {"name": "close_account", "params": ["id"],
             "steps": [{"statements": [upd("DELETE FROM account WHERE id = :id")]}],
             "writes": [w("account", None, "delete", json!({"id": "id"}))]},
            {"name": "deposit", "params": ["id", "amount"],
             "steps": [{"statements": [exists("account", "id", "id"), upd("UPDATE account SET balance = balance + :amount WHERE id = :id")]}],
             "writes": [w("account", Some("balance"), "increment", json!({"id": "id"}))]},
            {"name": "withdraw", "params": ["id", "amount"],
             "steps": [{"statements": [exists("account", "id", "id"), upd("UPDATE account SET balance = balance - :amount WHERE id = :id")]}],
             "writes": [w("account", Some("balance"), "decrement", json!({"id": "id"}))]},
            {"name": "set_balance", "params": ["id", "balance"], "types": {"id": "integer", "balance": "integer"},
             "steps": [{"statements": [exists("account", "id", "id"), upd("UPDATE account SET balance = :balance WHERE id = :id")]}],
             "writes": [w("account", Some("balance"), "set", json!({"id": "id"}))]},
            {"name": "earn_points", "params": ["id", "points"],
             "steps": [{"statements": [upd("UPDATE account SET points = points + :points WHERE id = :id")]}],
             "writes": [w("account", Some("points"), "increment", json!({"id": "id"}))]},
            {"name": "expire_points", "params": ["id"],
             "steps": [{"statements": [upd("UPDATE account SET points = 0 WHERE id = :id")]}],
             "writes": [w("account", Some("points"), "set", json!({"id": "id"}))]},
            {"name": "make_vip", "params": ["id"],
             "steps": [{"statements": [exists("account", "id", "id"), upd("UPDATE account SET vip = 1 WHERE id = :id")]}],
             "writes": [w("account", Some("vip"), "set", json!({"id": "id"}))]},
            {"name": "drop_vip", "params": ["id"],
             "steps": [{"statements": [upd("UPDATE account SET vip = 0 WHERE id = :id")]}],
             "writes": [w("account", Some("vip"), "set", json!({"id": "id"}))]},
            {"name": "transfer", "params": ["from", "to", "amount"],
             "steps": [{"statements": [
                exists("account", "id", "to"),
                upd("UPDATE account SET balance = balance - :amount WHERE id = :from"),
                upd("UPDATE account SET balance = balance + :amount WHERE id = :to"),
                upd("INSERT INTO transfer_log (from_id, to_id, amount) VALUES (:from, :to, :amount)")]}],
             "writes": [
                w("account", Some("balance"), "decrement", json!({"id": "from"})),
                w("account", Some("balance"), "increment", json!({"id": "to"})),
                w("transfer_log", None, "insert", json!({"from_id": "from", "to_id": "to"}))]},
            {"name": "tax_richest", "params": ["amount"],
             "steps": [{"statements": [
                {"sql": "SELECT id AS rid FROM account ORDER BY balance DESC, id LIMIT 1", "bind": true},
                upd("UPDATE account SET balance = balance - :amount WHERE id = :rid")]}],
             "writes": [w("account", Some("balance"), "decrement", json!({"id": "rid"}))]},
            {"name": "bulk_deposit", "params": [], "lists": {"items": ["id", "amount"]},
             "steps": [{"each": "items", "statements": [upd("UPDATE account SET balance = balance + :amount WHERE id = :id")]}],
             "writes": [{"table": "account", "column": "balance", "kind": "increment", "row": {"id": "id"}, "each": "items"}]},
            {"name": "open_loan", "params": ["id", "account"],
             "steps": [{"statements": [upd("INSERT INTO loan VALUES (:id, :account, 100)")]}],
             "writes": [w("loan", None, "insert", json!({"id": "id", "account_id": "account"}))]},
            {"name": "repay_loan", "params": ["id", "amount"],
             "steps": [{"statements": [exists("loan", "id", "id"), upd("UPDATE loan SET amount = amount - :amount WHERE id = :id")]}],
             "writes": [w("loan", Some("amount"), "decrement", json!({"id": "id"}))]},
            {"name": "restock", "params": ["item", "n"],
             "steps": [{"statements": [upd("UPDATE stock SET qty = qty + :n WHERE item = :item")]}],
             "writes": [w("stock", Some("qty"), "increment", json!({"item": "item"}))]},
            {"name": "sell", "params": ["item", "n"],
             "steps": [{"statements": [upd("UPDATE stock SET qty = qty - :n WHERE item = :item")]}],
             "writes": [w("stock", Some("qty"), "decrement", json!({"item": "item"}))]},
            {"name": "count_stock", "params": ["item", "qty"],
             "steps": [{"statements": [upd("UPDATE stock SET qty = :qty WHERE item = :item")]}],
             "writes": [w("stock", Some("qty"), "set", json!({"item": "item"}))]},
            {"name": "join", "params": ["id", "handle"],
             "steps": [{"statements": [upd("INSERT INTO member VALUES (:id, :handle)")]}],
             "writes": [w("member", None, "insert", json!({"id": "id", "handle": "handle"}))]},
            {"name": "rename", "params": ["id", "handle"],
             "steps": [{"statements": [upd("UPDATE member SET handle = :handle WHERE id = :id")]}],
             "writes": [w("member", Some("handle"), "set", json!({"id": "id"}))]},
            {"name": "leave", "params": ["id"],
             "steps": [{"statements": [upd("DELETE FROM member WHERE id = :id")]}],
             "writes": [w("member", None, "delete", json!({"id": "id"}))]}
        ]
    });
    let set: TemplateSet = serde_json::from_value(set).unwrap();
    set.validate().unwrap();
    set
}

/// A random request: small key ranges so that transactions collide; an id that no template
/// declares a type for is sent as a number or as a string at random.
///
/// `focus` is the key of a recent request: half the ids drawn are that key (as a number or a
/// string), so that what follows a buffered or awaiting transaction often meets its row: a
/// deletion, a set or a transfer to the account a suspicious deposit, earning or closure just
/// touched, a withdrawal larger than the balance without that deposit. These are the shapes
/// where a removal can be refused, leave a trace, cascade the wrong way or miss a dependency
/// through a parameter's JSON type (issue 27, items 1, 2, 3 and 6).
fn request(rng: &mut SmallRng, focus: Option<i64>) -> (String, Value) {
    let id = |rng: &mut SmallRng, n: i64| -> Value {
        let v = match focus {
            Some(f) if f <= n && rng.gen_bool(0.5) => f,
            _ => rng.gen_range(1..=n),
        };
        if rng.gen_bool(0.3) { json!(v.to_string()) } else { json!(v) }
    };
    // Mostly small amounts; sometimes more than an account holds without a recent deposit.
    let amount = |rng: &mut SmallRng| {
        if rng.gen_bool(0.15) { json!(rng.gen_range(12..=24) * 25) } else { json!(rng.gen_range(1..=6) * 25) }
    };
    let handle = |rng: &mut SmallRng| ["ann", "bob", "cy"][rng.gen_range(0..3)];
    let (t, p) = match rng.gen_range(0..30) {
        0..=1 => ("open_account", json!({"id": id(rng, 6)})),
        2..=3 => ("close_account", json!({"id": id(rng, 6)})),
        4..=6 => ("deposit", json!({"id": id(rng, 6), "amount": amount(rng)})),
        7..=9 => ("withdraw", json!({"id": id(rng, 6), "amount": amount(rng)})),
        10 => {
            let v = match focus {
                Some(f) if f <= 6 && rng.gen_bool(0.5) => f,
                _ => rng.gen_range(1..=6),
            };
            ("set_balance", json!({"id": v, "balance": rng.gen_range(0..=8) * 25}))
        }
        11..=12 => ("earn_points", json!({"id": id(rng, 6), "points": rng.gen_range(1..=50)})),
        13 => ("expire_points", json!({"id": id(rng, 6)})),
        14 => ("make_vip", json!({"id": id(rng, 6)})),
        15 => ("drop_vip", json!({"id": id(rng, 6)})),
        16..=17 => ("transfer", json!({"from": id(rng, 6), "to": id(rng, 6), "amount": amount(rng)})),
        18 => ("tax_richest", json!({"amount": amount(rng)})),
        19 => {
            let items: Vec<Value> =
                (0..rng.gen_range(1..=3)).map(|_| json!({"id": id(rng, 6), "amount": amount(rng)})).collect();
            ("bulk_deposit", json!({ "items": items }))
        }
        20..=21 => ("open_loan", json!({"id": id(rng, 2), "account": id(rng, 6)})),
        22..=23 => ("repay_loan", json!({"id": id(rng, 2), "amount": rng.gen_range(1..=4) * 25})),
        24 => ("restock", json!({"item": id(rng, 3), "n": rng.gen_range(1..=20) * 5})),
        25 => ("sell", json!({"item": id(rng, 3), "n": rng.gen_range(1..=20) * 5})),
        26 => ("count_stock", json!({"item": id(rng, 3), "qty": rng.gen_range(0..=10) * 100})),
        27 => ("join", json!({"id": id(rng, 5), "handle": handle(rng)})),
        28 => ("rename", json!({"id": id(rng, 5), "handle": handle(rng)})),
        _ => ("leave", json!({"id": id(rng, 5)})),
    };
    (t.to_owned(), p)
}

/// The key a request is about (its first id-like parameter), as an integer.
fn key_of(params: &Value) -> Option<i64> {
    ["id", "to", "item", "from"].iter().find_map(|k| match params.get(*k)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

fn fresh() -> SqliteDatabase {
    let mut db = SqliteDatabase::memory().unwrap();
    db.batch(SCHEMA).unwrap();
    db
}

/// Every table's rows. `transfer_log.seq` is generated by the database (a rowid), and a
/// removal does not renumber the rows inserted after it (docs/review.md: generated values are
/// outside the promise), so that table is compared without it, as a multiset.
fn dump(db: &mut dyn Database) -> Vec<(&'static str, Vec<Row>)> {
    let sql = |t: &str| match t {
        "transfer_log" => "SELECT from_id, to_id, amount FROM transfer_log ORDER BY 1, 2, 3".to_owned(),
        _ => format!("SELECT * FROM {t} ORDER BY 1"),
    };
    TABLES.iter().map(|t| (*t, db.query(&sql(t), &[]).unwrap())).collect()
}

/// Replays exactly the transactions in history (executed, not compensated) in the order they
/// executed, on a fresh database; returns its tables, or the first transaction the replay
/// refused although it ran live.
fn replay(set: &TemplateSet, log: &MemoryLog) -> Result<Vec<(&'static str, Vec<Row>)>, String> {
    let mut requests = std::collections::BTreeMap::new();
    let mut order: Vec<u64> = Vec::new();
    for rec in tidegate_review::DecisionLog::read_all(log).unwrap() {
        match rec {
            Record::Request { id, template, params, .. } => {
                requests.insert(id, (template, params));
            }
            Record::Executed { id, error: None, .. } => order.push(id),
            Record::Compensated { id, error: None } => order.retain(|x| *x != id),
            _ => {}
        }
    }
    let mut db = fresh();
    exec::install_marker_table(&mut db).unwrap();
    for id in order {
        let (t, params) = &requests[&id];
        match exec::execute(&mut db, set, set.get(t).unwrap(), params, id, false) {
            Ok(_) => {}
            Err(ExecFailure::Refused(e)) => {
                return Err(format!("tx {id} ({t} {params}) ran live but not in the replay: {e}"));
            }
            Err(ExecFailure::Error(e)) => panic!("replay: {e}"),
        }
    }
    Ok(dump(&mut db))
}

/// A row value as the database compares it: a text that reads as an integer is that integer.
fn canon(v: &str) -> String {
    match v.strip_prefix('t').map(str::trim).and_then(|t| t.parse::<i64>().ok()) {
        Some(i) => format!("n{i}"),
        None => v.to_owned(),
    }
}

fn json_canon(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().parse::<i64>().map_or_else(|_| s.clone(), |i| i.to_string()),
        other => other.to_string(),
    }
}

/// Whether two transactions' declared writes may meet in a way whose order matters (known
/// keys compared canonically). Deltas of `account.points`, which no invariant bounds, commute.
fn overlap(a: &[Touch], b: &[Touch]) -> bool {
    let delta = |t: &Touch| matches!(t.kind, WriteKind::Increment | WriteKind::Decrement);
    let commute = |x: &Touch, y: &Touch| {
        x.table == "account"
            && x.column.as_deref() == Some("points")
            && y.column == x.column
            && delta(x)
            && delta(y)
            && x.row.values().chain(y.row.values()).all(Option::is_some)
    };
    a.iter().any(|x| {
        b.iter().any(|y| {
            !commute(x, y)
                && x.table == y.table
                && (x.column.is_none() || y.column.is_none() || x.column == y.column)
                && x.row.iter().all(|(c, vx)| match (vx, y.row.get(c)) {
                    (Some(p), Some(Some(q))) => canon(p) == canon(q),
                    _ => true,
                })
        })
    })
}

/// Non-suspicious transactions whose writes may meet ran in arrival order (docs/review.md
/// invariant 4; suspicious ones run when a reviewer accepts them, by design).
fn check_arrival_order(log: &MemoryLog, ctx: &str) {
    let mut touches = std::collections::BTreeMap::new();
    let mut ran: Vec<u64> = Vec::new();
    for rec in tidegate_review::DecisionLog::read_all(log).unwrap() {
        match rec {
            Record::Request { id, suspicious: false, touches: t, .. } => {
                touches.insert(id, t);
            }
            Record::Executed { id, .. } if touches.contains_key(&id) => ran.push(id),
            _ => {}
        }
    }
    for (pos, j) in ran.iter().enumerate() {
        for i in &ran[pos + 1..] {
            if i < j && overlap(&touches[i], &touches[j]) {
                panic!("{ctx}: tx {j} ran before the older tx {i} whose writes it meets (arrival order)");
            }
        }
    }
}

/// What a removal may take along: only transactions that presuppose the removed one's effect
/// (a repayment of the loan it opened; a loan or transfer log row of the account it opened).
fn presupposes(parent: &TxView, child: &TxView) -> bool {
    let p = |v: &TxView, k: &str| json_canon(&v.params[k]);
    match (parent.template.as_str(), child.template.as_str()) {
        ("open_loan", "repay_loan") => p(parent, "id") == p(child, "id"),
        ("open_account", "open_loan") => p(parent, "id") == p(child, "account"),
        ("open_account", "transfer") => p(parent, "id") == p(child, "to"),
        _ => false,
    }
}

fn check_cascade(m: &Manager, removed: u64, ctx: &str) {
    for c in m.cascaded(removed) {
        let child = m.status(c).unwrap();
        let parent = m.status(child.cascaded_from.unwrap()).unwrap();
        assert!(
            presupposes(&parent, &child),
            "{ctx}: removing {} ({} {}) took {} ({} {}) along, which does not build on it",
            parent.id,
            parent.template,
            parent.params,
            child.id,
            child.template,
            child.params
        );
    }
}

fn check(m: &mut Manager, set: &TemplateSet, log: &MemoryLog, ctx: &str) {
    // TIDEGATE_REVIEW_DUMP=1 prints the decision log when the database leaves the replay.
    if std::env::var("TIDEGATE_REVIEW_DUMP").is_ok() && replay(set, log).map_or(true, |w| w != dump(m.database())) {
        for rec in tidegate_review::DecisionLog::read_all(log).unwrap() {
            eprintln!("{}", serde_json::to_string(&rec).unwrap());
        }
    }
    check_arrival_order(log, ctx);
    let want = replay(set, log).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let got = dump(m.database());
    for ((t, g), (_, w)) in got.iter().zip(&want) {
        assert_eq!(g, w, "{ctx}: table {t} differs from the replay of history (left: database, right: replay)");
    }
    m.check_integrity().unwrap_or_else(|e| panic!("{ctx}: graph: {e}"));
    assert_eq!(m.stats().refused_removals, 0, "{ctx}: a removal was refused");
}

fn review(m: &mut Manager, id: u64, d: Decision, ctx: &str) {
    let st = m.review(id, d, "rita").unwrap_or_else(|e| panic!("{ctx}: review refused: {e}"));
    if d == Decision::Remove {
        assert_eq!(st, Status::Removed, "{ctx}: removal of {id} answered {st:?}");
        check_cascade(m, id, ctx);
    }
}

/// One random sequence; returns (requests, removals, cascaded).
fn sequence(strategy: Strategy, granularity: Granularity, seed: u64, steps: u64) -> (u64, u64, u64) {
    let set = world();
    let log = MemoryLog::new();
    let mut m = Manager::open(set.clone(), Box::new(fresh()), Box::new(log.clone()), Options { strategy, granularity })
        .unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let ctx = |i: u64, what: &str| {
        format!(
            "seed {seed} ({strategy:?}, {granularity:?}) step {i} [{what}]; replay: \
             TIDEGATE_REVIEW_SEED={seed} TIDEGATE_REVIEW_GRANULARITY={granularity:?}"
        )
    };
    let mut removals = 0;
    let mut trace: Vec<String> = Vec::new();
    let mut focus: Option<i64> = None;
    for i in 1..=steps {
        let reviewable = m.reviewable();
        let what = if !reviewable.is_empty() && rng.gen_bool(0.35) {
            let id = reviewable[rng.gen_range(0..reviewable.len())];
            let d = if rng.gen_bool(0.6) { Decision::Remove } else { Decision::Accept };
            removals += u64::from(d == Decision::Remove);
            review(&mut m, id, d, &format!("{}\n{}", ctx(i, ""), trace.join("\n")));
            format!("{d:?} {id}")
        } else {
            let (template, params) = request(&mut rng, focus);
            // Openings are suspicious more often, so that what builds on them is buffered
            // behind them and removals cascade.
            let suspicious = rng.gen_bool(if template.starts_with("open") { 0.7 } else { 0.3 });
            let what = format!("{template} {params} suspicious={suspicious}");
            // A suspicious request becomes the focus; otherwise the focus drifts away sometimes.
            if suspicious || focus.is_none() || rng.gen_bool(0.3) {
                focus = key_of(&params);
            }
            let id = m
                .request(Request { template, params, sender: "llm".into(), suspicious })
                .unwrap_or_else(|e| panic!("{}: request refused: {e}", ctx(i, &what)));
            format!("#{id} {what} -> {:?}", m.status(id).unwrap().status)
        };
        trace.push(format!("  {i}: {what}"));
        check(&mut m, &set, &log, &format!("{}\n{}", ctx(i, &what), trace.join("\n")));
    }
    while !m.reviewable().is_empty() {
        let r = m.reviewable();
        let id = r[rng.gen_range(0..r.len())];
        let d = if rng.gen_bool(0.5) { Decision::Remove } else { Decision::Accept };
        removals += u64::from(d == Decision::Remove);
        review(&mut m, id, d, &ctx(steps + 1, "drain"));
        trace.push(format!("  drain: {d:?} {id}"));
        check(&mut m, &set, &log, &format!("{}\n{}", ctx(steps + 1, "drain"), trace.join("\n")));
    }
    assert!(m.buffered().is_empty(), "{}: left in the buffer: {:?}", ctx(steps + 1, ""), m.buffered());
    (m.stats().requests, removals, m.stats().cascaded)
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run(strategy: Strategy) {
    let steps = env_num("TIDEGATE_REVIEW_WORLD_STEPS", 40);
    let seeds: Vec<u64> = match std::env::var("TIDEGATE_REVIEW_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => (0..env_num("TIDEGATE_REVIEW_WORLD_SEQUENCES", 120)).map(|i| 7000 + i).collect(),
    };
    let only = std::env::var("TIDEGATE_REVIEW_GRANULARITY").ok();
    let mut total = (0, 0, 0);
    for g in [Granularity::Field, Granularity::Row, Granularity::Column, Granularity::Table] {
        if only.as_deref().is_some_and(|o| !format!("{g:?}").eq_ignore_ascii_case(o)) {
            continue;
        }
        for &seed in &seeds {
            let (r, x, c) = sequence(strategy, g, seed, steps);
            total = (total.0 + r, total.1 + x, total.2 + c);
        }
    }
    eprintln!(
        "{strategy:?}: {} sequences x 4 granularities, {} requests, {} removals, {} cascaded; the database matched the replay after every step",
        seeds.len(),
        total.0,
        total.1,
        total.2
    );
    assert!(total.1 > 0, "the sequences removed something");
}

#[test]
fn world_buffer_suspicious_matches_a_replay_of_history() {
    run(Strategy::BufferSuspicious);
}

#[test]
fn world_buffer_compensating_matches_a_replay_of_history() {
    run(Strategy::BufferCompensating);
}

/// A manager over a fresh world database, and its decision log.
fn open(strategy: Strategy, granularity: Granularity) -> (Manager, MemoryLog) {
    let log = MemoryLog::new();
    let m =
        Manager::open(world(), Box::new(fresh()), Box::new(log.clone()), Options { strategy, granularity }).unwrap();
    (m, log)
}

/// A request from the LLM.
fn req(template: &str, params: Value, suspicious: bool) -> Request {
    Request { template: template.into(), params, sender: "llm".into(), suspicious }
}

/// At table granularity two tables still meet through a foreign key: `open_loan(account = 5)`
/// after a suspicious `open_account(5)` that ran (buffer-compensating) must not commit at once,
/// or the account's compensation (its delete) is refused by the loan's row; under
/// buffer-suspicious the loan builds on the buffered account and goes with it. Found by the
/// random sequences (seed 7022, table granularity).
#[test]
fn world_table_granularity_sees_a_foreign_key_across_tables() {
    for strategy in [Strategy::BufferSuspicious, Strategy::BufferCompensating] {
        let (mut m, log) = open(strategy, Granularity::Table);
        let open = m.request(req("open_account", json!({"id": 5}), true)).unwrap();
        let loan = m.request(req("open_loan", json!({"id": 2, "account": "5"}), false)).unwrap();
        assert_eq!(m.status(loan).unwrap().status, Status::Held, "{strategy:?}");
        assert_eq!(m.review(open, Decision::Remove, "rita").unwrap(), Status::Removed, "{strategy:?}");
        if strategy == Strategy::BufferSuspicious {
            assert_eq!(m.cascaded(open), vec![loan], "{strategy:?}: the loan presupposes the account");
        } else {
            // Nothing builds on a compensation (docs/review.md rule 3): the loan is released
            // after the account's removal and refused by its own foreign key.
            assert_eq!(m.status(loan).unwrap().status, Status::Failed, "{strategy:?}");
        }
        check(&mut m, &world(), &log, &format!("{strategy:?}"));
    }
}

/// Issue 27 item 4 on the library: at column granularity removing `open_loan(1)` takes only
/// loan 1's repayment along, not loan 2's.
#[test]
fn world_a_cascade_keeps_to_what_presupposes_the_removed_transaction() {
    for strategy in [Strategy::BufferSuspicious, Strategy::BufferCompensating] {
        let (mut m, log) = open(strategy, Granularity::Column);
        m.request(req("open_loan", json!({"id": 2, "account": 1}), false)).unwrap();
        let one = m.request(req("open_loan", json!({"id": 1, "account": 1}), true)).unwrap();
        let other = m.request(req("repay_loan", json!({"id": 2, "amount": 50}), false)).unwrap();
        let mine = m.request(req("repay_loan", json!({"id": "1", "amount": 25}), false)).unwrap();
        assert_eq!(m.status(other).unwrap().status, Status::Held, "{strategy:?}");
        assert_eq!(m.cascade_preview(one), vec![mine], "{strategy:?}");
        assert_eq!(m.review(one, Decision::Remove, "rita").unwrap(), Status::Removed);
        assert_eq!(m.cascaded(one), vec![mine], "{strategy:?}");
        assert_eq!(m.status(other).unwrap().status, Status::Committed, "{strategy:?}");
        check(&mut m, &world(), &log, &format!("{strategy:?}"));
    }
}

/// Rule 8: `tax_richest` picks its row by reading balances, so it waits for an executed
/// `tax_richest` whose compensation could change the choice; removing that one then leaves
/// the database as the replay of history (found by the soak, seed 7541).
#[test]
fn world_a_row_chosen_by_a_read_waits_for_writes_that_could_change_the_choice() {
    for granularity in [Granularity::Field, Granularity::Row, Granularity::Column] {
        let (mut m, log) = open(Strategy::BufferCompensating, granularity);
        let first = m.request(req("tax_richest", json!({"amount": 75}), true)).unwrap();
        let second = m.request(req("tax_richest", json!({"amount": 50}), false)).unwrap();
        assert_eq!(m.status(second).unwrap().status, Status::Held, "{granularity:?}");
        assert_eq!(m.review(first, Decision::Remove, "rita").unwrap(), Status::Removed);
        assert_eq!(m.status(second).unwrap().status, Status::Committed, "{granularity:?}");
        check(&mut m, &world(), &log, &format!("{granularity:?}"));
    }
}
