//! The database behind the middleware: a small trait and two real backends.
//!
//! Contract: `begin`, then any number of `query`/`execute`, then `commit` or `rollback`. A
//! statement error inside a transaction leaves it open; the caller MUST roll back. Values are
//! bound positionally in the placeholder style of [`Database::dialect`]; named placeholders are
//! rewritten by [`crate::value::bind`]. Constraint violations are reported as non-retryable
//! [`Error::Database`]; connection trouble and serialisation failures as retryable.

#[cfg(feature = "postgres")]
use std::collections::HashMap;

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

/// SQLite through rusqlite (the embedded default).
#[derive(Debug)]
pub struct SqliteDatabase {
    conn: rusqlite::Connection,
}

fn sqlite_err(op: &str, e: rusqlite::Error) -> Error {
    let retryable =
        matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked));
    Error::db(op, e, retryable)
}

impl SqliteDatabase {
    /// Opens (or creates) a database file, with foreign keys enforced.
    pub fn open(path: &std::path::Path) -> Result<SqliteDatabase> {
        let conn = rusqlite::Connection::open(path).map_err(|e| sqlite_err("open", e))?;
        Self::setup(conn)
    }

    /// A private in-memory database.
    pub fn memory() -> Result<SqliteDatabase> {
        let conn = rusqlite::Connection::open_in_memory().map_err(|e| sqlite_err("open", e))?;
        Self::setup(conn)
    }

    fn setup(conn: rusqlite::Connection) -> Result<SqliteDatabase> {
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
            .map_err(|e| sqlite_err("pragma", e))?;
        conn.set_prepared_statement_cache_capacity(256);
        Ok(SqliteDatabase { conn })
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
        self.conn.execute_batch(sql).map_err(|e| sqlite_err("batch", e))
    }

    fn begin(&mut self) -> Result<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| sqlite_err("begin", e))
    }

    fn commit(&mut self) -> Result<()> {
        self.conn.execute_batch("COMMIT").map_err(|e| sqlite_err("commit", e))
    }

    fn rollback(&mut self) -> Result<()> {
        if self.conn.is_autocommit() {
            return Ok(());
        }
        self.conn.execute_batch("ROLLBACK").map_err(|e| sqlite_err("rollback", e))
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        let mut st = self.conn.prepare_cached(sql).map_err(|e| sqlite_err(sql, e))?;
        let names: Vec<String> = st.column_names().map(str::to_owned).collect();
        let mut rows =
            st.query(rusqlite::params_from_iter(params.iter().map(to_sqlite))).map_err(|e| sqlite_err(sql, e))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(|e| sqlite_err(sql, e))? {
            let mut row = Vec::with_capacity(names.len());
            for (i, n) in names.iter().enumerate() {
                let v = match r.get_ref(i).map_err(|e| sqlite_err(sql, e))? {
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
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        let mut st = self.conn.prepare_cached(sql).map_err(|e| sqlite_err(sql, e))?;
        st.execute(rusqlite::params_from_iter(params.iter().map(to_sqlite)))
            .map(|n| n as u64)
            .map_err(|e| sqlite_err(sql, e))
    }
}

/// PostgreSQL through the `postgres` crate. Column types the middleware reads: `BIGINT`,
/// `INTEGER`, `SMALLINT`, `DOUBLE PRECISION`, `REAL`, `TEXT`, `VARCHAR`, `BOOLEAN` (cast other
/// types in the SQL, e.g. `CAST(SUM(x) AS BIGINT)`).
#[cfg(feature = "postgres")]
pub struct PgDatabase {
    client: postgres::Client,
    statements: HashMap<String, postgres::Statement>,
    in_tx: bool,
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDatabase").field("statements", &self.statements.len()).field("in_tx", &self.in_tx).finish()
    }
}

#[cfg(feature = "postgres")]
fn pg_err(op: &str, e: postgres::Error) -> Error {
    let retryable = e.is_closed()
        || e.code().is_some_and(|c| {
            *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                || *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
        })
        || e.code().is_none();
    let msg = match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    };
    Error::db(op, msg, retryable)
}

#[cfg(feature = "postgres")]
impl PgDatabase {
    /// Connects to `url` (`postgres://user@host:port/db`), optionally setting `search_path` to
    /// `schema` (created if missing).
    pub fn connect(url: &str, schema: Option<&str>) -> Result<PgDatabase> {
        let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(|e| pg_err("connect", e))?;
        if let Some(s) = schema {
            if !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(Error::db("connect", format!("schema name {s:?}: expected letters, digits and _"), false));
            }
            client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}; SET search_path TO {s}"))
                .map_err(|e| pg_err("schema", e))?;
        }
        Ok(PgDatabase { client, statements: HashMap::new(), in_tx: false })
    }

    /// Drops a schema and everything in it.
    pub fn drop_schema(&mut self, schema: &str) -> Result<()> {
        self.client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .map_err(|e| pg_err("drop schema", e))
    }

    fn prepare(&mut self, sql: &str) -> Result<postgres::Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).map_err(|e| pg_err(sql, e))?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }
}

