//! The conformance suite every [`TenantState`] implementation passes (run below once per
//! implementation; a later PostgreSQL one runs the same functions), and the durable
//! implementation's own tests: reopening the same directory, and damaged files.
#![allow(clippy::unwrap_used)] // tests unwrap by design

use serde_json::{Value, json};

use super::*;
use crate::dispatch::queue::{TaskRefusal, TaskResult};
use crate::dispatch::{Attempt, Operation};
use crate::idempotency::{Begin, Fingerprint, Recorded};

const LIMITS: Limits = Limits { idempotency_ttl_ms: 60_000, idempotency_max: 100, attempts_retained: 100 };

fn fp(body: Value) -> Fingerprint {
    Fingerprint { method: "POST".into(), path: "/v1/calls".into(), body }
}

fn response(n: u8) -> Recorded {
    Recorded {
        status: 201,
        content_type: Some("application/json".into()),
        location: Some(format!("/v1/transactions/tx_{n}")),
        body: vec![b'{', n, 0, 255, b'}'],
    }
}

fn spec(cap: &str, op: Operation, key: &str) -> TaskSpec {
    TaskSpec {
        capability: cap.into(),
        operation: op,
        tool: "book".into(),
        key: key.into(),
        effect_key: key.trim_end_matches("#compensate").into(),
        args: json!({"id": key}),
        output: (op == Operation::Compensate).then(|| json!({"receipt": key})),
    }
}

fn attempt(n: u32) -> Attempt {
    Attempt {
        operation: Operation::Release,
        capability: "mailer".into(),
        kind: "webhook".into(),
        attempt: n,
        key: "k".into(),
        started_at_ms: u64::from(n),
        finished_at_ms: Some(u64::from(n) + 1),
        result: "done".into(),
        detail: "2xx".into(),
    }
}

fn record(e: Enqueued) -> TaskRecord {
    match e {
        Enqueued::New(r) | Enqueued::Adopted(r) => r,
        Enqueued::Settled(r, _) => panic!("unexpected settled task {r:?}"),
    }
}

fn done(v: Value) -> TaskResult {
    TaskResult::Done { output: v, residue: None }
}

/// Idempotency: first use, in progress, replay byte for byte, mismatch, a freed key.
pub(super) async fn idempotency_replays_and_refuses(s: &TenantState) {
    let i = &s.idempotency;
    assert_eq!(i.begin("k", fp(json!({"a": 1})), 1_000).await.unwrap(), Begin::Proceed);
    assert_eq!(i.begin("k", fp(json!({"a": 1})), 1_001).await.unwrap(), Begin::InProgress);
    match i.begin("k", fp(json!({"a": 2})), 1_002).await.unwrap() {
        Begin::Mismatch(d) => assert!(d.contains("`body.a` was 1 and is now 2"), "{d}"),
        other => panic!("{other:?}"),
    }
    i.finish("k", Some(response(7))).await.unwrap();
    assert_eq!(i.begin("k", fp(json!({"a": 1})), 1_003).await.unwrap(), Begin::Replay(response(7)));
    // Finishing again changes nothing: the first response stays.
    i.finish("k", Some(response(8))).await.unwrap();
    i.finish("k", None).await.unwrap();
    assert_eq!(i.begin("k", fp(json!({"a": 1})), 1_004).await.unwrap(), Begin::Replay(response(7)));
    // A request that took no effect frees its key for any request.
    assert_eq!(i.begin("free", fp(json!(1)), 1_005).await.unwrap(), Begin::Proceed);
    i.finish("free", None).await.unwrap();
    assert_eq!(i.begin("free", fp(json!(2)), 1_006).await.unwrap(), Begin::Proceed);
}

