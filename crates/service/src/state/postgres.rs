//! [`PgState`]: the tenant state in PostgreSQL, shared by every node that may serve the tenant
//! (issue 29 item 2). The same three traits and the same conformance suite as
//! [`super::SqliteState`]; the same rows, with a `tenant` column, in tables of the database
//! that holds the tenants' ledger streams (docs/postgres.md):
//!
//! ```text
//!   tidegate_idempotency(id bigserial PK, tenant, key, begun_ms, method, path, body, done,
//!                        status?, content_type?, location?, response?)  UNIQUE (tenant, key)
//!   tidegate_tasks(n bigserial PK, tenant, capability, operation, tool, key, effect_key, args,
//!                  output?, attempt, lease_ms, worker?, lease_until_ms?, lease_started_ms,
//!                  holders, carried, settled, result?)
//!   tidegate_attempt_keys(id bigserial PK, tenant, effect_key)          UNIQUE (tenant, effect_key)
//!   tidegate_attempts(id bigserial PK, tenant, effect_key, operation, capability, kind, attempt,
//!                     key, started_ms, finished_ms?, result, detail)
//! ```
//!
//! Operations run on a thread of the state's own (one connection), in the order they were
//! submitted, each in one transaction. What is acknowledged to someone commits with the
//! database's `synchronous_commit`; what nobody was told about (a running idempotency marker,
//! a freed key, a withdrawn task, an attempt record) with `SET LOCAL synchronous_commit = off`,
//! the same split as the SQLite state's FULL / NORMAL. Leasing takes the queued rows with
//! `FOR UPDATE SKIP LOCKED`, so two nodes that briefly both serve a tenant never lease one task
//! twice. Task numbers come from one sequence: they grow and are never reused, across nodes and
//! restarts. Opening the state of a tenant (the node that takes the tenant) drops its running
//! idempotency records and carries its unsettled tasks over, in one transaction (module docs of
//! `state`). A lost connection is reopened for the next operation; the operation that saw it
//! fails retryable.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use postgres::types::ToSql;
use postgres::{Client, Config, NoTls, Transaction};
use serde_json::Value;

use super::sqlite::tasks::{COLUMNS, Raw, ResultRow, Row, holders_text};
use super::sqlite::{corrupt, operation};
use super::{
    ATTEMPTS_PER_KEY, AttemptStore, Depth, Enqueued, IdempotencyStore, Limits, Reported, SETTLED_TASKS_KEPT,
    StateError, StateFuture, TaskLease, TaskRecord, TaskSpec, TaskStore, Withdrawn,
};
use crate::dispatch::Attempt;
use crate::dispatch::queue::{TaskRefusal, TaskResult};
use crate::idempotency::{Begin, Fingerprint, Recorded, difference};

/// The state schema version this build writes (`tidegate_meta.state_schema_version`).
pub const PG_STATE_SCHEMA_VERSION: i64 = 1;

/// Held while creating the tables, so concurrent first opens create them once.
const MIGRATION_LOCK: i64 = 0x7467_7374_6174_6531; // "tgstate1"

const SCHEMA: &str = "
CREATE TABLE tidegate_idempotency(
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    key text NOT NULL,
    begun_ms bigint NOT NULL,
    method text NOT NULL,
    path text NOT NULL,
    body text NOT NULL,
    done boolean NOT NULL,
    status integer,
    content_type text,
    location text,
    response bytea,
    UNIQUE (tenant, key)
);
CREATE INDEX tidegate_idempotency_age ON tidegate_idempotency(tenant, done, begun_ms);
CREATE TABLE tidegate_tasks(
    n bigserial PRIMARY KEY,
    tenant text NOT NULL,
    capability text NOT NULL,
    operation text NOT NULL,
    tool text NOT NULL,
    key text NOT NULL,
    effect_key text NOT NULL,
    args text NOT NULL,
    output text,
    attempt bigint NOT NULL,
    lease_ms bigint NOT NULL,
    worker text,
    lease_until_ms bigint,
    lease_started_ms bigint NOT NULL,
    holders text NOT NULL,
    carried boolean NOT NULL,
    settled boolean NOT NULL,
    result text
);
CREATE INDEX tidegate_tasks_ready ON tidegate_tasks(tenant, capability, n) WHERE NOT settled;
CREATE INDEX tidegate_tasks_settled ON tidegate_tasks(tenant, settled, carried, n);
CREATE INDEX tidegate_tasks_carried ON tidegate_tasks(tenant, key) WHERE carried;
CREATE TABLE tidegate_attempt_keys(
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    effect_key text NOT NULL,
    UNIQUE (tenant, effect_key)
);
CREATE TABLE tidegate_attempts(
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    effect_key text NOT NULL,
    operation text NOT NULL,
    capability text NOT NULL,
    kind text NOT NULL,
    attempt bigint NOT NULL,
    key text NOT NULL,
    started_ms bigint NOT NULL,
    finished_ms bigint,
    result text NOT NULL,
    detail text NOT NULL
);
CREATE INDEX tidegate_attempts_by_key ON tidegate_attempts(tenant, effect_key, id);
";

