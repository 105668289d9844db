//! How a store is opened: [`Options`], how much to [`Verify`] at open, and the crash hooks of
//! the tests.

use serde::{Deserialize, Serialize};

/// How much of the ledger [`SqliteStore::open_with`] decodes before accepting it. Whatever
/// the choice, open checks that the LSNs are dense up to the high-water mark and that the
/// row at the mark is the one acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// Every row, and the whole hash chain: any corrupt row is found at open. Open then costs
    /// a read of the whole history (about 4 s per 8 million events).
    Full,
    /// Only the last `rows` rows (and their chain, from the stored value before them); LSN
    /// continuity is still checked for all. A corrupt row before them is found later, by the
    /// `scan` that reads it (an error naming its LSN).
    Tail {
        /// How many rows at the end to decode.
        rows: u64,
    },
    /// Only the rows after the stored checkpoint (all rows if there is none), which are the
    /// rows a reopening engine replays, chained from the value the checkpoint recorded; LSN
    /// continuity is checked for them, and the ledger's first LSN is checked to be 1. Open
    /// then reads nothing before the checkpoint, so its cost follows the tail, not the
    /// history. `verify()` still checks everything. The default: a ledger without a
    /// checkpoint is verified in full.
    SinceCheckpoint,
}

/// How a [`SqliteStore`] is opened. Every field has a default ([`Options::default`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// How much to verify at open. Default: [`Verify::SinceCheckpoint`].
    pub verify: Verify,
    /// The most corrupt tail rows (above the high-water mark) open may cut; more is refused
    /// as corruption. Default 10 000.
    pub max_tail_cut: u64,
    /// Commit as soon as this many rows are queued, even if nobody waits. Default 16 384.
    pub max_batch_rows: usize,
    /// Commit queued rows nobody waits for after this many milliseconds (`None`: only when
    /// someone waits, the queue is full, or the store closes). Default `Some(100)`.
    pub idle_flush_ms: Option<u64>,
    /// Refuse to grow the database file past about this many bytes (SQLite's
    /// `max_page_count`); the commit that would is a write failure. Default `None`.
    pub max_ledger_bytes: Option<u64>,
    /// Create the data directory and a new ledger if there is none. With `false`, a missing
    /// directory is an error naming it. Default `true`.
    pub create: bool,
    /// Acknowledge a group commit only after its high-water mark is synced too. Default
    /// `false`: the mark is *written* before a commit is acknowledged and synced behind it
    /// (at most [`mark_sync_ms`](Options::mark_sync_ms) later). A crash of the process loses
    /// nothing either way (the mark is in the page cache, the commit in SQLite); only a power
    /// loss that also loses the write-ahead log inside that window could shorten the ledger
    /// undetected (docs/ledger.md, "Acknowledgement and the mark"). `true` closes the window
    /// at the price of a second sync in series per commit.
    pub ack_after_mark: bool,
    /// Sync the high-water mark at most this many milliseconds after it was written (0: as
    /// soon as it is written, behind the acknowledgement). `sync()`, a checkpoint and a clean
    /// close sync it at once. At most 60 000. Default 50.
    pub mark_sync_ms: u64,
}

impl Options {
    /// The largest [`mark_sync_ms`](Options::mark_sync_ms) accepted.
    pub const MAX_MARK_SYNC_MS: u64 = 60_000;

    /// Checks the fields a caller could set out of range.
    pub(crate) fn check(&self) -> Result<(), tidegate_storage::StoreError> {
        if self.mark_sync_ms > Options::MAX_MARK_SYNC_MS {
            return Err(tidegate_storage::StoreError::InvalidArgument {
                field: "mark_sync_ms",
                value: self.mark_sync_ms.to_string(),
                expected: "at most 60000 milliseconds",
            });
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            verify: Verify::SinceCheckpoint,
            max_tail_cut: 10_000,
            max_batch_rows: 16_384,
            idle_flush_ms: Some(100),
            max_ledger_bytes: None,
            create: true,
            ack_after_mark: false,
            mark_sync_ms: 50,
        }
    }
}

/// Fault injection for crash tests (cargo feature `test-hooks`). `None`/`false` never fires.
/// Passed to [`SqliteStore::open_with_hooks`]; the production [`Options`] have no such
/// switches.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// Let this many non-empty appends succeed; the next one "crashes" the store (it fails,
    /// and so does everything after it; queued batches are dropped, not committed).
    pub crash_after_appends: Option<u64>,
    /// Let this many group commits succeed; the next one "crashes" the store instead of
    /// committing (its batches are dropped, and reopening shows none of them). Set
    /// `idle_flush_ms: None` in the [`Options`] too if the test counts syncs.
    pub crash_after_syncs: Option<u64>,
    /// Open without taking the directory lock, as if the lock did not work (a file system
    /// where `flock` is not reliable): a second owner can then open the directory, and the
    /// owner token in `meta` is what fences the first one out.
    pub ignore_dir_lock: bool,
}

/// The hooks as the store keeps them (always present, inert without the feature).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Hooks {
    pub(crate) crash_after_appends: Option<u64>,
    pub(crate) crash_after_syncs: Option<u64>,
    pub(crate) ignore_dir_lock: bool,
}
