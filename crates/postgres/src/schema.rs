//! The tables and functions (docs/postgres.md), their migrations, and claiming a stream.

use std::path::Path;

use postgres::Client;
use tidegate_storage::wire::{Chain, LEDGER_FORMAT_VERSION};
use tidegate_storage::{Lsn, StoreError};

use crate::error::database;

/// The newest schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 1;

/// An advisory lock key held while migrating, so concurrent first opens migrate once.
const MIGRATION_LOCK: i64 = 0x7469_6465_6761_7465; // "tidegate"

/// Migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: [&str; 1] = [r#"
CREATE TABLE tidegate_streams (
    stream          text PRIMARY KEY,
    ledger_id       bytea NOT NULL,
    format_version  integer NOT NULL,
    token           bigint NOT NULL,
    last_lsn        bigint NOT NULL,
    last_chain      bytea NOT NULL
);
CREATE TABLE tidegate_events (
    stream  text NOT NULL,
    lsn     bigint NOT NULL,
    body    text NOT NULL,
    chain   bytea NOT NULL,
    PRIMARY KEY (stream, lsn)
);
CREATE TABLE tidegate_checkpoints (
    stream  text PRIMARY KEY,
    lsn     bigint NOT NULL,
    bytes   bytea NOT NULL
);
-- One group commit: the owner's token and the next LSN are checked under the head's row lock,
-- the rows inserted and the head moved, in the caller's one statement (one transaction).
CREATE FUNCTION tidegate_append(p_stream text, p_token bigint, p_first bigint,
                                p_bodies text[], p_chains bytea[], p_last_chain bytea)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    cur bigint;
    last bigint;
    n bigint := coalesce(array_length(p_bodies, 1), 0);
BEGIN
    SELECT token, last_lsn INTO cur, last FROM tidegate_streams WHERE stream = p_stream FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ledger stream % does not exist', p_stream USING ERRCODE = 'TG002';
    END IF;
    IF cur <> p_token THEN
        RAISE EXCEPTION 'ledger stream % is owned by token %, not %', p_stream, cur, p_token
            USING ERRCODE = 'TG001', DETAIL = cur::text;
    END IF;
    IF last + 1 <> p_first THEN
        RAISE EXCEPTION 'ledger stream % ends at LSN %; a batch starting at LSN % does not continue it',
            p_stream, last, p_first USING ERRCODE = 'TG003', DETAIL = last::text;
    END IF;
    INSERT INTO tidegate_events (stream, lsn, body, chain)
        SELECT p_stream, p_first + u.i - 1, u.body, u.chain
        FROM unnest(p_bodies, p_chains) WITH ORDINALITY AS u(body, chain, i);
    UPDATE tidegate_streams SET last_lsn = last + n, last_chain = p_last_chain WHERE stream = p_stream;
    RETURN last + n;
END
$fn$;
CREATE FUNCTION tidegate_put_checkpoint(p_stream text, p_token bigint, p_lsn bigint, p_bytes bytea)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    cur bigint;
    last bigint;
BEGIN
    SELECT token, last_lsn INTO cur, last FROM tidegate_streams WHERE stream = p_stream FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'ledger stream % does not exist', p_stream USING ERRCODE = 'TG002';
    END IF;
    IF cur <> p_token THEN
        RAISE EXCEPTION 'ledger stream % is owned by token %, not %', p_stream, cur, p_token
            USING ERRCODE = 'TG001', DETAIL = cur::text;
    END IF;
    IF p_lsn > last THEN
        RAISE EXCEPTION 'checkpoint at LSN % is past the end of ledger stream % (LSN %)', p_lsn, p_stream, last
            USING ERRCODE = 'TG004', DETAIL = last::text;
    END IF;
    INSERT INTO tidegate_checkpoints (stream, lsn, bytes) VALUES (p_stream, p_lsn, p_bytes)
        ON CONFLICT (stream) DO UPDATE SET lsn = excluded.lsn, bytes = excluded.bytes;
END
$fn$;
"#];

