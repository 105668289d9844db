//! [`SqliteState`]: the tenant state in `<tenant dir>/state.db` (SQLite, WAL), on a thread of
//! its own (blocking SQLite calls never run on an async task: an operation is sent to the
//! thread when it is called and its future waits for the answer).
//!
//! ```text
//!   idempotency(id PK AUTOINCREMENT, key UNIQUE, begun_ms, method, path, body JSON,
//!               done, status?, content_type?, location?, response BLOB?)
//!   tasks(n PK AUTOINCREMENT, capability, operation, tool, key, effect_key, args JSON,
//!         output JSON?, attempt, lease_ms, worker?, lease_until_ms?, lease_started_ms,
//!         holders JSON, carried, settled, result JSON?)
//!   attempt_keys(id PK AUTOINCREMENT, effect_key UNIQUE)
//!   attempts(id PK AUTOINCREMENT, effect_key, operation, capability, kind, attempt, key,
//!            started_ms, finished_ms?, result, detail)
//! ```
//!
//! Schema version: `PRAGMA user_version` = [`SCHEMA_VERSION`]; a newer one is refused, a file
//! that is not a SQLite database, fails `PRAGMA quick_check` or lacks a table is
//! [`StateError::Corrupt`] (the tenant does not open; nothing is reset behind anyone's back).
//! A row that does not decode is `Corrupt` for the operation that read it.
//!
//! Durability: each operation is one write transaction, except attempt records, which the
//! thread gathers and writes together (at most 256 in one transaction): before any other job
//! runs, once the queue is empty when someone waits on one, else once 64 are gathered or the
//! oldest has waited 10 ms. What is acknowledged to someone (a
//! completed idempotency record, a task queued, leased, heartbeaten, reported or adopted)
//! commits with `synchronous=FULL`; what is not (a running idempotency marker, which is
//! dropped at the next open anyway, a freed key, a withdrawn task, an attempt record, the
//! bounds' deletions) with `synchronous=NORMAL`, which in WAL mode survives a process crash
//! and may lose the newest such commits with the machine.
//!
//! At open, in one transaction: running idempotency records are dropped and unsettled tasks
//! are marked carried over (module docs of `state`).

mod records;
pub(in crate::state) mod tasks;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, TransactionBehavior};

use super::{Limits, StateError, StateFuture};
use crate::dispatch::Operation;

/// The state file in a tenant's directory.
pub const STATE_FILE: &str = "state.db";

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE idempotency(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    begun_ms INTEGER NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    body TEXT NOT NULL,
    done INTEGER NOT NULL,
    status INTEGER,
    content_type TEXT,
    location TEXT,
    response BLOB
);
CREATE INDEX idempotency_age ON idempotency(done, begun_ms);
CREATE TABLE tasks(
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    capability TEXT NOT NULL,
    operation TEXT NOT NULL,
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    effect_key TEXT NOT NULL,
    args TEXT NOT NULL,
    output TEXT,
    attempt INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL,
    worker TEXT,
    lease_until_ms INTEGER,
    lease_started_ms INTEGER NOT NULL,
    holders TEXT NOT NULL,
    carried INTEGER NOT NULL,
    settled INTEGER NOT NULL,
    result TEXT
);
CREATE INDEX tasks_ready ON tasks(capability, n) WHERE settled = 0;
CREATE INDEX tasks_settled ON tasks(settled, carried, n);
CREATE INDEX tasks_carried ON tasks(key) WHERE carried = 1;
CREATE TABLE attempt_keys(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_key TEXT NOT NULL UNIQUE
);
CREATE TABLE attempts(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_key TEXT NOT NULL,
    operation TEXT NOT NULL,
    capability TEXT NOT NULL,
    kind TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    key TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    finished_ms INTEGER,
    result TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX attempts_by_key ON attempts(effect_key, id);
";

const TABLES: [&str; 4] = ["idempotency", "tasks", "attempt_keys", "attempts"];

type Job = Box<dyn FnOnce(&mut Db) + Send>;

/// The tenant state in a SQLite file.
pub struct SqliteState {
    path: PathBuf,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SqliteState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteState").field("path", &self.path).finish_non_exhaustive()
    }
}

