//! [`SqliteStore`]: what a handle holds, its accessors, closing it, its pool of read
//! connections, and the [`LedgerStore`] contract, whose operations live by side: `append.rs`
//! (appending and waiting for durability), `read.rs` (scanning, reading the checkpoint).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rusqlite::Connection;
use tidegate_core::Event;
use tidegate_storage::{LedgerStore, Lsn, Ownership, StoreError, StoredCheckpoint};

use crate::head::LedgerId;
use crate::report::{OpenReport, StoreStats};
use crate::schema::{self, Access};
use crate::writer::Shared;

/// The embedded default ledger: SQLite (compiled in) in WAL mode, in a data directory.
///
/// ```text
///   <dir>/LOCK          exclusive lock (holder's pid inside) — one owner per directory
///   <dir>/ledger.db     meta(key, value) · events(lsn, tx, kind, body, chain) · cut_rows · checkpoint
///   <dir>/ledger.head   high-water mark: the last acknowledged LSN and its chain value (written
///                       before each acknowledgement, synced behind it)
///   <dir>/ledger.db-wal, -shm   SQLite's write-ahead log (folded into ledger.db on a clean close)
/// ```
///
/// `append` assigns the batch its LSNs and queues it as it is (shared, not copied), without
/// encoding it and without I/O: the caller holds the engine's lock. One writer thread encodes
/// and commits everything queued in one SQLite transaction (`synchronous=FULL`: one
/// sync) when somebody waits for durability, so concurrent appenders share a sync; then it
/// advances the durable LSN and wakes exactly the blocking ([`LedgerStore::wait_durable`]) and
/// async ([`tidegate_storage::durable`], no thread needed) waiters it satisfied, while a
/// marker thread syncs the high-water mark behind it (before the wake instead with
/// [`Options::ack_after_mark`](crate::Options::ack_after_mark)). If a write fails the store stops (see
/// [`LedgerStore`]). Dropping the store commits what is queued, folds the write-ahead log into
/// the database and releases the directory.
///
/// [`SqliteStore::open_read_only`] opens an operator's view: no lock, no writes, no cut, on a
/// read-only directory too, while a writer runs elsewhere.
#[derive(Debug)]
pub struct SqliteStore {
    pub(crate) shared: Arc<Shared>,
    pub(crate) writer: Option<JoinHandle<()>>,
    pub(crate) read_only: bool,
    /// The ledger's identity (`None`: a schema-1 ledger opened read-only, without a chain).
    pub(crate) id: Option<LedgerId>,
    /// Rows from this LSN on were verified at open (or written by this store): a scan checks
    /// the chain only below it.
    pub(crate) checked_from: Lsn,
    pub(crate) access: Access,
    pub(crate) ownership: Ownership,
    pub(crate) crash_after_appends: Option<u64>,
    pub(crate) max_batch_rows: usize,
    /// Idle read connections for `scan` and `verify`.
    pub(crate) readers: Mutex<Vec<Connection>>,
    pub(crate) report: OpenReport,
    pub(crate) dir: PathBuf,
    /// Dropped last: the directory stays locked until the connections are closed.
    pub(crate) _lock: Option<File>,
}

impl SqliteStore {
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
            marked_lsn: st.marked,
            queued_rows: st.queued_rows,
            failed: st.failed.is_some(),
        }
    }

    /// Makes everything appended so far durable, and waits until the high-water mark covers
    /// it too (so a copy of the directory taken now proves every event of it).
    pub fn sync(&self) -> Result<(), StoreError> {
        let last = self.last_lsn();
        self.wait_durable(last)?;
        let mut st = self.shared.state.lock();
        while st.marked < last {
            st.failure()?;
            st.mark_now = true;
            self.shared.marking.notify_one();
            self.shared.marked.wait(&mut st);
        }
        Ok(())
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
    pub(crate) fn with_reader<R>(&self, f: impl FnOnce(&Connection) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let conn = self.readers.lock().pop();
        let conn = match conn {
            Some(c) => c,
            None => schema::connect(&self.shared.path, self.access)?,
        };
        let r = f(&conn);
        let mut idle = self.readers.lock();
        if idle.len() < 4 {
            idle.push(conn);
        }
        r
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl LedgerStore for SqliteStore {
    fn append(&self, batch: &tidegate_core::Batch) -> Result<Lsn, StoreError> {
        self.append_batch(batch)
    }

    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.shared.durable.load(Ordering::Acquire)
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        self.wait_durable_blocking(lsn)
    }

    fn poll_durable(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        self.poll_durable_lsn(lsn, cx)
    }

    fn last_lsn(&self) -> Lsn {
        self.shared.last.load(Ordering::Acquire)
    }

    /// The data directory, and the token this open took in `meta` (0 for a read-only store,
    /// which never writes).
    fn ownership(&self) -> Ownership {
        self.ownership.clone()
    }

    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        self.scan_events(from, visit)
    }

    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        self.put_checkpoint_now(lsn, bytes)
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.read_checkpoint()
    }
}
