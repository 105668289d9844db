//! The embedded store's own behaviour: the data directory, versions, torn tails, group
//! commit, write failures and injected crashes.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use serde_json::Value;
use tidegate_core::{EffectId, Event, TxId};
use tidegate_sqlite::{Options, SqliteStore, TestHooks, Verify};
use tidegate_storage::conformance::{collect, event};
use tidegate_storage::wire::Chain;
use tidegate_storage::{LedgerStore, Lsn, StoreError, durable, fsync_per_s};

fn append(store: &dyn LedgerStore, events: Vec<Event>) -> Result<Lsn, StoreError> {
    store.append(&tidegate_core::Batch::from(events))
}

fn events(tx: u64, n: u64) -> Vec<Event> {
    (0..n).map(|i| event(tx, i)).collect()
}

/// Options for deterministic crash tests: syncs happen only when someone waits.
fn on_demand() -> Options {
    Options { idle_flush_ms: None, ..Options::default() }
}

fn db(dir: &Path) -> Connection {
    Connection::open(dir.join("ledger.db")).unwrap()
}

/// The high-water mark file's bytes now, to put back later: as if the rows appended after
/// this point had been committed to SQLite but a crash had come before their mark was
/// written (the only way a ledger legitimately holds rows above its mark).
fn save_mark(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join(tidegate_sqlite::HEAD_FILE)).unwrap()
}

fn restore_mark(dir: &Path, bytes: &[u8]) {
    std::fs::write(dir.join(tidegate_sqlite::HEAD_FILE), bytes).unwrap();
}

fn all(store: &dyn LedgerStore) -> Vec<Event> {
    collect(store, 1).unwrap().into_iter().map(|(_, e)| e).collect()
}

#[test]
fn open_creates_the_directory_in_wal_mode_and_reports_a_new_ledger() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("a/b/data");
    let store = SqliteStore::open(&dir).unwrap();
    let report = store.open_report().clone();
    assert!(report.created);
    assert_eq!(
        (report.last_lsn, report.rows_verified, report.format_version),
        (0, 0, tidegate_core::ledger::LEDGER_FORMAT_VERSION)
    );
    assert!(report.cut_rows.is_empty());
    assert_eq!(report.path, dir.join("ledger.db"));
    assert!(report.to_string().starts_with("created ledger"), "{report}");
    append(&store, events(1, 3)).unwrap();
    store.close().unwrap();

    let conn = db(&dir);
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    drop(conn);
    let store = SqliteStore::open(&dir).unwrap();
    assert!(!store.open_report().created);
    assert_eq!(store.open_report().rows_verified, 3);
    assert_eq!(store.verify().unwrap().rows, 3);
}

#[test]
fn schema_and_record_format_match_the_ledger_doc() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    let executed = Event::EffectExecuted { tx: TxId(7), effect: EffectId(2), output: Arc::new(Value::from("ok")) };
    append(&store, vec![event(7, 1), executed.clone()]).unwrap();
    store.close().unwrap();

    let conn = db(root.path());
    let meta: Vec<(String, String)> = conn
        .prepare("SELECT key, value FROM meta ORDER BY key")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let keys: Vec<&str> = meta.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["format_version", "ledger_id", "owner_token", "schema_version", "written_by"]);
    assert_eq!(meta[0].1, tidegate_core::ledger::LEDGER_FORMAT_VERSION.to_string());
    assert!(meta[1].1.len() == 32 && meta[1].1.chars().all(|c| c.is_ascii_hexdigit()), "{:?}", meta[1]);
    assert_eq!(meta[2].1, "1", "the first open for writing owns the stream with token 1");
    assert_eq!(meta[3].1, tidegate_sqlite::SCHEMA_VERSION.to_string());
    assert!(meta[4].1.starts_with("tidegate-sqlite "));
    let rows: Vec<(i64, i64, String, String)> = conn
        .prepare("SELECT lsn, tx, kind, body FROM events ORDER BY lsn")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Each row's chain value follows from the one before it (docs/ledger.md, "Integrity").
    let id: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&meta[1].1[2 * i..2 * i + 2], 16).unwrap()).collect();
    let mut prev = Chain::genesis(&id);
    let chains: Vec<Vec<u8>> = conn
        .prepare("SELECT chain FROM events ORDER BY lsn")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    for (i, (lsn, _, _, body)) in rows.iter().enumerate() {
        prev = prev.next(*lsn as u64, body.as_bytes());
        assert_eq!(chains[i], prev.0.to_vec(), "chain value of LSN {lsn}");
    }
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].0, rows[0].1, rows[0].2.as_str()), (1, 7, "read"));
    assert_eq!((rows[1].0, rows[1].1, rows[1].2.as_str()), (2, 7, "effect_executed"));
    assert_eq!(rows[1].3, tidegate_storage::wire::encode(0, &executed).unwrap());
    assert_eq!(rows[1].3, r#"{"event":"effect_executed","tx":7,"effect":2,"output":"ok"}"#);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused_as_held_by_another_process() {
    let root = tempfile::tempdir().unwrap();
    let first = SqliteStore::open(root.path()).unwrap();
    let err = SqliteStore::open(root.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("held by another process"), "{msg}");
    assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
    assert!(msg.contains(&root.path().display().to_string()), "{msg}");
    assert!(!err.retryable());
    drop(first);
    SqliteStore::open(root.path()).unwrap();
}