/// How a write commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sync {
    /// `synchronous=FULL`: acknowledged records.
    Full,
    /// `synchronous=NORMAL`: what nobody was told about.
    Relaxed,
}

/// The connection and what the thread keeps beside it.
pub(super) struct Db {
    conn: Connection,
    path: PathBuf,
    limits: Limits,
    sync: Option<Sync>,
    /// Idempotency rows, when known (forgotten after a failed write).
    idempotency_rows: Option<u64>,
    /// Attempt keys, when known.
    attempt_keys: Option<u64>,
    /// Settlements since the settled tasks were last pruned.
    settled_since_prune: usize,
    /// Attempt records gathered for one write ([`Db::flush_attempts`]), with whoever waits
    /// on each.
    pending_attempts: Vec<(String, crate::dispatch::Attempt, Option<AttemptWaiter>)>,
    /// When the oldest of them was gathered.
    pending_since: Option<std::time::Instant>,
}

/// Who waits on an attempt record.
type AttemptWaiter = tokio::sync::oneshot::Sender<Result<(), StateError>>;

/// Most attempt records gathered into one write.
const MAX_GATHERED_ATTEMPTS: usize = 256;

/// How long an attempt record nobody waits on may wait for others to share its write.
const ATTEMPT_GATHER: Duration = Duration::from_millis(10);

/// Maps SQLite's error for `op` on `path`: a damaged file or one that is not a database is
/// [`StateError::Corrupt`].
pub(super) fn sql_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(rusqlite::Error) -> StateError + 'a {
    move |e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
            StateError::Corrupt { path: path.to_owned(), detail: format!("{op}: {e}") }
        }
        _ => StateError::Sqlite { path: path.to_owned(), op, source: std::sync::Arc::new(e) },
    }
}

/// An operation's text as the file keeps it (`Operation::as_str`), read back.
pub(in crate::state) fn operation(
    path: &Path,
    whose: impl std::fmt::Display,
    text: &str,
) -> Result<Operation, StateError> {
    Ok(match text {
        "call" => Operation::Call,
        "release" => Operation::Release,
        "compensate" => Operation::Compensate,
        "probe" => Operation::Probe,
        other => return Err(corrupt(path, format!("{whose}: unknown operation `{other}`"))),
    })
}

/// A value in a row that does not decode.
pub(in crate::state) fn corrupt(path: &Path, what: impl std::fmt::Display) -> StateError {
    StateError::Corrupt { path: path.to_owned(), detail: what.to_string() }
}

impl Db {
    fn open(path: &Path, limits: Limits) -> Result<Db, StateError> {
        let conn = Connection::open(path).map_err(sql_err(path, "open"))?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(sql_err(path, "set the busy timeout"))?;
        // Every statement of the hot paths stays prepared (rusqlite keeps 16 by default).
        conn.set_prepared_statement_cache_capacity(64);
        // Without the planner's stability guarantee, SQLite marks a statement whose plan may
        // depend on a bound value and re-prepares it after each rebinding: the per-attempt
        // `DELETE ... LIMIT 1 OFFSET ?2` that keeps each effect's attempts bounded (a bound
        // LIMIT/OFFSET is such a value) was parsed and planned again on every attempt record,
        // about 120,000 instructions per server transaction. It changes plans only, never
        // results, and no statement here relies on a value-specific plan (no ANALYZE data).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(sql_err(path, "enable the query planner stability guarantee"))?;
        let mut db = Db {
            conn,
            path: path.to_owned(),
            limits,
            sync: None,
            idempotency_rows: None,
            attempt_keys: None,
            settled_since_prune: 0,
            pending_attempts: Vec::new(),
            pending_since: None,
        };
        db.prepare()?;
        Ok(db)
    }

