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

mod error;
mod head;
mod open;
mod writer;

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use tidegate_core::Event;
use tidegate_storage::wire::Chain;
use tidegate_storage::{LedgerStore, Lsn, Ownership, StoreError, StoredCheckpoint};

use head::{LedgerId, Mark};
use open::{Access, Check, Kind};
use writer::{Batch, Row, Shared};

pub use head::HEAD_FILE;
pub use open::{DB_FILE, LOCK_FILE};

/// The version of the table layout (`meta`, `events`, `cut_rows`, `checkpoint`) and the files
/// around it, stored in `meta.schema_version` next to the event format version. Same rule as
/// the event format: a reader refuses a newer one. History: 1, the first; 2 adds the hash
/// chain (`events.chain`, `checkpoint.chain`), the ledger's identity and owner token in
/// `meta`, and the high-water mark file `ledger.head`. A schema-1 ledger is read as is and
/// upgraded when opened for writing.
pub const SCHEMA_VERSION: u64 = 2;

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
struct Hooks {
    crash_after_appends: Option<u64>,
    crash_after_syncs: Option<u64>,
    ignore_dir_lock: bool,
}

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
    /// High-water marks written (one sync each; one per group commit that added rows).
    pub marks: u64,
    /// The last LSN assigned.
    pub last_lsn: Lsn,
    /// Every event up to here is durable.
    pub durable_lsn: Lsn,
    /// Rows queued for the next commit.
    pub queued_rows: usize,
    /// Whether the store has stopped after a failure.
    pub failed: bool,
}

/// The embedded default ledger: SQLite (compiled in) in WAL mode, in a data directory.
///
/// ```text
///   <dir>/LOCK          exclusive lock (holder's pid inside) — one owner per directory
///   <dir>/ledger.db     meta(key, value) · events(lsn, tx, kind, body, chain) · cut_rows · checkpoint
///   <dir>/ledger.head   high-water mark: last acknowledged LSN and its chain value
///   <dir>/ledger.db-wal, -shm   SQLite's write-ahead log (folded into ledger.db on a clean close)
/// ```
///
/// `append` encodes the batch, assigns its LSNs and queues it, without I/O. One writer
/// thread commits everything queued in one SQLite transaction (`synchronous=FULL`: one
/// sync) when somebody waits for durability, so concurrent appenders share a sync; then it
/// advances the high-water mark (a second sync), then the durable LSN, and wakes exactly the
/// blocking ([`LedgerStore::wait_durable`]) and async ([`tidegate_storage::durable`], no
/// thread needed) waiters it satisfied. If a write fails the store stops (see
/// [`LedgerStore`]). Dropping the store commits what is queued, folds the write-ahead log into
/// the database and releases the directory.
///
/// [`SqliteStore::open_read_only`] opens an operator's view: no lock, no writes, no cut, on a
/// read-only directory too, while a writer runs elsewhere.
#[derive(Debug)]
pub struct SqliteStore {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    read_only: bool,
    /// The ledger's identity (`None`: a schema-1 ledger opened read-only, without a chain).
    id: Option<LedgerId>,
    /// Rows from this LSN on were verified at open (or written by this store): a scan checks
    /// the chain only below it.
    checked_from: Lsn,
    access: Access,
    ownership: Ownership,
    crash_after_appends: Option<u64>,
    max_batch_rows: usize,
    /// Idle read connections for `scan` and `verify`.
    readers: Mutex<Vec<Connection>>,
    report: OpenReport,
    dir: PathBuf,
    /// Dropped last: the directory stays locked until the connections are closed.
    _lock: Option<File>,
}