/// Not a test on its own: the child process of
/// `a_directory_held_by_a_child_process_is_refused_until_it_dies`.
#[test]
fn lock_holder_child() {
    let Ok(dir) = std::env::var("TIDEGATE_LOCK_HOLDER_DIR") else { return };
    let store = SqliteStore::open(dir).unwrap();
    append(&store, events(1, 1)).unwrap();
    store.sync().unwrap();
    println!("LOCKED");
    // Hold the lock until the parent kills this process.
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_directory_held_by_a_child_process_is_refused_until_it_dies() {
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "lock_holder_child", "--nocapture", "--test-threads=1"])
        .env("TIDEGATE_LOCK_HOLDER_DIR", root.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("LOCKED"))), "the child never took the lock");
    let err = SqliteStore::open(root.path()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("held by another process") && msg.contains(&format!("pid {}", child.id())), "{msg}");
    // SIGKILL: the kernel drops the lock with the process; no stale lock file blocks.
    child.kill().unwrap();
    child.wait().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(store.last_lsn(), 1, "the child's synced event survived its SIGKILL");
}

#[test]
fn a_ledger_from_a_newer_version_is_refused_naming_both_versions_and_left_untouched() {
    let root = tempfile::tempdir().unwrap();
    SqliteStore::open(root.path()).unwrap().close().unwrap();
    for (key, other) in [("format_version", "schema_version"), ("schema_version", "format_version")] {
        db(root.path()).execute("UPDATE meta SET value = '99' WHERE key = ?1", [key]).unwrap();
        db(root.path()).execute("UPDATE meta SET value = '1' WHERE key = ?1", [other]).unwrap();
        let err = SqliteStore::open(root.path()).unwrap_err();
        let supported = match &err {
            StoreError::NewerFormat { key: k, found: 99, supported, .. } => {
                assert_eq!(*k, key);
                *supported
            }
            other => panic!("expected NewerFormat, got {other:?}"),
        };
        if key == "format_version" {
            assert_eq!(supported, u64::from(tidegate_core::ledger::LEDGER_FORMAT_VERSION));
        }
        let msg = err.to_string();
        assert!(msg.contains(&format!("{key} 99")) && msg.contains(&format!("newer than {supported}")), "{msg}");
        let still: String =
            db(root.path()).query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).unwrap();
        assert_eq!(still, "99", "a refused ledger is not rewritten");
    }
}

#[test]
fn an_older_ledger_is_read_and_raised_to_this_format_version() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    store.append(&tidegate_core::Batch::from(vec![event(1, 1)])).unwrap();
    store.close().unwrap();
    db(root.path()).execute("UPDATE meta SET value = '1' WHERE key = 'format_version'", []).unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(store.last_lsn(), 1, "the version-1 events are read as they are");
    store.close().unwrap();
    let now: String =
        db(root.path()).query_row("SELECT value FROM meta WHERE key = 'format_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(now, tidegate_core::ledger::LEDGER_FORMAT_VERSION.to_string());
}

#[test]
fn a_file_that_is_not_a_ledger_is_refused() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("ledger.db"), vec![0xAB; 8192]).unwrap();
    let err = SqliteStore::open(root.path()).unwrap_err();
    assert!(matches!(err, StoreError::NotALedger { .. }), "{err:?}");

    let other = tempfile::tempdir().unwrap();
    db(other.path()).execute_batch("CREATE TABLE customers (id INTEGER)").unwrap();
    let err = SqliteStore::open(other.path()).unwrap_err();
    assert!(err.to_string().contains("customers"), "{err}");
}

#[test]
fn a_corrupt_tail_is_cut_at_the_last_complete_record_and_reported() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 4)).unwrap();
    append(&store, events(2, 4)).unwrap();
    store.sync().unwrap();
    let mark = save_mark(root.path());
    append(&store, events(3, 2)).unwrap();
    store.close().unwrap();
    restore_mark(root.path(), &mark);
    // Damage from outside above the mark: the last two rows hold garbage.
    db(root.path()).execute("UPDATE events SET body = '{\"event\":\"rea' WHERE lsn >= 9", []).unwrap();

    let store = SqliteStore::open(root.path()).unwrap();
    let report = store.open_report().clone();
    assert_eq!(report.last_lsn, 8);
    assert_eq!(report.cut_rows.iter().map(|c| c.lsn).collect::<Vec<_>>(), vec![9, 10]);
    assert!(report.cut_rows[0].reason.contains("does not decode"), "{}", report.cut_rows[0].reason);
    let shown = report.to_string();
    assert!(shown.contains("cut a corrupt tail of 2 rows (LSN 9..=10"), "{shown}");
    assert_eq!(store.last_lsn(), 8);
    assert_eq!(all(&store), [events(1, 4), events(2, 4)].concat());
    // The ledger goes on from the cut; the cut rows are kept for an operator.
    assert_eq!(append(&store, events(4, 1)).unwrap(), 9);
    store.close().unwrap();
    let kept: i64 = db(root.path()).query_row("SELECT count(*) FROM cut_rows", [], |r| r.get(0)).unwrap();
    assert_eq!(kept, 2);
    let store = SqliteStore::open(root.path()).unwrap();
    assert!(store.open_report().cut_rows.is_empty());
    assert_eq!(store.verify().unwrap().rows, 9);
}

