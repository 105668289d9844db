//! The tables and functions (docs/postgres.md), their migrations, and claiming a stream.

use std::path::Path;

use postgres::Client;
use tidegate_storage::wire::{Chain, LEDGER_FORMAT_VERSION};
use tidegate_storage::{Lsn, StoreError};

use crate::error::database;

/// The newest schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 3;

/// An advisory lock key held while migrating, so concurrent first opens migrate once.
const MIGRATION_LOCK: i64 = 0x7469_6465_6761_7465; // "tidegate"

/// Migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: [&str; 3] = [
    r#"
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
-- The owner check every write makes first: locks the stream's head row (ordering the write
-- against a take-over), refuses a stream that does not exist (TG002) or a token that is not
-- the head's (TG001, the current token in DETAIL), and returns the stream's last LSN.
CREATE FUNCTION tidegate_owned(p_stream text, p_token bigint) RETURNS bigint LANGUAGE plpgsql AS $fn$
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
    RETURN last;
END
$fn$;
-- One group commit: the owner's token and the next LSN are checked under the head's row lock,
-- the rows inserted and the head moved, in the caller's one statement (one transaction).
CREATE FUNCTION tidegate_append(p_stream text, p_token bigint, p_first bigint,
                                p_bodies text[], p_chains bytea[], p_last_chain bytea)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    last bigint := tidegate_owned(p_stream, p_token);
    n bigint := coalesce(array_length(p_bodies, 1), 0);
BEGIN
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
    last bigint := tidegate_owned(p_stream, p_token);
BEGIN
    IF p_lsn > last THEN
        RAISE EXCEPTION 'checkpoint at LSN % is past the end of ledger stream % (LSN %)', p_lsn, p_stream, last
            USING ERRCODE = 'TG004', DETAIL = last::text;
    END IF;
    INSERT INTO tidegate_checkpoints (stream, lsn, bytes) VALUES (p_stream, p_lsn, p_bytes)
        ON CONFLICT (stream) DO UPDATE SET lsn = excluded.lsn, bytes = excluded.bytes;
END
$fn$;
"#,
    r#"
-- Schema 2: who holds each stream and until when (a node's lease, by the database's clock).
ALTER TABLE tidegate_streams ADD COLUMN owner text, ADD COLUMN lease_until timestamptz;
"#,
    r#"
-- Schema 3: the nodes of a cluster, where each answers and when it last said it was alive (by
-- the database's clock), so that a node that does not serve a tenant can say where to go.
CREATE TABLE tidegate_nodes (
    node        text PRIMARY KEY,
    address     text,
    started_at  timestamptz NOT NULL,
    seen_at     timestamptz NOT NULL
);
"#,
];

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
    /// The node holding it, if it said (a leased open names itself).
    pub(crate) owner: Option<String>,
    /// How long its lease still runs (`None`: no lease, or run out).
    pub(crate) lease_left_ms: Option<u64>,
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
            owner: row.get(5),
            lease_left_ms: row.get::<_, Option<i64>>(6).and_then(|ms| u64::try_from(ms).ok()).filter(|ms| *ms > 0),
            ledger_id: row.get(0),
            format_version: u32::try_from(row.get::<_, i32>(1)).unwrap_or(u32::MAX),
            token: num(2),
            last_lsn: num(3),
            last_chain: Chain::from_slice(row.get(4)),
        }
    }
}

const HEAD_COLUMNS: &str = "ledger_id, format_version, token, last_lsn, last_chain, owner, \
                            (extract(epoch FROM lease_until - now()) * 1000)::bigint";

fn newer_format(location: &Path, found: u32) -> StoreError {
    StoreError::NewerFormat {
        path: location.to_owned(),
        key: "format_version",
        found: u64::from(found),
        supported: u64::from(LEDGER_FORMAT_VERSION),
    }
}

/// Who takes a stream, and for how long.
#[derive(Debug, Clone)]
pub(crate) struct Claimant {
    /// The node's id (`None`: an unnamed process, e.g. an embedded engine or a CLI command).
    pub(crate) node: Option<String>,
    /// The lease, renewed by the writer (`None`: held until another owner takes it).
    pub(crate) lease_ms: Option<u64>,
}

/// Creates the stream if it does not exist and takes it for a new owner: the token is raised
/// under the head's row lock, which fences every earlier owner out. A live lease of another
/// node refuses the take-over ([`StoreError::Leased`]). Returns the head as the new owner
/// holds it, and whether the stream was created.
pub(crate) fn claim(
    client: &mut Client,
    stream: &str,
    claimant: &Claimant,
    location: &Path,
) -> Result<(Head, bool), StoreError> {
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
    if let (Some(owner), Some(remaining_ms)) = (&found.owner, found.lease_left_ms)
        && claimant.node.as_ref() != Some(owner)
    {
        let address = tx
            .query_opt("SELECT address FROM tidegate_nodes WHERE node = $1", &[owner])
            .map_err(db("look up the owner's address"))?
            .and_then(|row| row.get::<_, Option<String>>(0));
        return Err(StoreError::Leased { stream: stream.to_owned(), owner: owner.clone(), address, remaining_ms });
    }
    let lease = claimant.lease_ms.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
    let row = tx
        .query_one(
            &format!(
                "UPDATE tidegate_streams SET token = token + 1, format_version = $2, owner = $3, \
                 lease_until = now() + $4::bigint * interval '1 millisecond' WHERE stream = $1 \
                 RETURNING {HEAD_COLUMNS}"
            ),
            &[&stream, &i32::try_from(LEDGER_FORMAT_VERSION).unwrap_or(i32::MAX), &claimant.node, &lease],
        )
        .map_err(db("take a new owner token"))?;
    // Delivered at commit to the nodes listening (crate::nodes): they learn the new owner at
    // once instead of at their next round. A lost notification only costs that round.
    tx.execute("SELECT pg_notify('tidegate_cluster', $1)", &[&stream]).map_err(db("announce the new owner"))?;
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

/// One stream as the cluster view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOwner {
    /// The stream.
    pub stream: String,
    /// The node that took it last (`None`: an unnamed process).
    pub owner: Option<String>,
    /// The current owner token.
    pub token: u64,
    /// How long the owner's lease still runs (`None`: no lease, or it ran out).
    pub lease_left_ms: Option<u64>,
    /// The last acknowledged LSN.
    pub last_lsn: Lsn,
}

/// Every stream of the database with its owner, token and lease, by stream name.
pub(crate) fn owners(client: &mut Client, location: &Path) -> Result<Vec<StreamOwner>, StoreError> {
    let rows = client
        .query(&format!("SELECT stream, {HEAD_COLUMNS} FROM tidegate_streams ORDER BY stream"), &[])
        .map_err(|e| database("list the streams", location, e))?;
    Ok(rows
        .iter()
        .map(|row| {
            let stream: String = row.get(0);
            let num = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
            StreamOwner {
                stream,
                owner: row.get(6),
                token: num(3),
                lease_left_ms: row.get::<_, Option<i64>>(7).and_then(|ms| u64::try_from(ms).ok()).filter(|ms| *ms > 0),
                last_lsn: num(4),
            }
        })
        .collect())
}
