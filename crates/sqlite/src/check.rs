//! The ledger's integrity checks: one row (it decodes as the event its columns say), the hash
//! chain, and the whole of a ledger against its high-water mark (dense LSNs, rows that decode,
//! the chain, the checkpoint's chain value), as every open makes them and
//! [`SqliteStore::verify`] repeats them; and the cut of a corrupt tail above the mark.

use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tidegate_core::Event;
use tidegate_storage::wire::{self, Chain};
use tidegate_storage::{Lsn, StoreError};

use crate::head::{self, LedgerId, Mark};
use crate::schema::{WRITTEN_BY, db};
use crate::{CutRow, SqliteStore, Verify, VerifyReport};

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

impl SqliteStore {
    /// Checks the whole durable ledger: SQLite's own `quick_check`; LSNs exactly `1..=n`;
    /// every row decodes as an event matching its `kind` and `tx` columns; the hash chain
    /// from the ledger's genesis to its end; the checkpoint's recorded chain value; and the
    /// high-water mark (the ledger reaches it, and the row there is the one acknowledged).
    /// Any failure is an error naming the LSN and the rule broken.
    pub fn verify(&self) -> Result<VerifyReport, StoreError> {
        let mark = match self.id {
            Some(id) => {
                let path = &self.shared.path;
                Some(SqliteStore::expect_mark(path, &self.dir, id, head::read(&self.dir)?)?.0)
            }
            None => None,
        };
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let check: String = conn
                .query_row("PRAGMA quick_check", [], |r| r.get(0))
                .map_err(|e| crate::error::database("quick_check", path, e))?;
            if check != "ok" {
                return Err(StoreError::Corrupt { lsn: 0, detail: format!("SQLite quick_check: {check}") });
            }
            let v =
                verify_rows(conn, path, &Check { id: self.id, mark, verify: Verify::Full, max_tail_cut: u64::MAX })?;
            if let Some(first) = v.bad.first() {
                return Err(StoreError::Corrupt {
                    lsn: first.lsn,
                    detail: format!(
                        "{} ({} corrupt rows at the tail, above the high-water mark; a writing open would cut them)",
                        first.reason,
                        v.bad.len()
                    ),
                });
            }
            if let Some(ck) = v.notes.first() {
                return Err(StoreError::Corrupt { lsn: 0, detail: ck.clone() });
            }
            Ok(VerifyReport { rows: v.last, acknowledged_lsn: mark.map_or(0, |m| m.lsn), chained: self.id.is_some() })
        })
    }
}