#[test]
fn a_row_whose_columns_disagree_with_its_body_counts_as_corrupt() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 2)).unwrap();
    store.sync().unwrap();
    let mark = save_mark(root.path());
    append(&store, events(1, 1)).unwrap();
    store.close().unwrap();
    restore_mark(root.path(), &mark);
    db(root.path()).execute("UPDATE events SET kind = 'sealed' WHERE lsn = 3", []).unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(store.open_report().cut_rows.len(), 1);
    assert!(store.open_report().cut_rows[0].reason.contains("kind column"));
}

#[test]
fn corruption_in_the_middle_is_an_error_naming_the_lsn() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 10)).unwrap();
    store.close().unwrap();
    db(root.path()).execute("UPDATE events SET body = 'garbage' WHERE lsn = 4", []).unwrap();
    let err = SqliteStore::open(root.path()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { lsn: 4, .. }), "{err:?}");
    assert!(err.to_string().contains("LSN 4") && err.to_string().contains("not a torn tail"), "{err}");
    assert_eq!(db(root.path()).query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0)).unwrap(), 10);

    // With only the tail verified the store opens, and the scan that reaches LSN 4 fails.
    let store = SqliteStore::open_with(root.path(), Options { verify: Verify::Tail { rows: 3 }, ..Options::default() })
        .unwrap();
    assert_eq!(store.open_report().rows_verified, 3);
    let err = collect(&store, 1).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { lsn: 4, .. }), "{err:?}");
    assert_eq!(collect(&store, 5).unwrap().len(), 6);
    assert!(matches!(store.verify(), Err(StoreError::Corrupt { lsn: 4, .. })));
    drop(store);

    // A missing row is corruption too.
    db(root.path())
        .execute("UPDATE events SET body = (SELECT body FROM events WHERE lsn = 3) WHERE lsn = 4", [])
        .unwrap();
    db(root.path()).execute("DELETE FROM events WHERE lsn = 6", []).unwrap();
    let err = SqliteStore::open(root.path()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { lsn: 6, .. }), "{err:?}");
}

#[test]
fn a_tail_longer_than_max_tail_cut_is_refused_not_cut() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 4)).unwrap();
    store.sync().unwrap();
    let mark = save_mark(root.path());
    append(&store, events(1, 6)).unwrap();
    store.close().unwrap();
    restore_mark(root.path(), &mark);
    db(root.path()).execute("UPDATE events SET body = 'x' WHERE lsn >= 5", []).unwrap();
    let err = SqliteStore::open_with(root.path(), Options { max_tail_cut: 3, ..Options::default() }).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { lsn: 5, .. }), "{err:?}");
    assert!(err.to_string().contains("max_tail_cut"), "{err}");
    assert_eq!(db(root.path()).query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0)).unwrap(), 10);
}

#[test]
fn concurrent_appenders_share_syncs() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    std::thread::scope(|s| {
        for t in 0..32 {
            let store = &store;
            s.spawn(move || {
                for _ in 0..20 {
                    let lsn = append(store, events(t, 3)).unwrap();
                    store.wait_durable(lsn).unwrap();
                }
            });
        }
    });
    let stats = store.stats();
    assert_eq!((stats.appends, stats.last_lsn, stats.durable_lsn), (640, 1920, 1920));
    eprintln!("640 durable appends took {} syncs", stats.syncs);
    assert!(stats.syncs < stats.appends, "{stats:?}");
}

#[test]
fn a_single_client_pays_one_sync_per_wait_however_many_appends_precede_it() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(root.path(), on_demand()).unwrap();
    for tx in 0..10 {
        for n in 0..5 {
            append(&store, vec![event(tx, n)]).unwrap();
        }
        store.wait_durable(store.last_lsn()).unwrap();
    }
    assert_eq!(store.stats().syncs, 10);
}