/// Idempotency bounds: count (oldest completed first, running kept) and age.
pub(super) async fn idempotency_bounds(s: &TenantState) {
    let i = &s.idempotency;
    // The limits of this state: at most 2 records, 60 s.
    assert_eq!(i.begin("running", fp(json!(0)), 0).await.unwrap(), Begin::Proceed);
    for (t, k) in [(1, "a"), (2, "b"), (3, "c")] {
        assert_eq!(i.begin(k, fp(json!(1)), t).await.unwrap(), Begin::Proceed);
        i.finish(k, Some(response(1))).await.unwrap();
    }
    // The running record is never dropped by the bounds; "a" and "b" were.
    assert_eq!(i.begin("running", fp(json!(0)), 4).await.unwrap(), Begin::InProgress);
    assert!(matches!(i.begin("c", fp(json!(1)), 5).await.unwrap(), Begin::Replay(_)));
    assert_eq!(i.begin("a", fp(json!(1)), 6).await.unwrap(), Begin::Proceed);
    i.finish("a", Some(response(2))).await.unwrap();
    // Age: a completed record begun more than the TTL ago is gone; within it, kept.
    assert!(matches!(i.begin("a", fp(json!(1)), 6 + 60_000).await.unwrap(), Begin::Replay(_)));
    assert_eq!(i.begin("a", fp(json!(1)), 6 + 60_001).await.unwrap(), Begin::Proceed);
    assert_eq!(i.begin("running", fp(json!(0)), 10 * 60_000).await.unwrap(), Begin::InProgress);
}

/// Tasks: queue, lease (per capability, lowest number first), heartbeat, report, refusals.
pub(super) async fn tasks_lease_heartbeat_report(s: &TenantState) {
    let t = &s.tasks;
    let a1 = record(t.enqueue(spec("a", Operation::Release, "k1"), 1, 1_000).await.unwrap());
    let a2 = record(t.enqueue(spec("a", Operation::Release, "k2"), 1, 1_000).await.unwrap());
    let b1 = record(t.enqueue(spec("b", Operation::Compensate, "k3#compensate"), 1, 1_000).await.unwrap());
    assert!(a1.n < a2.n && a2.n < b1.n, "numbers grow");
    assert_eq!(t.depth().await.unwrap(), (3, 0));
    let caps = ["b".to_owned(), "a".to_owned()];
    let got = t.lease("w", &caps, 2, None, 10_000).await.unwrap();
    assert_eq!(got.iter().map(|r| r.n).collect::<Vec<_>>(), vec![b1.n, a1.n], "capabilities in order, lowest first");
    assert_eq!(got[0].lease, Some(TaskLease { worker: "w".into(), until_ms: 11_000 }));
    assert_eq!(got[0].spec.output, Some(json!({"receipt": "k3#compensate"})));
    assert!(got[0].ever_leased);
    assert_eq!(t.depth().await.unwrap(), (1, 2));
    assert_eq!(t.next_expiry().await.unwrap(), Some(11_000));
    let listed = t.list().await.unwrap();
    assert_eq!(listed.iter().map(|r| r.n).collect::<Vec<_>>(), vec![a1.n, a2.n, b1.n]);

    assert_eq!(t.heartbeat(a1.n, "other", None, 10_500).await.unwrap(), Err(TaskRefusal::NotLeased));
    assert_eq!(t.heartbeat(a2.n, "w", None, 10_500).await.unwrap(), Err(TaskRefusal::NotLeased), "not leased");
    let hb = t.heartbeat(a1.n, "w", Some(5_000), 10_500).await.unwrap().unwrap();
    assert_eq!(hb.lease.map(|l| l.until_ms), Some(15_500));
    assert_eq!(t.heartbeat(999_999, "w", None, 10_500).await.unwrap(), Err(TaskRefusal::NotFound));

    assert_eq!(t.report(a1.n, "other", done(json!(1))).await.unwrap(), Err(TaskRefusal::NotLeased));
    let rep = t.report(a1.n, "w", done(json!({"ok": true}))).await.unwrap().unwrap();
    assert!(rep.waited);
    assert_eq!((rep.record.n, rep.record.attempt), (a1.n, 1));
    assert_eq!(t.report(a1.n, "w", TaskResult::Failed("late".into())).await.unwrap(), Err(TaskRefusal::Settled));
    assert_eq!(t.heartbeat(a1.n, "w", None, 10_600).await.unwrap(), Err(TaskRefusal::Settled));
    assert_eq!(t.outcome(a1.n).await.unwrap(), Some((done(json!({"ok": true})), 1)));
    assert_eq!(t.outcome(a2.n).await.unwrap(), None, "unsettled");
    assert_eq!(t.report(b1.n, "w", TaskResult::Unknown("lost".into())).await.unwrap().map(|r| r.waited), Ok(true));
    assert_eq!(t.outcome(b1.n).await.unwrap(), Some((TaskResult::Unknown("lost".into()), 1)));
    assert_eq!(t.depth().await.unwrap(), (1, 0));
    assert_eq!(t.drop_carried_over(u64::MAX).await.unwrap(), 0, "nothing of this opening is carried over");
}

