//! The data directory and its database: the lock, connections, the schema and its versions,
//! the owner token, and the upgrade of older ledgers. The integrity checks every open makes
//! are in `check.rs`; the order in which an open uses both is in `open.rs`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tidegate_storage::wire::{Chain, LEDGER_FORMAT_VERSION};
use tidegate_storage::{Lsn, StoreError};

use crate::SCHEMA_VERSION;
use crate::head::{self, LedgerId, Mark};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "LOCK";
/// The database file's name inside the data directory.
pub const DB_FILE: &str = "ledger.db";

/// This build, as it signs the rows it writes.
pub(crate) const WRITTEN_BY: &str = concat!("tidegate-sqlite ", env!("CARGO_PKG_VERSION"));

pub(crate) fn db<'a>(op: &'static str, path: &'a Path) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |e| crate::error::database(op, path, e)
}

/// Takes the data directory's exclusive lock (held until the returned file is dropped) and
/// writes this process's id into it for the next one's error message.
pub(crate) fn lock_dir(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| crate::error::file("open the lock file", &path, e))?;
    // A lock held by this very process can look taken for a moment after it was released:
    // a thread that forks a child (std::process::Command) duplicates every descriptor, and
    // the child holds the lock until its exec closes them. So a refusal is retried for a
    // short, bounded time before it is reported.
    let mut waited = std::time::Duration::ZERO;
    let step = std::time::Duration::from_millis(20);
    let patience = std::time::Duration::from_millis(500);
    let taken = loop {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) if waited < patience => {
                std::thread::sleep(step);
                waited += step;
            }
            other => break other,
        }
    };
    match taken {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let holder = match file.read_to_string(&mut holder) {
                Ok(_) if !holder.trim().is_empty() => Some(holder.trim().to_owned()),
                _ => None,
            };
            return Err(StoreError::Locked { dir: dir.to_owned(), lock_file: path, holder });
        }
        Err(TryLockError::Error(e)) => return Err(crate::error::file("lock the data directory", &path, e)),
    }
    let stamp = format!("pid {}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(stamp.as_bytes()))
        .map_err(|e| crate::error::file("write the lock file", &path, e))?;
    Ok(file)
}

/// How a connection opens the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read and write (the writer, and an open that creates or upgrades).
    Write,
    /// Read only; SQLite may still maintain the `-shm` index.
    Read,
    /// No file at all: a private in-memory database holding the empty schema. A read-only
    /// open of a ledger whose creation was interrupted before its schema was written (an
    /// empty database file) reads through it, so it reads as the empty ledger it is.
    EmptySchema,
    /// Read only, for a directory SQLite cannot write and a database with no write-ahead
    /// log beside it: `immutable=1`, so SQLite needs no `-shm` file. Never used while a WAL
    /// exists (an immutable connection ignores it).
    ReadImmutable,
}

/// Opens a connection with the settings every connection of the store uses.
pub(crate) fn connect(path: &Path, access: Access) -> Result<Connection, StoreError> {
    let conn = match access {
        Access::EmptySchema => {
            let conn = Connection::open_in_memory().map_err(db("open an in-memory database", path))?;
            conn.execute_batch(TABLES).map_err(db("create the empty schema in memory", path))?;
            return Ok(conn);
        }
        Access::Write => Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ),
        Access::Read => {
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        }
        Access::ReadImmutable => {
            let mut uri = String::from("file:");
            for b in path.as_os_str().as_encoded_bytes() {
                match b {
                    b'%' | b'?' | b'#' => uri.push_str(&format!("%{b:02X}")),
                    _ => uri.push(char::from(*b)),
                }
            }
            uri.push_str("?immutable=1");
            Connection::open_with_flags(
                uri,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
            )
        }
    }
    .map_err(|e| crate::error::database("open", path, e))?;
    // The directory lock keeps other writers out; this covers checkpoints racing readers.
    conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(db("set busy_timeout", path))?;
    Ok(conn)
}

fn not_a_ledger<'a>(path: &'a Path, op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
    move |e| {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
            StoreError::NotALedger { path: path.to_owned(), detail: e.to_string() }
        } else {
            crate::error::database(op, path, e)
        }
    }
}

/// Reads a `meta` value, `None` if the key is absent.
fn meta(conn: &Connection, path: &Path, key: &str) -> Result<Option<String>, StoreError> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get::<_, String>(0))
        .optional()
        .map_err(not_a_ledger(path, "read the meta table"))
}

fn meta_u64(conn: &Connection, path: &Path, key: &str) -> Result<Option<u64>, StoreError> {
    meta(conn, path, key)?
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| StoreError::NotALedger {
                path: path.to_owned(),
                detail: format!("meta.{key} = {v:?}: expected a non-negative integer"),
            })
        })
        .transpose()
}