type Job = Box<dyn FnOnce(&mut Db) + Send>;
type Params<'a> = [&'a (dyn ToSql + std::marker::Sync)];

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The tenant state in PostgreSQL.
pub struct PgState {
    path: PathBuf,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PgState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgState").field("path", &self.path).finish_non_exhaustive()
    }
}

/// How a write commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sync {
    /// The database's `synchronous_commit`: acknowledged records.
    Full,
    /// `synchronous_commit = off` for this transaction: what nobody was told about.
    Relaxed,
}

/// The connection and what the thread keeps beside it.
struct Db {
    config: Config,
    client: Option<Client>,
    tenant: String,
    path: PathBuf,
    limits: Limits,
    settled_since_prune: usize,
}

/// A database error during `op`.
fn pg_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(postgres::Error) -> StateError + 'a {
    move |e| StateError::Postgres {
        path: path.to_owned(),
        op,
        retryable: tidegate_postgres::is_transient(&e),
        source: Arc::new(e),
    }
}

impl Db {
    fn client(&mut self) -> Result<&mut Client, StateError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let c = self.config.connect(NoTls).map_err(pg_err(&self.path, "connect"))?;
            self.client = Some(c);
        }
        self.client.as_mut().ok_or(StateError::Closed)
    }

    /// Creates the tables (once, under an advisory lock), refuses a newer schema, and carries
    /// over what the tenant's previous node left.
    fn prepare(&mut self) -> Result<(), StateError> {
        let path = self.path.clone();
        let e = |op| pg_err(&path, op);
        let client = self.client()?;
        let mut tx = client.transaction().map_err(e("begin the state's setup"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(e("take the migration lock"))?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS tidegate_meta (key text PRIMARY KEY, value bigint NOT NULL)")
            .map_err(e("create tidegate_meta"))?;
        let found: i64 = tx
            .query_opt("SELECT value FROM tidegate_meta WHERE key = 'state_schema_version'", &[])
            .map_err(e("read the state schema version"))?
            .map_or(0, |r| r.get(0));
        if found > PG_STATE_SCHEMA_VERSION {
            return Err(StateError::Version { path, found, supported: PG_STATE_SCHEMA_VERSION });
        }
        if found == 0 {
            tx.batch_execute(SCHEMA).map_err(e("create the state tables"))?;
            tx.execute(
                "INSERT INTO tidegate_meta (key, value) VALUES ('state_schema_version', $1)",
                &[&PG_STATE_SCHEMA_VERSION],
            )
            .map_err(e("record the state schema version"))?;
        }
        tx.commit().map_err(e("create the state tables"))?;
        self.write(Sync::Full, "carry over the previous node's state", |tx, db| {
            let e = |op| pg_err(db.path, op);
            tx.execute("DELETE FROM tidegate_idempotency WHERE tenant = $1 AND NOT done", &[&db.tenant])
                .map_err(e("drop running records"))?;
            tx.execute("UPDATE tidegate_tasks SET carried = true WHERE tenant = $1 AND NOT settled", &[&db.tenant])
                .map_err(e("carry over the tasks"))?;
            Ok(())
        })
    }

    /// Runs `f` in one transaction committed as `sync` says. A lost connection is reopened by
    /// the next operation.
    fn write<T>(
        &mut self,
        sync: Sync,
        op: &'static str,
        f: impl FnOnce(&mut Transaction<'_>, &mut Meta<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let path = self.path.clone();
        let mut meta = Meta {
            tenant: &self.tenant,
            path: &path,
            limits: &self.limits,
            settled_since_prune: &mut self.settled_since_prune,
        };
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            self.client = Some(self.config.connect(NoTls).map_err(pg_err(&path, "connect"))?);
        }
        let Some(client) = self.client.as_mut() else { return Err(StateError::Closed) };
        let mut tx = client.transaction().map_err(pg_err(&path, op))?;
        if sync == Sync::Relaxed {
            tx.batch_execute("SET LOCAL synchronous_commit = off").map_err(pg_err(&path, op))?;
        }
        let v = f(&mut tx, &mut meta)?;
        tx.commit().map_err(pg_err(&path, op))?;
        Ok(v)
    }
}

/// What an operation needs beside the transaction.
struct Meta<'a> {
    tenant: &'a str,
    path: &'a Path,
    limits: &'a Limits,
    settled_since_prune: &'a mut usize,
}

