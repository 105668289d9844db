//! `tidegate ledger` and `demo` on damaged, missing and copied data directories.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

fn run(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN).args(args).arg("--data-dir").arg(dir).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Regression (issue 11): `ledger verify|stats|export|inspect` on a mistyped directory created
/// an empty ledger and answered "ok: 0 events verified" with exit 0.
#[test]
fn ledger_commands_on_a_missing_directory_fail_naming_it_and_create_nothing() {
    let root = tempfile::tempdir().unwrap();
    let typo = root.path().join("typo");
    for cmd in [&["ledger", "verify"][..], &["ledger", "stats"], &["ledger", "export"], &["ledger", "inspect"]] {
        let out = run(cmd, &typo);
        assert!(!out.status.success(), "{cmd:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&typo.display().to_string()), "{cmd:?}: {err}");
        // Regression (issue 11): error chains repeated their text.
        assert_eq!(err.matches("no such directory").count(), 1, "{cmd:?}: {err}");
        assert!(!typo.exists(), "{cmd:?} created the directory");
    }
}

#[test]
fn backup_copies_a_ledger_that_verifies_on_its_own() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    assert!(run(&["demo"], &dir).status.success());
    let copy = root.path().join("copy");
    let out = Command::new(BIN).args(["ledger", "backup", "--data-dir"]).arg(&dir).arg(&copy).output().unwrap();
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("copied LSN 1..=") && shown.contains("hash chain"), "{shown}");
    let verify = run(&["ledger", "verify"], &copy);
    assert!(verify.status.success(), "{}", text(&verify));
    // The copy is a ledger of its own: the demo runs on it.
    assert!(run(&["demo"], &copy).status.success());
}

/// Regression (issue 11): `demo` kept appending to a ledger that `verify` rejected. Here the
/// ledger's high-water mark is gone, so nothing proves it whole: both refuse, and the demo
/// changes nothing.
#[test]
fn demo_refuses_a_ledger_that_verify_rejects() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    assert!(run(&["demo"], &dir).status.success());
    std::fs::remove_file(dir.join("ledger.head")).unwrap();
    let before = std::fs::read(dir.join("ledger.db")).unwrap();
    let verify = run(&["ledger", "verify"], &dir);
    assert!(!verify.status.success());
    assert!(text(&verify).contains("cannot prove"), "{}", text(&verify));
    let demo = run(&["demo"], &dir);
    assert!(!demo.status.success(), "{}", text(&demo));
    assert!(text(&demo).contains("cannot prove"), "{}", text(&demo));
    assert_eq!(std::fs::read(dir.join("ledger.db")).unwrap(), before, "the refused ledger was changed");
}

/// `ledger verify --store postgres://…`: a real engine ledger (the demo's, copied event by
/// event into a PostgreSQL stream) verifies and replays; one changed row makes it fail naming
/// the LSN. Needs the PostgreSQL at `TIDEGATE_PG_URL` (fails without it).
#[test]
fn verify_checks_a_postgres_stream_and_names_a_damaged_row() {
    use tidegate_storage::LedgerStore;
    let admin = std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let name = format!("tidegate_cli_verify_{}", std::process::id());
    let mut c = postgres::Client::connect(&admin, postgres::NoTls)
        .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin} (TIDEGATE_PG_URL): {e}"));
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);

    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    assert!(run(&["demo"], &dir).status.success());
    let events = {
        let sqlite = tidegate_sqlite::SqliteStore::open_read_only(&dir).unwrap();
        let mut all = Vec::new();
        sqlite
            .scan(1, &mut |_, e| {
                all.push(e.clone());
                true
            })
            .unwrap();
        all
    };
    let pg = tidegate_postgres::PgStore::open(&url, "acme").unwrap();
    let last = pg.append(&tidegate_core::Batch::from(events.clone())).unwrap();
    pg.wait_durable(last).unwrap();
    drop(pg);

    let verify = || Command::new(BIN).args(["ledger", "verify", "--store", &url, "--stream", "acme"]).output().unwrap();
    let out = verify();
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains(&format!("ok: {} events verified", events.len())), "{shown}");
    assert!(shown.contains("replay rebuilt"), "{shown}");

    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    db.execute("UPDATE tidegate_events SET body = body || ' ' WHERE stream = 'acme' AND lsn = 4", &[]).unwrap();
    let out = verify();
    let shown = text(&out);
    assert!(!out.status.success(), "{shown}");
    assert!(shown.contains("LSN 4"), "{shown}");
    drop(db);
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
}

/// The demo on a PostgreSQL ledger (`--store postgres://…`): the second run rebuilds from the
/// first's checkpoint and appends to the same stream, which then verifies.
#[test]
fn the_demo_runs_twice_on_a_postgres_ledger_that_then_verifies() {
    let admin = std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let name = format!("tidegate_cli_demo_{}", std::process::id());
    let mut c = postgres::Client::connect(&admin, postgres::NoTls)
        .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin} (TIDEGATE_PG_URL): {e}"));
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    let demo = || Command::new(BIN).args(["demo", "--store", &url]).output().unwrap();
    let first = demo();
    assert!(first.status.success(), "{}", text(&first));
    let second = demo();
    let shown = text(&second);
    assert!(second.status.success(), "{shown}");
    assert!(shown.contains("Ledger: postgres://") && shown.contains("rebuilt from the checkpoint at LSN"), "{shown}");
    let out = Command::new(BIN).args(["ledger", "verify", "--store", &url]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
}