/// What a database file holds, read without writing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No tables: a new ledger (or an empty file).
    Empty,
    /// Schema version 1: events without the hash chain and no high-water mark.
    Legacy {
        /// The event format version found.
        format: u32,
    },
    /// This build's schema.
    Current {
        /// The event format version found.
        format: u32,
        /// The ledger's identity.
        id: LedgerId,
        /// The fencing token of the stream's latest owner.
        token: u64,
    },
}

impl Kind {
    pub(crate) fn format(&self) -> u32 {
        match self {
            Kind::Empty => LEDGER_FORMAT_VERSION,
            Kind::Legacy { format } | Kind::Current { format, .. } => *format,
        }
    }

    pub(crate) fn schema(&self) -> u64 {
        match self {
            Kind::Legacy { .. } => 1,
            Kind::Empty | Kind::Current { .. } => SCHEMA_VERSION,
        }
    }
}

/// Reads the versions of a database, refusing one written by a newer build and a file that is
/// not a ledger. Writes nothing.
pub(crate) fn inspect(conn: &Connection, path: &Path) -> Result<Kind, StoreError> {
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(not_a_ledger(path, "list tables"))?;
    let has = |t: &str| tables.iter().any(|n| n == t);
    if !has("meta") {
        if tables.is_empty() {
            return Ok(Kind::Empty);
        }
        return Err(StoreError::NotALedger {
            path: path.to_owned(),
            detail: format!("it holds tables ({}) but no meta table", tables.join(", ")),
        });
    }
    let found = meta_u64(conn, path, "format_version")?.ok_or_else(|| StoreError::NotALedger {
        path: path.to_owned(),
        detail: "the meta table has no format_version".into(),
    })?;
    if found > u64::from(LEDGER_FORMAT_VERSION) {
        return Err(StoreError::NewerFormat {
            path: path.to_owned(),
            key: "format_version",
            found,
            supported: LEDGER_FORMAT_VERSION.into(),
        });
    }
    let schema = meta_u64(conn, path, "schema_version")?.unwrap_or(1);
    if schema > SCHEMA_VERSION {
        return Err(StoreError::NewerFormat {
            path: path.to_owned(),
            key: "schema_version",
            found: schema,
            supported: SCHEMA_VERSION,
        });
    }
    if !has("events") {
        return Err(StoreError::NotALedger { path: path.to_owned(), detail: "it has no events table".into() });
    }
    // `found` ≤ LEDGER_FORMAT_VERSION, a u32.
    let format = found as u32;
    if schema < 2 {
        return Ok(Kind::Legacy { format });
    }
    let id = meta(conn, path, "ledger_id")?;
    let id = id.as_deref().and_then(head::parse_id).ok_or_else(|| StoreError::NotALedger {
        path: path.to_owned(),
        detail: format!("meta.ledger_id = {id:?}: expected 32 hex digits"),
    })?;
    let token = meta_u64(conn, path, "owner_token")?.ok_or_else(|| StoreError::NotALedger {
        path: path.to_owned(),
        detail: "the meta table has no owner_token".into(),
    })?;
    Ok(Kind::Current { format, id, token })
}

/// Puts the database in WAL mode with `synchronous=FULL` (a commit returns only after the
/// write-ahead log is synced).
pub(crate) fn set_wal(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mode: String =
        conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(db("switch to WAL mode", path))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Database {
            op: "switch to WAL mode",
            path: path.to_owned(),
            retryable: false,
            source: format!("the database stayed in journal mode {mode:?}").into(),
        });
    }
    conn.pragma_update(None, "synchronous", "FULL").map_err(db("set synchronous=FULL", path))
}

const TABLES: &str = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS events (
         lsn   INTEGER PRIMARY KEY,
         tx    INTEGER NOT NULL,
         kind  TEXT NOT NULL,
         body  TEXT NOT NULL,
         chain BLOB
     );
     CREATE TABLE IF NOT EXISTS cut_rows (
         lsn    INTEGER NOT NULL,
         tx,
         kind,
         body,
         reason TEXT NOT NULL,
         cut_by TEXT NOT NULL
     );
     CREATE TABLE IF NOT EXISTS checkpoint (
         id         INTEGER PRIMARY KEY CHECK (id = 1),
         lsn        INTEGER NOT NULL,
         body       BLOB NOT NULL,
         written_by TEXT NOT NULL,
         chain      BLOB
     );";

fn write_meta(tx: &rusqlite::Transaction<'_>, path: &Path, rows: &[(&str, String)]) -> Result<(), StoreError> {
    for (key, value) in rows {
        tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])
            .map_err(db("write the meta table", path))?;
    }
    Ok(())
}