fn count(tx: &mut Transaction<'_>, m: &Meta<'_>, table: &str) -> Result<u64, StateError> {
    let n: i64 = tx
        .query_one(&format!("SELECT COUNT(*) FROM {table} WHERE tenant = $1"), &[&m.tenant])
        .map_err(pg_err(m.path, "count rows"))?
        .get(0);
    Ok(u64_of(n))
}

impl Db {
    fn begin(&mut self, key: &str, fp: Fingerprint, now_ms: u64) -> Result<Begin, StateError> {
        self.write(Sync::Relaxed, "begin an idempotent request", |tx, m| {
            let e = |op| pg_err(m.path, op);
            let ttl = m.limits.idempotency_ttl_ms;
            if now_ms > ttl {
                tx.execute(
                    "DELETE FROM tidegate_idempotency WHERE tenant = $1 AND done AND begun_ms < $2",
                    &[&m.tenant, &i64_of(now_ms - ttl)],
                )
                .map_err(e("drop expired records"))?;
            }
            let stored = tx
                .query_opt(
                    "SELECT method, path, body, done, status, content_type, location, response \
                     FROM tidegate_idempotency WHERE tenant = $1 AND key = $2",
                    &[&m.tenant, &key],
                )
                .map_err(e("read a record"))?;
            if let Some(r) = stored {
                let body: String = r.get(2);
                let body: Value = serde_json::from_str(&body)
                    .map_err(|err| corrupt(m.path, format!("idempotency record `{key}`: body: {err}")))?;
                let first = Fingerprint { method: r.get(0), path: r.get(1), body };
                if let Some(d) = difference(&first, &fp) {
                    return Ok(Begin::Mismatch(d));
                }
                if !r.get::<_, bool>(3) {
                    return Ok(Begin::InProgress);
                }
                let status = r
                    .get::<_, Option<i32>>(4)
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| corrupt(m.path, format!("idempotency record `{key}`: no status")))?;
                return Ok(Begin::Replay(Recorded {
                    status,
                    content_type: r.get(5),
                    location: r.get(6),
                    body: r.get::<_, Option<Vec<u8>>>(7).unwrap_or_default(),
                }));
            }
            let rows = count(tx, m, "tidegate_idempotency")?;
            let excess = (rows + 1).saturating_sub(m.limits.idempotency_max as u64);
            if excess > 0 {
                tx.execute(
                    "DELETE FROM tidegate_idempotency WHERE id IN (SELECT id FROM tidegate_idempotency \
                     WHERE tenant = $1 AND done ORDER BY id LIMIT $2)",
                    &[&m.tenant, &i64_of(excess)],
                )
                .map_err(e("drop the oldest records"))?;
            }
            tx.execute(
                "INSERT INTO tidegate_idempotency(tenant, key, begun_ms, method, path, body, done) \
                 VALUES ($1, $2, $3, $4, $5, $6, false)",
                &[&m.tenant, &key, &i64_of(now_ms), &fp.method, &fp.path, &fp.body.to_string()],
            )
            .map_err(e("record a key"))?;
            Ok(Begin::Proceed)
        })
    }

    fn finish(&mut self, key: &str, response: Option<Recorded>) -> Result<(), StateError> {
        match response {
            Some(r) => self.write(Sync::Full, "record a response", |tx, m| {
                tx.execute(
                    "UPDATE tidegate_idempotency SET done = true, status = $3, content_type = $4, location = $5, \
                     response = $6 WHERE tenant = $1 AND key = $2 AND NOT done",
                    &[&m.tenant, &key, &i32::from(r.status), &r.content_type, &r.location, &r.body],
                )
                .map_err(pg_err(m.path, "record a response"))?;
                Ok(())
            }),
            None => self.write(Sync::Relaxed, "free a key", |tx, m| {
                tx.execute(
                    "DELETE FROM tidegate_idempotency WHERE tenant = $1 AND key = $2 AND NOT done",
                    &[&m.tenant, &key],
                )
                .map_err(pg_err(m.path, "free a key"))?;
                Ok(())
            }),
        }
    }

    fn record_attempt(&mut self, effect_key: &str, a: Attempt) -> Result<(), StateError> {
        self.write(Sync::Relaxed, "record an attempt", |tx, m| {
            let e = |op| pg_err(m.path, op);
            let new = tx
                .execute(
                    "INSERT INTO tidegate_attempt_keys(tenant, effect_key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[&m.tenant, &effect_key],
                )
                .map_err(e("record an attempt"))?;
            if new == 1 {
                let keys = count(tx, m, "tidegate_attempt_keys")?;
                let excess = keys.saturating_sub(m.limits.attempts_retained as u64);
                if excess > 0 {
                    tx.execute(
                        "DELETE FROM tidegate_attempts WHERE tenant = $1 AND effect_key IN (SELECT effect_key \
                         FROM tidegate_attempt_keys WHERE tenant = $1 ORDER BY id LIMIT $2)",
                        &[&m.tenant, &i64_of(excess)],
                    )
                    .map_err(e("forget old attempts"))?;
                    tx.execute(
                        "DELETE FROM tidegate_attempt_keys WHERE id IN (SELECT id FROM tidegate_attempt_keys \
                         WHERE tenant = $1 ORDER BY id LIMIT $2)",
                        &[&m.tenant, &i64_of(excess)],
                    )
                    .map_err(e("forget old attempts"))?;
                }
            }
            tx.execute(
                "INSERT INTO tidegate_attempts(tenant, effect_key, operation, capability, kind, attempt, key, \
                 started_ms, finished_ms, result, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[
                    &m.tenant,
                    &effect_key,
                    &a.operation.as_str(),
                    &a.capability,
                    &a.kind,
                    &i64::from(a.attempt),
                    &a.key,
                    &i64_of(a.started_at_ms),
                    &a.finished_at_ms.map(i64_of),
                    &a.result,
                    &a.detail,
                ],
            )
            .map_err(e("record an attempt"))?;
            tx.execute(
                "DELETE FROM tidegate_attempts WHERE tenant = $1 AND effect_key = $2 AND id <= (SELECT id FROM \
                 tidegate_attempts WHERE tenant = $1 AND effect_key = $2 ORDER BY id DESC LIMIT 1 OFFSET $3)",
                &[&m.tenant, &effect_key, &i64_of(ATTEMPTS_PER_KEY as u64)],
            )
            .map_err(e("forget old attempts"))?;
            Ok(())
        })
    }

    fn attempts(&mut self, effect_key: &str) -> Result<Vec<Attempt>, StateError> {
        self.write(Sync::Full, "read attempts", |tx, m| {
            let rows = tx
                .query(
                    "SELECT operation, capability, kind, attempt, key, started_ms, finished_ms, result, detail \
                     FROM tidegate_attempts WHERE tenant = $1 AND effect_key = $2 ORDER BY id",
                    &[&m.tenant, &effect_key],
                )
                .map_err(pg_err(m.path, "read attempts"))?;
            rows.iter()
                .map(|r| {
                    let op: String = r.get(0);
                    Ok(Attempt {
                        operation: operation(m.path, format_args!("attempt of `{effect_key}`"), &op)?,
                        capability: r.get(1),
                        kind: r.get(2),
                        attempt: u32::try_from(r.get::<_, i64>(3)).unwrap_or(u32::MAX),
                        key: r.get(4),
                        started_at_ms: u64_of(r.get(5)),
                        finished_at_ms: r.get::<_, Option<i64>>(6).map(u64_of),
                        result: r.get(7),
                        detail: r.get(8),
                    })
                })
                .collect()
        })
    }
}