/// Creates or upgrades the tables and functions; refuses a database a newer build wrote.
/// Returns the schema version found before (0: none) and whether anything was applied.
pub(crate) fn migrate(client: &mut Client, location: &Path) -> Result<(u64, bool), StoreError> {
    let db = |op| move |e| database(op, location, e);
    let mut tx = client.transaction().map_err(db("begin the migration"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(db("take the migration lock"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS tidegate_meta (key text PRIMARY KEY, value bigint NOT NULL)")
        .map_err(db("create tidegate_meta"))?;
    let found: u64 = tx
        .query_opt("SELECT value FROM tidegate_meta WHERE key = 'schema_version'", &[])
        .map_err(db("read the schema version"))?
        .map(|row| row.get::<_, i64>(0))
        .map_or(0, |v| u64::try_from(v).unwrap_or(u64::MAX));
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerFormat {
            path: location.to_owned(),
            key: "schema_version",
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(usize::try_from(found).unwrap_or(usize::MAX)) {
        tx.batch_execute(sql).map_err(db("apply a schema migration"))?;
        let to = i64::try_from(from + 1).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO tidegate_meta (key, value) VALUES ('schema_version', $1) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&to],
        )
        .map_err(db("record the schema version"))?;
    }
    tx.commit().map_err(db("commit the migration"))?;
    Ok((found, found < SCHEMA_VERSION))
}

/// A stream's head row.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) ledger_id: Vec<u8>,
    pub(crate) format_version: u32,
    pub(crate) token: u64,
    pub(crate) last_lsn: Lsn,
    /// `None` when the stored value is not 32 bytes.
    pub(crate) last_chain: Option<Chain>,
}

impl Head {
    fn from_row(row: &postgres::Row) -> Head {
        let num = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Head {
            ledger_id: row.get(0),
            format_version: u32::try_from(row.get::<_, i32>(1)).unwrap_or(u32::MAX),
            token: num(2),
            last_lsn: num(3),
            last_chain: Chain::from_slice(row.get(4)),
        }
    }
}

const HEAD_COLUMNS: &str = "ledger_id, format_version, token, last_lsn, last_chain";

fn newer_format(location: &Path, found: u32) -> StoreError {
    StoreError::NewerFormat {
        path: location.to_owned(),
        key: "format_version",
        found: u64::from(found),
        supported: u64::from(LEDGER_FORMAT_VERSION),
    }
}

/// Creates the stream if it does not exist and takes it for a new owner: the token is raised
/// under the head's row lock, which fences every earlier owner out. Returns the head as the
/// new owner holds it, and whether the stream was created.
pub(crate) fn claim(client: &mut Client, stream: &str, location: &Path) -> Result<(Head, bool), StoreError> {
    let db = |op| move |e| database(op, location, e);
    let mut tx = client.transaction().map_err(db("begin taking the stream"))?;
    let id: [u8; 16] = rand::random();
    let genesis = Chain::genesis(&id);
    let created = tx
        .execute(
            "INSERT INTO tidegate_streams (stream, ledger_id, format_version, token, last_lsn, last_chain) \
             VALUES ($1, $2, $3, 0, 0, $4) ON CONFLICT (stream) DO NOTHING",
            &[
                &stream,
                &id.as_slice(),
                &i32::try_from(LEDGER_FORMAT_VERSION).unwrap_or(i32::MAX),
                &genesis.0.as_slice(),
            ],
        )
        .map_err(db("create the stream"))?
        == 1;
    let row = tx
        .query_one(&format!("SELECT {HEAD_COLUMNS} FROM tidegate_streams WHERE stream = $1 FOR UPDATE"), &[&stream])
        .map_err(db("lock the stream's head"))?;
    let found = Head::from_row(&row);
    if found.format_version > LEDGER_FORMAT_VERSION {
        return Err(newer_format(location, found.format_version));
    }
    let row = tx
        .query_one(
            &format!(
                "UPDATE tidegate_streams SET token = token + 1, format_version = $2 WHERE stream = $1 \
                 RETURNING {HEAD_COLUMNS}"
            ),
            &[&stream, &i32::try_from(LEDGER_FORMAT_VERSION).unwrap_or(i32::MAX)],
        )
        .map_err(db("take a new owner token"))?;
    tx.commit().map_err(db("commit taking the stream"))?;
    let mut head = Head::from_row(&row);
    // The format the events were written in (the open reports it); from now on it is ours.
    head.format_version = found.format_version;
    Ok((head, created))
}

/// Reads a stream's head without taking it (for a read-only view). `None`: no such stream.
pub(crate) fn read_head(client: &mut Client, stream: &str, location: &Path) -> Result<Option<Head>, StoreError> {
    let row = client
        .query_opt(&format!("SELECT {HEAD_COLUMNS} FROM tidegate_streams WHERE stream = $1"), &[&stream])
        .map_err(|e| database("read the stream's head", location, e))?;
    let head = row.as_ref().map(Head::from_row);
    if let Some(h) = &head
        && h.format_version > LEDGER_FORMAT_VERSION
    {
        return Err(newer_format(location, h.format_version));
    }
    Ok(head)
}

/// The schema version a database holds (0: none), without changing anything.
pub(crate) fn schema_version(client: &mut Client, location: &Path) -> Result<u64, StoreError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('tidegate_meta') IS NOT NULL", &[])
        .map_err(|e| database("look for tidegate_meta", location, e))?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let v = client
        .query_opt("SELECT value FROM tidegate_meta WHERE key = 'schema_version'", &[])
        .map_err(|e| database("read the schema version", location, e))?
        .map_or(0, |row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(u64::MAX));
    if v > SCHEMA_VERSION {
        return Err(StoreError::NewerFormat {
            path: location.to_owned(),
            key: "schema_version",
            found: v,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(v)
}