/// Creates the schema of a new ledger with identity `id` (whose high-water mark, at LSN 0,
/// already exists).
pub(crate) fn create(conn: &mut Connection, path: &Path, id: &LedgerId) -> Result<(), StoreError> {
    set_wal(conn, path)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("begin the schema transaction", path))?;
    tx.execute_batch(TABLES).map_err(db("create the schema", path))?;
    write_meta(
        &tx,
        path,
        &[
            ("format_version", LEDGER_FORMAT_VERSION.to_string()),
            ("schema_version", SCHEMA_VERSION.to_string()),
            ("written_by", WRITTEN_BY.to_owned()),
            ("ledger_id", head::id_hex(id)),
            ("owner_token", "0".to_owned()),
        ],
    )?;
    tx.commit().map_err(db("commit the schema", path))
}

/// Raises the owner token (this open becomes the stream's owner) and records this build and
/// this build's format version (the upgrade rule: an older ledger is read as is, and its
/// version raised once it is opened for writing). Returns the new token.
pub(crate) fn take_ownership(conn: &mut Connection, path: &Path) -> Result<u64, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db("take ownership", path))?;
    let token = meta_u64(&tx, path, "owner_token")?.unwrap_or(0).checked_add(1).ok_or_else(|| {
        StoreError::NotALedger { path: path.to_owned(), detail: "meta.owner_token is at its maximum".into() }
    })?;
    write_meta(
        &tx,
        path,
        &[
            ("owner_token", token.to_string()),
            ("format_version", LEDGER_FORMAT_VERSION.to_string()),
            ("schema_version", SCHEMA_VERSION.to_string()),
            ("written_by", WRITTEN_BY.to_owned()),
        ],
    )?;
    tx.commit().map_err(db("take ownership", path))?;
    Ok(token)
}

/// Upgrades a schema-1 ledger (already verified, with any corrupt tail cut) to this schema:
/// adds the chain columns, chains every row under a new ledger identity, writes the
/// high-water mark at the last LSN, and raises the versions, in one transaction. The mark is
/// written just before the commit; a crash between the two leaves a schema-1 ledger, which
/// the next open upgrades again (replacing the mark). Returns the identity and the mark.
pub(crate) fn upgrade(conn: &mut Connection, dir: &Path, path: &Path, found: Kind) -> Result<Mark, StoreError> {
    let id = head::new_ledger_id(dir);
    let genesis = Chain::genesis(&id);
    set_wal(conn, path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db("upgrade the ledger", path))?;
    let add = |table: &str| -> Result<(), StoreError> {
        let has: bool = tx
            .query_row(&format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = 'chain'"), [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n > 0)
            .map_err(db("upgrade the ledger", path))?;
        if !has {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN chain BLOB"))
                .map_err(db("upgrade the ledger", path))?;
        }
        Ok(())
    };
    tx.execute_batch(TABLES).map_err(db("upgrade the ledger", path))?;
    add("events")?;
    add("checkpoint")?;
    // Chain the rows in chunks, so memory stays bounded however long the history.
    let mut prev = genesis;
    let mut next: i64 = 1;
    loop {
        let chunk: Vec<(i64, Vec<u8>)> = {
            let mut stmt = tx
                .prepare_cached("SELECT lsn, CAST(body AS BLOB) FROM events WHERE lsn >= ?1 ORDER BY lsn LIMIT 8192")
                .map_err(db("upgrade the ledger", path))?;
            stmt.query_map([next], |r| Ok((r.get(0)?, r.get(1)?)))
                .and_then(|rows| rows.collect())
                .map_err(db("upgrade the ledger", path))?
        };
        if chunk.is_empty() {
            break;
        }
        let mut set =
            tx.prepare_cached("UPDATE events SET chain = ?2 WHERE lsn = ?1").map_err(db("upgrade the ledger", path))?;
        for (lsn, body) in &chunk {
            prev = prev.next(*lsn as Lsn, body);
            set.execute(params![lsn, &prev.0[..]]).map_err(db("upgrade the ledger", path))?;
            next = lsn + 1;
        }
    }
    let last = (next - 1).max(0) as Lsn;
    tx.execute("UPDATE checkpoint SET chain = (SELECT chain FROM events WHERE events.lsn = checkpoint.lsn)", [])
        .map_err(db("upgrade the ledger", path))?;
    write_meta(
        &tx,
        path,
        &[
            ("ledger_id", head::id_hex(&id)),
            ("owner_token", "0".to_owned()),
            ("schema_version", SCHEMA_VERSION.to_string()),
            ("format_version", LEDGER_FORMAT_VERSION.to_string()),
            ("upgraded_from", format!("format {} schema {} by {WRITTEN_BY}", found.format(), found.schema())),
        ],
    )?;
    let mark = Mark { id, seq: 1, lsn: last, chain: prev };
    head::create(dir, &mark)?;
    tx.commit().map_err(db("upgrade the ledger", path))?;
    Ok(mark)
}
