//! The PostgreSQL store against a real PostgreSQL (`TIDEGATE_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`): the conformance suite unchanged, and the damage
//! it must refuse. Each test binary creates its own database and drops it at the end; a server
//! that is not there fails the tests (they never pass without it).

use std::sync::atomic::{AtomicU64, Ordering};

use postgres::{Client, NoTls};
use tidegate_core::Batch;
use tidegate_postgres::{PgStore, SCHEMA_VERSION};
use tidegate_storage::conformance::{self, Owned, Reopenable};
use tidegate_storage::{LedgerStore, StoreError};

mod common;
use common::{Db, admin_url};

/// A login role of this test's own, dropped after the databases that granted it anything.
struct Role {
    name: String,
}

impl Role {
    fn new(tag: &str) -> Role {
        let name = format!("{tag}_{}", std::process::id());
        let mut c = Client::connect(&admin_url(), NoTls).expect("PostgreSQL");
        c.batch_execute(&format!("DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN")).expect("create role");
        Role { name }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&admin_url(), NoTls) {
            let _ = c.batch_execute(&format!("DROP ROLE IF EXISTS {}", self.name));
        }
    }
}

fn events(tx: u64, n: u64) -> Batch {
    Batch::from((0..n).map(|i| conformance::event(tx, i)).collect::<Vec<_>>())
}

#[test]
fn the_postgres_store_passes_the_conformance_suite() {
    let db = Db::new("conf");
    let n = AtomicU64::new(0);
    let url = db.url.clone();
    let create = || PgStore::open(&url, &format!("case-{}", n.fetch_add(1, Ordering::Relaxed))).expect("open");
    let reopen = |store: PgStore| {
        let stream = store.stream().to_owned();
        store.close().expect("close");
        PgStore::open(&url, &stream).expect("reopen")
    };
    conformance::run_all(Owned::new(Reopenable::new(create, reopen), |old: &PgStore| {
        PgStore::open(&url, old.stream())
    }));
}

/// Opens a stream, appends `n` events in batches of 5, and closes it.
fn written(db: &Db, stream: &str, n: u64) {
    let store = PgStore::open(&db.url, stream).expect("open");
    for b in 0..n / 5 {
        store.append(&events(b, 5)).expect("append");
    }
    store.close().expect("close");
}

fn refused(db: &Db, stream: &str) -> StoreError {
    match PgStore::open(&db.url, stream) {
        Ok(s) => panic!("a damaged stream opened: {:?}", s.open_report()),
        Err(e) => {
            // The read-only view (what `tidegate ledger verify` uses) refuses it too.
            assert!(PgStore::open_read_only(&db.url, stream).is_err(), "the read-only view opened it: {e}");
            e
        }
    }
}

#[test]
fn damage_from_outside_is_refused_at_open_naming_what_is_wrong() {
    let db = Db::new("damage");
    let mut c = db.client();
    for s in ["tail", "gap", "body", "past", "head"] {
        written(&db, s, 20);
    }
    // The last rows deleted (a lost tail): the head still says 20.
    c.execute("DELETE FROM tidegate_events WHERE stream = 'tail' AND lsn > 17", &[]).unwrap();
    match refused(&db, "tail") {
        StoreError::Shortened { acknowledged: 20, last: 17, .. } => {}
        e => panic!("tail: {e:?}"),
    }
    c.execute("DELETE FROM tidegate_events WHERE stream = 'gap' AND lsn = 8", &[]).unwrap();
    match refused(&db, "gap") {
        StoreError::Corrupt { lsn: 8, .. } => {}
        e => panic!("gap: {e:?}"),
    }
    // One body changed, still valid JSON of a valid event: only the chain shows it.
    c.execute(
        "UPDATE tidegate_events SET body = replace(body, '\"version\":2', '\"version\":3') \
         WHERE stream = 'body' AND lsn = 3",
        &[],
    )
    .unwrap();
    match refused(&db, "body") {
        StoreError::Corrupt { lsn: 3, detail } => assert!(detail.contains("chain"), "{detail}"),
        e => panic!("body: {e:?}"),
    }
    c.execute(
        "INSERT INTO tidegate_events SELECT stream, 21, body, chain FROM tidegate_events \
         WHERE stream = 'past' AND lsn = 20",
        &[],
    )
    .unwrap();
    match refused(&db, "past") {
        StoreError::Corrupt { lsn: 21, .. } => {}
        e => panic!("past: {e:?}"),
    }
    c.execute(
        "UPDATE tidegate_streams SET last_chain = '\\x00'::bytea || substr(last_chain, 2) WHERE stream = 'head'",
        &[],
    )
    .unwrap();
    match refused(&db, "head") {
        StoreError::Unprovable { .. } => {}
        e => panic!("head: {e:?}"),
    }
    // The healthy stream beside them still opens and verifies.
    written(&db, "healthy", 10);
    let store = PgStore::open_read_only(&db.url, "healthy").expect("read-only open");
    assert_eq!(store.verify().expect("verify"), (10, 10));
}

