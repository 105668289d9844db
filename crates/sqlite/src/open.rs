//! Opening a data directory: the lock, the schema and its versions, the upgrade of older
//! ledgers, and the integrity checks every open makes (dense LSNs, rows that decode, the hash
//! chain, the high-water mark).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tidegate_core::Event;
use tidegate_storage::wire::{self, Chain, LEDGER_FORMAT_VERSION};
use tidegate_storage::{Lsn, StoreError};

use crate::head::{self, LedgerId, Mark};
use crate::{CutRow, SCHEMA_VERSION, Verify};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "LOCK";
/// The database file's name inside the data directory.
pub const DB_FILE: &str = "ledger.db";

/// This build, as it signs the rows it writes.
pub(crate) const WRITTEN_BY: &str = concat!("tidegate-sqlite ", env!("CARGO_PKG_VERSION"));

fn db<'a>(op: &'static str, path: &'a Path) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
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

/// Checks one stored row: the body decodes as an [`Event`] whose tag and transaction match
/// the `kind` and `tx` columns. Returns the event and the body's bytes, or what is wrong.
pub(crate) fn check_row<'a>(
    tx: ValueRef<'_>,
    kind: ValueRef<'_>,
    body: ValueRef<'a>,
) -> Result<(Event, &'a [u8]), String> {
    let bytes = match body {
        ValueRef::Text(b) | ValueRef::Blob(b) => b,
        other => return Err(format!("body is {:?}, not JSON text", other.data_type())),
    };
    let text = std::str::from_utf8(bytes).map_err(|e| format!("body is not UTF-8: {e}"))?;
    let event = wire::decode(text)?;
    let tag = wire::kind_range(text).and_then(|r| text.get(r));
    match kind {
        ValueRef::Text(k) if Some(k) == tag.map(str::as_bytes) => {}
        other => return Err(format!("kind column {other:?} does not match the body's tag {tag:?}")),
    }
    match tx {
        ValueRef::Integer(t) if u64::try_from(t).ok() == Some(event.tx().0) => {}
        other => return Err(format!("tx column {other:?} does not match the body's {}", event.tx())),
    }
    Ok((event, bytes))
}

/// Checks a row's stored chain value against the one that follows from `prev`. Returns the
/// value to continue from (the stored one when it is readable, so that one damaged row does
/// not make every later row look damaged) and what is wrong, if anything.
pub(crate) fn check_chain(prev: &Chain, lsn: Lsn, body: &[u8], stored: ValueRef<'_>) -> (Chain, Result<(), String>) {
    let expected = prev.next(lsn, body);
    let stored = match stored {
        ValueRef::Blob(b) => Chain::from_slice(b),
        _ => None,
    };
    match stored {
        Some(s) if s == expected => (s, Ok(())),
        Some(s) => (
            s,
            Err(format!(
                "its hash chain value {} does not follow from LSN {} ({} expected): the row was changed, \
                 moved, duplicated or inserted, or the one before it was",
                s.short(),
                lsn.saturating_sub(1),
                expected.short()
            )),
        ),
        None => (expected, Err("it has no readable hash chain value".into())),
    }
}

/// What to check, and against what.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Check {
    /// The ledger's identity, for its chain (`None`: a schema-1 ledger without one).
    pub(crate) id: Option<LedgerId>,
    /// The high-water mark to hold the ledger to.
    pub(crate) mark: Option<Mark>,
    pub(crate) verify: Verify,
    pub(crate) max_tail_cut: u64,
}

/// What [`verify_rows`] found.
#[derive(Debug, Default)]
pub(crate) struct Verified {
    pub(crate) rows_verified: u64,
    /// The last intact LSN (before the corrupt tail, if any).
    pub(crate) last: Lsn,
    /// The chain value at `last` (the genesis value for an empty ledger; `None` without a
    /// chain).
    pub(crate) last_chain: Option<Chain>,
    /// A corrupt tail above the high-water mark, to cut (or, read-only, to hide).
    pub(crate) bad: Vec<CutRow>,
    pub(crate) notes: Vec<String>,
    /// The first LSN whose row (and chain value) was checked: every row from here on is
    /// verified.
    pub(crate) checked_from: Lsn,
}

/// The stored chain value of the row at `lsn`.
fn stored_chain(conn: &Connection, path: &Path, lsn: Lsn) -> Result<Option<Chain>, StoreError> {
    let v: Option<Option<Vec<u8>>> = conn
        .query_row("SELECT chain FROM events WHERE lsn = ?1", [lsn as i64], |r| r.get(0))
        .optional()
        .map_err(db("read a chain value", path))?;
    Ok(v.flatten().and_then(|b| Chain::from_slice(&b)))
}