    /// WAL, integrity, schema, and the carry-over of what the previous process left.
    fn prepare(&mut self) -> Result<(), StateError> {
        let path = self.path.clone();
        // The first statement that reads the file: one that is not a database fails here.
        let _mode: String = self
            .conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(sql_err(&path, "switch to WAL mode"))?;
        let mut check = self.conn.prepare("PRAGMA quick_check").map_err(sql_err(&path, "check integrity"))?;
        let problems: Vec<String> = check
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect())
            .map_err(sql_err(&path, "check integrity"))?;
        drop(check);
        if problems != ["ok"] {
            return Err(corrupt(&path, format!("integrity check: {}", problems.join("; "))));
        }
        let version: i64 =
            self.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(sql_err(&path, "read the version"))?;
        let tables: i64 = self
            .conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
                [],
                |r| r.get(0),
            )
            .map_err(sql_err(&path, "list the tables"))?;
        match version {
            0 if tables == 0 => {
                let tx = self
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql_err(&path, "create the schema"))?;
                tx.execute_batch(SCHEMA).map_err(sql_err(&path, "create the schema"))?;
                tx.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(sql_err(&path, "create the schema"))?;
                tx.commit().map_err(sql_err(&path, "create the schema"))?;
            }
            0 => return Err(corrupt(&path, "it holds tables but no schema version: not a state file")),
            SCHEMA_VERSION => {
                for t in TABLES {
                    let n: i64 = self
                        .conn
                        .query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1", [t], |r| {
                            r.get(0)
                        })
                        .map_err(sql_err(&path, "list the tables"))?;
                    if n != 1 {
                        return Err(corrupt(&path, format!("table `{t}` is missing")));
                    }
                }
            }
            v if v > SCHEMA_VERSION => {
                return Err(StateError::Version { path, found: v, supported: SCHEMA_VERSION });
            }
            v => return Err(corrupt(&path, format!("unknown schema version {v}"))),
        }
        self.write(Sync::Full, "carry over the previous process's state", |tx, _| {
            let e = |op| sql_err(&path, op);
            // A running record's request was never answered with a 2xx: nothing of it was
            // acknowledged, and its client's retry runs it again.
            tx.execute("DELETE FROM idempotency WHERE done = 0", []).map_err(e("drop running records"))?;
            tx.execute("UPDATE tasks SET carried = 1 WHERE settled = 0", []).map_err(e("carry over the tasks"))?;
            Ok(())
        })
    }

    fn set_sync(&mut self, sync: Sync) -> Result<(), StateError> {
        if self.sync != Some(sync) {
            let value = if sync == Sync::Full { "FULL" } else { "NORMAL" };
            self.sync = None;
            self.conn.pragma_update(None, "synchronous", value).map_err(sql_err(&self.path, "set synchronous"))?;
            self.sync = Some(sync);
        }
        Ok(())
    }

    /// Runs `f` in one write transaction committed as `sync` says. A failure rolls it back
    /// and forgets the cached counts (they are read again).
    fn write<T>(
        &mut self,
        sync: Sync,
        op: &'static str,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &mut Counts<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        self.set_sync(sync)?;
        let path = self.path.clone();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql_err(&path, op))?;
        let mut counts = Counts {
            path: &path,
            limits: &self.limits,
            idempotency_rows: &mut self.idempotency_rows,
            attempt_keys: &mut self.attempt_keys,
            settled_since_prune: &mut self.settled_since_prune,
        };
        let result = f(&tx, &mut counts).and_then(|v| tx.commit().map(|()| v).map_err(sql_err(&path, op)));
        if result.is_err() {
            self.idempotency_rows = None;
            self.attempt_keys = None;
        }
        result
    }
}

/// The counts a write keeps current, and the bounds.
pub(super) struct Counts<'a> {
    path: &'a Path,
    limits: &'a Limits,
    idempotency_rows: &'a mut Option<u64>,
    attempt_keys: &'a mut Option<u64>,
    settled_since_prune: &'a mut usize,
}

