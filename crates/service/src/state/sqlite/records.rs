//! Idempotency records and the attempt log in `state.db` ([`IdempotencyStore`] and
//! [`AttemptStore`] for [`SqliteState`]).

use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::{Db, SqliteState, Sync, corrupt, operation, sql_err};
use crate::dispatch::Attempt;
use crate::idempotency::{Begin, Fingerprint, Recorded, difference};
use crate::state::{ATTEMPTS_PER_KEY, AttemptStore, IdempotencyStore, StateError, StateFuture};

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A stored record: the first use's fingerprint and, once done, its response.
type Stored = (String, String, String, bool, Option<i64>, Option<String>, Option<String>, Option<Vec<u8>>);

impl Db {
    fn begin(&mut self, key: &str, fp: Fingerprint, now_ms: u64) -> Result<Begin, StateError> {
        // A running marker is acknowledged to nobody (and dropped at the next open).
        self.write(Sync::Relaxed, "begin an idempotent request", |tx, c| {
            let path = c.path;
            let e = |op| sql_err(path, op);
            let ttl = c.limits.idempotency_ttl_ms;
            if now_ms > ttl {
                let gone = tx
                    .execute("DELETE FROM idempotency WHERE done = 1 AND begun_ms < ?1", [i64_of(now_ms - ttl)])
                    .map_err(e("drop expired records"))?;
                if let Some(rows) = c.idempotency_rows.as_mut() {
                    *rows = rows.saturating_sub(gone as u64);
                }
            }
            let stored: Option<Stored> = tx
                .query_row(
                    "SELECT method, path, body, done, status, content_type, location, response \
                     FROM idempotency WHERE key = ?1",
                    [key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?)),
                )
                .optional()
                .map_err(e("read a record"))?;
            if let Some((method, p, body, done, status, content_type, location, response)) = stored {
                let body: Value = serde_json::from_str(&body)
                    .map_err(|err| corrupt(path, format!("idempotency record `{key}`: body: {err}")))?;
                let first = Fingerprint { method, path: p, body };
                if let Some(d) = difference(&first, &fp) {
                    return Ok(Begin::Mismatch(d));
                }
                if !done {
                    return Ok(Begin::InProgress);
                }
                let status = status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| corrupt(path, format!("idempotency record `{key}`: no status")))?;
                return Ok(Begin::Replay(Recorded {
                    status,
                    content_type,
                    location,
                    body: response.unwrap_or_default(),
                }));
            }
            let rows = match *c.idempotency_rows {
                Some(n) => n,
                None => c.count(tx, "idempotency")?,
            };
            let excess = (rows + 1).saturating_sub(c.limits.idempotency_max as u64);
            let mut dropped = 0;
            if excess > 0 {
                dropped = tx
                    .execute(
                        "DELETE FROM idempotency WHERE id IN \
                         (SELECT id FROM idempotency WHERE done = 1 ORDER BY id LIMIT ?1)",
                        [i64_of(excess)],
                    )
                    .map_err(e("drop the oldest records"))? as u64;
            }
            tx.execute(
                "INSERT INTO idempotency(key, begun_ms, method, path, body, done) VALUES (?1, ?2, ?3, ?4, ?5, 0)",
                params![key, i64_of(now_ms), fp.method, fp.path, fp.body.to_string()],
            )
            .map_err(e("record a key"))?;
            *c.idempotency_rows = Some(rows - dropped + 1);
            Ok(Begin::Proceed)
        })
    }

    fn finish(&mut self, key: &str, response: Option<Recorded>) -> Result<(), StateError> {
        match response {
            // Acknowledged: the response goes to the client only after this commit.
            Some(r) => self.write(Sync::Full, "record a response", |tx, c| {
                tx.execute(
                    "UPDATE idempotency SET done = 1, status = ?2, content_type = ?3, location = ?4, response = ?5 \
                     WHERE key = ?1 AND done = 0",
                    params![key, r.status, r.content_type, r.location, r.body],
                )
                .map_err(sql_err(c.path, "record a response"))?;
                Ok(())
            }),
            None => self.write(Sync::Relaxed, "free a key", |tx, c| {
                let gone = tx
                    .execute("DELETE FROM idempotency WHERE key = ?1 AND done = 0", [key])
                    .map_err(sql_err(c.path, "free a key"))?;
                if let Some(rows) = c.idempotency_rows.as_mut() {
                    *rows = rows.saturating_sub(gone as u64);
                }
                Ok(())
            }),
        }
    }

    /// Writes the gathered attempt records in one transaction (committed `NORMAL`: nobody was
    /// told about them) and answers whoever waits on them. A failure fails them all (the
    /// transaction rolls back whole) and is logged for those nobody waits on.
    pub(super) fn flush_attempts(&mut self) {
        if self.pending_attempts.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending_attempts);
        self.pending_since = None;
        let result = self.write(Sync::Relaxed, "record attempts", |tx, c| {
            for (key, a, _) in &pending {
                record_one(tx, c, key, a)?;
            }
            Ok(())
        });
        if let Err(e) = &result
            && pending.iter().any(|(_, _, w)| w.is_none())
        {
            tracing::warn!("recording dispatch attempts: {e}");
        }
        for (_, _, waiter) in pending {
            if let Some(w) = waiter {
                let _ = w.send(result.clone());
            }
        }
    }

    fn attempts(&mut self, effect_key: &str) -> Result<Vec<Attempt>, StateError> {
        let path = self.path.clone();
        let e = || sql_err(&path, "read attempts");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT operation, capability, kind, attempt, key, started_ms, finished_ms, result, detail \
                 FROM attempts WHERE effect_key = ?1 ORDER BY id",
            )
            .map_err(e())?;
        type Raw = (String, String, String, i64, String, i64, Option<i64>, String, String);
        let raws: Vec<Raw> = stmt
            .query_map([effect_key], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?))
            })
            .and_then(|rows| rows.collect())
            .map_err(e())?;
        raws.into_iter()
            .map(|(op, capability, kind, attempt, key, started, finished, result, detail)| {
                let operation = operation(&path, format_args!("attempt of `{effect_key}`"), &op)?;
                Ok(Attempt {
                    operation,
                    capability,
                    kind,
                    attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                    key,
                    started_at_ms: u64_of(started),
                    finished_at_ms: finished.map(u64_of),
                    result,
                    detail,
                })
            })
            .collect()
    }
}

