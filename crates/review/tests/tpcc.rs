//! TPC-C through the review middleware on real databases: random sequences of requests (some
//! suspicious) and reviews (accept/remove at random times) under both strategies. After every
//! step the TPC-C consistency conditions and the declared invariants hold, the manager's graph
//! is consistent, and no removal was ever refused.
//!
//! Sizes: `TIDEGATE_REVIEW_SEQUENCES` sequences (default 40 per strategy on SQLite, 4 on
//! PostgreSQL) of `TIDEGATE_REVIEW_STEPS` steps (default 60). PostgreSQL:
//! `TIDEGATE_PG_URL` (default postgres://postgres@127.0.0.1:5432/test), skipped with a message
//! when no server answers. Each failure prints its seed; replay it with `TIDEGATE_REVIEW_SEED`.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tidegate_review::tpcc::{self, Generator, Scale};
use tidegate_review::{
    Database, Decision, Granularity, Manager, MemoryLog, Options, Request, SqliteDatabase, Status, Strategy,
};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[cfg(feature = "postgres")]
fn pg_url() -> String {
    std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

#[cfg(feature = "postgres")]
/// A fresh PostgreSQL schema, or `None` (with a message) when no server answers.
fn pg(schema: &str) -> Option<tidegate_review::PgDatabase> {
    match tidegate_review::PgDatabase::connect(&pg_url(), None) {
        Ok(mut db) => {
            db.drop_schema(schema).unwrap();
            drop(db);
            Some(tidegate_review::PgDatabase::connect(&pg_url(), Some(schema)).unwrap())
        }
        Err(e) => {
            eprintln!("SKIPPED: no PostgreSQL at {} ({e}); set TIDEGATE_PG_URL to run this test", pg_url());
            None
        }
    }
}

fn assert_consistent(m: &mut Manager, ctx: &str) {
    let v = tpcc::check_consistency(m.database()).unwrap();
    assert!(v.is_empty(), "{ctx}: {v:#?}");
    m.check_integrity().unwrap_or_else(|e| panic!("{ctx}: graph: {e}"));
    assert_eq!(m.stats().refused_removals, 0, "{ctx}: a removal was refused");
}

/// One random sequence on `db`; returns the manager's counters.
fn sequence(
    mut db: Box<dyn Database>,
    strategy: Strategy,
    seed: u64,
    steps: u64,
    mix: [u32; 5],
) -> tidegate_review::Stats {
    // Few districts, customers and items, every loaded order delivered: transactions
    // collide often and Delivery soon reaches orders created during the run.
    let scale = Scale { warehouses: 1, districts: 2, customers: 3, items: 20 };
    tpcc::load(db.as_mut(), scale, seed).unwrap();
    let mut m = Manager::open(
        tpcc::templates().unwrap(),
        db,
        Box::new(MemoryLog::new()),
        Options { strategy, granularity: Granularity::Field },
    )
    .unwrap();
    let mut g = Generator::new(scale, seed ^ 0x5eed).with_mix(mix);
    let mut rng = SmallRng::seed_from_u64(seed);
    let ctx = |i: u64| format!("seed {seed} ({strategy:?}) step {i}; replay: TIDEGATE_REVIEW_SEED={seed}");
    assert_consistent(&mut m, &ctx(0));
    for i in 1..=steps {
        let reviewable = m.reviewable();
        if !reviewable.is_empty() && rng.gen_bool(0.3) {
            let id = reviewable[rng.gen_range(0..reviewable.len())];
            let d = if rng.gen_bool(0.5) { Decision::Remove } else { Decision::Accept };
            let st = m.review(id, d, "reviewer").unwrap_or_else(|e| panic!("{}: review refused: {e}", ctx(i)));
            if d == Decision::Remove {
                assert_eq!(st, Status::Removed, "{}", ctx(i));
            }
        } else {
            let (template, params) = g.next_request();
            let suspicious = rng.gen_bool(0.25);
            m.request(Request {
                template,
                params,
                sender: if suspicious { "llm".into() } else { "clerk".into() },
                suspicious,
            })
            .unwrap();
        }
        assert_consistent(&mut m, &ctx(i));
    }
    // Reviewers finish the queue in random order; everything settles.
    while !m.reviewable().is_empty() {
        let r = m.reviewable();
        let id = r[rng.gen_range(0..r.len())];
        m.review(id, if rng.gen_bool(0.5) { Decision::Remove } else { Decision::Accept }, "reviewer").unwrap();
        assert_consistent(&mut m, &ctx(steps + 1));
    }
    assert!(m.buffered().is_empty(), "{}: left in the buffer: {:?}", ctx(steps + 1), m.buffered());
    m.stats().clone()
}

fn run(strategy: Strategy, make: &dyn Fn(u64) -> Option<Box<dyn Database>>, default_sequences: u64) {
    let steps = env_num("TIDEGATE_REVIEW_STEPS", 60);
    let seeds: Vec<u64> = match std::env::var("TIDEGATE_REVIEW_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => (0..env_num("TIDEGATE_REVIEW_SEQUENCES", default_sequences)).map(|i| 1000 + i).collect(),
    };
    let mut total = tidegate_review::Stats::default();
    for seed in seeds {
        let Some(db) = make(seed) else { return };
        // Odd seeds run the standard mix; even ones a Delivery-heavy mix, so that Deliveries
        // reach orders of buffered New-Orders within a short sequence.
        let mix = if seed % 2 == 1 { tpcc::STANDARD_MIX } else { [40, 20, 5, 30, 5] };
        let s = sequence(db, strategy, seed, steps, mix);
        total.requests += s.requests;
        total.buffered_on_arrival += s.buffered_on_arrival;
        total.held_on_arrival += s.held_on_arrival;
        total.compensations += s.compensations;
        total.cascaded += s.cascaded;
        total.failed += s.failed;
    }
    eprintln!("{strategy:?}: {total:?}");
    assert!(total.requests > 0);
}

#[test]
fn tpcc_stays_consistent_under_random_reviews_buffer_suspicious_sqlite() {
    run(Strategy::BufferSuspicious, &|_| Some(Box::new(SqliteDatabase::memory().unwrap())), 40);
}

#[test]
fn tpcc_stays_consistent_under_random_reviews_buffer_compensating_sqlite() {
    run(Strategy::BufferCompensating, &|_| Some(Box::new(SqliteDatabase::memory().unwrap())), 40);
}

#[cfg(feature = "postgres")]
#[test]
fn tpcc_stays_consistent_under_random_reviews_buffer_suspicious_postgres() {
    run(
        Strategy::BufferSuspicious,
        &|seed| pg(&format!("tg_review_s_{seed}")).map(|d| Box::new(d) as Box<dyn Database>),
        2,
    );
}

#[cfg(feature = "postgres")]
#[test]
fn tpcc_stays_consistent_under_random_reviews_buffer_compensating_postgres() {
    run(
        Strategy::BufferCompensating,
        &|seed| pg(&format!("tg_review_c_{seed}")).map(|d| Box::new(d) as Box<dyn Database>),
        2,
    );
}

#[test]
fn every_transaction_type_commits_and_keeps_tpcc_consistent_without_review() {
    let scale = Scale::tiny();
    let mut db = SqliteDatabase::memory().unwrap();
    tpcc::load(&mut db, scale, 7).unwrap();
    let mut m = Manager::open(tpcc::templates().unwrap(), Box::new(db), Box::new(MemoryLog::new()), Options::default())
        .unwrap();
    let mut g = Generator::new(scale, 7);
    for t in [
        tpcc::TxType::NewOrder,
        tpcc::TxType::Payment,
        tpcc::TxType::OrderStatus,
        tpcc::TxType::Delivery,
        tpcc::TxType::StockLevel,
    ] {
        let (template, params) = g.of_type(t);
        let id = m
            .request(Request { template: template.clone(), params, sender: "clerk".into(), suspicious: false })
            .unwrap();
        let v = m.status(id).unwrap();
        assert!(matches!(v.status, Status::Committed | Status::Failed), "{template}: {v:?}");
        assert_consistent(&mut m, &template);
    }
    for _ in 0..200 {
        let (template, params) = g.next_request();
        m.request(Request { template, params, sender: "clerk".into(), suspicious: false }).unwrap();
    }
    assert_consistent(&mut m, "200 more");
    assert!(m.stats().failed <= 10, "only the 1% unused-item New-Orders fail: {:?}", m.stats());
}

#[test]
fn a_delivery_waits_for_an_executed_suspicious_new_order_it_could_deliver() {
    // Delivering the order of a buffered New-Order would make its removal delete a delivered
    // order (the customer's balance already counts it): the Delivery must wait.
    let scale = Scale { warehouses: 1, districts: 1, customers: 3, items: 20 };
    let mut db = SqliteDatabase::memory().unwrap();
    tpcc::load(&mut db, scale, 1).unwrap();
    let opts = Options { strategy: Strategy::BufferCompensating, granularity: Granularity::Field };
    let mut m = Manager::open(tpcc::templates().unwrap(), Box::new(db), Box::new(MemoryLog::new()), opts).unwrap();
    let mut g = Generator::new(scale, 1);
    let (t, mut p) = g.of_type(tpcc::TxType::NewOrder);
    p["lines"].as_array_mut().unwrap().retain(|l| l["ol_i_id"].as_i64().unwrap() <= 20);
    p["ol_cnt"] = p["lines"].as_array().unwrap().len().into();
    let no = m.request(Request { template: t, params: p, sender: "llm".into(), suspicious: true }).unwrap();
    assert_eq!(m.status(no).unwrap().status, Status::ExecutedAwaitingReview);
    let (t, p) = g.of_type(tpcc::TxType::Delivery);
    let del = m.request(Request { template: t, params: p, sender: "clerk".into(), suspicious: false }).unwrap();
    assert_eq!(m.status(del).unwrap().waits_for, vec![no]);
    m.review(no, Decision::Remove, "rita").unwrap();
    assert_eq!(m.status(del).unwrap().status, Status::Committed);
    assert_consistent(&mut m, "after the removal");
}