impl Counts<'_> {
    fn count(&self, tx: &rusqlite::Transaction<'_>, table: &str) -> Result<u64, StateError> {
        let n: i64 = tx
            .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .map_err(sql_err(self.path, "count rows"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

impl SqliteState {
    /// Opens (or creates) `dir/`[`STATE_FILE`] and starts its thread, named after `name`.
    /// Blocking.
    pub fn open(dir: &Path, limits: Limits, name: &str) -> Result<SqliteState, StateError> {
        let limits = Limits {
            idempotency_max: limits.idempotency_max.max(1),
            attempts_retained: limits.attempts_retained.max(1),
            ..limits
        };
        std::fs::create_dir_all(dir).map_err(|source| StateError::Io {
            path: dir.to_owned(),
            op: "create the directory",
            source: std::sync::Arc::new(source),
        })?;
        let path = dir.join(STATE_FILE);
        let mut db = Db::open(&path, limits)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("tidegate-state-{name}"))
            .spawn(move || {
                // Attempt records wait while more jobs are queued and are written together
                // once the queue is empty (or before any other job, which flushes them first).
                // Records nobody waits on also wait up to `ATTEMPT_GATHER` for company (a
                // read flushes them first, so nothing is hidden from it meanwhile).
                loop {
                    let job = if db.pending_attempts.is_empty() {
                        rx.recv().ok()
                    } else {
                        let waited = db.pending_attempts.iter().any(|(_, _, w)| w.is_some());
                        let left = if waited || db.pending_attempts.len() >= MAX_GATHERED_ATTEMPTS / 4 {
                            Duration::ZERO
                        } else {
                            db.pending_since.map_or(Duration::ZERO, |t| ATTEMPT_GATHER.saturating_sub(t.elapsed()))
                        };
                        match rx.recv_timeout(left) {
                            Ok(job) => Some(job),
                            Err(mpsc::RecvTimeoutError::Timeout) => {
                                db.flush_attempts();
                                continue;
                            }
                            Err(mpsc::RecvTimeoutError::Disconnected) => None,
                        }
                    };
                    let Some(job) = job else { break };
                    job(&mut db);
                }
                db.flush_attempts();
            })
            .map_err(|source| StateError::Io {
                path: path.clone(),
                op: "start the state thread",
                source: std::sync::Arc::new(source),
            })?;
        Ok(SqliteState { path, jobs: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) })
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `f` to the state's thread now; the future yields its answer.
    fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<T, StateError> + Send + 'static,
    ) -> StateFuture<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |db| {
            // Gathered attempt records are written before anything that could read them.
            db.flush_attempts();
            let _ = tx.send(f(db));
        });
        let sent = self.jobs.lock().as_ref().is_some_and(|s| s.send(job).is_ok());
        Box::pin(async move {
            if !sent {
                return Err(StateError::Closed);
            }
            rx.await.unwrap_or(Err(StateError::Closed))
        })
    }

    /// Sends an attempt record to the state's thread, which gathers it with others into one
    /// write; the future (when `wait`) yields once it is written.
    fn submit_attempt(&self, effect_key: String, attempt: crate::dispatch::Attempt, wait: bool) -> StateFuture<()> {
        let (tx, rx) = if wait {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let job: Job = Box::new(move |db| {
            if db.pending_attempts.is_empty() {
                db.pending_since = Some(std::time::Instant::now());
            }
            db.pending_attempts.push((effect_key, attempt, tx));
            if db.pending_attempts.len() >= MAX_GATHERED_ATTEMPTS {
                db.flush_attempts();
            }
        });
        let sent = self.jobs.lock().as_ref().is_some_and(|s| s.send(job).is_ok());
        if !sent && !wait {
            tracing::warn!("recording a dispatch attempt: {}", StateError::Closed);
        }
        Box::pin(async move {
            if !sent {
                return Err(StateError::Closed);
            }
            match rx {
                Some(rx) => rx.await.unwrap_or(Err(StateError::Closed)),
                None => Ok(()),
            }
        })
    }

    /// Finishes every operation submitted so far and closes the file. Blocking. Later
    /// operations fail [`StateError::Closed`].
    pub fn close(&self) {
        drop(self.jobs.lock().take());
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for SqliteState {
    fn drop(&mut self) {
        // The thread ends once it has done what was submitted; nobody waits for it here (a
        // drop may happen on an async task).
        drop(self.jobs.lock().take());
    }
}