#[test]
fn events_nobody_waits_for_become_durable_after_the_idle_flush() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(root.path(), Options { idle_flush_ms: Some(20), ..Options::default() }).unwrap();
    let lsn = append(&store, events(1, 2)).unwrap();
    let start = Instant::now();
    while !store.is_durable(lsn) {
        assert!(start.elapsed() < Duration::from_secs(5), "never flushed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `append` runs under the engine's lock, so it must queue the engine's batch as it is and
/// leave the encoding to the writer: until the commit, `scan` hands out the very events of the
/// appended `Arc` (an encoded-then-decoded copy would live elsewhere), and after it the rows
/// in SQLite are exactly `wire::encode` of them.
#[test]
fn append_queues_the_engines_batch_and_the_writer_encodes_it() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(root.path(), on_demand()).unwrap();
    let batch = tidegate_core::Batch::from(events(3, 3));
    let last = store.append(&batch).unwrap();
    assert_eq!((last, store.durable_lsn()), (3, 0), "nothing committed yet");
    let mut seen = Vec::new();
    store
        .scan(1, &mut |lsn, e| {
            seen.push((lsn, e as *const Event));
            true
        })
        .unwrap();
    let expected: Vec<(Lsn, *const Event)> =
        batch.iter().enumerate().map(|(i, e)| (i as Lsn + 1, e as *const Event)).collect();
    assert_eq!(seen, expected, "queued events are served from the appended batch itself");
    store.sync().unwrap();
    let conn = db(root.path());
    let bodies: Vec<(i64, i64, String, String)> = conn
        .prepare("SELECT lsn, tx, kind, body FROM events ORDER BY lsn")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<(i64, i64, String, String)> = batch
        .iter()
        .enumerate()
        .map(|(i, e)| (i as i64 + 1, 3, "read".to_owned(), tidegate_storage::wire::encode(i, e).unwrap()))
        .collect();
    assert_eq!(bodies, want);
    assert_eq!(all(&store), batch.to_vec());
}

/// A transaction id the `tx` column cannot hold still fails the append itself (checked
/// without encoding), with nothing queued.
#[test]
fn an_event_whose_tx_does_not_fit_fails_the_append_and_queues_nothing() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(root.path(), on_demand()).unwrap();
    append(&store, events(1, 1)).unwrap();
    let err = append(&store, vec![event(2, 0), event(u64::MAX, 1)]).unwrap_err();
    match &err {
        StoreError::InvalidArgument { field, value, .. } => {
            assert_eq!(*field, "event.tx");
            assert!(value.contains(&u64::MAX.to_string()) && value.contains("event 1"), "{value}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(!err.retryable());
    assert_eq!((store.last_lsn(), store.stats().queued_rows), (1, 1));
    store.sync().unwrap();
    assert_eq!(all(&store), events(1, 1));
}

#[test]
fn an_async_waiter_is_woken_by_the_writer() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(root.path(), on_demand()).unwrap();
    let lsn = append(&store, events(1, 2)).unwrap();
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(durable(&store, lsn));
    // The first poll registers demand; the writer commits; a later poll sees it.
    let start = Instant::now();
    while fut.as_mut().poll(&mut cx).is_pending() {
        assert!(start.elapsed() < Duration::from_secs(5), "never became durable");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(store.is_durable(lsn));
    assert_eq!(store.stats().syncs, 1);
}

#[test]
fn a_crash_at_a_sync_drops_the_unsynced_batches() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with_hooks(
        root.path(),
        on_demand(),
        TestHooks { crash_after_syncs: Some(2), ..TestHooks::default() },
    )
    .unwrap();
    let a = append(&store, events(1, 3)).unwrap();
    store.wait_durable(a).unwrap();
    let b = append(&store, events(2, 2)).unwrap();
    store.wait_durable(b).unwrap();
    let c = append(&store, events(3, 4)).unwrap();
    let err = store.wait_durable(c).unwrap_err();
    assert!(err.is_injected_crash() && !err.retryable(), "{err:?}");
    assert!(err.to_string().contains("injected crash at sync #3"), "{err}");
    assert!(!store.is_durable(c));
    assert!(store.append(&tidegate_core::Batch::from(events(4, 1))).unwrap_err().is_injected_crash());
    assert!(collect(&store, 1).is_err());
    assert!(store.stats().failed);
    assert!(store.close().unwrap_err().is_injected_crash());

    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(all(&store), [events(1, 3), events(2, 2)].concat());
    assert_eq!(store.verify().unwrap().rows, 5);
}

#[test]
fn a_crash_at_an_append_fails_it_and_everything_after() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with_hooks(
        root.path(),
        on_demand(),
        TestHooks { crash_after_appends: Some(3), ..TestHooks::default() },
    )
    .unwrap();
    for tx in 0..3 {
        let l = append(&store, events(tx, 2)).unwrap();
        store.wait_durable(l).unwrap();
    }
    assert_eq!(append(&store, vec![]).unwrap(), 6, "an empty batch is not an append");
    let err = append(&store, events(9, 1)).unwrap_err();
    assert!(err.to_string().contains("injected crash at append #4"), "{err}");
    assert!(store.wait_durable(6).is_ok(), "what was durable stays durable");
    drop(store);
    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(store.last_lsn(), 6);
}

#[test]
fn crash_now_drops_queued_batches_and_wakes_waiters_with_an_error() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(root.path(), on_demand()).unwrap();
    let a = append(&store, events(1, 2)).unwrap();
    store.wait_durable(a).unwrap();
    append(&store, events(2, 2)).unwrap();
    store.crash_now();
    assert!(store.wait_durable(4).unwrap_err().is_injected_crash());
    drop(store);
    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(all(&store), events(1, 2));
}

