//! The worker queue in `state.db` ([`TaskStore`] for [`SqliteState`]).

use std::path::Path;
use std::sync::Arc;

use rusqlite::{OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Counts, Db, SqliteState, Sync, corrupt, operation, sql_err};
use crate::dispatch::queue::{TaskRefusal, TaskResult};
use crate::state::{
    Depth, Enqueued, Reported, SETTLED_TASKS_KEPT, StateError, StateFuture, TaskLease, TaskRecord, TaskSpec, TaskStore,
    Withdrawn,
};

pub(in crate::state) const COLUMNS: &str = "n, capability, operation, tool, key, effect_key, args, output, attempt, lease_ms, worker, \
                       lease_until_ms, lease_started_ms, holders, carried, settled, result";

/// A worker's result as the file keeps it (its own type: the queue's enum is not serialised).
#[derive(Debug, Serialize, Deserialize)]
pub(in crate::state) struct ResultRow {
    /// `done`, `failed`, `transient` or `unknown`.
    status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    residue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The task's attempt when it was reported.
    attempt: u32,
}

impl ResultRow {
    pub(in crate::state) fn new(r: &TaskResult, attempt: u32) -> ResultRow {
        let (status, output, residue, error) = match r {
            TaskResult::Done { output, residue } => ("done", Some(output.clone()), residue.clone(), None),
            TaskResult::Failed(e) => ("failed", None, None, Some(e.clone())),
            TaskResult::Transient(e) => ("transient", None, None, Some(e.clone())),
            TaskResult::Unknown(e) => ("unknown", None, None, Some(e.clone())),
        };
        ResultRow { status: status.into(), output, residue, error, attempt }
    }

    pub(in crate::state) fn decode(self, path: &Path, n: u64) -> Result<(TaskResult, u32), StateError> {
        let error = || self.error.clone().unwrap_or_default();
        let r = match self.status.as_str() {
            "done" => {
                TaskResult::Done { output: self.output.clone().unwrap_or(Value::Null), residue: self.residue.clone() }
            }
            "failed" => TaskResult::Failed(error()),
            "transient" => TaskResult::Transient(error()),
            "unknown" => TaskResult::Unknown(error()),
            other => return Err(corrupt(path, format!("task {n}: unknown result status `{other}`"))),
        };
        Ok((r, self.attempt))
    }
}

/// A row as SQLite (or PostgreSQL) gives it.
pub(in crate::state) struct Raw {
    pub(in crate::state) n: i64,
    pub(in crate::state) capability: String,
    pub(in crate::state) operation: String,
    pub(in crate::state) tool: String,
    pub(in crate::state) key: String,
    pub(in crate::state) effect_key: String,
    pub(in crate::state) args: String,
    pub(in crate::state) output: Option<String>,
    pub(in crate::state) attempt: i64,
    pub(in crate::state) lease_ms: i64,
    pub(in crate::state) worker: Option<String>,
    pub(in crate::state) lease_until_ms: Option<i64>,
    pub(in crate::state) lease_started_ms: i64,
    pub(in crate::state) holders: String,
    pub(in crate::state) carried: bool,
    pub(in crate::state) settled: bool,
    pub(in crate::state) result: Option<String>,
}

fn raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok(Raw {
        n: r.get(0)?,
        capability: r.get(1)?,
        operation: r.get(2)?,
        tool: r.get(3)?,
        key: r.get(4)?,
        effect_key: r.get(5)?,
        args: r.get(6)?,
        output: r.get(7)?,
        attempt: r.get(8)?,
        lease_ms: r.get(9)?,
        worker: r.get(10)?,
        lease_until_ms: r.get(11)?,
        lease_started_ms: r.get(12)?,
        holders: r.get(13)?,
        carried: r.get(14)?,
        settled: r.get(15)?,
        result: r.get(16)?,
    })
}