#[test]
fn a_newer_schema_or_format_is_refused_with_the_versions() {
    let db = Db::new("newer");
    written(&db, "a", 5);
    written(&db, "b", 5);
    let mut c = db.client();
    c.execute("UPDATE tidegate_streams SET format_version = 99 WHERE stream = 'a'", &[]).unwrap();
    match PgStore::open(&db.url, "a") {
        Err(StoreError::NewerFormat { key: "format_version", found: 99, .. }) => {}
        other => panic!("{other:?}"),
    }
    // The refused open took no token.
    let token: i64 = c.query_one("SELECT token FROM tidegate_streams WHERE stream = 'a'", &[]).unwrap().get(0);
    assert_eq!(token, 1);
    c.execute("UPDATE tidegate_meta SET value = 7 WHERE key = 'schema_version'", &[]).unwrap();
    for r in [PgStore::open(&db.url, "b"), PgStore::open_read_only(&db.url, "b")] {
        match r {
            Err(e @ StoreError::NewerFormat { key: "schema_version", found: 7, .. }) => {
                assert!(e.to_string().contains(&format!("newer than {SCHEMA_VERSION}")), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_read_only_view_takes_no_token_and_sees_what_the_owner_committed() {
    let db = Db::new("ro");
    let owner = PgStore::open(&db.url, "t").expect("open");
    let l = owner.append(&events(1, 5)).unwrap();
    owner.wait_durable(l).unwrap();
    let view = PgStore::open_read_only(&db.url, "t").expect("view");
    assert_eq!(view.ownership().token, 0);
    assert!(matches!(view.append(&events(2, 1)), Err(StoreError::ReadOnly { .. })));
    assert_eq!(conformance::collect(&view, 1).unwrap().len(), 5);
    // The owner was not fenced by the view.
    let l = owner.append(&events(3, 2)).unwrap();
    owner.wait_durable(l).unwrap();
    assert!(matches!(PgStore::open_read_only(&db.url, "nope"), Err(StoreError::NotALedger { .. })));
    assert!(matches!(PgStore::open(&db.url, ""), Err(StoreError::InvalidArgument { field: "stream", .. })));
    assert!(matches!(
        PgStore::open("postgres://x@/nodb?port=nan", "t"),
        Err(StoreError::InvalidArgument { field: "store", .. })
    ));
}

#[test]
fn first_opens_racing_on_a_new_database_migrate_once() {
    let db = Db::new("race");
    let url = db.url.clone();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let s = PgStore::open(&url, &format!("s{i}")).expect("open");
                let l = s.append(&events(i, 3)).unwrap();
                s.wait_durable(l).unwrap();
                s.open_report().migrated
            })
        })
        .collect();
    let migrated = handles.into_iter().map(|h| h.join().expect("thread")).filter(|m| *m).count();
    assert_eq!(migrated, 1, "exactly one open creates the tables");
}

/// The store is used from inside an async runtime (the server): open, append, await
/// durability, scan and drop on a runtime thread must neither panic nor block the runtime.
#[test]
fn the_store_works_from_inside_an_async_runtime() {
    let db = Db::new("rt");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let store = PgStore::open(&db.url, "t").expect("open");
        let mut lsns = Vec::new();
        for b in 0..20 {
            lsns.push(store.append(&events(b, 2)).unwrap());
        }
        tidegate_storage::durable(&store, *lsns.last().unwrap()).await.unwrap();
        assert_eq!(conformance::collect(&store, 1).unwrap().len(), 40);
        assert!(store.commits() <= 20, "batches appended together share commits");
        store.put_checkpoint(40, b"cp").unwrap();
        drop(store);
        let again = PgStore::open(&db.url, "t").expect("reopen");
        assert_eq!(again.checkpoint().unwrap().map(|c| c.lsn), Some(40));
    });
}

