//! The database-row sink: SQLite in a temporary file. Also holds the retail `orders` table
//! whose per-row version and operation history are the ground truth of the contention
//! workloads.

use parking_lot::Mutex;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

use super::{Sink, SinkError, SinkKind, SinkResult};

/// Rows in a SQLite database in a temporary directory.
#[derive(Debug)]
pub struct DbSink {
    conn: Mutex<Connection>,
    _dir: tempfile::TempDir,
}

/// An order as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderRow {
    /// `pending`, `cancelled`, `shipped`.
    pub status: String,
    /// Incremented by every applied operation (and every undo).
    pub version: u64,
    /// Modifications applied so far.
    pub modified: u64,
}

fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> SinkError {
    move |source| SinkError::Db { op, source }
}

impl DbSink {
    /// A new database in a new temporary directory.
    pub fn new() -> SinkResult<DbSink> {
        let dir = tempfile::Builder::new().prefix("tidegate-eval-db-").tempdir().map_err(|source| SinkError::Io {
            op: "create the temporary directory",
            path: "$TMPDIR".into(),
            source,
        })?;
        let conn = Connection::open(dir.path().join("sink.sqlite")).map_err(db("open"))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;
             CREATE TABLE effects (res TEXT NOT NULL, body TEXT NOT NULL);
             CREATE INDEX effects_res ON effects(res);
             CREATE TABLE keys (key TEXT PRIMARY KEY);
             CREATE TABLE reserved (id INTEGER PRIMARY KEY, res TEXT NOT NULL, body TEXT NOT NULL, state TEXT NOT NULL);
             CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL, modified INTEGER NOT NULL);
             CREATE TABLE order_ops (seq INTEGER PRIMARY KEY, res TEXT NOT NULL, id TEXT NOT NULL, op TEXT NOT NULL,
                based_on INTEGER NOT NULL, at_version INTEGER NOT NULL, prior_status TEXT NOT NULL,
                stale INTEGER NOT NULL, undone INTEGER NOT NULL DEFAULT 0);
             CREATE INDEX order_ops_res ON order_ops(res);
             CREATE INDEX order_ops_id ON order_ops(id);",
        )
        .map_err(db("create the schema"))?;
        Ok(DbSink { conn: Mutex::new(conn), _dir: dir })
    }

    /// Creates `id` as a pending order at version 0 (no-op if it exists).
    pub fn create_order(&self, id: &str) -> SinkResult<()> {
        self.conn
            .lock()
            .execute("INSERT OR IGNORE INTO orders VALUES (?1, 'pending', 0, 0)", params![id])
            .map_err(db("create order"))?;
        Ok(())
    }

    /// The order as stored now.
    pub fn order(&self, id: &str) -> SinkResult<OrderRow> {
        let row = self
            .conn
            .lock()
            .query_row("SELECT status, version, modified FROM orders WHERE id = ?1", params![id], |r| {
                Ok(OrderRow {
                    status: r.get(0)?,
                    version: r.get::<_, i64>(1)? as u64,
                    modified: r.get::<_, i64>(2)? as u64,
                })
            })
            .optional()
            .map_err(db("read order"))?;
        Ok(row.unwrap_or(OrderRow { status: "absent".into(), version: 0, modified: 0 }))
    }

    /// Applies `op` (`cancel`, `modify`, `ship`) to order `id`, planned on `based_on`.
    /// The sink records whether the plan was stale (the order's version had moved since the
    /// plan's read) but never refuses: checking is the mechanisms' job.
    pub fn apply_order(&self, res: &str, id: &str, op: &str, based_on: u64, key: Option<&str>) -> SinkResult<()> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(db("begin"))?;
        if let Some(k) = key
            && tx.execute("INSERT OR IGNORE INTO keys VALUES (?1)", params![k]).map_err(db("record key"))? == 0
        {
            return Ok(());
        }
        let (status, version): (String, i64) = tx
            .query_row("SELECT status, version FROM orders WHERE id = ?1", params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(db("read order for write"))?;
        let stale = based_on as i64 != version;
        let new_status = match op {
            "cancel" => "cancelled",
            "ship" => "shipped",
            _ => status.as_str(),
        }
        .to_owned();
        let modified = i64::from(op == "modify");
        tx.execute(
            "UPDATE orders SET status = ?2, version = version + 1, modified = modified + ?3 WHERE id = ?1",
            params![id, new_status, modified],
        )
        .map_err(db("write order"))?;
        tx.execute(
            "INSERT INTO order_ops (res, id, op, based_on, at_version, prior_status, stale) VALUES (?1,?2,?3,?4,?5,?6,?7)",
            params![res, id, op, based_on as i64, version, status, stale],
        )
        .map_err(db("log order op"))?;
        tx.commit().map_err(db("commit"))
    }

    /// Undoes the latest live operation logged under `res` (restores the prior status).
    pub fn undo_order(&self, res: &str) -> SinkResult<()> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(db("begin"))?;
        let row: Option<(i64, String, String, String)> = tx
            .query_row(
                "SELECT seq, id, op, prior_status FROM order_ops WHERE res = ?1 AND undone = 0 ORDER BY seq DESC LIMIT 1",
                params![res],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(db("find order op"))?;
        if let Some((seq, id, op, prior)) = row {
            let unmod = i64::from(op == "modify");
            tx.execute(
                "UPDATE orders SET status = ?2, version = version + 1, modified = modified - ?3 WHERE id = ?1",
                params![id, prior, unmod],
            )
            .map_err(db("restore order"))?;
            tx.execute("UPDATE order_ops SET undone = 1 WHERE seq = ?1", params![seq]).map_err(db("mark undone"))?;
        }
        tx.commit().map_err(db("commit"))
    }

    /// Live operations logged under `res`.
    pub fn order_ops_live(&self, res: &str) -> SinkResult<u64> {
        let n: i64 = self
            .conn
            .lock()
            .query_row("SELECT COUNT(*) FROM order_ops WHERE res = ?1 AND undone = 0", params![res], |r| r.get(0))
            .map_err(db("count order ops"))?;
        Ok(n as u64)
    }

    /// Live operations on order `id` that were planned on a stale version: each one is a
    /// committed read-then-write whose read another committed write had already overtaken
    /// (a conflict-cycle witness on the order).
    pub fn stale_writes(&self, id: &str) -> SinkResult<u64> {
        let n: i64 = self
            .conn
            .lock()
            .query_row("SELECT COUNT(*) FROM order_ops WHERE id = ?1 AND undone = 0 AND stale = 1", params![id], |r| {
                r.get(0)
            })
            .map_err(db("count stale writes"))?;
        Ok(n as u64)
    }

    /// Live operations on order `id` applied to an order that was already cancelled (the
    /// cancelled-and-modified invariant, and double cancels).
    pub fn ops_after_cancel(&self, id: &str) -> SinkResult<u64> {
        let n: i64 = self
            .conn
            .lock()
            .query_row(
                "SELECT COUNT(*) FROM order_ops WHERE id = ?1 AND undone = 0 AND prior_status = 'cancelled'",
                params![id],
                |r| r.get(0),
            )
            .map_err(db("count ops after cancel"))?;
        Ok(n as u64)
    }

    /// Live operations of kind `op` on order `id`.
    pub fn live_ops(&self, id: &str, op: &str) -> SinkResult<u64> {
        let n: i64 = self
            .conn
            .lock()
            .query_row(
                "SELECT COUNT(*) FROM order_ops WHERE id = ?1 AND op = ?2 AND undone = 0",
                params![id, op],
                |r| r.get(0),
            )
            .map_err(db("count ops"))?;
        Ok(n as u64)
    }
}