/// Regression guard for the crash-test contract: at every crash point, with concurrent
/// appenders, every acknowledged batch survives whole, every surviving batch is whole, and
/// the survivors are a prefix of the ledger.
#[test]
fn acknowledged_batches_survive_a_crash_at_every_sync_and_only_whole_batches_do() {
    for crash_at in 0..12u64 {
        let root = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_with_hooks(
            root.path(),
            Options { idle_flush_ms: Some(1), ..Options::default() },
            TestHooks { crash_after_syncs: Some(crash_at), ..TestHooks::default() },
        )
        .unwrap();
        // (thread, batch) -> (last LSN, events, acknowledged)
        let outcomes: Vec<(Lsn, Vec<Event>, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        for b in 0..20u64 {
                            let batch = events(t * 100 + b, 1 + (b + t) % 3);
                            let Ok(lsn) = append(store, batch.clone()) else { break };
                            let acked = if b % 2 == 0 { store.wait_durable(lsn).is_ok() } else { false };
                            mine.push((lsn, batch, acked));
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        drop(store);
        let store = SqliteStore::open(root.path()).unwrap();
        let survived = collect(&store, 1).unwrap();
        let last = store.last_lsn();
        for (lsn, batch, acked) in &outcomes {
            let first = lsn - batch.len() as Lsn + 1;
            if *lsn <= last {
                let stored: Vec<Event> =
                    survived[first as usize - 1..*lsn as usize].iter().map(|(_, e)| e.clone()).collect();
                assert_eq!(&stored, batch, "crash at sync {crash_at}: batch ending at {lsn} is whole");
            } else {
                assert!(!acked, "crash at sync {crash_at}: acknowledged batch ending at {lsn} was lost");
                assert!(first > last, "crash at sync {crash_at}: batch {first}..={lsn} survived in part");
            }
        }
        assert_eq!(store.verify().unwrap().rows, last);
    }
}

#[test]
fn a_failed_write_stops_the_store_and_loses_nothing_acknowledged() {
    let root = tempfile::tempdir().unwrap();
    let opts = Options { max_ledger_bytes: Some(256 * 1024), ..on_demand() };
    let store = SqliteStore::open_with(root.path(), opts).unwrap();
    let a = append(&store, events(1, 10)).unwrap();
    store.wait_durable(a).unwrap();
    // Far more than the size limit: the commit fails as on a full disk.
    let big =
        Event::EffectExecuted { tx: TxId(2), effect: EffectId(0), output: Arc::new(Value::from("y".repeat(1 << 20))) };
    let b = append(&store, vec![big]).unwrap();
    let err = store.wait_durable(b).unwrap_err();
    assert!(matches!(&err, StoreError::Failed { cause } if matches!(**cause, StoreError::Database { .. })), "{err:?}");
    assert!(err.to_string().contains("full"), "{err}");
    assert!(!err.retryable());
    assert!(append(&store, events(3, 1)).is_err());
    drop(store);
    let store = SqliteStore::open(root.path()).unwrap();
    assert_eq!(all(&store), events(1, 10));
}

#[test]
fn scan_inside_a_scan_visitor_does_not_deadlock() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    let l = append(&store, events(1, 5)).unwrap();
    store.wait_durable(l).unwrap();
    let mut inner_total = 0;
    store
        .scan(1, &mut |_, _| {
            inner_total += collect(&store, 1).unwrap().len();
            true
        })
        .unwrap();
    assert_eq!(inner_total, 25);
}

#[test]
fn options_read_from_json_with_defaults_and_refuse_unknown_fields() {
    let opts: Options = serde_json::from_str(r#"{"idle_flush_ms": null, "verify": {"tail": {"rows": 5}}}"#).unwrap();
    assert_eq!(opts, Options { idle_flush_ms: None, verify: Verify::Tail { rows: 5 }, ..Options::default() });
    assert!(serde_json::from_str::<Options>(r#"{"crash_after_sync": 1}"#).is_err());
    // Crash switches are test hooks (feature `test-hooks`), never production options.
    assert!(serde_json::from_str::<Options>(r#"{"crash_after_syncs": 1}"#).is_err());
}

#[test]
fn fsync_per_s_measures_a_positive_rate_and_cleans_up() {
    let root = tempfile::tempdir().unwrap();
    let rate = fsync_per_s(root.path(), Duration::from_millis(200)).unwrap();
    assert!(rate > 0.0 && rate.is_finite(), "{rate}");
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    assert!(matches!(fsync_per_s(root.path(), Duration::ZERO), Err(StoreError::InvalidArgument { .. })));
}

/// The high-water mark as docs/ledger.md specifies it: two 88-byte slots at offsets 0 and
/// 4096 (magic, ledger id, seq, lsn, chain, checksum); the newest valid slot counts.
fn mark_on_disk(dir: &Path) -> (u64, Lsn) {
    let bytes = std::fs::read(dir.join(tidegate_sqlite::HEAD_FILE)).unwrap();
    assert_eq!(bytes.len(), 8192);
    (0..2)
        .filter_map(|slot| {
            let b = &bytes[slot * 4096..slot * 4096 + 88];
            let sum = blake3::hash(&b[..72]);
            (&b[..8] == b"TGHEAD01" && b[72..88] == sum.as_bytes()[..16]).then(|| {
                let seq = u64::from_le_bytes(b[24..32].try_into().unwrap());
                let lsn = u64::from_le_bytes(b[32..40].try_into().unwrap());
                (seq, lsn)
            })
        })
        .max()
        .unwrap()
}

/// No waiter hears "durable" before the high-water mark in the file covers its LSN (the mark
/// is written after the SQLite commit and before the wake-up; synced behind it), with
/// concurrent appenders whose commits and marks overlap.
#[test]
fn a_durability_wait_returns_only_after_the_high_water_mark_covers_it() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    std::thread::scope(|s| {
        for t in 0..8 {
            let store = &store;
            let dir = root.path();
            s.spawn(move || {
                for _ in 0..15 {
                    let lsn = append(store, events(t, 2)).unwrap();
                    store.wait_durable(lsn).unwrap();
                    let (_, marked) = mark_on_disk(dir);
                    assert!(marked >= lsn, "LSN {lsn} acknowledged with the mark at {marked}");
                }
            });
        }
    });
    let stats = store.stats();
    assert!(stats.marks <= stats.syncs, "{stats:?}");
    store.sync().unwrap();
    let stats = store.stats();
    assert!(stats.marks >= 1 && stats.marked_lsn == 240, "sync() waits for a synced mark: {stats:?}");
    store.close().unwrap();
    assert_eq!(mark_on_disk(root.path()).1, 240, "a clean close leaves the mark at the last LSN");
}

/// The mark's sync runs behind the acknowledgements, at most every `mark_sync_ms`: with a
/// long interval, a run of commits syncs the mark not once, while every acknowledged LSN is
/// still covered by the mark written in the file; `sync()` then syncs it once, at once.
#[test]
fn the_mark_is_written_before_each_acknowledgement_and_synced_behind_them() {
    let root = tempfile::tempdir().unwrap();
    let opts = Options { mark_sync_ms: Options::MAX_MARK_SYNC_MS, ..on_demand() };
    let store = SqliteStore::open_with(root.path(), opts).unwrap();
    let start = store.stats();
    for tx in 0..40 {
        let lsn = append(&store, events(tx, 3)).unwrap();
        store.wait_durable(lsn).unwrap();
        assert!(mark_on_disk(root.path()).1 >= lsn, "LSN {lsn} acknowledged before its mark was written");
    }
    let stats = store.stats();
    assert_eq!((stats.syncs - start.syncs, stats.marks - start.marks), (40, 0), "{stats:?}");
    assert_eq!((stats.durable_lsn, stats.marked_lsn), (120, 0), "{stats:?}");
    let t = Instant::now();
    store.sync().unwrap();
    assert!(t.elapsed() < Duration::from_secs(30), "sync() waited for the interval instead of asking");
    let stats = store.stats();
    assert_eq!((stats.marks - start.marks, stats.marked_lsn), (1, 120), "{stats:?}");
    // A checkpoint waits for a synced mark over its commit, asked for at once too.
    append(&store, events(99, 2)).unwrap();
    store.put_checkpoint(122, b"state").unwrap();
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(store.stats().marked_lsn, 122);
    drop(store);
    let reopened = SqliteStore::open(root.path()).unwrap();
    assert_eq!(reopened.open_report().acknowledged_lsn, 122);
}

/// With `ack_after_mark`, no waiter hears "durable" before the mark is synced.
#[test]
fn with_ack_after_mark_a_wait_returns_only_after_the_mark_is_synced() {
    let root = tempfile::tempdir().unwrap();
    let opts = Options { ack_after_mark: true, mark_sync_ms: Options::MAX_MARK_SYNC_MS, ..on_demand() };
    let store = SqliteStore::open_with(root.path(), opts).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = &store;
            s.spawn(move || {
                for _ in 0..10 {
                    let lsn = append(store, events(t, 2)).unwrap();
                    store.wait_durable(lsn).unwrap();
                    let marked = store.stats().marked_lsn;
                    assert!(marked >= lsn, "LSN {lsn} acknowledged with the synced mark at {marked}");
                }
            });
        }
    });
    let stats = store.stats();
    assert!(stats.marks >= 1 && stats.marks <= stats.syncs, "{stats:?}");
}

#[test]
fn a_mark_sync_interval_out_of_range_is_refused_naming_the_field() {
    let root = tempfile::tempdir().unwrap();
    let opts = Options { mark_sync_ms: Options::MAX_MARK_SYNC_MS + 1, ..Options::default() };
    match SqliteStore::open_with(root.path().join("d"), opts) {
        Err(StoreError::InvalidArgument { field, value, .. }) => {
            assert_eq!((field, value.as_str()), ("mark_sync_ms", "60001"));
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(!root.path().join("d").exists(), "a refused open creates nothing");
}

/// Regression (issue 11): the read-only reader connection closed last, so SQLite never
/// folded the write-ahead log into ledger.db and most of the ledger lived only in the log.
#[test]
fn the_wal_is_folded_into_the_database_on_every_clean_close() {
    let root = tempfile::tempdir().unwrap();
    for round in 0..3u64 {
        let store = SqliteStore::open(root.path()).unwrap();
        let l = append(&store, events(round, 50)).unwrap();
        store.wait_durable(l).unwrap();
        assert_eq!(collect(&store, 1).unwrap().len() as u64, l, "a scan opens a reader connection");
        store.close().unwrap();
        assert!(!root.path().join("ledger.db-wal").exists(), "round {round}: the WAL survived a clean close");
    }
    // ledger.db alone (with its mark) is the whole ledger.
    let copy = tempfile::tempdir().unwrap();
    for f in ["ledger.db", tidegate_sqlite::HEAD_FILE] {
        std::fs::copy(root.path().join(f), copy.path().join(f)).unwrap();
    }
    let store = SqliteStore::open_read_only(copy.path()).unwrap();
    assert_eq!(store.verify().unwrap().rows, 150);
}

/// Regression (issue 11): a negative LSN was reported as "LSN 1 is missing".
#[test]
fn a_negative_lsn_is_named_as_such() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 5)).unwrap();
    store.close().unwrap();
    db(root.path()).execute("UPDATE events SET lsn = -3 WHERE lsn = 2", []).unwrap();
    let err = SqliteStore::open(root.path()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("LSN -3") && msg.contains("start at 1"), "{msg}");
    assert!(!msg.contains("LSN 1 is missing"), "{msg}");
}

/// The read-only view writes nothing: the database and the mark keep their bytes, the
/// versions of an older ledger stay as they are, a corrupt tail is reported, not cut.
#[test]
fn opening_read_only_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 4)).unwrap();
    store.sync().unwrap();
    let mark = save_mark(root.path());
    append(&store, events(2, 3)).unwrap();
    store.close().unwrap();
    restore_mark(root.path(), &mark);
    db(root.path()).execute("UPDATE events SET body = 'torn' WHERE lsn = 7", []).unwrap();
    let before = (std::fs::read(root.path().join("ledger.db")).unwrap(), save_mark(root.path()));
    let ro = SqliteStore::open_read_only(root.path()).unwrap();
    let report = ro.open_report().clone();
    assert!(report.read_only && report.chained);
    assert_eq!((report.last_lsn, report.acknowledged_lsn), (6, 4));
    assert_eq!(report.cut_rows.iter().map(|c| c.lsn).collect::<Vec<_>>(), vec![7]);
    assert!(report.to_string().contains("a writing open would cut"), "{report}");
    assert_eq!(collect(&ro, 1).unwrap().len(), 6, "the damaged tail is not shown");
    assert!(matches!(append(&ro, events(3, 1)), Err(StoreError::ReadOnly { .. })));
    assert!(matches!(ro.put_checkpoint(1, b"x"), Err(StoreError::ReadOnly { .. })));
    drop(ro);
    assert_eq!(std::fs::read(root.path().join("ledger.db")).unwrap(), before.0, "ledger.db changed");
    assert_eq!(save_mark(root.path()), before.1, "ledger.head changed");
    assert!(!root.path().join("LOCK").exists() || std::fs::read(root.path().join("LOCK")).is_ok());
}

