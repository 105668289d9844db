//! What a store reports: what an open found and did, what `verify` checked, what `backup`
//! wrote, and the counters.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;
use tidegate_storage::Lsn;

/// A row cut from a corrupt tail at open (moved to the `cut_rows` table, not deleted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CutRow {
    /// Its LSN.
    pub lsn: Lsn,
    /// What was wrong with it.
    pub reason: String,
}

/// What [`SqliteStore::open_with`] (or [`SqliteStore::open_read_only`]) found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenReport {
    /// The database file.
    pub path: PathBuf,
    /// Whether the ledger was created by this open.
    pub created: bool,
    /// Whether the store is open read-only (then nothing was changed).
    pub read_only: bool,
    /// The event format version the ledger had (raised to this build's when opened for
    /// writing).
    pub format_version: u32,
    /// The schema version the ledger had (likewise).
    pub schema_version: u64,
    /// Whether this open upgraded an older ledger to this build's schema.
    pub upgraded: bool,
    /// Whether the ledger carries the hash chain and high-water mark (schema 2 and later). A
    /// schema-1 ledger opened read-only does not: its completeness cannot be proven.
    pub chained: bool,
    /// The high-water mark the ledger was held to: the last LSN acknowledged as durable.
    pub acknowledged_lsn: Lsn,
    /// How many rows were decoded and checked.
    pub rows_verified: u64,
    /// The last LSN after the open (after any cut).
    pub last_lsn: Lsn,
    /// Corrupt tail rows above the high-water mark that were cut, in LSN order (read-only:
    /// that a writing open would cut; they are not shown). Empty for a healthy ledger.
    pub cut_rows: Vec<CutRow>,
    /// Anything else worth an operator's attention.
    pub notes: Vec<String>,
}

impl fmt::Display for OpenReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match (self.created, self.read_only, self.upgraded) {
            (true, _, _) => "created",
            (_, true, _) => "opened read-only",
            (_, _, true) => "upgraded",
            _ => "opened",
        };
        write!(
            f,
            "{what} ledger {} (format {}, schema {}), last LSN {}, {} rows verified",
            self.path.display(),
            self.format_version,
            self.schema_version,
            self.last_lsn,
            self.rows_verified
        )?;
        if self.chained {
            write!(f, ", acknowledged up to LSN {} (high-water mark checked)", self.acknowledged_lsn)?;
        } else {
            write!(f, ", no hash chain (schema 1): completeness cannot be proven until it is upgraded")?;
        }
        if let (Some(first), Some(last)) = (self.cut_rows.first(), self.cut_rows.last()) {
            let did = if self.read_only { "a writing open would cut" } else { "cut" };
            let kept = if self.read_only { "not shown" } else { "kept in table cut_rows" };
            write!(
                f,
                "; {did} a corrupt tail of {} rows (LSN {}..={}, {kept}): {}",
                self.cut_rows.len(),
                first.lsn,
                last.lsn,
                first.reason
            )?;
        }
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

/// What [`SqliteStore::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Rows checked: the ledger holds exactly LSNs `1..=rows`.
    pub rows: u64,
    /// The high-water mark the ledger was held to (0 for a schema-1 ledger).
    pub acknowledged_lsn: Lsn,
    /// Whether the hash chain was checked (schema 2 and later).
    pub chained: bool,
}

/// What [`SqliteStore::backup`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackupReport {
    /// The new data directory.
    pub dir: PathBuf,
    /// The copy's last LSN.
    pub last_lsn: Lsn,
    /// The source's high-water mark when the copy started: the copy holds at least this.
    pub acknowledged_lsn: Lsn,
    /// The database file's size.
    pub bytes: u64,
}

/// Counters of a [`SqliteStore`], for benchmarks and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Non-empty appends since open.
    pub appends: u64,
    /// Group commits (one SQLite commit and sync each) since open.
    pub syncs: u64,
    /// Syncs of the high-water mark (at most one per `mark_sync_ms` while commits happen, or
    /// one per group commit with `ack_after_mark`; each covers every mark written before it).
    pub marks: u64,
    /// The last LSN assigned.
    pub last_lsn: Lsn,
    /// Every event up to here is durable (committed and synced by SQLite; acknowledged).
    pub durable_lsn: Lsn,
    /// Every event up to here is covered by the *synced* high-water mark (it reaches
    /// `durable_lsn` at most [`Options::mark_sync_ms`](crate::Options::mark_sync_ms) later; it is
    /// never behind it with [`Options::ack_after_mark`](crate::Options::ack_after_mark)).
    pub marked_lsn: Lsn,
    /// Rows queued for the next commit.
    pub queued_rows: usize,
    /// Whether the store has stopped after a failure.
    pub failed: bool,
}
