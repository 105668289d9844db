//! The database behind the middleware: a small trait and two real backends.
//!
//! Contract: `begin`, then any number of `query`/`execute`, then `commit` or `rollback`. A
//! statement error inside a transaction leaves it open; the caller MUST roll back. Values are
//! bound positionally in the placeholder style of [`Database::dialect`]; named placeholders are
//! rewritten by [`crate::value::bind`]. Constraint violations are reported as non-retryable
//! [`Error::Database`]; connection trouble and serialisation failures as retryable.

use crate::error::{Error, Result};
use crate::value::{Dialect, Row, SqlValue};

/// A relational database the middleware executes transactions on.
pub trait Database: Send {
    /// The placeholder style.
    fn dialect(&self) -> Dialect;
    /// Runs several `;`-separated statements without parameters (schema, loading).
    fn batch(&mut self, sql: &str) -> Result<()>;
    /// Starts a transaction.
    fn begin(&mut self) -> Result<()>;
    /// Commits the open transaction.
    fn commit(&mut self) -> Result<()>;
    /// Rolls the open transaction back (a no-op when none is open).
    fn rollback(&mut self) -> Result<()>;
    /// Runs a query and returns all its rows.
    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>>;
    /// Runs a statement and returns the number of rows it changed.
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64>;
}

/// Bounds on every piece of SQL a tenant or an LLM supplies (docs/review.md, "Least
/// privilege"): both backends interrupt a call that runs longer than `statement_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlBounds {
    /// The longest one call (a statement, or one statement of a batch on PostgreSQL; a whole
    /// batch on SQLite) may run before the database interrupts it. Default 30 s.
    pub statement_timeout: std::time::Duration,
}

impl Default for SqlBounds {
    fn default() -> Self {
        SqlBounds { statement_timeout: std::time::Duration::from_secs(30) }
    }
}

/// The pragmas tenant SQL may run on SQLite: read-only looks at the tenant's own schema.
const SQLITE_PRAGMAS: [&str; 9] = [
    "table_info",
    "table_xinfo",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
];

/// Built-in functions that reach beyond the database (files, shared libraries) or its
/// internals; every other function SQLite has built in is allowed (the connection registers
/// none of its own).
const SQLITE_DENIED_FUNCTIONS: [&str; 6] =
    ["load_extension", "fts3_tokenizer", "readfile", "writefile", "edit", "fsdir"];

/// Eponymous virtual tables that show the database's files or pages rather than its rows.
const SQLITE_DENIED_TABLES: [&str; 6] =
    ["dbstat", "sqlite_dbpage", "sqlite_dbdata", "sqlite_dbptr", "sqlite_stmt", "fts3tokenize"];

/// What the authorizer and the progress handler share with the connection.
#[derive(Debug)]
struct SqlitePolicy {
    /// Why the authorizer last refused, read when the statement fails.
    denied: std::sync::Mutex<Option<String>>,
    /// The reference point of `deadline_ms`.
    origin: std::time::Instant,
    /// Milliseconds after `origin` at which a running call is interrupted; 0: none.
    deadline_ms: std::sync::atomic::AtomicU64,
}