/// A missing directory is an error naming it, for a read-only open and for a writing open
/// that may not create; nothing is created.
#[test]
fn a_missing_data_directory_is_an_error_naming_it_never_a_new_ledger() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("typo");
    for err in [
        SqliteStore::open_read_only(&dir).unwrap_err(),
        SqliteStore::open_with(&dir, Options { create: false, ..Options::default() }).unwrap_err(),
    ] {
        assert!(err.to_string().contains(&dir.display().to_string()), "{err}");
        assert!(!err.retryable() || matches!(err, StoreError::File { .. }));
    }
    assert!(!dir.exists(), "nothing was created");
    std::fs::create_dir(&dir).unwrap();
    let err = SqliteStore::open_read_only(&dir).unwrap_err();
    assert!(matches!(err, StoreError::NotALedger { .. }) && err.to_string().contains("no ledger.db"), "{err}");
    let err = SqliteStore::open_with(&dir, Options { create: false, ..Options::default() }).unwrap_err();
    assert!(matches!(err, StoreError::NotALedger { .. }), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing was created");
}

/// The high-water mark refuses what looks whole: a ledger whose mark was deleted, and one
/// given another ledger's mark.
#[test]
fn a_missing_or_foreign_high_water_mark_is_refused() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    for dir in [a.path(), b.path()] {
        let store = SqliteStore::open(dir).unwrap();
        append(&store, events(1, 3)).unwrap();
        store.close().unwrap();
    }
    std::fs::copy(b.path().join(tidegate_sqlite::HEAD_FILE), a.path().join(tidegate_sqlite::HEAD_FILE)).unwrap();
    let err = SqliteStore::open(a.path()).unwrap_err();
    assert!(matches!(err, StoreError::Unprovable { .. }) && err.to_string().contains("another ledger"), "{err}");
    std::fs::remove_file(a.path().join(tidegate_sqlite::HEAD_FILE)).unwrap();
    let err = SqliteStore::open_read_only(a.path()).unwrap_err();
    assert!(matches!(err, StoreError::Unprovable { .. }) && err.to_string().contains("missing"), "{err}");
    assert!(!err.retryable());
}