/// Tasks: an expired lease returns the task to the queue with the next attempt; a worker
/// that held it may still report.
pub(super) async fn tasks_expire_and_withdraw(s: &TenantState) {
    let t = &s.tasks;
    let r = record(t.enqueue(spec("a", Operation::Probe, "k"), 1, 100).await.unwrap());
    assert_eq!(t.lease("w1", &["a".to_owned()], 5, None, 1_000).await.unwrap().len(), 1);
    assert!(t.expire(1_099).await.unwrap().is_empty());
    let expired = t.expire(1_100).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!((expired[0].attempt, expired[0].lease.as_ref().map(|l| l.worker.as_str())), (1, Some("w1")));
    assert_eq!(t.next_expiry().await.unwrap(), None);
    let again = t.lease("w2", &["a".to_owned()], 5, Some(1_000), 2_000).await.unwrap();
    assert_eq!((again[0].n, again[0].attempt), (r.n, 2));
    assert_eq!(t.heartbeat(r.n, "w1", None, 2_001).await.unwrap(), Err(TaskRefusal::NotLeased));
    // The first holder's late report is accepted: the work was done under the same key.
    let rep = t.report(r.n, "w1", TaskResult::Transient("busy".into())).await.unwrap().unwrap();
    assert_eq!(rep.record.attempt, 2);
    assert_eq!(t.outcome(r.n).await.unwrap(), Some((TaskResult::Transient("busy".into()), 2)));

    // Withdrawal: once, then settled; a report after it is refused.
    let w = record(t.enqueue(spec("a", Operation::Call, "k2"), 3, 100).await.unwrap());
    assert_eq!(w.attempt, 3);
    t.lease("w1", &["a".to_owned()], 1, None, 3_000).await.unwrap();
    match t.withdraw(w.n).await.unwrap() {
        Withdrawn::Open(rec) => assert!(rec.ever_leased),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.withdraw(w.n).await.unwrap(), Withdrawn::Settled);
    assert_eq!(t.withdraw(888_888).await.unwrap(), Withdrawn::Unknown);
    assert_eq!(t.report(w.n, "w1", done(Value::Null)).await.unwrap(), Err(TaskRefusal::Settled));
    assert_eq!(t.outcome(w.n).await.unwrap(), None, "withdrawn without a result");
    assert!(t.list().await.unwrap().is_empty());
    assert_eq!(t.depth().await.unwrap(), (0, 0));
}