/// The database ends the writer's connection (an administrator, a restart): the writer
/// reconnects, learns from the head whether its commit landed, and goes on; every event is in
/// the ledger exactly once. If another owner took the stream meanwhile, the handle stops with
/// `Fenced` instead.
#[test]
fn a_lost_connection_is_reconnected_and_each_event_lands_once() {
    let db = Db::new("kill");
    let kill = |c: &mut Client| {
        c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap();
    };
    let store = PgStore::open(&db.url, "t").expect("open");
    let mut c = db.client();
    let mut last = 0;
    for round in 0..5 {
        let l = store.append(&events(round, 5)).unwrap();
        store.wait_durable(l).unwrap_or_else(|e| panic!("round {round}: {e}"));
        kill(&mut c);
        last = l;
    }
    let l = store.append(&events(9, 5)).unwrap();
    store.wait_durable(l).expect("after the last kill");
    drop(store);
    let again = PgStore::open(&db.url, "t").expect("reopen");
    assert_eq!(again.last_lsn(), last + 5);
    let seen = conformance::collect(&again, 1).unwrap();
    assert_eq!(seen.len(), 30, "every event once");
    assert_eq!(seen[25].1, conformance::event(9, 0));
    drop(again);

    // Lost connection and a take-over: the old handle learns it was fenced.
    let old = PgStore::open(&db.url, "u").expect("open");
    kill(&mut c);
    let new = PgStore::open(&db.url, "u").expect("take over");
    let refused = old.append(&events(1, 1)).and_then(|l| old.wait_durable(l));
    assert!(refused.as_ref().is_err_and(StoreError::is_fenced), "{refused:?}");
    assert_eq!(new.last_lsn(), 0);
}