/// A backup taken while the store appends is a consistent, verified ledger of its own that
/// holds at least everything acknowledged when it started.
#[test]
fn a_backup_taken_while_appending_is_whole_and_verifies() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path().join("src")).unwrap();
    let l = append(&store, events(1, 100)).unwrap();
    store.wait_durable(l).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the appender however the backup ends (a panic included), so the scope joins.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            let mut t = 2;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let l = append(&store, events(t, 3)).unwrap();
                store.wait_durable(l).unwrap();
                t += 1;
            }
        });
        let _stop = Stop(&stop);
        store.backup(root.path().join("copy"))
    });
    let report = report.unwrap();
    assert!(report.last_lsn >= report.acknowledged_lsn && report.acknowledged_lsn >= 100, "{report:?}");
    let copy = SqliteStore::open_read_only(root.path().join("copy")).unwrap();
    assert_eq!(copy.verify().unwrap().rows, report.last_lsn);
    let original: Vec<Event> = all(&store)[..report.last_lsn as usize].to_vec();
    assert_eq!(all(&copy), original, "the copy is a prefix of the ledger");
    drop(copy);
    // The copy opens for writing as a ledger of its own; a second backup into it is refused.
    let reopened = SqliteStore::open(root.path().join("copy")).unwrap();
    assert_eq!(reopened.last_lsn(), report.last_lsn);
    assert!(matches!(store.backup(root.path().join("copy")), Err(StoreError::InvalidArgument { .. })));
}