/// Attempts: per key in order, at most [`ATTEMPTS_PER_KEY`], the newest keys kept.
pub(super) async fn attempts_bounds(s: &TenantState) {
    let a = &s.attempts;
    for n in 1..=(ATTEMPTS_PER_KEY as u32 + 6) {
        a.record("k1", attempt(n)).await.unwrap();
    }
    let got = a.list("k1").await.unwrap();
    assert_eq!(got.len(), ATTEMPTS_PER_KEY);
    assert_eq!(got[0], attempt(7), "the oldest dropped");
    assert_eq!(got.last(), Some(&attempt(ATTEMPTS_PER_KEY as u32 + 6)));
    // This state keeps 2 keys: a third drops the oldest.
    a.record("k2", attempt(1)).await.unwrap();
    a.record("k3", attempt(1)).await.unwrap();
    assert!(a.list("k1").await.unwrap().is_empty());
    assert_eq!(a.list("k2").await.unwrap(), vec![attempt(1)]);
    assert!(a.list("none").await.unwrap().is_empty());
}

/// Records nobody waits on (which a store may gather into one write) keep the same bounds
/// and order as waited ones, and a read right after them sees them all.
pub(super) async fn unwaited_attempts_keep_the_bounds(s: &TenantState) {
    let a = &s.attempts;
    let per_key = ATTEMPTS_PER_KEY as u32 + 100;
    for key in ["u1", "u2", "u3"] {
        for n in 1..=per_key {
            a.record_unwaited(key, attempt(n));
        }
    }
    // This state keeps 2 keys: `u1` is gone, the two newest hold their newest attempts.
    assert!(a.list("u1").await.unwrap().is_empty());
    for key in ["u2", "u3"] {
        let got = a.list(key).await.unwrap();
        assert_eq!(got.len(), ATTEMPTS_PER_KEY, "{key}");
        assert_eq!(got[0], attempt(per_key - ATTEMPTS_PER_KEY as u32 + 1), "{key}: the oldest dropped");
        assert_eq!(got.last(), Some(&attempt(per_key)), "{key}");
    }
    // A waited record after unwaited ones comes after them.
    a.record_unwaited("u3", attempt(per_key + 1));
    a.record("u3", attempt(per_key + 2)).await.unwrap();
    let got = a.list("u3").await.unwrap();
    assert_eq!(&got[got.len() - 2..], &[attempt(per_key + 1), attempt(per_key + 2)]);
}

/// Operations are submitted when called: a future dropped unpolled still takes effect, in
/// order.
pub(super) async fn operations_take_effect_unpolled(s: &TenantState) {
    drop(s.idempotency.begin("k", fp(json!(1)), 1));
    drop(s.idempotency.finish("k", Some(response(3))));
    drop(s.attempts.record("k", attempt(1)));
    assert_eq!(s.idempotency.begin("k", fp(json!(1)), 2).await.unwrap(), Begin::Replay(response(3)));
    assert_eq!(s.attempts.list("k").await.unwrap(), vec![attempt(1)]);
}

async fn run_all(make: impl Fn(Limits) -> TenantState) {
    idempotency_replays_and_refuses(&make(LIMITS)).await;
    idempotency_bounds(&make(Limits { idempotency_max: 2, ..LIMITS })).await;
    tasks_lease_heartbeat_report(&make(LIMITS)).await;
    tasks_expire_and_withdraw(&make(LIMITS)).await;
    attempts_bounds(&make(Limits { attempts_retained: 2, ..LIMITS })).await;
    unwaited_attempts_keep_the_bounds(&make(Limits { attempts_retained: 2, ..LIMITS })).await;
    operations_take_effect_unpolled(&make(LIMITS)).await;
}

#[tokio::test]
async fn memory_state_conforms() {
    run_all(TenantState::memory).await;
}

#[tokio::test]
async fn sqlite_state_conforms() {
    let root = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicUsize::new(0);
    run_all(|limits| {
        let dir = root.path().join(n.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_string());
        TenantState::open_sqlite(&dir, limits, "t").unwrap()
    })
    .await;
}