/// A decoded row.
pub(in crate::state) struct Row {
    pub(in crate::state) rec: TaskRecord,
    pub(in crate::state) holders: Vec<String>,
    pub(in crate::state) carried: bool,
    pub(in crate::state) settled: bool,
    pub(in crate::state) result: Option<ResultRow>,
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Raw {
    pub(in crate::state) fn decode(self, path: &Path) -> Result<Row, StateError> {
        let n = u64_of(self.n);
        let json = |what: &str, text: &str| -> Result<Value, StateError> {
            serde_json::from_str(text).map_err(|e| corrupt(path, format!("task {n}: {what}: {e}")))
        };
        let spec = TaskSpec {
            capability: self.capability,
            operation: operation(path, format_args!("task {n}"), &self.operation)?,
            tool: self.tool,
            key: self.key,
            effect_key: self.effect_key,
            args: json("args", &self.args)?,
            output: self.output.as_deref().map(|o| json("output", o)).transpose()?,
        };
        let holders: Vec<String> =
            serde_json::from_str(&self.holders).map_err(|e| corrupt(path, format!("task {n}: holders: {e}")))?;
        let result = match self.result.as_deref() {
            Some(text) => Some(
                serde_json::from_str::<ResultRow>(text).map_err(|e| corrupt(path, format!("task {n}: result: {e}")))?,
            ),
            None => None,
        };
        let lease = match (self.worker, self.lease_until_ms) {
            (Some(worker), Some(until)) => Some(TaskLease { worker, until_ms: u64_of(until) }),
            _ => None,
        };
        Ok(Row {
            rec: TaskRecord {
                n,
                spec: Arc::new(spec),
                attempt: u32::try_from(self.attempt).unwrap_or(u32::MAX),
                lease_ms: u64_of(self.lease_ms),
                lease,
                lease_started_ms: u64_of(self.lease_started_ms),
                ever_leased: !holders.is_empty(),
            },
            holders,
            carried: self.carried,
            settled: self.settled,
            result,
        })
    }
}

fn select(
    tx: &Transaction<'_>,
    path: &Path,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<Row>, StateError> {
    let e = || sql_err(path, "read tasks");
    let mut stmt = tx.prepare_cached(&format!("SELECT {COLUMNS} FROM tasks WHERE {filter}")).map_err(e())?;
    let raws: Vec<Raw> = stmt.query_map(args, raw).and_then(|rows| rows.collect()).map_err(e())?;
    raws.into_iter().map(|r| r.decode(path)).collect()
}

fn one(tx: &Transaction<'_>, path: &Path, n: u64) -> Result<Option<Row>, StateError> {
    Ok(select(tx, path, "n = ?1", [i64_of(n)])?.pop())
}

/// Forgets settled tasks beyond the newest [`SETTLED_TASKS_KEPT`] (every 256 settlements, so
/// at most that many more are kept for a while).
fn settled_one(tx: &Transaction<'_>, c: &mut Counts<'_>) -> Result<(), StateError> {
    *c.settled_since_prune += 1;
    if *c.settled_since_prune < 256 {
        return Ok(());
    }
    *c.settled_since_prune = 0;
    tx.execute(
        "DELETE FROM tasks WHERE settled = 1 AND carried = 0 AND n < \
         (SELECT n FROM tasks WHERE settled = 1 AND carried = 0 ORDER BY n DESC LIMIT 1 OFFSET ?1)",
        [i64::try_from(SETTLED_TASKS_KEPT - 1).unwrap_or(i64::MAX)],
    )
    .map_err(sql_err(c.path, "forget settled tasks"))?;
    Ok(())
}

pub(in crate::state) fn holders_text(h: &[String]) -> String {
    serde_json::to_string(h).unwrap_or_else(|_| "[]".into())
}

impl Db {
    fn enqueue(&mut self, spec: TaskSpec, attempt: u32, lease_ms: u64) -> Result<Enqueued, StateError> {
        self.write(Sync::Full, "queue a task", |tx, c| {
            let path = c.path;
            let e = |op| sql_err(path, op);
            let found = select(
                tx,
                path,
                "carried = 1 AND key = ?1 AND capability = ?2 AND operation = ?3 AND (settled = 0 OR result IS NOT NULL) \
                 ORDER BY n LIMIT 1",
                params![spec.key, spec.capability, spec.operation.as_str()],
            )?
            .pop();
            if let Some(row) = found {
                tx.execute("UPDATE tasks SET carried = 0 WHERE n = ?1", [i64_of(row.rec.n)])
                    .map_err(e("adopt a task"))?;
                return Ok(match (row.settled, row.result) {
                    (true, Some(r)) => {
                        let (result, _) = r.decode(path, row.rec.n)?;
                        Enqueued::Settled(row.rec, result)
                    }
                    _ => Enqueued::Adopted(row.rec),
                });
            }
            let output = spec.output.as_ref().map(Value::to_string);
            tx.execute(
                "INSERT INTO tasks(capability, operation, tool, key, effect_key, args, output, attempt, lease_ms, \
                 lease_started_ms, holders, carried, settled) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, '[]', 0, 0)",
                params![
                    spec.capability,
                    spec.operation.as_str(),
                    spec.tool,
                    spec.key,
                    spec.effect_key,
                    spec.args.to_string(),
                    output,
                    attempt,
                    i64_of(lease_ms),
                ],
            )
            .map_err(e("queue a task"))?;
            let n = u64_of(tx.last_insert_rowid());
            Ok(Enqueued::New(TaskRecord {
                n,
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
        self.write(Sync::Full, "lease tasks", |tx, c| {
            let mut out = Vec::new();
            for cap in capabilities {
                let room = max.saturating_sub(out.len());
                if room == 0 {
                    break;
                }
                let rows = select(
                    tx,
                    c.path,
                    "capability = ?1 AND settled = 0 AND carried = 0 AND worker IS NULL ORDER BY n LIMIT ?2",
                    params![cap, i64::try_from(room).unwrap_or(i64::MAX)],
                )?;
                for mut row in rows {
                    let until = now_ms.saturating_add(lease_ms.unwrap_or(row.rec.lease_ms));
                    if !row.holders.iter().any(|h| h == worker) {
                        row.holders.push(worker.to_owned());
                    }
                    tx.execute(
                        "UPDATE tasks SET worker = ?2, lease_until_ms = ?3, lease_started_ms = ?4, holders = ?5 \
                         WHERE n = ?1",
                        params![i64_of(row.rec.n), worker, i64_of(until), i64_of(now_ms), holders_text(&row.holders)],
                    )
                    .map_err(sql_err(c.path, "lease a task"))?;
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
        self.write(Sync::Full, "extend a lease", |tx, c| {
            let Some(mut row) = one(tx, c.path, n)? else { return Ok(Err(TaskRefusal::NotFound)) };
            if row.settled {
                return Ok(Err(TaskRefusal::Settled));
            }
            let until = now_ms.saturating_add(lease_ms.unwrap_or(row.rec.lease_ms));
            match &mut row.rec.lease {
                Some(l) if l.worker == worker => l.until_ms = until,
                _ => return Ok(Err(TaskRefusal::NotLeased)),
            }
            tx.execute("UPDATE tasks SET lease_until_ms = ?2 WHERE n = ?1", [i64_of(n), i64_of(until)])
                .map_err(sql_err(c.path, "extend a lease"))?;
            Ok(Ok(row.rec))
        })
    }

    fn report(
        &mut self,
        n: u64,
        worker: &str,
        result: TaskResult,
    ) -> Result<Result<Reported, TaskRefusal>, StateError> {
        self.write(Sync::Full, "settle a task", |tx, c| {
            let Some(row) = one(tx, c.path, n)? else { return Ok(Err(TaskRefusal::NotFound)) };
            if row.settled {
                return Ok(Err(TaskRefusal::Settled));
            }
            if !row.holders.iter().any(|h| h == worker) {
                return Ok(Err(TaskRefusal::NotLeased));
            }
            let text = serde_json::to_string(&ResultRow::new(&result, row.rec.attempt))
                .map_err(|e| corrupt(c.path, format!("task {n}: result: {e}")))?;
            // The lease end stays: a carried-over task's result is adoptable until then.
            tx.execute(
                "UPDATE tasks SET settled = 1, worker = NULL, result = ?2 WHERE n = ?1",
                params![i64_of(n), text],
            )
            .map_err(sql_err(c.path, "settle a task"))?;
            settled_one(tx, c)?;
            Ok(Ok(Reported { record: row.rec, waited: !row.carried }))
        })
    }

    fn expire(&mut self, now_ms: u64) -> Result<Vec<TaskRecord>, StateError> {
        self.write(Sync::Full, "expire leases", |tx, c| {
            let rows = select(
                tx,
                c.path,
                "settled = 0 AND worker IS NOT NULL AND lease_until_ms <= ?1 ORDER BY n",
                [i64_of(now_ms)],
            )?;
            for r in &rows {
                tx.execute(
                    "UPDATE tasks SET worker = NULL, lease_until_ms = NULL, attempt = attempt + 1 WHERE n = ?1",
                    [i64_of(r.rec.n)],
                )
                .map_err(sql_err(c.path, "expire a lease"))?;
            }
            Ok(rows.into_iter().map(|r| r.rec).collect())
        })
    }

    fn withdraw(&mut self, n: u64) -> Result<Withdrawn, StateError> {
        self.write(Sync::Relaxed, "withdraw a task", |tx, c| {
            let Some(row) = one(tx, c.path, n)? else { return Ok(Withdrawn::Unknown) };
            if row.settled {
                return Ok(Withdrawn::Settled);
            }
            tx.execute("UPDATE tasks SET settled = 1, worker = NULL, lease_until_ms = NULL WHERE n = ?1", [i64_of(n)])
                .map_err(sql_err(c.path, "withdraw a task"))?;
            settled_one(tx, c)?;
            Ok(Withdrawn::Open(row.rec))
        })
    }

    fn drop_carried_over(&mut self, now_ms: u64) -> Result<usize, StateError> {
        self.write(Sync::Full, "drop carried-over tasks", |tx, c| {
            tx.execute(
                "UPDATE tasks SET carried = 0, settled = 1, worker = NULL \
                 WHERE carried = 1 AND (lease_until_ms IS NULL OR lease_until_ms <= ?1)",
                [i64_of(now_ms)],
            )
            .map_err(sql_err(c.path, "drop carried-over tasks"))
        })
    }

    /// A read in a transaction of its own.
    fn read<T>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&Transaction<'_>, &Path) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(sql_err(&path, op))?;
        f(&tx, &path)
    }
}

impl TaskStore for SqliteState {
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
        self.submit(move |db| {
            db.read("read a task's result", |tx, path| {
                let text: Option<Option<String>> = tx
                    .query_row("SELECT result FROM tasks WHERE n = ?1 AND settled = 1", [i64_of(n)], |r| r.get(0))
                    .optional()
                    .map_err(sql_err(path, "read a task's result"))?;
                match text.flatten() {
                    None => Ok(None),
                    Some(t) => {
                        let row: ResultRow =
                            serde_json::from_str(&t).map_err(|e| corrupt(path, format!("task {n}: result: {e}")))?;
                        row.decode(path, n).map(Some)
                    }
                }
            })
        })
    }

    fn list(&self) -> StateFuture<Vec<TaskRecord>> {
        self.submit(|db| {
            db.read("list tasks", |tx, path| {
                Ok(select(tx, path, "settled = 0 AND carried = 0 ORDER BY n", [])?.into_iter().map(|r| r.rec).collect())
            })
        })
    }

    fn depth(&self) -> StateFuture<Depth> {
        self.submit(|db| {
            db.read("count tasks", |tx, path| {
                let e = || sql_err(path, "count tasks");
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT worker IS NOT NULL, COUNT(*) FROM tasks WHERE settled = 0 AND carried = 0 GROUP BY 1",
                    )
                    .map_err(e())?;
                let rows: Vec<(bool, i64)> =
                    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).and_then(|r| r.collect()).map_err(e())?;
                let mut d = (0, 0);
                for (leased, k) in rows {
                    if leased { d.1 = u64_of(k) } else { d.0 = u64_of(k) }
                }
                Ok(d)
            })
        })
    }

    fn next_expiry(&self) -> StateFuture<Option<u64>> {
        self.submit(|db| {
            db.read("find the next lease end", |tx, path| {
                let v: Option<i64> = tx
                    .query_row(
                        "SELECT MIN(lease_until_ms) FROM tasks WHERE settled = 0 AND worker IS NOT NULL",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(sql_err(path, "find the next lease end"))?;
                Ok(v.map(u64_of))
            })
        })
    }

    fn drop_carried_over(&self, now_ms: u64) -> StateFuture<usize> {
        self.submit(move |db| db.drop_carried_over(now_ms))
    }
}