/// Task rows of this tenant matching `filter` (which may use `$2` on; `$1` is the tenant).
fn select(tx: &mut Transaction<'_>, m: &Meta<'_>, filter: &str, args: &Params<'_>) -> Result<Vec<Row>, StateError> {
    let mut all: Vec<&(dyn ToSql + std::marker::Sync)> = vec![&m.tenant];
    all.extend_from_slice(args);
    let rows = tx
        .query(&format!("SELECT {COLUMNS} FROM tidegate_tasks WHERE tenant = $1 AND {filter}"), &all)
        .map_err(pg_err(m.path, "read tasks"))?;
    rows.iter()
        .map(|r| {
            Raw {
                n: r.get(0),
                capability: r.get(1),
                operation: r.get(2),
                tool: r.get(3),
                key: r.get(4),
                effect_key: r.get(5),
                args: r.get(6),
                output: r.get(7),
                attempt: r.get(8),
                lease_ms: r.get(9),
                worker: r.get(10),
                lease_until_ms: r.get(11),
                lease_started_ms: r.get(12),
                holders: r.get(13),
                carried: r.get(14),
                settled: r.get(15),
                result: r.get(16),
            }
            .decode(m.path)
        })
        .collect()
}

fn one(tx: &mut Transaction<'_>, m: &Meta<'_>, n: u64) -> Result<Option<Row>, StateError> {
    Ok(select(tx, m, "n = $2 FOR UPDATE", &[&i64_of(n)])?.pop())
}