/// Checks the stored ledger as `check` says: LSNs exactly `1..=n`, at least up to the
/// high-water mark; every checked row decodes, matches its columns and continues the hash
/// chain; the row at the mark is the one acknowledged. A corrupt suffix *above* the mark is
/// returned for cutting; anything else wrong is an error naming the LSN and the rule broken.
/// Reads only.
pub(crate) fn verify_rows(conn: &Connection, path: &Path, check: &Check) -> Result<Verified, StoreError> {
    let mut out = Verified::default();
    let chained = check.id.is_some();
    let checkpoint: Option<(i64, Option<Vec<u8>>)> = if chained {
        conn.query_row("SELECT lsn, chain FROM checkpoint WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
    } else {
        conn.query_row("SELECT lsn, NULL FROM checkpoint WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
    }
    .optional()
    .map_err(db("read the checkpoint's LSN", path))?;
    let mut verify = check.verify;
    // With `SinceCheckpoint`, only the rows after the checkpoint are counted and decoded:
    // min and max come from the rowid b-tree's ends, so the rows before it are not read.
    let since = match verify {
        Verify::SinceCheckpoint => checkpoint.as_ref().map_or(0, |c| c.0).max(0),
        _ => 0,
    };
    let (count, min, max): (i64, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM events WHERE lsn > ?1), (SELECT min(lsn) FROM events), \
             (SELECT max(lsn) FROM events)",
            [since],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(db("count the events", path))?;
    let max = max.unwrap_or(0);
    if let Some(m) = min.filter(|&m| m < 1) {
        return Err(StoreError::Corrupt {
            lsn: 0,
            detail: format!("{} holds a row with LSN {m}; LSNs start at 1", path.display()),
        });
    }
    // A ledger shorter than its high-water mark: refused before anything else is read.
    if let Some(mark) = &check.mark
        && (max as Lsn) < mark.lsn
    {
        return Err(StoreError::Shortened { path: path.to_owned(), acknowledged: mark.lsn, last: max as Lsn });
    }
    let since = since.min(max);
    let count = count.max(0) + since;
    if min.is_some_and(|m| m != 1) || max != count {
        // LSNs must be exactly 1..=max; name the first one that is missing.
        let mut missing = 1i64;
        let mut stmt = conn.prepare("SELECT lsn FROM events ORDER BY lsn").map_err(db("find missing LSNs", path))?;
        let mut rows = stmt.query([]).map_err(db("find missing LSNs", path))?;
        while let Some(row) = rows.next().map_err(db("find missing LSNs", path))? {
            let lsn: i64 = row.get(0).map_err(db("find missing LSNs", path))?;
            if lsn != missing {
                break;
            }
            missing += 1;
        }
        return Err(StoreError::Corrupt {
            lsn: missing as Lsn,
            detail: format!("{} has {count} rows but its last LSN is {max}: LSN {missing} is missing", path.display()),
        });
    }
    let max = max as Lsn;
    let genesis = check.id.map(|id| Chain::genesis(&id));
    // Where to start, and the chain value before it.
    let (mut from, mut prev) = loop {
        match verify {
            Verify::Full => break (1, genesis),
            Verify::SinceCheckpoint => {
                let Some((c, ck_chain)) = checkpoint.as_ref().filter(|c| c.0 >= 1 && c.0 as Lsn <= max) else {
                    verify = Verify::Full;
                    continue;
                };
                let c = *c as Lsn;
                if !chained {
                    break (c + 1, None);
                }
                let at = stored_chain(conn, path, c)?;
                let recorded = ck_chain.as_deref().and_then(Chain::from_slice);
                if at.is_none() || at != recorded {
                    out.notes.push(format!(
                        "the checkpoint at LSN {c} does not record the chain value of the row there; \
                         verified the whole ledger instead"
                    ));
                    verify = Verify::Full;
                    continue;
                }
                break (c + 1, at);
            }
            Verify::Tail { rows } => {
                let from = max.saturating_sub(rows).saturating_add(1).max(1);
                if from == 1 || !chained {
                    break (from, genesis);
                }
                match stored_chain(conn, path, from - 1)? {
                    Some(p) => break (from, Some(p)),
                    None => {
                        verify = Verify::Full;
                        continue;
                    }
                }
            }
        }
    };
    if from > max {
        from = max + 1;
    }
    out.checked_from = from;
    {
        let mut stmt = conn
            .prepare(if chained {
                "SELECT lsn, tx, kind, body, chain FROM events WHERE lsn >= ?1 ORDER BY lsn"
            } else {
                "SELECT lsn, tx, kind, body, NULL FROM events WHERE lsn >= ?1 ORDER BY lsn"
            })
            .map_err(db("read the events", path))?;
        let mut rows = stmt.query([from as i64]).map_err(db("read the events", path))?;
        while let Some(row) = rows.next().map_err(db("read the events", path))? {
            let lsn: i64 = row.get(0).map_err(db("read the events", path))?;
            let lsn = lsn as Lsn;
            let cols = (|| -> rusqlite::Result<_> {
                Ok((row.get_ref(1)?, row.get_ref(2)?, row.get_ref(3)?, row.get_ref(4)?))
            })()
            .map_err(db("read the events", path))?;
            let (tx, kind, body, chain) = cols;
            let mut verdict = check_row(tx, kind, body).map(|(_, bytes)| bytes);
            if let Some(p) = prev {
                let bytes = match body {
                    ValueRef::Text(b) | ValueRef::Blob(b) => b,
                    _ => &[][..],
                };
                let (next, linked) = check_chain(&p, lsn, bytes, chain);
                prev = Some(next);
                if let (Ok(_), Err(why)) = (&verdict, linked) {
                    verdict = Err(why);
                }
            }
            out.rows_verified += 1;
            match verdict {
                Ok(_) => {
                    if let Some(first) = out.bad.first() {
                        return Err(StoreError::Corrupt {
                            lsn: first.lsn,
                            detail: format!(
                                "{} (and {} rows after it), but LSN {lsn} after them is intact, so this is not a torn tail",
                                first.reason,
                                out.bad.len() - 1
                            ),
                        });
                    }
                }
                Err(reason) => {
                    if let Some(mark) = check.mark.as_ref().filter(|m| lsn <= m.lsn) {
                        return Err(StoreError::Corrupt {
                            lsn,
                            detail: format!(
                                "{reason}; LSN {} was acknowledged as durable, so this is damage, not a torn tail",
                                mark.lsn
                            ),
                        });
                    }
                    if out.bad.len() as u64 >= check.max_tail_cut {
                        let first = out.bad.first().map_or(lsn, |c| c.lsn);
                        return Err(StoreError::Corrupt {
                            lsn: first,
                            detail: format!(
                                "more than {} corrupt rows at the tail (max_tail_cut); refusing to cut them: {reason}",
                                check.max_tail_cut
                            ),
                        });
                    }
                    out.bad.push(CutRow { lsn, reason });
                }
            }
        }
    }
    out.last = out.bad.first().map_or(max, |c| c.lsn - 1);
    if chained {
        out.last_chain = if out.last == 0 { genesis } else { stored_chain(conn, path, out.last)? };
    }
    // The row at the high-water mark must be the one acknowledged.
    if let Some(mark) = &check.mark {
        let at = if mark.lsn == 0 { genesis } else { stored_chain(conn, path, mark.lsn)? };
        if at != Some(mark.chain) {
            return Err(StoreError::Corrupt {
                lsn: mark.lsn,
                detail: format!(
                    "the event at LSN {} is not the one acknowledged: its chain value {} differs from the \
                     high-water mark's {} (the ledger was rewritten or replaced from outside)",
                    mark.lsn,
                    at.map_or_else(|| "(none)".to_owned(), |c| c.short()),
                    mark.chain.short()
                ),
            });
        }
    }
    Ok(out)
}

/// Cuts a corrupt tail: moves the rows after `last` to `cut_rows` (never simply deleted), and
/// deletes a checkpoint that summarises events that no longer exist, in one transaction.
pub(crate) fn cut_tail(conn: &mut Connection, path: &Path, bad: &[CutRow], last: Lsn) -> Result<(), StoreError> {
    let tx =
        conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db("cut the corrupt tail", path))?;
    for c in bad {
        tx.execute(
            "INSERT INTO cut_rows (lsn, tx, kind, body, reason, cut_by)
             SELECT lsn, tx, kind, body, ?2, ?3 FROM events WHERE lsn = ?1",
            params![c.lsn as i64, c.reason, WRITTEN_BY],
        )
        .map_err(db("cut the corrupt tail", path))?;
    }
    tx.execute("DELETE FROM events WHERE lsn > ?1", [last as i64]).map_err(db("cut the corrupt tail", path))?;
    tx.execute("DELETE FROM checkpoint WHERE lsn > ?1", [last as i64]).map_err(db("cut the corrupt tail", path))?;
    tx.commit().map_err(db("cut the corrupt tail", path))
}
