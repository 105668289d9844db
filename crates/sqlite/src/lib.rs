//! The embedded default ledger backend: SQLite in WAL mode, one data directory, group commit.
//!
//! [`SqliteStore`] implements the contract of `tidegate-storage` ([`LedgerStore`]) and passes
//! its conformance suite. The record format, the schema and the upgrade rule are specified in
//! `docs/ledger.md`. With the cargo feature `test-hooks`, [`TestHooks`] and
//! [`SqliteStore::crash_now`] inject crashes for tests; production builds have neither.

#![deny(missing_docs)]

mod error;
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
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use tidegate_core::Event;

use tidegate_storage::{LedgerStore, Lsn, StoreError, StoredCheckpoint};
use writer::{Batch, Row, Shared};

/// The version of the table layout (`meta`, `events`, `cut_rows`), stored in
/// `meta.schema_version` next to the event format version. Same rule as the event format:
/// a reader refuses a newer one.
pub const SCHEMA_VERSION: u64 = 1;

/// How much of the ledger [`SqliteStore::open_with`] decodes before accepting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// Every row: any corrupt row is found at open. Open then costs a read of the whole
    /// history (about 4 s per 8 million events).
    Full,
    /// Only the last `rows` rows; LSN continuity is still checked for all. A corrupt row
    /// before them is found later, by the `scan` that reads it (an error naming its LSN).
    Tail {
        /// How many rows at the end to decode.
        rows: u64,
    },
    /// Only the rows after the stored checkpoint (all rows if there is none), which are the
    /// rows a reopening engine replays; LSN continuity is checked for them, and the ledger's
    /// first LSN is checked to be 1. Open then reads nothing before the checkpoint, so its
    /// cost follows the tail, not the history. `verify()` still checks everything. The
    /// default: a ledger without a checkpoint is verified in full.
    SinceCheckpoint,
}

/// How a [`SqliteStore`] is opened. Every field has a default ([`Options::default`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// How much to verify at open. Default: [`Verify::SinceCheckpoint`].
    pub verify: Verify,
    /// The most corrupt tail rows open may cut; more is refused as corruption. Default 10 000.
    pub max_tail_cut: u64,
    /// Commit as soon as this many rows are queued, even if nobody waits. Default 16 384.
    pub max_batch_rows: usize,
    /// Commit queued rows nobody waits for after this many milliseconds (`None`: only when
    /// someone waits, the queue is full, or the store closes). Default `Some(100)`.
    pub idle_flush_ms: Option<u64>,
    /// Refuse to grow the database file past about this many bytes (SQLite's
    /// `max_page_count`); the commit that would is a write failure. Default `None`.
    pub max_ledger_bytes: Option<u64>,
}

/// Fault injection for crash tests (cargo feature `test-hooks`): where the store "crashes".
/// `None` never crashes there. Passed to [`SqliteStore::open_with_hooks`]; the production
/// [`Options`] have no such switches.
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
}

/// The hooks as the store keeps them (always present, inert without the feature).
#[derive(Debug, Clone, Copy, Default)]
struct Hooks {
    crash_after_appends: Option<u64>,
    crash_after_syncs: Option<u64>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            verify: Verify::SinceCheckpoint,
            max_tail_cut: 10_000,
            max_batch_rows: 16_384,
            idle_flush_ms: Some(100),
            max_ledger_bytes: None,
        }
    }
}

/// A row cut from a corrupt tail at open (moved to the `cut_rows` table, not deleted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CutRow {
    /// Its LSN.
    pub lsn: Lsn,
    /// What was wrong with it.
    pub reason: String,
}

/// What [`SqliteStore::open_with`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenReport {
    /// The database file.
    pub path: PathBuf,
    /// Whether the ledger was created by this open.
    pub created: bool,
    /// The event format version the ledger had (now raised to this build's).
    pub format_version: u32,
    /// How many rows were decoded and checked.
    pub rows_verified: u64,
    /// The last LSN after the open (after any cut).
    pub last_lsn: Lsn,
    /// Corrupt tail rows that were cut, in LSN order. Empty for a healthy ledger.
    pub cut_rows: Vec<CutRow>,
}