/// Forgets settled tasks beyond the newest [`SETTLED_TASKS_KEPT`] (every 256 settlements).
fn settled_one(tx: &mut Transaction<'_>, m: &mut Meta<'_>) -> Result<(), StateError> {
    *m.settled_since_prune += 1;
    if *m.settled_since_prune < 256 {
        return Ok(());
    }
    *m.settled_since_prune = 0;
    tx.execute(
        "DELETE FROM tidegate_tasks WHERE tenant = $1 AND settled AND NOT carried AND n < (SELECT n FROM \
         tidegate_tasks WHERE tenant = $1 AND settled AND NOT carried ORDER BY n DESC LIMIT 1 OFFSET $2)",
        &[&m.tenant, &i64::try_from(SETTLED_TASKS_KEPT - 1).unwrap_or(i64::MAX)],
    )
    .map_err(pg_err(m.path, "forget settled tasks"))?;
    Ok(())
}

impl Db {
    fn enqueue(&mut self, spec: TaskSpec, attempt: u32, lease_ms: u64) -> Result<Enqueued, StateError> {
        self.write(Sync::Full, "queue a task", |tx, m| {
            let e = |op| pg_err(m.path, op);
            let found = select(
                tx,
                m,
                "carried AND key = $2 AND capability = $3 AND operation = $4 AND (NOT settled OR result IS NOT NULL) \
                 ORDER BY n LIMIT 1 FOR UPDATE",
                &[&spec.key, &spec.capability, &spec.operation.as_str()],
            )?
            .pop();
            if let Some(row) = found {
                tx.execute("UPDATE tidegate_tasks SET carried = false WHERE n = $1", &[&i64_of(row.rec.n)])
                    .map_err(e("adopt a task"))?;
                return Ok(match (row.settled, row.result) {
                    (true, Some(r)) => {
                        let (result, _) = r.decode(m.path, row.rec.n)?;
                        Enqueued::Settled(row.rec, result)
                    }
                    _ => Enqueued::Adopted(row.rec),
                });
            }
            let output = spec.output.as_ref().map(Value::to_string);
            let n: i64 = tx
                .query_one(
                    "INSERT INTO tidegate_tasks(tenant, capability, operation, tool, key, effect_key, args, output, \
                     attempt, lease_ms, lease_started_ms, holders, carried, settled) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0, '[]', false, false) RETURNING n",
                    &[
                        &m.tenant,
                        &spec.capability,
                        &spec.operation.as_str(),
                        &spec.tool,
                        &spec.key,
                        &spec.effect_key,
                        &spec.args.to_string(),
                        &output,
                        &i64::from(attempt),
                        &i64_of(lease_ms),
                    ],
                )
                .map_err(e("queue a task"))?
                .get(0);
            Ok(Enqueued::New(TaskRecord {
                n: u64_of(n),
                spec: Arc::new(spec),
                attempt,
                lease_ms,
                lease: None,
                lease_started_ms: 0,
                ever_leased: false,
            }))
        })
    }

