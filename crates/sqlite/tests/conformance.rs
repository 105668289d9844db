//! The backend conformance suite of `tidegate-storage`, run for the embedded store.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_sqlite::SqliteStore;
use tidegate_storage::conformance::{self, Reopenable};

#[test]
fn sqlite_store_conforms() {
    let root = tempfile::tempdir().unwrap();
    let mut n = 0;
    conformance::run_all(Reopenable::new(
        || {
            n += 1;
            SqliteStore::open(root.path().join(format!("ledger-{n}"))).unwrap()
        },
        |store: SqliteStore| {
            let dir = store.dir().to_owned();
            store.close().unwrap();
            let store = SqliteStore::open(&dir).unwrap();
            assert!(store.open_report().cut_rows.is_empty(), "a clean reopen cuts nothing");
            store
        },
    ));
}
