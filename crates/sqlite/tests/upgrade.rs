//! The upgrade rule, exercised on a ledger written before the hash chain by the build it came
//! from (tests/data/format2-schema1-demo: event format 2, schema 1, most events only in the
//! write-ahead log): it opens read-only as it is, then opens for writing, is upgraded in place
//! with every event kept, verifies, and reopens.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;
use tidegate_core::Event;
use tidegate_runtime::Tidegate;
use tidegate_sqlite::{HEAD_FILE, SCHEMA_VERSION, SqliteStore};
use tidegate_storage::LedgerStore;
use tidegate_storage::conformance::collect;

const FIXTURE: &str = "tests/data/format2-schema1-demo";
/// Events in the fixture (three demo runs of the old build).
const EVENTS: usize = 167;

fn fixture_copy(root: &Path) -> PathBuf {
    let dir = root.join("ledger");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["ledger.db", "ledger.db-wal"] {
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE).join(f), dir.join(f)).unwrap();
    }
    dir
}

fn meta(dir: &Path, key: &str) -> Option<String> {
    let conn = Connection::open(dir.join("ledger.db")).unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).ok()
}

#[test]
fn a_ledger_written_before_the_hash_chain_opens_verifies_and_upgrades() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture_copy(root.path());

    // Read-only: the old ledger as it is, without a chain, changing nothing.
    let ro = SqliteStore::open_read_only(&dir).unwrap();
    let report = ro.open_report().clone();
    assert_eq!((report.format_version, report.schema_version, report.chained), (2, 1, false));
    assert_eq!(report.last_lsn, EVENTS as u64);
    let before: Vec<Event> = collect(&ro, 1).unwrap().into_iter().map(|(_, e)| e).collect();
    let v = ro.verify().unwrap();
    assert_eq!((v.rows, v.chained), (EVENTS as u64, false));
    drop(ro);
    assert!(!dir.join(HEAD_FILE).exists(), "a read-only open writes no mark");

    // For writing: upgraded in place, every event kept at its LSN.
    let store = SqliteStore::open(&dir).unwrap();
    let report = store.open_report().clone();
    assert!(report.upgraded && report.chained, "{report}");
    assert_eq!((report.last_lsn, report.acknowledged_lsn), (EVENTS as u64, EVENTS as u64));
    let after: Vec<Event> = collect(&store, 1).unwrap().into_iter().map(|(_, e)| e).collect();
    assert_eq!(after, before, "the upgrade kept every event");
    assert_eq!(store.verify().unwrap().rows, EVENTS as u64);
    store.close().unwrap();
    assert_eq!(meta(&dir, "schema_version").unwrap(), SCHEMA_VERSION.to_string(), "an older build now refuses it");
    assert!(meta(&dir, "upgraded_from").unwrap().starts_with("format 2 schema 1"));
    assert!(dir.join(HEAD_FILE).exists());

    // The engine replays it from the old checkpoint (which the upgrade chained) and goes on.
    let store = Arc::new(SqliteStore::open(&dir).unwrap());
    assert!(!store.open_report().upgraded);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let r = tg.open_report();
        assert_eq!(r.checkpoint_fallback, None, "the old checkpoint still loads");
        assert_eq!(r.checkpoint_lsn, Some(EVENTS as u64));
        let tx = tg.begin("after-upgrade").unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
    });
    assert!(store.last_lsn() > EVENTS as u64);
    drop(store);
    let again = SqliteStore::open_read_only(&dir).unwrap();
    assert!(again.verify().unwrap().rows > EVENTS as u64);
}

/// A crash between writing the new mark and committing the upgrade leaves a schema-1 ledger
/// beside a mark; the next open upgrades it again.
#[test]
fn an_upgrade_interrupted_before_its_commit_is_redone() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture_copy(root.path());
    // A mark for another identity, as an interrupted upgrade leaves it.
    let other = root.path().join("other");
    SqliteStore::open(&other).unwrap().close().unwrap();
    std::fs::copy(other.join(HEAD_FILE), dir.join(HEAD_FILE)).unwrap();
    let store = SqliteStore::open(&dir).unwrap();
    assert!(store.open_report().upgraded);
    assert_eq!(store.verify().unwrap().rows, EVENTS as u64);
}

/// The record types own the format now (the engine's `Event` has no serde form): every row the
/// old build wrote decodes and re-encodes to exactly its stored bytes.
#[test]
fn every_record_the_old_build_wrote_re_encodes_to_its_stored_bytes() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture_copy(root.path());
    let conn = Connection::open(dir.join("ledger.db")).unwrap();
    let bodies: Vec<String> = conn
        .prepare("SELECT body FROM events ORDER BY lsn")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(bodies.len(), EVENTS);
    for body in &bodies {
        let event = tidegate_storage::wire::decode(body).unwrap();
        assert_eq!(&tidegate_storage::wire::encode(0, &event).unwrap(), body);
    }
}
