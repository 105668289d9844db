//! The embedded default ledger backend: SQLite in WAL mode, one data directory, group commit.
//!
//! [`SqliteStore`] implements the contract of `tidegate-storage` ([`LedgerStore`]) and passes
//! its conformance suite. The ledger's integrity does not rest on SQLite's: every row carries
//! a hash chain value over its stored bytes, and a high-water mark outside the database
//! (`ledger.head`, synced after each group commit and before anyone hears of it) records the
//! last acknowledged LSN and its chain value, so a ledger that lost, reordered or changed
//! acknowledged events is refused at open, never replayed as if whole. The record format,
//! the schema, the guarantees and their limits and the upgrade rule are specified in
//! `docs/ledger.md`. With the cargo feature `test-hooks`, `TestHooks` and
//! `SqliteStore::crash_now` inject crashes for tests; production builds have neither.

#![deny(missing_docs)]

mod append;
mod backup;
mod check;
mod error;
mod head;
mod open;
mod options;
mod read;
mod report;
mod schema;
mod store;
mod writer;

pub use head::HEAD_FILE;
#[cfg(feature = "test-hooks")]
pub use options::TestHooks;
pub use options::{Options, Verify};
pub use report::{BackupReport, CutRow, OpenReport, StoreStats, VerifyReport};
pub use schema::{DB_FILE, LOCK_FILE};
pub use store::SqliteStore;

/// The version of the table layout (`meta`, `events`, `cut_rows`, `checkpoint`) and the files
/// around it, stored in `meta.schema_version` next to the event format version. Same rule as
/// the event format: a reader refuses a newer one. History: 1, the first; 2 adds the hash
/// chain (`events.chain`, `checkpoint.chain`), the ledger's identity and owner token in
/// `meta`, and the high-water mark file `ledger.head`. A schema-1 ledger is read as is and
/// upgraded when opened for writing.
pub const SCHEMA_VERSION: u64 = 2;