impl Sink for DbSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Db
    }

    fn apply(&self, res: &str, body: &Value, key: Option<&str>) -> SinkResult<()> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(db("begin"))?;
        if let Some(k) = key
            && tx.execute("INSERT OR IGNORE INTO keys VALUES (?1)", params![k]).map_err(db("record key"))? == 0
        {
            return Ok(());
        }
        tx.execute("INSERT INTO effects VALUES (?1, ?2)", params![res, body.to_string()]).map_err(db("insert row"))?;
        tx.commit().map_err(db("commit"))
    }

    fn undo(&self, res: &str) -> SinkResult<()> {
        self.conn
            .lock()
            .execute("DELETE FROM effects WHERE rowid = (SELECT MAX(rowid) FROM effects WHERE res = ?1)", params![res])
            .map_err(db("delete row"))?;
        Ok(())
    }

    fn applied_key(&self, key: &str) -> SinkResult<bool> {
        let n: i64 = self
            .conn
            .lock()
            .query_row("SELECT COUNT(*) FROM keys WHERE key = ?1", params![key], |r| r.get(0))
            .map_err(db("probe key"))?;
        Ok(n > 0)
    }

    fn live(&self, res: &str) -> SinkResult<u64> {
        let n: i64 = self
            .conn
            .lock()
            .query_row("SELECT COUNT(*) FROM effects WHERE res = ?1", params![res], |r| r.get(0))
            .map_err(db("count rows"))?;
        Ok(n as u64)
    }

    fn reserve(&self, res: &str, body: &Value) -> SinkResult<String> {
        let conn = self.conn.lock();
        conn.execute(
            "INSERT INTO reserved (res, body, state) VALUES (?1, ?2, 'tried')",
            params![res, body.to_string()],
        )
        .map_err(db("reserve"))?;
        Ok(format!("db-{}", conn.last_insert_rowid()))
    }

    fn confirm(&self, id: &str) -> SinkResult<()> {
        let rowid: i64 = id
            .strip_prefix("db-")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| SinkError::NoReservation { sink: "database", id: id.to_owned() })?;
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(db("begin"))?;
        let row: Option<(String, String, String)> = tx
            .query_row("SELECT res, body, state FROM reserved WHERE id = ?1", params![rowid], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(db("read reservation"))?;
        let Some((res, body, state)) = row else {
            return Err(SinkError::NoReservation { sink: "database", id: id.to_owned() });
        };
        if state == "tried" {
            tx.execute("INSERT INTO effects VALUES (?1, ?2)", params![res, body]).map_err(db("confirm row"))?;
            tx.execute("UPDATE reserved SET state = 'confirmed' WHERE id = ?1", params![rowid])
                .map_err(db("mark confirmed"))?;
        }
        tx.commit().map_err(db("commit"))
    }

    fn cancel(&self, id: &str) -> SinkResult<()> {
        if let Some(rowid) = id.strip_prefix("db-").and_then(|n| n.parse::<i64>().ok()) {
            self.conn
                .lock()
                .execute("UPDATE reserved SET state = 'cancelled' WHERE id = ?1 AND state = 'tried'", params![rowid])
                .map_err(db("cancel"))?;
        }
        Ok(())
    }
}