impl SqlitePolicy {
    fn arm(&self, timeout: std::time::Duration) {
        *self.denied.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let at = self.origin.elapsed().saturating_add(timeout).as_millis();
        self.deadline_ms.store(u64::try_from(at).unwrap_or(u64::MAX).max(1), std::sync::atomic::Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.deadline_ms.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    fn expired(&self) -> bool {
        let d = self.deadline_ms.load(std::sync::atomic::Ordering::Relaxed);
        d != 0 && u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX) >= d
    }

    fn take_denied(&self) -> Option<String> {
        self.denied.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// The authorizer's rule: `Err(what)` names what a statement may not do. Everything outside
/// the tenant's own `main` database is refused (attached and temporary databases, temporary
/// schema objects), as are ATTACH/DETACH (and so `VACUUM`, which attaches its target),
/// virtual tables, pragmas outside [`SQLITE_PRAGMAS`] (a `pragma_*` table-valued function
/// runs its pragma, so it is checked the same way) and [`SQLITE_DENIED_FUNCTIONS`].
fn sqlite_authorize(ctx: &rusqlite::hooks::AuthContext<'_>) -> std::result::Result<(), String> {
    use rusqlite::hooks::AuthAction as A;
    let lower = |s: &str| s.to_ascii_lowercase();
    match ctx.action {
        A::Attach { .. } => return Err("ATTACH DATABASE (also run by VACUUM)".into()),
        A::Detach { .. } => return Err("DETACH DATABASE".into()),
        A::CreateTempIndex { .. }
        | A::CreateTempTable { .. }
        | A::CreateTempTrigger { .. }
        | A::CreateTempView { .. }
        | A::DropTempIndex { .. }
        | A::DropTempTable { .. }
        | A::DropTempTrigger { .. }
        | A::DropTempView { .. } => return Err("temporary schema objects (CREATE TEMP ...)".into()),
        A::CreateVtable { module_name, .. } | A::DropVtable { module_name, .. } => {
            return Err(format!("virtual tables (module `{module_name}`)"));
        }
        A::Pragma { pragma_name, .. } if !SQLITE_PRAGMAS.contains(&lower(pragma_name).as_str()) => {
            return Err(format!(
                "PRAGMA {pragma_name} (and pragma_{pragma_name}); allowed: {}",
                SQLITE_PRAGMAS.join(", ")
            ));
        }
        A::Function { function_name } if SQLITE_DENIED_FUNCTIONS.contains(&lower(function_name).as_str()) => {
            return Err(format!("the function {function_name}()"));
        }
        A::Read { table_name, .. } if SQLITE_DENIED_TABLES.contains(&lower(table_name).as_str()) => {
            return Err(format!("the virtual table {table_name}"));
        }
        // ATTACH and DETACH of a name bound at run time (`ATTACH ?1`) arrive without their
        // argument, as codes rusqlite does not name.
        A::Unknown { code: rusqlite::ffi::SQLITE_ATTACH, .. } => return Err("ATTACH DATABASE".into()),
        A::Unknown { code: rusqlite::ffi::SQLITE_DETACH, .. } => return Err("DETACH DATABASE".into()),
        A::Unknown { code, .. } => return Err(format!("an action SQLite reports as code {code}")),
        _ => {}
    }
    match ctx.database_name {
        Some(db) if !db.eq_ignore_ascii_case("main") => {
            Err(format!("objects of the database `{db}` (only the tenant's own `main` database is reachable)"))
        }
        _ => Ok(()),
    }
}

/// SQLite through rusqlite (the embedded default), with least privilege on every connection:
/// an authorizer that keeps statements inside the tenant's own `main`
/// database, extension loading off, `SQLITE_DBCONFIG_DEFENSIVE` on, `trusted_schema` off,
/// ATTACH unable to create or write files, limits (no attached database at all, 16 MiB values,
/// 1 MiB statements, trigger depth 16), and a progress handler that interrupts a call running
/// longer than [`SqlBounds::statement_timeout`]. A refusal is a non-retryable
/// [`Error::Database`] naming what was refused; error texts never carry the database's path.
pub struct SqliteDatabase {
    conn: rusqlite::Connection,
    policy: std::sync::Arc<SqlitePolicy>,
    bounds: SqlBounds,
    /// Texts replaced in error messages (the file's path and directory), longest first.
    hide: Vec<(String, &'static str)>,
}

impl std::fmt::Debug for SqliteDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDatabase").field("bounds", &self.bounds).finish_non_exhaustive()
    }
}

fn sqlite_retryable(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

impl SqliteDatabase {
    /// Opens (or creates) a database file, with foreign keys enforced, under the default
    /// [`SqlBounds`].
    pub fn open(path: &std::path::Path) -> Result<SqliteDatabase> {
        Self::open_with(path, SqlBounds::default())
    }

    /// Opens (or creates) a database file under `bounds`. The file name is taken as a path,
    /// never as a URI.
    pub fn open_with(path: &std::path::Path, bounds: SqlBounds) -> Result<SqliteDatabase> {
        use rusqlite::OpenFlags as F;
        fn note(hide: &mut Vec<(String, &'static str)>, p: &std::path::Path, label: &'static str) {
            let text = p.to_string_lossy().into_owned();
            if text.len() > 1 && !hide.iter().any(|(t, _)| *t == text) {
                hide.push((text, label));
            }
        }
        let mut hide = Vec::new();
        note(&mut hide, path, "<review database>");
        if let Some(dir) = path.parent() {
            note(&mut hide, dir, "<review directory>");
        }
        let flags = F::SQLITE_OPEN_READ_WRITE | F::SQLITE_OPEN_CREATE | F::SQLITE_OPEN_NO_MUTEX;
        let conn = rusqlite::Connection::open_with_flags(path, flags).map_err(|e| {
            let mut msg = e.to_string();
            for (t, label) in &hide {
                msg = msg.replace(t.as_str(), label);
            }
            Error::db("open", msg, sqlite_retryable(&e))
        })?;
        if let Ok(real) = std::fs::canonicalize(path) {
            note(&mut hide, &real, "<review database>");
            if let Some(dir) = real.parent() {
                note(&mut hide, dir, "<review directory>");
            }
        }
        hide.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        Self::setup(conn, bounds, hide)
    }

    /// A private in-memory database under the default [`SqlBounds`].
    pub fn memory() -> Result<SqliteDatabase> {
        Self::memory_with(SqlBounds::default())
    }

    /// A private in-memory database under `bounds`.
    pub fn memory_with(bounds: SqlBounds) -> Result<SqliteDatabase> {
        use rusqlite::OpenFlags as F;
        let conn = rusqlite::Connection::open_in_memory_with_flags(F::SQLITE_OPEN_READ_WRITE | F::SQLITE_OPEN_NO_MUTEX)
            .map_err(|e| Error::db("open", e, false))?;
        Self::setup(conn, bounds, Vec::new())
    }

    fn setup(
        mut conn: rusqlite::Connection,
        bounds: SqlBounds,
        hide: Vec<(String, &'static str)>,
    ) -> Result<SqliteDatabase> {
        use rusqlite::config::DbConfig as C;
        use rusqlite::limits::Limit as L;
        let fail = |op: &'static str| move |e: rusqlite::Error| Error::db(op, e, false);
        // Settings the server chooses, before the authorizer refuses pragmas.
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
            .map_err(fail("pragma"))?;
        conn.load_extension_disable().map_err(fail("disable extension loading"))?;
        for (option, on) in [
            (C::SQLITE_DBCONFIG_DEFENSIVE, true),
            (C::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false),
            (C::SQLITE_DBCONFIG_WRITABLE_SCHEMA, false),
            (C::SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, false),
            (C::SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE, false),
            (C::SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE, false),
        ] {
            let now = conn.set_db_config(option, on).map_err(fail("db config"))?;
            if now != on {
                return Err(Error::db("db config", format!("{option:?} stayed {now}"), false));
            }
        }
        for (limit, value) in [
            (L::SQLITE_LIMIT_ATTACHED, 0),
            (L::SQLITE_LIMIT_LENGTH, 16 << 20),
            (L::SQLITE_LIMIT_SQL_LENGTH, 1 << 20),
            (L::SQLITE_LIMIT_TRIGGER_DEPTH, 16),
            (L::SQLITE_LIMIT_WORKER_THREADS, 0),
        ] {
            conn.set_limit(limit, value).map_err(fail("limit"))?;
            let now = conn.limit(limit).map_err(fail("limit"))?;
            if now > value {
                return Err(Error::db("limit", format!("{limit:?} stayed {now}, above {value}"), false));
            }
        }
        let policy = std::sync::Arc::new(SqlitePolicy {
            denied: std::sync::Mutex::new(None),
            origin: std::time::Instant::now(),
            deadline_ms: std::sync::atomic::AtomicU64::new(0),
        });
        let p = policy.clone();
        conn.authorizer(Some(move |ctx: rusqlite::hooks::AuthContext<'_>| match sqlite_authorize(&ctx) {
            Ok(()) => rusqlite::hooks::Authorization::Allow,
            Err(what) => {
                *p.denied.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(what);
                rusqlite::hooks::Authorization::Deny
            }
        }))
        .map_err(fail("authorizer"))?;
        let p = policy.clone();
        conn.progress_handler(1000, Some(move || p.expired())).map_err(fail("progress handler"))?;
        conn.set_prepared_statement_cache_capacity(256);
        Ok(SqliteDatabase { conn, policy, bounds, hide })
    }

    /// The database's error for `op`, with a refusal named and the file's path hidden.
    fn err(&self, op: &str, e: rusqlite::Error) -> Error {
        let retryable = sqlite_retryable(&e);
        // The authorizer's reason, whatever code SQLite chose for the refusal ("not
        // authorized" for most actions, a plain error for a function).
        let mut msg = match (self.policy.take_denied(), e.sqlite_error_code()) {
            (Some(what), _) => format!(
                "not permitted: {what}; a tenant's SQL reaches only its own review database (docs/review.md, \"Least privilege\")"
            ),
            (None, Some(rusqlite::ErrorCode::OperationInterrupted)) => format!(
                "interrupted: it ran longer than the statement timeout of {} ms",
                self.bounds.statement_timeout.as_millis()
            ),
            (None, _) => e.to_string(),
        };
        let mut op = op.to_owned();
        for (t, label) in &self.hide {
            msg = msg.replace(t.as_str(), label);
            op = op.replace(t.as_str(), label);
        }
        Error::db(op, msg, retryable)
    }

    /// Runs `f` with the statement timeout armed.
    fn timed<R>(&mut self, f: impl FnOnce(&mut rusqlite::Connection) -> R) -> R {
        self.policy.arm(self.bounds.statement_timeout);
        let r = f(&mut self.conn);
        self.policy.disarm();
        r
    }
}

fn to_sqlite(v: &SqlValue) -> rusqlite::types::Value {
    match v {
        SqlValue::Null => rusqlite::types::Value::Null,
        SqlValue::Int(i) => rusqlite::types::Value::Integer(*i),
        SqlValue::Real(f) => rusqlite::types::Value::Real(*f),
        SqlValue::Text(s) => rusqlite::types::Value::Text(s.clone()),
    }
}

impl Database for SqliteDatabase {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.timed(|c| c.execute_batch(sql)).map_err(|e| self.err("batch", e))
    }

    fn begin(&mut self) -> Result<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| self.err("begin", e))
    }

    fn commit(&mut self) -> Result<()> {
        self.conn.execute_batch("COMMIT").map_err(|e| self.err("commit", e))
    }

    fn rollback(&mut self) -> Result<()> {
        if self.conn.is_autocommit() {
            return Ok(());
        }
        self.conn.execute_batch("ROLLBACK").map_err(|e| self.err("rollback", e))
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        let r = self.timed(|c| -> rusqlite::Result<Vec<Row>> {
            let mut st = c.prepare_cached(sql)?;
            let names: Vec<String> = st.column_names().map(str::to_owned).collect();
            let mut rows = st.query(rusqlite::params_from_iter(params.iter().map(to_sqlite)))?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let mut row = Vec::with_capacity(names.len());
                for (i, n) in names.iter().enumerate() {
                    let v = match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => SqlValue::Null,
                        rusqlite::types::ValueRef::Integer(x) => SqlValue::Int(x),
                        rusqlite::types::ValueRef::Real(x) => SqlValue::Real(x),
                        rusqlite::types::ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
                        rusqlite::types::ValueRef::Blob(b) => SqlValue::Text(String::from_utf8_lossy(b).into_owned()),
                    };
                    row.push((n.clone(), v));
                }
                out.push(row);
            }
            Ok(out)
        });
        r.map_err(|e| self.err(sql, e))
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        let r = self.timed(|c| -> rusqlite::Result<u64> {
            let mut st = c.prepare_cached(sql)?;
            st.execute(rusqlite::params_from_iter(params.iter().map(to_sqlite))).map(|n| n as u64)
        });
        r.map_err(|e| self.err(sql, e))
    }
}

#[cfg(feature = "postgres")]
pub use crate::pg::{PgDatabase, PgTenantOptions};