fn missing_dir(dir: &Path) -> StoreError {
    crate::error::file(
        "open the data directory",
        dir,
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory (nothing was created)"),
    )
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger in `dir` with default [`Options`].
    pub fn open(dir: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(dir, Options::default())
    }

    /// Opens (creating it if `opts.create` and there is none) the ledger in `dir` for
    /// writing: takes the directory lock, checks the versions (refusing newer ones), upgrades
    /// an older ledger, holds the ledger to its high-water mark and verifies the rows (refusing
    /// a shortened, reordered or damaged ledger with an error naming what is wrong), cuts a
    /// corrupt tail above the mark (reported in [`SqliteStore::open_report`]), becomes the
    /// stream's owner (a new fencing token), then starts the writer.
    pub fn open_with(dir: impl AsRef<Path>, opts: Options) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_hooked(dir.as_ref(), opts, Hooks::default())
    }

    /// [`SqliteStore::open_with`] with crash injection (cargo feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    pub fn open_with_hooks(dir: impl AsRef<Path>, opts: Options, hooks: TestHooks) -> Result<SqliteStore, StoreError> {
        let hooks = Hooks {
            crash_after_appends: hooks.crash_after_appends,
            crash_after_syncs: hooks.crash_after_syncs,
            ignore_dir_lock: hooks.ignore_dir_lock,
        };
        SqliteStore::open_hooked(dir.as_ref(), opts, hooks)
    }

    /// Opens the ledger in `dir` read-only, verifying every row ([`Verify::Full`]).
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_read_only_with(dir, Verify::Full)
    }

    /// Opens the ledger in `dir` read-only: it never writes (no lock, no version raised, no
    /// tail cut, no upgrade), works on a read-only directory and beside a running writer, and
    /// refuses what a writing open refuses. A missing directory or database is an error
    /// naming it. A corrupt tail above the high-water mark is reported and hidden.
    pub fn open_read_only_with(dir: impl AsRef<Path>, verify: Verify) -> Result<SqliteStore, StoreError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(missing_dir(dir));
        }
        let path = dir.join(DB_FILE);
        if !path.is_file() {
            return Err(StoreError::NotALedger {
                path: path.clone(),
                detail: format!("there is no {DB_FILE} in {}", dir.display()),
            });
        }
        // The mark first: the database snapshot read after it holds at least what it says.
        let found = head::read(dir)?;
        let wal = dir.join(format!("{DB_FILE}-wal"));
        let (conn, kind, access) = match open::connect(&path, Access::Read).and_then(|c| {
            let k = open::inspect(&c, &path)?;
            Ok((c, k))
        }) {
            Ok((c, k)) => (c, k, Access::Read),
            // SQLite could not read through its shared-memory index (a read-only directory
            // without one); with no write-ahead log the database file alone is the ledger.
            Err(first) if !wal.exists() => match open::connect(&path, Access::ReadImmutable)
                .and_then(|c| open::inspect(&c, &path).map(|k| (c, k)))
            {
                Ok((c, k)) => (c, k, Access::ReadImmutable),
                Err(_) => return Err(first),
            },
            Err(e @ StoreError::Database { .. }) if !dir.join(format!("{DB_FILE}-shm")).exists() => {
                return Err(StoreError::Database {
                    op: "open read-only: the directory holds a write-ahead log (ledger.db-wal) without its \
                         index (ledger.db-shm), which SQLite cannot create here; copy the data directory somewhere \
                         writable and open the copy",
                    path,
                    retryable: false,
                    source: Box::new(e),
                });
            }
            Err(e) => return Err(e),
        };
        let (conn, access) = match kind {
            // A ledger whose creation was cut off before its schema was written (a kill
            // between creating the file and committing the schema). Nothing can have been
            // acknowledged from it unless its high-water mark says so; otherwise it reads as
            // the empty ledger it is (the next writing open creates the schema).
            Kind::Empty => match &found {
                head::Found::Missing => (open::connect(&path, Access::EmptySchema)?, Access::EmptySchema),
                head::Found::Mark { mark, .. } if mark.lsn == 0 => {
                    (open::connect(&path, Access::EmptySchema)?, Access::EmptySchema)
                }
                head::Found::Mark { mark, .. } => {
                    return Err(StoreError::Shortened { path, acknowledged: mark.lsn, last: 0 });
                }
                head::Found::Damaged(detail) => {
                    return Err(StoreError::Unprovable { path, detail: detail.clone() });
                }
            },
            _ => (conn, access),
        };
        let (id, mark, mut notes) = match kind {
            Kind::Empty => (
                None,
                None,
                vec![
                    "the database holds no tables: the ledger's creation was interrupted before its schema was \
                     written, so it holds no events and nothing was acknowledged (the next writing open creates it)"
                        .to_owned(),
                ],
            ),
            Kind::Legacy { .. } => (None, None, Vec::new()),
            Kind::Current { id, .. } => {
                let (mark, notes) = SqliteStore::expect_mark(&path, dir, id, found)?;
                (Some(id), Some(mark), notes)
            }
        };
        let v = open::verify_rows(&conn, &path, &Check { id, mark, verify, max_tail_cut: u64::MAX })?;
        notes.extend(v.notes);
        let report = OpenReport {
            path: path.clone(),
            created: false,
            read_only: true,
            format_version: kind.format(),
            schema_version: kind.schema(),
            upgraded: false,
            chained: id.is_some(),
            acknowledged_lsn: mark.map_or(0, |m| m.lsn),
            rows_verified: v.rows_verified,
            last_lsn: v.last,
            cut_rows: v.bad,
            notes,
        };
        let stream: Arc<str> = dir.display().to_string().into();
        Ok(SqliteStore {
            shared: Arc::new(Shared::new(path, v.last)),
            writer: None,
            read_only: true,
            id,
            checked_from: v.checked_from,
            access,
            ownership: Ownership { stream, token: 0 },
            crash_after_appends: None,
            max_batch_rows: 1,
            readers: Mutex::new(vec![conn]),
            report,
            dir: dir.to_owned(),
            _lock: None,
        })
    }

    /// The mark a schema-2 ledger must have: present, readable, and its own.
    fn expect_mark(
        path: &Path,
        dir: &Path,
        id: LedgerId,
        found: head::Found,
    ) -> Result<(Mark, Vec<String>), StoreError> {
        let head_path = head::path(dir);
        match found {
            head::Found::Missing => Err(StoreError::Unprovable {
                path: path.to_owned(),
                detail: format!(
                    "its high-water mark {} is missing, so a lost tail could not be told from a whole \
                     ledger. Copy a ledger with `tidegate ledger backup`, or the whole data directory \
                     after a clean stop, never {DB_FILE} alone",
                    head_path.display()
                ),
            }),
            head::Found::Damaged(detail) => Err(StoreError::Unprovable { path: path.to_owned(), detail }),
            head::Found::Mark { mark, note } => {
                if mark.id != id {
                    return Err(StoreError::Unprovable {
                        path: path.to_owned(),
                        detail: format!(
                            "its high-water mark {} belongs to another ledger (id {}, this ledger is {})",
                            head_path.display(),
                            head::id_hex(&mark.id),
                            head::id_hex(&id)
                        ),
                    });
                }
                Ok((mark, note.into_iter().collect()))
            }
        }
    }

    fn open_hooked(dir: &Path, opts: Options, hooks: Hooks) -> Result<SqliteStore, StoreError> {
        if !dir.is_dir() {
            if !opts.create {
                return Err(missing_dir(dir));
            }
            std::fs::create_dir_all(dir).map_err(|e| crate::error::file("create the data directory", dir, e))?;
        }
        let path = dir.join(DB_FILE);
        if !opts.create && !path.is_file() {
            return Err(StoreError::NotALedger {
                path: path.clone(),
                detail: format!("there is no {DB_FILE} in {}", dir.display()),
            });
        }
        let lock = if hooks.ignore_dir_lock { None } else { Some(open::lock_dir(dir)?) };
        let found = head::read(dir)?;
        let mut conn = open::connect(&path, Access::Write)?;
        let kind = open::inspect(&conn, &path)?;
        let mut notes = Vec::new();
        let mut cut_rows = Vec::new();
        let (mut created, mut upgraded) = (false, false);
        let (id, mark) = match kind {
            Kind::Empty => {
                // Nothing can have been acknowledged from a ledger without tables, unless its
                // high-water mark says otherwise.
                let mark = match found {
                    head::Found::Missing => {
                        let id = head::new_ledger_id(dir);
                        let mark = Mark { id, seq: 1, lsn: 0, chain: Chain::genesis(&id) };
                        head::create(dir, &mark)?;
                        mark
                    }
                    head::Found::Mark { mark, .. } if mark.lsn == 0 => mark,
                    head::Found::Mark { mark, .. } => {
                        return Err(StoreError::Shortened { path, acknowledged: mark.lsn, last: 0 });
                    }
                    head::Found::Damaged(detail) => return Err(StoreError::Unprovable { path, detail }),
                };
                open::create(&mut conn, &path, &mark.id)?;
                created = true;
                (mark.id, mark)
            }
            Kind::Legacy { .. } => {
                // Verified in full and its tail cut under the old rules, then chained.
                let v = open::verify_rows(
                    &conn,
                    &path,
                    &Check { id: None, mark: None, verify: Verify::Full, max_tail_cut: opts.max_tail_cut },
                )?;
                if !v.bad.is_empty() {
                    open::cut_tail(&mut conn, &path, &v.bad, v.last)?;
                }
                cut_rows = v.bad;
                let mark = open::upgrade(&mut conn, dir, &path, kind)?;
                upgraded = true;
                notes.push(format!(
                    "upgraded from format {} schema 1: the {} events before the upgrade are chained as found",
                    kind.format(),
                    mark.lsn
                ));
                (mark.id, mark)
            }
            Kind::Current { id, .. } => {
                let (mark, n) = SqliteStore::expect_mark(&path, dir, id, found)?;
                notes.extend(n);
                open::set_wal(&conn, &path)?;
                (id, mark)
            }
        };
        if let Some(bytes) = opts.max_ledger_bytes {
            let page: i64 = conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .map_err(|e| crate::error::database("read page_size", &path, e))?;
            let pages = i64::try_from(bytes / page.max(512) as u64).unwrap_or(i64::MAX).max(1);
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(|e| crate::error::database("set max_page_count", &path, e))?;
        }
        let check = Check { id: Some(id), mark: Some(mark), verify: opts.verify, max_tail_cut: opts.max_tail_cut };
        let v = open::verify_rows(&conn, &path, &check)?;
        notes.extend(v.notes);
        if !v.bad.is_empty() {
            open::cut_tail(&mut conn, &path, &v.bad, v.last)?;
        }
        cut_rows.extend(v.bad);
        let token = open::take_ownership(&mut conn, &path)?;
        let genesis = Chain::genesis(&id);
        let last_chain = v.last_chain.unwrap_or(genesis);
        let mut head_file = head::HeadFile::open(dir, mark)?;
        if v.last > mark.lsn {
            // Rows a crash left committed but unmarked: durable, so from now on acknowledged.
            head_file.advance(v.last, last_chain)?;
        }
        let report = OpenReport {
            path: path.clone(),
            created,
            read_only: false,
            format_version: kind.format(),
            schema_version: kind.schema(),
            upgraded,
            chained: true,
            acknowledged_lsn: mark.lsn,
            rows_verified: v.rows_verified,
            last_lsn: v.last,
            cut_rows,
            notes,
        };
        let stream: Arc<str> = dir.display().to_string().into();
        let shared = Arc::new(Shared::new(path, v.last));
        let cfg = writer::WriterConfig::new(
            &opts,
            hooks.crash_after_syncs,
            (genesis, last_chain),
            head_file,
            stream.to_string(),
            token,
        );
        let for_writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("tidegate-ledger-writer".into())
            .spawn(move || writer::run(&for_writer, conn, cfg))
            .map_err(|e| StoreError::Io { op: "start the ledger writer thread", source: e })?;
        Ok(SqliteStore {
            shared,
            writer: Some(writer),
            read_only: false,
            id: Some(id),
            checked_from: v.checked_from,
            access: Access::Read,
            ownership: Ownership { stream, token },
            crash_after_appends: hooks.crash_after_appends,
            max_batch_rows: opts.max_batch_rows.max(1),
            readers: Mutex::new(Vec::new()),
            report,
            dir: dir.to_owned(),
            _lock: lock,
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The database file (`<dir>/ledger.db`).
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// What the open found: versions, rows verified, the high-water mark, and any corrupt
    /// tail it cut.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// Whether the store is open read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Every event up to this LSN is durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        let st = self.shared.state.lock();
        StoreStats {
            appends: st.appends,
            syncs: st.syncs,
            marks: st.marks,
            last_lsn: self.shared.last.load(Ordering::Acquire),
            durable_lsn: st.durable,
            queued_rows: st.queued_rows,
            failed: st.failed.is_some(),
        }
    }

    /// Makes everything appended so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.wait_durable(self.last_lsn())
    }

    /// Fault injection (cargo feature `test-hooks`): "crashes" now. Queued batches are
    /// dropped without being committed (a commit already under way may still land, as in a
    /// real crash), every waiter gets an error, and every later call fails. Drop the store and
    /// reopen the directory to recover.
    #[cfg(feature = "test-hooks")]
    pub fn crash_now(&self) {
        let st = self.shared.state.lock();
        if st.failed.is_none() {
            let n = st.syncs + 1;
            self.shared.fail(st, StoreError::InjectedCrash { what: "crash_now", n });
        }
    }

    /// Checks the whole durable ledger: SQLite's own `quick_check`; LSNs exactly `1..=n`;
    /// every row decodes as an event matching its `kind` and `tx` columns; the hash chain
    /// from the ledger's genesis to its end; the checkpoint's recorded chain value; and the
    /// high-water mark (the ledger reaches it, and the row there is the one acknowledged).
    /// Any failure is an error naming the LSN and the rule broken.
    pub fn verify(&self) -> Result<VerifyReport, StoreError> {
        let mark = match self.id {
            Some(id) => {
                let path = &self.shared.path;
                Some(SqliteStore::expect_mark(path, &self.dir, id, head::read(&self.dir)?)?.0)
            }
            None => None,
        };
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let check: String = conn
                .query_row("PRAGMA quick_check", [], |r| r.get(0))
                .map_err(|e| crate::error::database("quick_check", path, e))?;
            if check != "ok" {
                return Err(StoreError::Corrupt { lsn: 0, detail: format!("SQLite quick_check: {check}") });
            }
            let v = open::verify_rows(
                conn,
                path,
                &Check { id: self.id, mark, verify: Verify::Full, max_tail_cut: u64::MAX },
            )?;
            if let Some(first) = v.bad.first() {
                return Err(StoreError::Corrupt {
                    lsn: first.lsn,
                    detail: format!(
                        "{} ({} corrupt rows at the tail, above the high-water mark; a writing open would cut them)",
                        first.reason,
                        v.bad.len()
                    ),
                });
            }
            if let Some(ck) = v.notes.first() {
                return Err(StoreError::Corrupt { lsn: 0, detail: ck.clone() });
            }
            Ok(VerifyReport { rows: v.last, acknowledged_lsn: mark.map_or(0, |m| m.lsn), chained: self.id.is_some() })
        })
    }

    /// Copies the ledger into a new data directory `dest` with SQLite's online backup API: a
    /// consistent snapshot taken in one step, while this store (or a writer in another
    /// process, for a read-only store) keeps appending. The copy gets its own high-water mark
    /// at its last LSN; it must reach the source's mark as it was when the copy started, and
    /// its whole chain is verified before the mark is written. `dest` must not hold a ledger.
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackupReport, StoreError> {
        let dest = dest.as_ref();
        let dest_db = dest.join(DB_FILE);
        for existing in [dest_db.clone(), head::path(dest), dest.join(format!("{DB_FILE}-wal"))] {
            if existing.exists() {
                return Err(StoreError::InvalidArgument {
                    field: "backup destination",
                    value: dest.display().to_string(),
                    expected: "a directory that holds no ledger (it has a ledger.db, ledger.head or WAL)",
                });
            }
        }
        std::fs::create_dir_all(dest).map_err(|e| crate::error::file("create the backup directory", dest, e))?;
        let before = match self.id {
            Some(id) => Some(SqliteStore::expect_mark(&self.shared.path, &self.dir, id, head::read(&self.dir)?)?.0),
            None => None,
        };
        self.with_reader(|src| {
            let mut dst = open::connect(&dest_db, Access::Write)?;
            let backup = rusqlite::backup::Backup::new(src, &mut dst)
                .map_err(|e| crate::error::database("start the backup", &dest_db, e))?;
            // All pages in one step, so the copy is one snapshot of the source; a busy or
            // locked database is retried for a while, then reported.
            for _ in 0..500 {
                match backup.step(-1).map_err(|e| crate::error::database("copy the ledger", &dest_db, e))? {
                    rusqlite::backup::StepResult::Done => return Ok(()),
                    _ => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
            Err(StoreError::Database {
                op: "copy the ledger",
                path: dest_db.clone(),
                retryable: true,
                source: "the source stayed busy or locked for 5 s".into(),
            })
        })?;
        let dst = open::connect(&dest_db, Access::Write)?;
        let kind = open::inspect(&dst, &dest_db)?;
        open::set_wal(&dst, &dest_db)?;
        let (last, mark) = match kind {
            Kind::Current { id, .. } => {
                let v = open::verify_rows(
                    &dst,
                    &dest_db,
                    &Check { id: Some(id), mark: before, verify: Verify::Full, max_tail_cut: 0 },
                )?;
                let chain = v.last_chain.unwrap_or_else(|| Chain::genesis(&id));
                (v.last, Some(Mark { id, seq: 1, lsn: v.last, chain }))
            }
            Kind::Legacy { .. } => {
                let v = open::verify_rows(
                    &dst,
                    &dest_db,
                    &Check { id: None, mark: None, verify: Verify::Full, max_tail_cut: 0 },
                )?;
                (v.last, None)
            }
            Kind::Empty => {
                return Err(StoreError::NotALedger { path: dest_db, detail: "the copy holds no tables".into() });
            }
        };
        let _ = dst.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        drop(dst);
        File::open(&dest_db)
            .and_then(|f| f.sync_all())
            .map_err(|e| crate::error::file("sync the backup", &dest_db, e))?;
        if let Some(m) = mark {
            head::create(dest, &m)?;
        } else {
            head::sync_dir(dest)?;
        }
        let bytes = std::fs::metadata(&dest_db).map(|m| m.len()).unwrap_or(0);
        Ok(BackupReport { dir: dest.to_owned(), last_lsn: last, acknowledged_lsn: before.map_or(0, |m| m.lsn), bytes })
    }

    /// Commits what is queued, folds the write-ahead log into the database, stops the writer
    /// and releases the directory, reporting a failure the store had stopped on. (Dropping
    /// does the same, silently.)
    pub fn close(mut self) -> Result<(), StoreError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), StoreError> {
        // The read connections close first, so the writer's connection is the last one and
        // its checkpoint can fold the whole log into the database.
        self.readers.lock().clear();
        self.shared.state.lock().closing = true;
        self.shared.work.notify_all();
        if let Some(handle) = self.writer.take()
            && handle.join().is_err()
        {
            return Err(StoreError::Io {
                op: "stop the ledger writer",
                source: std::io::Error::other("the writer thread panicked"),
            });
        }
        self.shared.state.lock().failure()
    }

    /// Runs `f` on an idle read connection (opening one if none is idle, so a `scan` inside
    /// a `scan`'s visitor works).
    fn with_reader<R>(&self, f: impl FnOnce(&Connection) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let conn = self.readers.lock().pop();
        let conn = match conn {
            Some(c) => c,
            None => open::connect(&self.shared.path, self.access)?,
        };
        let r = f(&conn);
        let mut idle = self.readers.lock();
        if idle.len() < 4 {
            idle.push(conn);
        }
        r
    }

    /// Visits committed rows with `from ≤ LSN ≤ upto`, checking each row and its chain value
    /// (from the stored value before `from`). Returns the LSN after the last row read and
    /// whether `visit` asked to stop.
    fn scan_committed(
        &self,
        from: Lsn,
        upto: Lsn,
        visit: &mut dyn FnMut(Lsn, &Event) -> bool,
    ) -> Result<(Lsn, bool), StoreError> {
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let db = |op| move |e| crate::error::database(op, path, e);
            let mut prev = match self.id {
                None => None,
                // Verified at open, or written by this store.
                Some(_) if from >= self.checked_from => None,
                Some(id) if from <= 1 => Some(Chain::genesis(&id)),
                Some(_) => {
                    let stored: Option<Option<Vec<u8>>> = conn
                        .query_row("SELECT chain FROM events WHERE lsn = ?1", [(from - 1) as i64], |r| r.get(0))
                        .optional()
                        .map_err(db("scan"))?;
                    match stored.flatten().and_then(|b| Chain::from_slice(&b)) {
                        Some(c) => Some(c),
                        None => {
                            return Err(StoreError::Corrupt {
                                lsn: from - 1,
                                detail: "it has no readable hash chain value".into(),
                            });
                        }
                    }
                }
            };
            let sql = if self.id.is_some() {
                "SELECT lsn, tx, kind, body, chain FROM events WHERE lsn >= ?1 AND lsn <= ?2 ORDER BY lsn"
            } else {
                "SELECT lsn, tx, kind, body, NULL FROM events WHERE lsn >= ?1 AND lsn <= ?2 ORDER BY lsn"
            };
            let mut stmt = conn.prepare_cached(sql).map_err(db("scan"))?;
            let mut rows = stmt.query([from as i64, upto as i64]).map_err(db("scan"))?;
            let mut next = from;
            while let Some(row) = rows.next().map_err(db("scan"))? {
                let lsn: i64 = row.get(0).map_err(db("scan"))?;
                if lsn != next as i64 {
                    return Err(StoreError::Corrupt {
                        lsn: next,
                        detail: format!("missing; the next row has LSN {lsn}"),
                    });
                }
                let body: ValueRef<'_> = row.get_ref(3).map_err(db("scan"))?;
                let (event, bytes) =
                    open::check_row(row.get_ref(1).map_err(db("scan"))?, row.get_ref(2).map_err(db("scan"))?, body)
                        .map_err(|detail| StoreError::Corrupt { lsn: next, detail })?;
                if let Some(p) = prev {
                    let (c, linked) = open::check_chain(&p, next, bytes, row.get_ref(4).map_err(db("scan"))?);
                    linked.map_err(|detail| StoreError::Corrupt { lsn: next, detail })?;
                    prev = if next + 1 >= self.checked_from { None } else { Some(c) };
                }
                next += 1;
                if !visit(lsn as Lsn, &event) {
                    return Ok((next, true));
                }
            }
            Ok((next, false))
        })
    }
}