impl fmt::Display for OpenReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.created { "created" } else { "opened" };
        write!(
            f,
            "{what} ledger {} (format {}), last LSN {}, {} rows verified",
            self.path.display(),
            self.format_version,
            self.last_lsn,
            self.rows_verified
        )?;
        if let (Some(first), Some(last)) = (self.cut_rows.first(), self.cut_rows.last()) {
            write!(
                f,
                "; cut a corrupt tail of {} rows (LSN {}..={}, kept in table cut_rows): {}",
                self.cut_rows.len(),
                first.lsn,
                last.lsn,
                first.reason
            )?;
        }
        Ok(())
    }
}

/// Counters of a [`SqliteStore`], for benchmarks and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Non-empty appends since open.
    pub appends: u64,
    /// Group commits (one sync each) since open.
    pub syncs: u64,
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
///   <dir>/LOCK         exclusive lock (holder's pid inside) — one store per directory
///   <dir>/ledger.db    meta(key, value) · events(lsn, tx, kind, body) · cut_rows(…)
///   <dir>/ledger.db-wal, -shm   SQLite's write-ahead log
/// ```
///
/// `append` encodes the batch, assigns its LSNs and queues it, without I/O. One writer
/// thread commits everything queued in one SQLite transaction (`synchronous=FULL`: one
/// sync) when somebody waits for durability, so concurrent appenders share a sync; then it
/// advances the durable LSN and wakes exactly the blocking ([`LedgerStore::wait_durable`])
/// and async ([`tidegate_storage::durable`], no thread needed) waiters it satisfied. If a write fails the store stops (see [`LedgerStore`]).
/// Dropping the store commits what is queued and releases the directory.
#[derive(Debug)]
pub struct SqliteStore {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    crash_after_appends: Option<u64>,
    max_batch_rows: usize,
    /// Idle read connections for `scan` and `verify`.
    readers: Mutex<Vec<Connection>>,
    report: OpenReport,
    dir: PathBuf,
    /// Dropped last: the directory stays locked until the connections are closed.
    _lock: File,
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger in `dir` with default [`Options`].
    pub fn open(dir: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(dir, Options::default())
    }