#[tokio::test]
async fn sqlite_state_writes_gathered_attempts_before_it_closes() {
    let root = tempfile::tempdir().unwrap();
    let s = TenantState::open_sqlite(root.path(), LIMITS, "t").unwrap();
    for n in 1..=10 {
        s.attempts.record_unwaited("k", attempt(n));
    }
    s.close();
    let s = TenantState::open_sqlite(root.path(), LIMITS, "t").unwrap();
    assert_eq!(s.attempts.list("k").await.unwrap(), (1..=10).map(attempt).collect::<Vec<_>>());
}

/// A database of this test's own on the PostgreSQL at `TIDEGATE_PG_URL` (default
/// `postgres://postgres@127.0.0.1:5432/test`), dropped at the end. The tests fail without it.
struct PgDb {
    name: String,
    url: String,
}

fn admin_url() -> String {
    std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs `f` on a plain thread (the blocking client must not run on an async test's thread).
fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

impl PgDb {
    fn new(tag: &str) -> PgDb {
        off_runtime(|| PgDb::create(tag))
    }

    fn create(tag: &str) -> PgDb {
        let name = format!("tidegate_state_{tag}_{}", std::process::id());
        let admin = admin_url();
        let mut c = ::postgres::Client::connect(&admin, ::postgres::NoTls)
            .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin} (TIDEGATE_PG_URL): {e}"));
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b).to_owned();
        PgDb { url: format!("{base}/{name}"), name }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let name = &self.name;
        off_runtime(|| {
            if let Ok(mut c) = ::postgres::Client::connect(&admin_url(), ::postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        });
    }
}

#[tokio::test]
async fn postgres_state_conforms() {
    let db = PgDb::new("conf");
    let n = std::sync::atomic::AtomicUsize::new(0);
    run_all(|limits| {
        let tenant = format!("t{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        TenantState::open_postgres(&db.url, limits, &tenant).unwrap()
    })
    .await;
}

/// What a restart keeps: completed records replay, running ones are gone, leased tasks are
/// still known (heartbeat, report), carried-over tasks are adopted by the same dispatch or
/// dropped when recovery ends, attempts survive, task numbers go on.
#[tokio::test]
async fn the_durable_state_outlives_its_process() {
    let dir = tempfile::tempdir().unwrap();
    outlives_its_process(|| TenantState::open_sqlite(dir.path(), LIMITS, "t").unwrap()).await;
}

/// The same on PostgreSQL, where "the next process" is the next node to take the tenant; a
/// second tenant in the same tables is untouched by the first one's carry-over.
#[tokio::test]
async fn the_postgres_state_outlives_its_node() {
    let db = PgDb::new("restart");
    let other = TenantState::open_postgres(&db.url, LIMITS, "other").unwrap();
    let kept = record(other.tasks.enqueue(spec("x", Operation::Release, "o"), 1, 1_000).await.unwrap());
    outlives_its_process(|| TenantState::open_postgres(&db.url, LIMITS, "t").unwrap()).await;
    assert_eq!(other.tasks.list().await.unwrap().iter().map(|r| r.n).collect::<Vec<_>>(), vec![kept.n]);
    other.close();
    // A newer state schema is refused, naming both versions.
    off_runtime(|| {
        let mut c = ::postgres::Client::connect(&db.url, ::postgres::NoTls).unwrap();
        c.execute("UPDATE tidegate_meta SET value = 9 WHERE key = 'state_schema_version'", &[]).unwrap();
    });
    match TenantState::open_postgres(&db.url, LIMITS, "t") {
        Err(StateError::Version { found: 9, supported: PG_STATE_SCHEMA_VERSION, .. }) => {}
        other => panic!("{other:?}"),
    }
}

async fn outlives_its_process(open: impl Fn() -> TenantState) {
    let s = open();
    s.idempotency.begin("done", fp(json!({"tool": "send"})), 1_000).await.unwrap();
    s.idempotency.finish("done", Some(response(9))).await.unwrap();
    s.idempotency.begin("running", fp(json!(1)), 1_000).await.unwrap();
    let t = &s.tasks;
    // A compensation leased and reported after the restart, a compensation still queued, a
    // release leased (recovery probes it, never sends it again), a probe leased and adopted.
    let comp = record(t.enqueue(spec("undo", Operation::Compensate, "a#compensate"), 1, 60_000).await.unwrap());
    let queued = record(t.enqueue(spec("undo", Operation::Compensate, "b#compensate"), 1, 60_000).await.unwrap());
    let release = record(t.enqueue(spec("mail", Operation::Release, "m"), 1, 60_000).await.unwrap());
    let probe = record(t.enqueue(spec("mail-probe", Operation::Probe, "p"), 1, 60_000).await.unwrap());
    let caps: Vec<String> = ["undo", "mail", "mail-probe"].map(String::from).to_vec();
    assert_eq!(t.lease("w", &caps[..1], 1, None, 10_000).await.unwrap()[0].n, comp.n);
    assert_eq!(t.lease("w", &caps[1..], 2, None, 10_000).await.unwrap().len(), 2);
    // A call leased with a lease ending at 15 000, reported after the restart and adopted late.
    let late = record(t.enqueue(spec("late", Operation::Compensate, "l#compensate"), 1, 5_000).await.unwrap());
    assert_eq!(t.lease("w", &["late".to_owned()], 1, None, 10_000).await.unwrap()[0].n, late.n);
    s.attempts.record("a", attempt(1)).await.unwrap();
    s.close();
    assert!(matches!(s.tasks.list().await, Err(StateError::Closed)), "a closed state refuses");
    drop(s);

    let s = open();
    let t = &s.tasks;
    assert_eq!(
        s.idempotency.begin("done", fp(json!({"tool": "send"})), 2_000).await.unwrap(),
        Begin::Replay(response(9)),
        "a completed record replays the same response"
    );
    assert_eq!(
        s.idempotency.begin("running", fp(json!(1)), 2_000).await.unwrap(),
        Begin::Proceed,
        "a record running at the stop is gone"
    );
    assert!(t.list().await.unwrap().is_empty(), "carried-over tasks wait for their dispatch");
    assert!(t.report(late.n, "w", done(json!("late"))).await.unwrap().is_ok_and(|r| !r.waited));
    assert!(t.lease("w2", &caps, 10, None, 20_000).await.unwrap().is_empty(), "and are not offered");
    // The worker holding a lease from before the restart is still known.
    let hb = t.heartbeat(probe.n, "w", Some(30_000), 20_000).await.unwrap().unwrap();
    assert_eq!(hb.lease.map(|l| l.until_ms), Some(50_000));
    let rep = t.report(comp.n, "w", done(json!("undone"))).await.unwrap().unwrap();
    assert!(!rep.waited, "no dispatch waits yet: the result is kept");
    // Recovery dispatches the compensations and the probe again: they adopt their tasks.
    match t.enqueue(spec("undo", Operation::Compensate, "a#compensate"), 1, 60_000).await.unwrap() {
        Enqueued::Settled(r, result) => assert_eq!((r.n, result), (comp.n, done(json!("undone")))),
        other => panic!("{other:?}"),
    }
    match t.enqueue(spec("undo", Operation::Compensate, "b#compensate"), 1, 60_000).await.unwrap() {
        Enqueued::Adopted(r) => assert_eq!((r.n, r.lease), (queued.n, None)),
        other => panic!("{other:?}"),
    }
    match t.enqueue(spec("mail-probe", Operation::Probe, "p"), 1, 60_000).await.unwrap() {
        Enqueued::Adopted(r) => assert_eq!((r.n, r.lease.map(|l| l.worker)), (probe.n, Some("w".into()))),
        other => panic!("{other:?}"),
    }
    assert_eq!(t.drop_carried_over(14_999).await.unwrap(), 0, "a reported result is kept until its lease end");
    match t.enqueue(spec("late", Operation::Compensate, "l#compensate"), 1, 5_000).await.unwrap() {
        Enqueued::Settled(r, result) => assert_eq!((r.n, result), (late.n, done(json!("late")))),
        other => panic!("{other:?}"),
    }
    // A second dispatch of the same operation and key while the first waits gets a new task.
    let fresh = record(t.enqueue(spec("undo", Operation::Compensate, "b#compensate"), 1, 60_000).await.unwrap());
    assert!(fresh.n > probe.n, "numbers go on after a restart");
    assert_eq!(t.list().await.unwrap().iter().map(|r| r.n).collect::<Vec<_>>(), vec![queued.n, probe.n, fresh.n]);
    let offered = t.lease("w2", &caps[..1], 1, None, 20_000).await.unwrap();
    assert_eq!(offered[0].n, queued.n, "an adopted task is offered again");
    let rep = t.report(probe.n, "w", done(json!(true))).await.unwrap().unwrap();
    assert!(rep.waited);
    // Recovery has ended. The release nobody adopted (recovery probes a started release) is
    // still known while its lease runs: its worker may still report; it is never offered.
    assert_eq!(t.drop_carried_over(69_999).await.unwrap(), 0);
    assert_eq!(t.heartbeat(release.n, "w", Some(1), 69_999).await.unwrap().map(|r| r.n), Ok(release.n));
    assert_eq!(t.drop_carried_over(70_000).await.unwrap(), 1, "dropped once its lease ended");
    assert_eq!(t.report(release.n, "w", done(Value::Null)).await.unwrap(), Err(TaskRefusal::Settled));
    assert_eq!(s.attempts.list("a").await.unwrap(), vec![attempt(1)], "attempts survive");
    s.close();
}

#[tokio::test]
async fn a_damaged_state_file_is_a_typed_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_FILE);
    std::fs::write(&path, b"this is not a SQLite database, it is some text long enough to be read").unwrap();
    match TenantState::open_sqlite(dir.path(), LIMITS, "t") {
        Err(e @ StateError::Corrupt { .. }) => {
            assert!(!e.retryable());
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()) && text.contains("move it aside"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // The file is left as it was: nothing is reset behind the operator's back.
    assert!(std::fs::read(&path).unwrap().starts_with(b"this is not"));
}

#[tokio::test]
async fn a_newer_or_foreign_state_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(TenantState::open_sqlite(dir.path(), LIMITS, "t").unwrap());
    let conn = rusqlite::Connection::open(dir.path().join(STATE_FILE)).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    assert!(matches!(
        TenantState::open_sqlite(dir.path(), LIMITS, "t"),
        Err(StateError::Version { found: 99, supported: 1, .. })
    ));
    let other = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(other.path().join(STATE_FILE)).unwrap();
    conn.execute_batch("CREATE TABLE something(x)").unwrap();
    drop(conn);
    assert!(matches!(TenantState::open_sqlite(other.path(), LIMITS, "t"), Err(StateError::Corrupt { .. })));
}

#[tokio::test]
async fn a_row_that_does_not_decode_is_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let s = TenantState::open_sqlite(dir.path(), LIMITS, "t").unwrap();
    let r = record(s.tasks.enqueue(spec("a", Operation::Call, "k"), 1, 100).await.unwrap());
    s.idempotency.begin("k", fp(json!(1)), 1).await.unwrap();
    s.idempotency.finish("k", Some(response(1))).await.unwrap();
    let conn = rusqlite::Connection::open(dir.path().join(STATE_FILE)).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    conn.execute("UPDATE tasks SET args = '{not json' WHERE n = ?1", [r.n as i64]).unwrap();
    conn.execute("UPDATE idempotency SET body = 'nope'", []).unwrap();
    drop(conn);
    assert!(matches!(s.tasks.list().await, Err(StateError::Corrupt { .. })));
    assert!(matches!(s.idempotency.begin("k", fp(json!(1)), 2).await, Err(StateError::Corrupt { .. })));
    s.close();
}