/// An owner appending as fast as it can while another process takes the stream: every batch
/// it was told is durable is in the ledger at its LSN, it is refused with `Fenced` from the
/// take-over on (not with a later, vaguer error), and nothing it appended after the take-over
/// is in the ledger.
#[test]
fn a_take_over_under_load_keeps_every_acknowledged_batch_and_no_later_one() {
    let db = Db::new("race_owner");
    let old = std::sync::Arc::new(PgStore::open(&db.url, "t").expect("open"));
    let writer = {
        let old = old.clone();
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            for tx in 1..u64::MAX {
                let lsn = match old.append(&events(tx, 3)) {
                    Ok(l) => l,
                    Err(e) => return (acked, e),
                };
                match old.wait_durable(lsn) {
                    Ok(()) => acked.push((lsn, tx)),
                    Err(e) => return (acked, e),
                }
            }
            unreachable!()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let new = PgStore::open(&db.url, "t").expect("take over");
    let (acked, refused) = writer.join().expect("writer thread");
    assert!(refused.is_fenced(), "the old owner must learn it was fenced: {refused:?}");
    assert!(acked.len() > 5, "the old owner committed before the take-over ({} batches)", acked.len());
    let seen = conformance::collect(&new, 1).unwrap();
    assert_eq!(seen.len() as u64, new.last_lsn());
    for (lsn, tx) in &acked {
        assert_eq!(seen[(*lsn - 1) as usize].1, conformance::event(*tx, 2), "acknowledged batch {tx} at LSN {lsn}");
    }
    let last_acked = acked.last().map_or(0, |(l, _)| *l);
    assert!(new.last_lsn() <= last_acked + 3, "at most the batch in flight at the take-over committed");
    let l = new.append(&events(0, 2)).unwrap();
    new.wait_durable(l).unwrap();
    drop(new);
    let view = PgStore::open_read_only(&db.url, "t").expect("verify");
    assert_eq!(view.verify().unwrap().0, l);
}

/// Leases: a live lease of another node refuses a take-over (retryable, naming the owner); the
/// holder renews it; a clean close ends it at once (a drain); a holder that stops renewing (its
/// connection cut) loses the stream once the lease ran out, and the next node's token fences it.
#[test]
fn a_lease_keeps_other_nodes_out_until_it_ends_or_runs_out() {
    use std::time::{Duration, Instant};
    // Node b connects as a role of its own, so the test can cut it off from the database
    // (NOLOGIN, its sessions ended): it can neither renew nor reconnect, as behind a partition.
    let role = Role::new("tg_lease_node_b");
    let db = Db::new("lease");
    let lease = Duration::from_millis(900);
    let a = PgStore::open_leased(&db.url, "t", "node-a", lease).expect("node a");
    let l = a.append(&events(1, 2)).unwrap();
    a.wait_durable(l).unwrap();
    // Renewals keep it: well past the lease, node b is still refused.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(a.renewals() >= 2, "renewed every third of the lease: {}", a.renewals());
    for refused in [PgStore::open_leased(&db.url, "t", "node-b", lease), PgStore::open(&db.url, "t")] {
        match refused {
            Err(e @ StoreError::Leased { .. }) => {
                assert!(e.retryable(), "{e}");
                assert!(e.to_string().contains("node-a"), "{e}");
            }
            other => panic!("took a stream under a live lease: {other:?}"),
        }
    }
    let owners = PgStore::owners(&db.url).unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].owner.as_deref(), Some("node-a"));
    assert!(owners[0].lease_left_ms.is_some_and(|ms| ms <= 900), "{owners:?}");
    // The same node may take its own stream back (a restart before the lease ran out); the
    // earlier handle is fenced.
    let a2 = PgStore::open_leased(&db.url, "t", "node-a", lease).expect("node a again");
    let stale = a.append(&events(2, 1)).and_then(|l| a.wait_durable(l));
    assert!(stale.is_err_and(|e| e.is_fenced()), "the first handle of node a is fenced");
    drop(a);
    // A drain: a clean close ends the lease, node b takes over at once.
    a2.close().unwrap();
    db.client()
        .batch_execute(&format!(
            "GRANT ALL ON SCHEMA public TO {r}; GRANT ALL ON ALL TABLES IN SCHEMA public TO {r}",
            r = role.name
        ))
        .unwrap();
    let b_url = db.url.replacen("postgres@", &format!("{}@", role.name), 1);
    assert_ne!(b_url, db.url, "the test URL names the postgres user");
    let started = Instant::now();
    let b = PgStore::open_leased(&b_url, "t", "node-b", lease).expect("node b after a's close");
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(b.last_lsn(), 2);
    // Node b is cut off from the database: it cannot renew, its lease runs out, node c takes
    // the stream, and b never appends again.
    let mut c = db.client();
    c.batch_execute(&format!("ALTER ROLE {} NOLOGIN", role.name)).unwrap();
    c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", &[&role.name]).unwrap();
    let started = Instant::now();
    let taken = loop {
        match PgStore::open_leased(&db.url, "t", "node-c", lease) {
            Ok(s) => break s,
            Err(StoreError::Leased { owner, .. }) => assert_eq!(owner, "node-b"),
            Err(e) => panic!("{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the cut-off lease never ran out");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(started.elapsed() >= Duration::from_millis(200), "took the stream before b's lease ran out");
    let refused = b.append(&events(9, 1)).and_then(|l| b.wait_durable(l));
    assert!(refused.is_err(), "the cut-off owner appended after the take-over");
    assert_eq!(taken.last_lsn(), 2);
    assert!(matches!(
        PgStore::open_leased(&db.url, "t", "node-d", Duration::from_millis(10)),
        Err(StoreError::InvalidArgument { field: "lease", .. })
    ));
}

/// The child side of [`a_paused_owner_is_fenced_when_it_continues`]: run by that test as a
/// separate process (this test binary again, with `TIDEGATE_PG_CHILD_URL` set). It takes the
/// stream under a lease and appends one event at a time, printing `acked <lsn> <tx>` for each
/// acknowledged one and `refused <fenced>` when the store refuses it, then exits.
#[test]
fn child_owner_appending_until_refused() {
    use std::io::Write;
    let Ok(url) = std::env::var("TIDEGATE_PG_CHILD_URL") else {
        return; // Only meaningful as the child process.
    };
    let store =
        PgStore::open_leased(&url, "paused", "child", std::time::Duration::from_millis(900)).expect("child open");
    let mut out = std::io::stdout().lock();
    for tx in 1..u64::MAX {
        match store.append(&events(tx, 1)).and_then(|l| store.wait_durable(l).map(|()| l)) {
            Ok(lsn) => writeln!(out, "acked {lsn} {tx}").unwrap(),
            Err(e) => {
                writeln!(out, "refused {}", e.is_fenced()).unwrap();
                out.flush().unwrap();
                return;
            }
        }
        out.flush().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// SIGSTOP an owner (a separate process holding the stream under a lease) while it appends,
/// let its lease run out and another node take the stream, then SIGCONT it: its next write is
/// refused by the database as fenced, every event it was told is durable is in the ledger at
/// its LSN, and no event of it follows the take-over.
#[test]
fn a_paused_owner_is_fenced_when_it_continues() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::Duration;
    let db = Db::new("paused");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_owner_appending_until_refused", "--nocapture", "--test-threads=1"])
        .env("TIDEGATE_PG_CHILD_URL", &db.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child owner");
    let pid = child.id().to_string();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = Vec::new();
    let parse = |line: &str| -> Option<(u64, u64)> {
        let mut w = line.strip_prefix("acked ")?.split(' ');
        Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
    };
    while acked.len() < 20 {
        let line = lines.next().expect("the child stopped early").unwrap();
        acked.extend(parse(&line));
    }
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    // What the child printed before it stopped (a line may still be in the pipe).
    std::thread::sleep(Duration::from_millis(1_500));
    let new = loop {
        match PgStore::open_leased(&db.url, "paused", "parent", Duration::from_millis(900)) {
            Ok(s) => break s,
            Err(StoreError::Leased { .. }) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("{e}"),
        }
    };
    let taken_at = new.last_lsn();
    let mine = new.append(&events(1_000_000, 3)).unwrap();
    new.wait_durable(mine).unwrap();
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let mut refused = None;
    for line in lines {
        let line = line.unwrap();
        if let Some(a) = parse(&line) {
            acked.push(a);
        } else if let Some(f) = line.strip_prefix("refused ") {
            refused = Some(f == "true");
        }
    }
    let _ = child.wait();
    assert_eq!(refused, Some(true), "the continued owner must be refused as fenced");
    let seen = conformance::collect(&new, 1).unwrap();
    assert_eq!(seen.len() as u64, taken_at + 3, "nothing of the old owner after the take-over");
    for (lsn, tx) in &acked {
        assert!(*lsn <= taken_at, "the old owner was acknowledged LSN {lsn} after the take-over at {taken_at}");
        assert_eq!(seen[(*lsn - 1) as usize].1, conformance::event(*tx, 0), "acknowledged LSN {lsn}");
    }
    drop(new);
    let view = PgStore::open_read_only(&db.url, "paused").unwrap();
    assert_eq!(view.verify().unwrap().0, taken_at + 3);
}
