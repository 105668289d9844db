//! The backend conformance suite of `tidegate-storage`, run for the embedded store.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use tidegate_sqlite::{Options, SqliteStore, TestHooks};
use tidegate_storage::StoreError;
use tidegate_storage::conformance::{self, Owned, Reopenable};

/// The whole suite. A second owner is refused by the directory lock while the first lives.
#[test]
fn sqlite_store_conforms() {
    let root = tempfile::tempdir().unwrap();
    let mut n = 0;
    let backend = Reopenable::new(
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
    );
    conformance::run_all(Owned::new(backend, |old: &SqliteStore| {
        let refused = SqliteStore::open(old.dir());
        assert!(matches!(refused, Err(StoreError::Locked { .. })), "{refused:?}");
        refused
    }));
}

/// With a directory lock that does not hold (a file system without reliable `flock`), a second
/// owner can open the directory; the owner token in `meta`, checked in every commit, fences
/// the first one out.
#[test]
fn without_the_directory_lock_the_owner_token_fences_the_old_owner_out() {
    let root = tempfile::tempdir().unwrap();
    let mut n = 0;
    let mut backend = Owned::new(
        || {
            n += 1;
            SqliteStore::open(root.path().join(format!("ledger-{n}"))).unwrap()
        },
        |old: &SqliteStore| {
            let hooks = TestHooks { ignore_dir_lock: true, ..TestHooks::default() };
            SqliteStore::open_with_hooks(old.dir(), Options::default(), hooks)
        },
    );
    conformance::a_fenced_out_owner_can_never_append_again(&mut backend);
}