    /// Opens (creating if needed) the ledger in `dir`: takes the directory lock, checks the
    /// format version (refusing a newer one), verifies the rows and cuts a corrupt tail
    /// (reported in [`SqliteStore::open_report`]), then starts the writer.
    pub fn open_with(dir: impl AsRef<Path>, opts: Options) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_hooked(dir.as_ref(), opts, Hooks::default())
    }

    /// [`SqliteStore::open_with`] with crash injection (cargo feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    pub fn open_with_hooks(dir: impl AsRef<Path>, opts: Options, hooks: TestHooks) -> Result<SqliteStore, StoreError> {
        let hooks =
            Hooks { crash_after_appends: hooks.crash_after_appends, crash_after_syncs: hooks.crash_after_syncs };
        SqliteStore::open_hooked(dir.as_ref(), opts, hooks)
    }

    fn open_hooked(dir: &Path, opts: Options, hooks: Hooks) -> Result<SqliteStore, StoreError> {
        let path = open::db_path(dir)?;
        let lock = open::lock_dir(dir)?;
        let mut conn = open::connect(&path, false)?;
        let (created, format_version) = open::prepare(&mut conn, &path)?;
        if let Some(bytes) = opts.max_ledger_bytes {
            let page: i64 = conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .map_err(|e| crate::error::database("read page_size", &path, e))?;
            let pages = i64::try_from(bytes / page.max(512) as u64).unwrap_or(i64::MAX).max(1);
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(|e| crate::error::database("set max_page_count", &path, e))?;
        }
        let (rows_verified, last_lsn, cut_rows) = open::verify_and_cut(&mut conn, &path, &opts)?;
        let report = OpenReport { path: path.clone(), created, format_version, rows_verified, last_lsn, cut_rows };

        let shared = Arc::new(Shared::new(path, last_lsn));
        let cfg = writer::WriterConfig::new(&opts, hooks.crash_after_syncs);
        let for_writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("tidegate-ledger-writer".into())
            .spawn(move || writer::run(&for_writer, conn, &cfg))
            .map_err(|e| StoreError::Io { op: "start the ledger writer thread", source: e })?;
        Ok(SqliteStore {
            shared,
            writer: Some(writer),
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

    /// What the open found: versions, rows verified, and any corrupt tail it cut.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
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

    /// Checks the durable ledger: SQLite's own `quick_check`, then every row decodes as an
    /// event matching its `kind` and `tx` columns, with LSNs exactly `1..=n`. Returns `n`.
    pub fn verify(&self) -> Result<u64, StoreError> {
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let db = |op| move |e| crate::error::database(op, path, e);
            let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(db("quick_check"))?;
            if check != "ok" {
                return Err(StoreError::Corrupt { lsn: 0, detail: format!("SQLite quick_check: {check}") });
            }
            let mut stmt = conn.prepare("SELECT lsn, tx, kind, body FROM events ORDER BY lsn").map_err(db("verify"))?;
            let mut rows = stmt.query([]).map_err(db("verify"))?;
            let mut expected: Lsn = 1;
            while let Some(row) = rows.next().map_err(db("verify"))? {
                let lsn: i64 = row.get(0).map_err(db("verify"))?;
                if lsn != expected as i64 {
                    return Err(StoreError::Corrupt {
                        lsn: expected,
                        detail: format!("missing; the next row has LSN {lsn}"),
                    });
                }
                let ok = open::check_row(
                    row.get_ref(1).map_err(db("verify"))?,
                    row.get_ref(2).map_err(db("verify"))?,
                    row.get_ref(3).map_err(db("verify"))?,
                );
                if let Err(detail) = ok {
                    return Err(StoreError::Corrupt { lsn: expected, detail });
                }
                expected += 1;
            }
            Ok(expected - 1)
        })
    }

    /// Commits what is queued, stops the writer and releases the directory, reporting a
    /// failure the store had stopped on. (Dropping does the same, silently.)
    pub fn close(mut self) -> Result<(), StoreError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), StoreError> {
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
            None => open::connect(&self.shared.path, true)?,
        };
        let r = f(&conn);
        let mut idle = self.readers.lock();
        if idle.len() < 4 {
            idle.push(conn);
        }
        r
    }

    /// Visits committed rows with LSN ≥ `from`. Returns the LSN after the last row read and
    /// whether `visit` asked to stop.
    fn scan_committed(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(Lsn, bool), StoreError> {
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let db = |op| move |e| crate::error::database(op, path, e);
            let mut stmt = conn
                .prepare_cached("SELECT lsn, tx, kind, body FROM events WHERE lsn >= ?1 ORDER BY lsn")
                .map_err(db("scan"))?;
            let mut rows = stmt.query([from as i64]).map_err(db("scan"))?;
            let mut next = from;
            while let Some(row) = rows.next().map_err(db("scan"))? {
                let lsn: i64 = row.get(0).map_err(db("scan"))?;
                if lsn != next as i64 {
                    return Err(StoreError::Corrupt {
                        lsn: next,
                        detail: format!("missing; the next row has LSN {lsn}"),
                    });
                }
                let event = open::check_row(
                    row.get_ref(1).map_err(db("scan"))?,
                    row.get_ref(2).map_err(db("scan"))?,
                    row.get_ref(3).map_err(db("scan"))?,
                )
                .map_err(|detail| StoreError::Corrupt { lsn: next, detail })?;
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
    fn append(&self, events: &mut dyn Iterator<Item = Event>) -> Result<Lsn, StoreError> {
        let rows = events.enumerate().map(|(i, e)| Row::encode(i, &e)).collect::<Result<Vec<Row>, StoreError>>()?;
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

    /// Reads committed events from SQLite, then the ones still queued or being committed
    /// from memory, so the result is every event appended, in LSN order.
    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let mut pos = from.max(1);
        loop {
            self.shared.state.lock().failure()?;
            if pos <= self.durable_lsn() {
                let (next, stopped) = self.scan_committed(pos, visit)?;
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