#[cfg(feature = "postgres")]
fn to_pg(v: &SqlValue, ty: &postgres::types::Type) -> Result<Box<dyn postgres::types::ToSql + Sync>> {
    use postgres::types::Type;
    let bad = || Error::db("bind", format!("value {v:?} for a parameter of type {ty}"), false);
    Ok(match (v, ty) {
        (SqlValue::Null, t) if *t == Type::INT8 => Box::new(None::<i64>),
        (SqlValue::Null, t) if *t == Type::INT4 => Box::new(None::<i32>),
        (SqlValue::Null, t) if *t == Type::FLOAT8 => Box::new(None::<f64>),
        (SqlValue::Null, t) if *t == Type::BOOL => Box::new(None::<bool>),
        (SqlValue::Null, _) => Box::new(None::<String>),
        (v, t) if *t == Type::INT8 => Box::new(v.as_i64().ok_or_else(bad)?),
        (v, t) if *t == Type::INT4 => Box::new(i32::try_from(v.as_i64().ok_or_else(bad)?).map_err(|_| bad())?),
        (v, t) if *t == Type::INT2 => Box::new(i16::try_from(v.as_i64().ok_or_else(bad)?).map_err(|_| bad())?),
        (v, t) if *t == Type::FLOAT8 => Box::new(v.as_f64().ok_or_else(bad)?),
        (v, t) if *t == Type::FLOAT4 => Box::new(v.as_f64().ok_or_else(bad)? as f32),
        (v, t) if *t == Type::BOOL => Box::new(v.as_i64().ok_or_else(bad)? != 0),
        (SqlValue::Text(s), _) => Box::new(s.clone()),
        (SqlValue::Int(i), _) => Box::new(i.to_string()),
        (SqlValue::Real(f), _) => Box::new(f.to_string()),
    })
}

#[cfg(feature = "postgres")]
fn from_pg(row: &postgres::Row, i: usize) -> Result<SqlValue> {
    use postgres::types::Type;
    let ty = row.columns()[i].type_().clone();
    let e = |err: postgres::Error| pg_err("read column", err);
    Ok(if ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i).map_err(e)?.map_or(SqlValue::Null, SqlValue::Int)
    } else if ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Int(x.into()))
    } else if ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Int(x.into()))
    } else if ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(i).map_err(e)?.map_or(SqlValue::Null, SqlValue::Real)
    } else if ty == Type::FLOAT4 {
        row.try_get::<_, Option<f32>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Real(x.into()))
    } else if ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Int(x.into()))
    } else {
        row.try_get::<_, Option<String>>(i).map_err(e)?.map_or(SqlValue::Null, SqlValue::Text)
    })
}

#[cfg(feature = "postgres")]
impl PgDatabase {
    fn args(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<(postgres::Statement, Vec<Box<dyn postgres::types::ToSql + Sync>>)> {
        let st = self.prepare(sql)?;
        let mut args = Vec::with_capacity(params.len());
        for (v, ty) in params.iter().zip(st.params()) {
            args.push(to_pg(v, ty)?);
        }
        Ok((st, args))
    }
}

#[cfg(feature = "postgres")]
impl Database for PgDatabase {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.client.batch_execute(sql).map_err(|e| pg_err("batch", e))
    }

    fn begin(&mut self) -> Result<()> {
        self.client.batch_execute("BEGIN").map_err(|e| pg_err("begin", e))?;
        self.in_tx = true;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.in_tx = false;
        self.client.batch_execute("COMMIT").map_err(|e| pg_err("commit", e))
    }

    fn rollback(&mut self) -> Result<()> {
        if !self.in_tx {
            return Ok(());
        }
        self.in_tx = false;
        self.client.batch_execute("ROLLBACK").map_err(|e| pg_err("rollback", e))
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        let (st, args) = self.args(sql, params)?;
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = args.iter().map(|b| b.as_ref()).collect();
        let rows = self.client.query(&st, &refs).map_err(|e| pg_err(sql, e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let mut row = Vec::with_capacity(r.len());
            for (i, c) in r.columns().iter().enumerate() {
                row.push((c.name().to_owned(), from_pg(r, i)?));
            }
            out.push(row);
        }
        Ok(out)
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        let (st, args) = self.args(sql, params)?;
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = args.iter().map(|b| b.as_ref()).collect();
        self.client.execute(&st, &refs).map_err(|e| pg_err(sql, e))
    }
}