impl IdempotencyStore for SqliteState {
    fn begin(&self, key: &str, fp: Fingerprint, now_ms: u64) -> StateFuture<Begin> {
        let key = key.to_owned();
        self.submit(move |db| db.begin(&key, fp, now_ms))
    }

    fn finish(&self, key: &str, response: Option<Recorded>) -> StateFuture<()> {
        let key = key.to_owned();
        self.submit(move |db| db.finish(&key, response))
    }
}

impl AttemptStore for SqliteState {
    fn record(&self, effect_key: &str, attempt: Attempt) -> StateFuture<()> {
        self.submit_attempt(effect_key.to_owned(), attempt, true)
    }

    fn record_unwaited(&self, effect_key: &str, attempt: Attempt) {
        // Submitted when called; the future only reports, and nobody waits on this one.
        drop(self.submit_attempt(effect_key.to_owned(), attempt, false));
    }

    fn list(&self, effect_key: &str) -> StateFuture<Vec<Attempt>> {
        let key = effect_key.to_owned();
        self.submit(move |db| db.attempts(&key))
    }
}

/// One attempt record, inside a write: its key registered (the oldest keys past
/// `attempts_retained` forgotten), the row inserted, the key's rows past
/// [`ATTEMPTS_PER_KEY`] dropped.
fn record_one(
    tx: &rusqlite::Transaction<'_>,
    c: &mut super::Counts<'_>,
    effect_key: &str,
    a: &Attempt,
) -> Result<(), StateError> {
    let e = |op| sql_err(c.path, op);
    let new = tx
        .prepare_cached("INSERT OR IGNORE INTO attempt_keys(effect_key) VALUES (?1)")
        .and_then(|mut st| st.execute([effect_key]))
        .map_err(e("record an attempt"))?;
    if new == 1 {
        let keys = match *c.attempt_keys {
            Some(n) => n + 1,
            None => c.count(tx, "attempt_keys")?,
        };
        let excess = keys.saturating_sub(c.limits.attempts_retained as u64);
        if excess > 0 {
            tx.prepare_cached(
                "DELETE FROM attempts WHERE effect_key IN \
                 (SELECT effect_key FROM attempt_keys ORDER BY id LIMIT ?1)",
            )
            .and_then(|mut st| st.execute([i64_of(excess)]))
            .map_err(e("forget old attempts"))?;
            tx.prepare_cached(
                "DELETE FROM attempt_keys WHERE id IN (SELECT id FROM attempt_keys ORDER BY id LIMIT ?1)",
            )
            .and_then(|mut st| st.execute([i64_of(excess)]))
            .map_err(e("forget old attempts"))?;
        }
        *c.attempt_keys = Some(keys - excess);
    }
    tx.prepare_cached(
        "INSERT INTO attempts(effect_key, operation, capability, kind, attempt, key, started_ms, finished_ms, \
         result, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .and_then(|mut st| {
        st.execute(params![
            effect_key,
            a.operation.as_str(),
            a.capability,
            a.kind,
            a.attempt,
            a.key,
            i64_of(a.started_at_ms),
            a.finished_at_ms.map(i64_of),
            a.result,
            a.detail,
        ])
    })
    .map_err(e("record an attempt"))?;
    tx.prepare_cached(
        "DELETE FROM attempts WHERE effect_key = ?1 AND id <= \
         (SELECT id FROM attempts WHERE effect_key = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
    )
    .and_then(|mut st| st.execute(params![effect_key, i64_of(ATTEMPTS_PER_KEY as u64)]))
    .map_err(e("forget old attempts"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::super::{Db, Sync};
    use crate::dispatch::{Attempt, Operation};
    use crate::state::Limits;

    /// The statements of an attempt record stay prepared across writes: none is parsed and
    /// planned again after rebinding (the per-attempt `DELETE ... OFFSET ?2` was, on every
    /// record, before the connection enabled the planner's stability guarantee).
    #[test]
    fn recording_attempts_re_prepares_no_statement() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits { idempotency_ttl_ms: 60_000, idempotency_max: 100, attempts_retained: 3 };
        let mut db = Db::open(&dir.path().join("state.db"), limits).unwrap();
        // More keys than are retained, so the pruning statements run too.
        for i in 0..20u32 {
            let a = Attempt {
                operation: Operation::Call,
                capability: "cap".into(),
                kind: "webhook".into(),
                attempt: i % 4 + 1,
                key: format!("k{i}"),
                started_at_ms: u64::from(i),
                finished_at_ms: Some(u64::from(i) + 1),
                result: "done".into(),
                detail: "2xx".into(),
            };
            let key = format!("effect-{}", i / 2);
            db.write(Sync::Relaxed, "test", |tx, c| super::record_one(tx, c, &key, &a)).unwrap();
        }
        for sql in [
            "INSERT OR IGNORE INTO attempt_keys(effect_key) VALUES (?1)",
            "DELETE FROM attempts WHERE effect_key = ?1 AND id <= \
             (SELECT id FROM attempts WHERE effect_key = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            "DELETE FROM attempts WHERE effect_key IN \
             (SELECT effect_key FROM attempt_keys ORDER BY id LIMIT ?1)",
        ] {
            let cached = db.conn.prepare_cached(sql).unwrap();
            assert!(cached.get_status(StatementStatus::Run) > 0, "never ran, so it proves nothing: {sql}");
            assert_eq!(cached.get_status(StatementStatus::RePrepare), 0, "re-prepared: {sql}");
        }
    }
}
