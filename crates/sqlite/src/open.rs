//! Opening a data directory: the lock, the schema and its version, the tail check.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tidegate_core::Event;
use tidegate_core::ledger::LEDGER_FORMAT_VERSION;

use super::writer::{kind_range, preview};
use super::{CutRow, Options, SCHEMA_VERSION, Verify};
use tidegate_storage::{Lsn, StoreError};

/// The lock file's name inside the data directory.
pub(super) const LOCK_FILE: &str = "LOCK";
/// The database file's name inside the data directory.
pub(super) const DB_FILE: &str = "ledger.db";

/// Takes the data directory's exclusive lock (held until the returned file is dropped) and
/// writes this process's id into it for the next one's error message.
pub(super) fn lock_dir(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| crate::error::file("open the lock file", &path, e))?;
    match file.try_lock() {
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

/// Opens a connection with the settings every connection of the store uses.
pub(super) fn connect(path: &Path, read_only: bool) -> Result<Connection, StoreError> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags).map_err(|e| crate::error::database("open", path, e))?;
    // The directory lock keeps other processes out; this only covers checkpoints racing readers.
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| crate::error::database("set busy_timeout", path, e))?;
    Ok(conn)
}

fn not_a_ledger(path: &Path, e: rusqlite::Error, op: &'static str) -> StoreError {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
        StoreError::NotALedger { path: path.to_owned(), detail: e.to_string() }
    } else {
        crate::error::database(op, path, e)
    }
}

/// Reads a version from `meta`, `None` if the key is absent.
fn read_version(conn: &Connection, path: &Path, key: &'static str) -> Result<Option<u64>, StoreError> {
    let raw: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .map_err(|e| not_a_ledger(path, e, "read the meta table"))?;
    raw.map(|v| {
        v.trim().parse::<u64>().map_err(|_| StoreError::NotALedger {
            path: path.to_owned(),
            detail: format!("meta.{key} = {v:?}: expected a version number"),
        })
    })
    .transpose()
}

/// Checks the versions of an existing ledger (refusing newer ones) or creates the schema
/// of a new one, and puts the database in WAL mode. Returns whether it was created and the
/// event format version found.
pub(super) fn prepare(conn: &mut Connection, path: &Path) -> Result<(bool, u32), StoreError> {
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| not_a_ledger(path, e, "list tables"))?;
    let has = |t: &str| tables.iter().any(|n| n == t);
    let existing = if has("meta") {
        let found = read_version(conn, path, "format_version")?.ok_or_else(|| StoreError::NotALedger {
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
        let schema = read_version(conn, path, "schema_version")?.unwrap_or(1);
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
        Some(found as u32)
    } else if !tables.is_empty() {
        return Err(StoreError::NotALedger {
            path: path.to_owned(),
            detail: format!("it holds tables ({}) but no meta table", tables.join(", ")),
        });
    } else {
        None
    };

    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| crate::error::database("switch to WAL mode", path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Database {
            op: "switch to WAL mode",
            path: path.to_owned(),
            retryable: false,
            source: format!("the database stayed in journal mode {mode:?}").into(),
        });
    }
    // FULL: a commit returns only after the WAL is synced, so a durable LSN survives power loss.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| crate::error::database("set synchronous=FULL", path, e))?;

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| crate::error::database("begin the schema transaction", path, e))?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS events (
             lsn  INTEGER PRIMARY KEY,
             tx   INTEGER NOT NULL,
             kind TEXT NOT NULL,
             body TEXT NOT NULL
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
             written_by TEXT NOT NULL
         );",
    )
    .map_err(|e| crate::error::database("create the schema", path, e))?;
    // Upgrade rule: an older ledger is read as is (fields are only added within a version)
    // and its versions are raised to this build's once it is opened for writing, so an older
    // build refuses it from then on. Version 1 is the first; no migrations exist yet.
    for (key, value) in [
        ("format_version", LEDGER_FORMAT_VERSION.to_string()),
        ("schema_version", SCHEMA_VERSION.to_string()),
        ("written_by", format!("tidegate-storage {}", env!("CARGO_PKG_VERSION"))),
    ] {
        tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])
            .map_err(|e| crate::error::database("write the meta table", path, e))?;
    }
    tx.commit().map_err(|e| crate::error::database("commit the schema", path, e))?;
    Ok((existing.is_none(), existing.unwrap_or(LEDGER_FORMAT_VERSION)))
}

/// Checks one stored row: the body decodes as an [`Event`] whose tag and transaction match
/// the `kind` and `tx` columns. Returns the event, or what is wrong.
pub(super) fn check_row(tx: ValueRef<'_>, kind: ValueRef<'_>, body: ValueRef<'_>) -> Result<Event, String> {
    let body = match body {
        ValueRef::Text(b) | ValueRef::Blob(b) => b,
        other => return Err(format!("body is {:?}, not JSON text", other.data_type())),
    };
    let text = std::str::from_utf8(body).map_err(|e| format!("body is not UTF-8: {e}"))?;
    let event: Event =
        serde_json::from_str(text).map_err(|e| format!("body does not decode as an event ({e}): {}", preview(text)))?;
    let tag = kind_range(text).and_then(|r| text.get(r));
    match kind {
        ValueRef::Text(k) if Some(k) == tag.map(str::as_bytes) => {}
        other => return Err(format!("kind column {other:?} does not match the body's tag {tag:?}")),
    }
    match tx {
        ValueRef::Integer(t) if u64::try_from(t).ok() == Some(event.tx().0) => {}
        other => return Err(format!("tx column {other:?} does not match the body's {}", event.tx())),
    }
    Ok(event)
}