    fn lease(
        &mut self,
        worker: &str,
        capabilities: &[String],
        max: usize,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Vec<TaskRecord>, StateError> {
        self.write(Sync::Full, "lease tasks", |tx, m| {
            let mut out = Vec::new();
            for cap in capabilities {
                let room = max.saturating_sub(out.len());
                if room == 0 {
                    break;
                }
                let rows = select(
                    tx,
                    m,
                    "capability = $2 AND NOT settled AND NOT carried AND worker IS NULL ORDER BY n LIMIT $3 \
                     FOR UPDATE SKIP LOCKED",
                    &[cap, &i64::try_from(room).unwrap_or(i64::MAX)],
                )?;
                for mut row in rows {
                    let until = now_ms.saturating_add(lease_ms.unwrap_or(row.rec.lease_ms));
                    if !row.holders.iter().any(|h| h == worker) {
                        row.holders.push(worker.to_owned());
                    }
                    tx.execute(
                        "UPDATE tidegate_tasks SET worker = $2, lease_until_ms = $3, lease_started_ms = $4, \
                         holders = $5 WHERE n = $1",
                        &[&i64_of(row.rec.n), &worker, &i64_of(until), &i64_of(now_ms), &holders_text(&row.holders)],
                    )
                    .map_err(pg_err(m.path, "lease a task"))?;
                    row.rec.lease = Some(TaskLease { worker: worker.to_owned(), until_ms: until });
                    row.rec.lease_started_ms = now_ms;
                    row.rec.ever_leased = true;
                    out.push(row.rec);
                }
            }
            Ok(out)
        })
    }

    fn heartbeat(
        &mut self,
        n: u64,
        worker: &str,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Result<TaskRecord, TaskRefusal>, StateError> {
        self.write(Sync::Full, "extend a lease", |tx, m| {
            let Some(mut row) = one(tx, m, n)? else { return Ok(Err(TaskRefusal::NotFound)) };
            if row.settled {
                return Ok(Err(TaskRefusal::Settled));
            }
            let until = now_ms.saturating_add(lease_ms.unwrap_or(row.rec.lease_ms));
            match &mut row.rec.lease {
                Some(l) if l.worker == worker => l.until_ms = until,
                _ => return Ok(Err(TaskRefusal::NotLeased)),
            }
            tx.execute("UPDATE tidegate_tasks SET lease_until_ms = $2 WHERE n = $1", &[&i64_of(n), &i64_of(until)])
                .map_err(pg_err(m.path, "extend a lease"))?;
            Ok(Ok(row.rec))
        })
    }

    fn report(
        &mut self,
        n: u64,
        worker: &str,
        result: TaskResult,
    ) -> Result<Result<Reported, TaskRefusal>, StateError> {
        self.write(Sync::Full, "settle a task", |tx, m| {
            let Some(row) = one(tx, m, n)? else { return Ok(Err(TaskRefusal::NotFound)) };
            if row.settled {
                return Ok(Err(TaskRefusal::Settled));
            }
            if !row.holders.iter().any(|h| h == worker) {
                return Ok(Err(TaskRefusal::NotLeased));
            }
            let text = serde_json::to_string(&ResultRow::new(&result, row.rec.attempt))
                .map_err(|e| corrupt(m.path, format!("task {n}: result: {e}")))?;
            tx.execute(
                "UPDATE tidegate_tasks SET settled = true, worker = NULL, result = $2 WHERE n = $1",
                &[&i64_of(n), &text],
            )
            .map_err(pg_err(m.path, "settle a task"))?;
            settled_one(tx, m)?;
            Ok(Ok(Reported { record: row.rec, waited: !row.carried }))
        })
    }

    fn expire(&mut self, now_ms: u64) -> Result<Vec<TaskRecord>, StateError> {
        self.write(Sync::Full, "expire leases", |tx, m| {
            let rows = select(
                tx,
                m,
                "NOT settled AND worker IS NOT NULL AND lease_until_ms <= $2 ORDER BY n FOR UPDATE",
                &[&i64_of(now_ms)],
            )?;
            for r in &rows {
                tx.execute(
                    "UPDATE tidegate_tasks SET worker = NULL, lease_until_ms = NULL, attempt = attempt + 1 WHERE n = $1",
                    &[&i64_of(r.rec.n)],
                )
                .map_err(pg_err(m.path, "expire a lease"))?;
            }
            Ok(rows.into_iter().map(|r| r.rec).collect())
        })
    }

    fn withdraw(&mut self, n: u64) -> Result<Withdrawn, StateError> {
        self.write(Sync::Relaxed, "withdraw a task", |tx, m| {
            let Some(row) = one(tx, m, n)? else { return Ok(Withdrawn::Unknown) };
            if row.settled {
                return Ok(Withdrawn::Settled);
            }
            tx.execute(
                "UPDATE tidegate_tasks SET settled = true, worker = NULL, lease_until_ms = NULL WHERE n = $1",
                &[&i64_of(n)],
            )
            .map_err(pg_err(m.path, "withdraw a task"))?;
            settled_one(tx, m)?;
            Ok(Withdrawn::Open(row.rec))
        })
    }

    fn drop_carried_over(&mut self, now_ms: u64) -> Result<usize, StateError> {
        self.write(Sync::Full, "drop carried-over tasks", |tx, m| {
            let n = tx
                .execute(
                    "UPDATE tidegate_tasks SET carried = false, settled = true, worker = NULL WHERE tenant = $1 \
                     AND carried AND (lease_until_ms IS NULL OR lease_until_ms <= $2)",
                    &[&m.tenant, &i64_of(now_ms)],
                )
                .map_err(pg_err(m.path, "drop carried-over tasks"))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn outcome(&mut self, n: u64) -> Result<Option<(TaskResult, u32)>, StateError> {
        self.write(Sync::Full, "read a task's result", |tx, m| {
            let text: Option<String> = tx
                .query_opt(
                    "SELECT result FROM tidegate_tasks WHERE tenant = $1 AND n = $2 AND settled",
                    &[&m.tenant, &i64_of(n)],
                )
                .map_err(pg_err(m.path, "read a task's result"))?
                .and_then(|r| r.get(0));
            match text {
                None => Ok(None),
                Some(t) => {
                    let row: ResultRow =
                        serde_json::from_str(&t).map_err(|e| corrupt(m.path, format!("task {n}: result: {e}")))?;
                    row.decode(m.path, n).map(Some)
                }
            }
        })
    }

    fn depth(&mut self) -> Result<Depth, StateError> {
        self.write(Sync::Full, "count tasks", |tx, m| {
            let rows = tx
                .query(
                    "SELECT worker IS NOT NULL, COUNT(*) FROM tidegate_tasks WHERE tenant = $1 AND NOT settled \
                     AND NOT carried GROUP BY 1",
                    &[&m.tenant],
                )
                .map_err(pg_err(m.path, "count tasks"))?;
            let mut d = (0, 0);
            for r in rows {
                let k = u64_of(r.get(1));
                if r.get::<_, bool>(0) { d.1 = k } else { d.0 = k }
            }
            Ok(d)
        })
    }

    fn next_expiry(&mut self) -> Result<Option<u64>, StateError> {
        self.write(Sync::Full, "find the next lease end", |tx, m| {
            let v: Option<i64> = tx
                .query_one(
                    "SELECT MIN(lease_until_ms) FROM tidegate_tasks WHERE tenant = $1 AND NOT settled \
                     AND worker IS NOT NULL",
                    &[&m.tenant],
                )
                .map_err(pg_err(m.path, "find the next lease end"))?
                .get(0);
            Ok(v.map(u64_of))
        })
    }

    fn list(&mut self) -> Result<Vec<TaskRecord>, StateError> {
        self.write(Sync::Full, "list tasks", |tx, m| {
            Ok(select(tx, m, "NOT settled AND NOT carried ORDER BY n", &[])?.into_iter().map(|r| r.rec).collect())
        })
    }
}

impl PgState {
    /// Opens tenant `tenant`'s state in the database at `url` (creating the tables if none)
    /// and starts its thread; carries over what the tenant's previous node left. Blocking:
    /// call it from a plain thread (`spawn_blocking`), never from an async task.
    pub fn open(url: &str, tenant: &str, limits: Limits) -> Result<PgState, StateError> {
        let limits = Limits {
            idempotency_max: limits.idempotency_max.max(1),
            attempts_retained: limits.attempts_retained.max(1),
            ..limits
        };
        let config: Config = url.parse().map_err(|e: postgres::Error| StateError::Corrupt {
            path: PathBuf::from("store URL"),
            detail: format!("not a postgres URL: {e}"),
        })?;
        let path = PathBuf::from(format!("{} tenant {tenant}", tidegate_postgres::describe(&config)));
        let mut db =
            Db { config, client: None, tenant: tenant.to_owned(), path: path.clone(), limits, settled_since_prune: 0 };
        // The setup runs on the state's own thread too (the blocking client must not run on
        // an async task, and `open` may be called from one's `spawn_blocking`).
        let (ready_tx, ready_rx) = mpsc::channel();
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("tidegate-pgstate-{tenant}"))
            .spawn(move || {
                let ready = db.prepare();
                let ok = ready.is_ok();
                let _ = ready_tx.send(ready);
                if !ok {
                    return;
                }
                while let Ok(job) = rx.recv() {
                    job(&mut db);
                }
            })
            .map_err(|source| StateError::Io {
                path: path.clone(),
                op: "start the state thread",
                source: Arc::new(source),
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => return Err(StateError::Closed),
        }
        Ok(PgState { path, jobs: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) })
    }

    /// Where it lives (the database, without its password, and the tenant).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<T, StateError> + Send + 'static,
    ) -> StateFuture<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |db| {
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

    /// Finishes every operation submitted so far and closes the connection. Blocking. Later
    /// operations fail [`StateError::Closed`].
    pub fn close(&self) {
        drop(self.jobs.lock().take());
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for PgState {
    fn drop(&mut self) {
        drop(self.jobs.lock().take());
    }
}

impl IdempotencyStore for PgState {
    fn begin(&self, key: &str, fp: Fingerprint, now_ms: u64) -> StateFuture<Begin> {
        let key = key.to_owned();
        self.submit(move |db| db.begin(&key, fp, now_ms))
    }

    fn finish(&self, key: &str, response: Option<Recorded>) -> StateFuture<()> {
        let key = key.to_owned();
        self.submit(move |db| db.finish(&key, response))
    }
}

impl AttemptStore for PgState {
    fn record(&self, effect_key: &str, attempt: Attempt) -> StateFuture<()> {
        let key = effect_key.to_owned();
        self.submit(move |db| db.record_attempt(&key, attempt))
    }

    fn list(&self, effect_key: &str) -> StateFuture<Vec<Attempt>> {
        let key = effect_key.to_owned();
        self.submit(move |db| db.attempts(&key))
    }
}

impl TaskStore for PgState {
    fn enqueue(&self, spec: TaskSpec, attempt: u32, lease_ms: u64) -> StateFuture<Enqueued> {
        self.submit(move |db| db.enqueue(spec, attempt, lease_ms))
    }

    fn lease(
        &self,
        worker: &str,
        capabilities: &[String],
        max: usize,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> StateFuture<Vec<TaskRecord>> {
        let (worker, caps) = (worker.to_owned(), capabilities.to_vec());
        self.submit(move |db| db.lease(&worker, &caps, max, lease_ms, now_ms))
    }

    fn heartbeat(
        &self,
        n: u64,
        worker: &str,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> StateFuture<Result<TaskRecord, TaskRefusal>> {
        let worker = worker.to_owned();
        self.submit(move |db| db.heartbeat(n, &worker, lease_ms, now_ms))
    }

    fn report(&self, n: u64, worker: &str, result: TaskResult) -> StateFuture<Result<Reported, TaskRefusal>> {
        let worker = worker.to_owned();
        self.submit(move |db| db.report(n, &worker, result))
    }

    fn expire(&self, now_ms: u64) -> StateFuture<Vec<TaskRecord>> {
        self.submit(move |db| db.expire(now_ms))
    }

    fn withdraw(&self, n: u64) -> StateFuture<Withdrawn> {
        self.submit(move |db| db.withdraw(n))
    }

    fn outcome(&self, n: u64) -> StateFuture<Option<(TaskResult, u32)>> {
        self.submit(move |db| db.outcome(n))
    }

    fn list(&self) -> StateFuture<Vec<TaskRecord>> {
        self.submit(|db| db.list())
    }

    fn depth(&self) -> StateFuture<Depth> {
        self.submit(|db| db.depth())
    }

    fn next_expiry(&self) -> StateFuture<Option<u64>> {
        self.submit(|db| db.next_expiry())
    }

    fn drop_carried_over(&self, now_ms: u64) -> StateFuture<usize> {
        self.submit(move |db| db.drop_carried_over(now_ms))
    }
}