/// Wakes a thread blocked in [`SqliteStore::wait_durable`].
struct Unpark {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl LedgerStore for SqliteStore {
    fn append(&self, batch: &Arc<[Event]>) -> Result<Lsn, StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.shared.path.clone(), op: "append" });
        }
        let rows =
            batch.iter().enumerate().map(|(i, e)| Row::encode(i, e)).collect::<Result<Vec<Row>, StoreError>>()?;
        let mut st = self.shared.state.lock();
        st.failure()?;
        let last = self.shared.last.load(Ordering::Relaxed);
        if rows.is_empty() {
            return Ok(last);
        }
        if self.crash_after_appends.is_some_and(|n| st.appends >= n) {
            let n = st.appends + 1;
            return Err(self.shared.fail(st, StoreError::InjectedCrash { what: "append", n }));
        }
        let new_last = last + rows.len() as Lsn;
        if i64::try_from(new_last).is_err() {
            return Err(StoreError::InvalidArgument {
                field: "batch length",
                value: rows.len().to_string(),
                expected: "LSNs that fit in a signed 64-bit integer",
            });
        }
        st.appends += 1;
        let was_empty = st.queue.is_empty();
        if was_empty {
            st.oldest = Some(Instant::now());
        }
        st.queued_rows += rows.len();
        let full = st.queued_rows >= self.max_batch_rows;
        st.queue.push(Arc::new(Batch { first: last + 1, rows }));
        self.shared.last.store(new_last, Ordering::Release);
        drop(st);
        if was_empty || full {
            // The writer learns the idle deadline, or that the queue is full.
            self.shared.work.notify_one();
        }
        Ok(new_last)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.shared.durable.load(Ordering::Acquire)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        if self.is_durable(lsn) {
            return Ok(());
        }
        // The same registration as an async waiter, with a waker that unparks this thread:
        // a commit wakes only the waiters it satisfies.
        let unpark = Arc::new(Unpark { thread: std::thread::current(), woken: AtomicBool::new(false) });
        let waker = Waker::from(unpark.clone());
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = self.poll_durable(lsn, &mut cx) {
                return r;
            }
            while !unpark.woken.swap(false, Ordering::AcqRel) {
                std::thread::park();
            }
        }
    }

    fn poll_durable(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        if self.is_durable(lsn) {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.shared.state.lock();
        if st.durable >= lsn {
            return Poll::Ready(Ok(()));
        }
        if let Err(e) = st.failure() {
            return Poll::Ready(Err(e));
        }
        let last = self.shared.last.load(Ordering::Relaxed);
        if lsn > last {
            return Poll::Ready(Err(StoreError::BeyondEnd { lsn, last }));
        }
        let wakers = st.wakers.entry(lsn).or_default();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        if st.wanted < lsn {
            st.wanted = lsn;
            self.shared.work.notify_one();
        }
        Poll::Pending
    }

    fn last_lsn(&self) -> Lsn {
        self.shared.last.load(Ordering::Acquire)
    }

    /// The data directory, and the token this open took in `meta` (0 for a read-only store,
    /// which never writes).
    fn ownership(&self) -> Ownership {
        self.ownership.clone()
    }

    /// Reads committed events from SQLite, then the ones still queued or being committed
    /// from memory, so the result is every event appended, in LSN order.
    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let mut pos = from.max(1);
        loop {
            self.shared.state.lock().failure()?;
            let durable = self.durable_lsn();
            if pos <= durable {
                let (next, stopped) = self.scan_committed(pos, durable, visit)?;
                if stopped {
                    return Ok(());
                }
                pos = next;
            }
            // Under the lock, every event after `st.durable` is in `inflight` or `queue`.
            let pending: Vec<Arc<Batch>> = {
                let st = self.shared.state.lock();
                st.failure()?;
                if st.durable >= pos {
                    continue; // committed meanwhile: read it from the database
                }
                st.inflight.iter().chain(&st.queue).filter(|b| b.last() >= pos).cloned().collect()
            };
            for b in &pending {
                for (i, row) in b.rows.iter().enumerate() {
                    let lsn = b.first + i as Lsn;
                    if lsn < pos {
                        continue;
                    }
                    if !visit(lsn, &row.decode(lsn)?) {
                        return Ok(());
                    }
                }
            }
            return Ok(());
        }
    }

    /// Hands the checkpoint to the writer, which writes it in its next commit (started at
    /// once), after every batch queued so far; waits for that commit.
    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly { path: self.shared.path.clone(), op: "put_checkpoint" });
        }
        if i64::try_from(lsn).is_err() {
            return Err(StoreError::InvalidArgument {
                field: "checkpoint lsn",
                value: lsn.to_string(),
                expected: "an LSN that fits in a signed 64-bit integer",
            });
        }
        let mut st = self.shared.state.lock();
        st.failure()?;
        let last = self.shared.last.load(Ordering::Relaxed);
        if lsn > last {
            return Err(StoreError::BeyondEnd { lsn, last });
        }
        st.checkpoint_requested += 1;
        let seq = st.checkpoint_requested;
        st.checkpoint = Some((seq, lsn, Arc::from(bytes)));
        self.shared.work.notify_one();
        while st.checkpoint_written < seq {
            st.failure()?;
            self.shared.checkpointed.wait(&mut st);
        }
        Ok(())
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.shared.state.lock().failure()?;
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let row: Option<(i64, Vec<u8>)> = conn
                .query_row("SELECT lsn, body FROM checkpoint WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(|e| crate::error::database("read the checkpoint", path, e))?;
            match row {
                None => Ok(None),
                Some((lsn, bytes)) => match u64::try_from(lsn) {
                    Ok(lsn) => Ok(Some(StoredCheckpoint { lsn, bytes })),
                    Err(_) => Err(StoreError::Corrupt { lsn: 0, detail: format!("checkpoint row has LSN {lsn}") }),
                },
            }
        })
    }
}