/// Verifies the stored rows (all of them, or the tail as `opts.verify` says) and cuts a
/// corrupt tail: the rows after the last intact one are moved to `cut_rows` (never simply
/// deleted) and listed in the report. A corrupt row followed by an intact one is an error
/// naming its LSN. Returns `(rows verified, last LSN, cut rows)`.
pub(super) fn verify_and_cut(
    conn: &mut Connection,
    path: &Path,
    opts: &Options,
) -> Result<(u64, Lsn, Vec<CutRow>), StoreError> {
    let db = |op| move |e| crate::error::database(op, path, e);
    let checkpoint: Option<i64> = conn
        .query_row("SELECT lsn FROM checkpoint WHERE id = 1", [], |r| r.get(0))
        .optional()
        .map_err(db("read the checkpoint's LSN"))?;
    // With `SinceCheckpoint`, only the rows after the checkpoint are counted and decoded:
    // min and max come from the rowid b-tree's ends, so the rows before it are not read.
    let since = match opts.verify {
        Verify::SinceCheckpoint => checkpoint.unwrap_or(0).max(0),
        _ => 0,
    };
    let (count, min, max): (i64, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM events WHERE lsn > ?1), (SELECT min(lsn) FROM events), \
             (SELECT max(lsn) FROM events)",
            [since],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(db("count the events"))?;
    let since = since.min(max.unwrap_or(0));
    let (count, max) = ((count.max(0) + since) as u64, max.unwrap_or(0));
    if min.is_some_and(|m| m != 1) || max < 0 || max as u64 != count {
        // LSNs must be exactly 1..=max; name the first one that is missing.
        let mut missing = 1i64;
        let mut stmt = conn.prepare("SELECT lsn FROM events ORDER BY lsn").map_err(db("find missing LSNs"))?;
        let mut rows = stmt.query([]).map_err(db("find missing LSNs"))?;
        while let Some(row) = rows.next().map_err(db("find missing LSNs"))? {
            let lsn: i64 = row.get(0).map_err(db("find missing LSNs"))?;
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
    let from = match opts.verify {
        Verify::Full => 1,
        Verify::Tail { rows } => max.saturating_sub(i64::try_from(rows).unwrap_or(i64::MAX)).saturating_add(1).max(1),
        Verify::SinceCheckpoint => since + 1,
    };
    let mut bad: Vec<CutRow> = Vec::new();
    let mut checked = 0u64;
    {
        let mut stmt = conn
            .prepare("SELECT lsn, tx, kind, body FROM events WHERE lsn >= ?1 ORDER BY lsn")
            .map_err(db("read the events"))?;
        let mut rows = stmt.query([from]).map_err(db("read the events"))?;
        while let Some(row) = rows.next().map_err(db("read the events"))? {
            let lsn: i64 = row.get(0).map_err(db("read the events"))?;
            let lsn = lsn as Lsn;
            let checked_row = (|| -> rusqlite::Result<Result<Event, String>> {
                Ok(check_row(row.get_ref(1)?, row.get_ref(2)?, row.get_ref(3)?))
            })()
            .map_err(db("read the events"))?;
            checked += 1;
            match checked_row {
                Ok(_) => {
                    if let Some(first) = bad.first() {
                        return Err(StoreError::Corrupt {
                            lsn: first.lsn,
                            detail: format!(
                                "{} (and {} rows after it), but LSN {lsn} after them is intact, so this is not a torn tail",
                                first.reason,
                                bad.len() - 1
                            ),
                        });
                    }
                }
                Err(reason) => {
                    if bad.len() as u64 >= opts.max_tail_cut {
                        let first = bad.first().map_or(lsn, |c| c.lsn);
                        return Err(StoreError::Corrupt {
                            lsn: first,
                            detail: format!(
                                "more than {} corrupt rows at the tail (max_tail_cut); refusing to cut them: {reason}",
                                opts.max_tail_cut
                            ),
                        });
                    }
                    bad.push(CutRow { lsn, reason });
                }
            }
        }
    }
    let last = match bad.first() {
        Some(first) => first.lsn - 1,
        None => count,
    };
    if !bad.is_empty() {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db("cut the corrupt tail"))?;
        let cut_by = format!("tidegate-storage {}", env!("CARGO_PKG_VERSION"));
        for c in &bad {
            tx.execute(
                "INSERT INTO cut_rows (lsn, tx, kind, body, reason, cut_by)
                 SELECT lsn, tx, kind, body, ?2, ?3 FROM events WHERE lsn = ?1",
                params![c.lsn as i64, c.reason, cut_by],
            )
            .map_err(db("cut the corrupt tail"))?;
        }
        tx.execute("DELETE FROM events WHERE lsn > ?1", [last as i64]).map_err(db("cut the corrupt tail"))?;
        // A checkpoint of events that were cut summarises a ledger that no longer exists.
        tx.execute("DELETE FROM checkpoint WHERE lsn > ?1", [last as i64]).map_err(db("cut the corrupt tail"))?;
        tx.commit().map_err(db("cut the corrupt tail"))?;
    }
    Ok((checked, last, bad))
}

/// The data directory's database path, creating the directory if needed.
pub(super) fn db_path(dir: &Path) -> Result<PathBuf, StoreError> {
    std::fs::create_dir_all(dir).map_err(|e| crate::error::file("create the data directory", dir, e))?;
    Ok(dir.join(DB_FILE))
}