/// A last row rewritten with a correctly recomputed chain value still differs from the one the
/// high-water mark recorded: refused, naming the LSN.
#[test]
fn a_rewritten_last_row_with_a_recomputed_chain_is_refused_by_the_mark() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 5)).unwrap();
    store.close().unwrap();
    let conn = db(root.path());
    let prev: Vec<u8> = conn.query_row("SELECT chain FROM events WHERE lsn = 4", [], |r| r.get(0)).unwrap();
    let forged = tidegate_storage::wire::encode(0, &event(9, 9)).unwrap();
    let chain = Chain::from_slice(&prev).unwrap().next(5, forged.as_bytes());
    conn.execute(
        "UPDATE events SET body = ?1, tx = 9, chain = ?2 WHERE lsn = 5",
        rusqlite::params![forged, &chain.0[..]],
    )
    .unwrap();
    drop(conn);
    let err = SqliteStore::open(root.path()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { lsn: 5, .. }), "{err:?}");
    assert!(err.to_string().contains("not the one acknowledged"), "{err}");
}

/// A crash between a group commit and its mark leaves rows above the mark: they are durable,
/// not acknowledged; open accepts them and marks them.
#[test]
fn rows_committed_after_the_last_mark_are_accepted_and_marked_at_open() {
    let root = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(root.path()).unwrap();
    append(&store, events(1, 3)).unwrap();
    store.sync().unwrap();
    let mark = save_mark(root.path());
    append(&store, events(2, 4)).unwrap();
    store.close().unwrap();
    restore_mark(root.path(), &mark);
    assert_eq!(mark_on_disk(root.path()).1, 3);
    let store = SqliteStore::open(root.path()).unwrap();
    let report = store.open_report();
    assert_eq!((report.acknowledged_lsn, report.last_lsn), (3, 7));
    assert!(report.cut_rows.is_empty());
    assert_eq!(mark_on_disk(root.path()).1, 7, "the open marked the durable rows");
    assert_eq!(all(&store), [events(1, 3), events(2, 4)].concat());
}

/// A kill between creating `ledger.db` and committing its schema leaves an empty database
/// (with or without its LSN-0 high-water mark). Nothing was acknowledged from it: a read-only
/// open (`tidegate ledger verify`) reads it as an empty ledger and says why, writing nothing,
/// and the next writing open creates it. A mark that says events were acknowledged is still
/// refused.
#[test]
fn an_interrupted_creation_reads_as_an_empty_ledger_never_an_error() {
    let root = tempfile::tempdir().unwrap();
    // Without a mark: the kill came before the mark was written.
    let dir = root.path().join("no-mark");
    std::fs::create_dir(&dir).unwrap();
    std::fs::File::create(dir.join("ledger.db")).unwrap();
    let ro = SqliteStore::open_read_only(&dir).unwrap();
    assert_eq!(ro.last_lsn(), 0);
    assert_eq!(ro.open_report().rows_verified, 0);
    assert!(ro.open_report().notes.iter().any(|n| n.contains("creation was interrupted")), "{:?}", ro.open_report());
    let report = ro.verify().unwrap();
    drop((ro, report));
    assert_eq!(std::fs::metadata(dir.join("ledger.db")).unwrap().len(), 0, "the read-only open wrote nothing");
    let store = SqliteStore::open(&dir).unwrap();
    assert!(store.open_report().created);
    drop(store);

    // With the LSN-0 mark: the kill came after the mark, before the schema's commit.
    let dir = root.path().join("mark-0");
    std::fs::create_dir(&dir).unwrap();
    drop(SqliteStore::open(&dir).unwrap());
    std::fs::remove_file(dir.join("ledger.db")).unwrap();
    let _ = std::fs::remove_file(dir.join("ledger.db-wal"));
    let _ = std::fs::remove_file(dir.join("ledger.db-shm"));
    std::fs::File::create(dir.join("ledger.db")).unwrap();
    let ro = SqliteStore::open_read_only(&dir).unwrap();
    assert_eq!(ro.last_lsn(), 0);
    drop(ro);

    // A mark that acknowledged events: the empty database lost them.
    let dir = root.path().join("acknowledged");
    std::fs::create_dir(&dir).unwrap();
    let store = SqliteStore::open(&dir).unwrap();
    append(&store, events(1, 3)).unwrap();
    store.close().unwrap();
    for f in ["ledger.db", "ledger.db-wal", "ledger.db-shm"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    std::fs::File::create(dir.join("ledger.db")).unwrap();
    let err = SqliteStore::open_read_only(&dir).unwrap_err();
    assert!(matches!(err, StoreError::Shortened { .. }), "{err}");
}
