//! The read side of the contract: [`LedgerStore::scan`] (committed rows from SQLite, checked
//! row by row and along the chain, then the batches not yet durable from memory) and the
//! stored checkpoint.

use rusqlite::OptionalExtension;
use rusqlite::types::ValueRef;
use tidegate_core::Event;
use tidegate_storage::wire::Chain;
use tidegate_storage::{Lsn, StoreError, StoredCheckpoint};

use crate::SqliteStore;
use crate::check;
use crate::writer::Queued;

impl SqliteStore {
    /// Reads committed events from SQLite, then the ones still queued or being committed
    /// from memory, so the result is every event appended, in LSN order.
    pub(crate) fn scan_events(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        let mut pos = from.max(1);
        loop {
            self.shared.state.lock().failure()?;
            let durable = self.durable_lsn();
            if pos <= durable {
                let (next, stopped) = self.scan_committed(pos, durable, visit)?;
                if stopped {
                    return Ok(());
                }
                pos = next;
            }
            // Under the lock, every event after `st.durable` is in `inflight` or `queue`.
            let pending: Vec<Queued> = {
                let st = self.shared.state.lock();
                st.failure()?;
                if st.durable >= pos {
                    continue; // committed meanwhile: read it from the database
                }
                st.inflight.iter().chain(&st.queue).filter(|b| b.last() >= pos).cloned().collect()
            };
            for b in &pending {
                for (i, event) in b.events.iter().enumerate() {
                    let lsn = b.first + i as Lsn;
                    if lsn < pos {
                        continue;
                    }
                    if !visit(lsn, event) {
                        return Ok(());
                    }
                }
            }
            return Ok(());
        }
    }

    pub(crate) fn read_checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.shared.state.lock().failure()?;
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let row: Option<(i64, Vec<u8>)> = conn
                .query_row("SELECT lsn, body FROM checkpoint WHERE id = 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(|e| crate::error::database("read the checkpoint", path, e))?;
            match row {
                None => Ok(None),
                Some((lsn, bytes)) => match u64::try_from(lsn) {
                    Ok(lsn) => Ok(Some(StoredCheckpoint { lsn, bytes })),
                    Err(_) => Err(StoreError::Corrupt { lsn: 0, detail: format!("checkpoint row has LSN {lsn}") }),
                },
            }
        })
    }

    /// Visits committed rows with `from ≤ LSN ≤ upto`, checking each row and its chain value
    /// (from the stored value before `from`). Returns the LSN after the last row read and
    /// whether `visit` asked to stop.
    fn scan_committed(
        &self,
        from: Lsn,
        upto: Lsn,
        visit: &mut dyn FnMut(Lsn, &Event) -> bool,
    ) -> Result<(Lsn, bool), StoreError> {
        self.with_reader(|conn| {
            let path = &self.shared.path;
            let db = |op| move |e| crate::error::database(op, path, e);
            let mut prev = match self.id {
                None => None,
                // Verified at open, or written by this store.
                Some(_) if from >= self.checked_from => None,
                Some(id) if from <= 1 => Some(Chain::genesis(&id)),
                Some(_) => {
                    let stored: Option<Option<Vec<u8>>> = conn
                        .query_row("SELECT chain FROM events WHERE lsn = ?1", [(from - 1) as i64], |r| r.get(0))
                        .optional()
                        .map_err(db("scan"))?;
                    match stored.flatten().and_then(|b| Chain::from_slice(&b)) {
                        Some(c) => Some(c),
                        None => {
                            return Err(StoreError::Corrupt {
                                lsn: from - 1,
                                detail: "it has no readable hash chain value".into(),
                            });
                        }
                    }
                }
            };
            let sql = if self.id.is_some() {
                "SELECT lsn, tx, kind, body, chain FROM events WHERE lsn >= ?1 AND lsn <= ?2 ORDER BY lsn"
            } else {
                "SELECT lsn, tx, kind, body, NULL FROM events WHERE lsn >= ?1 AND lsn <= ?2 ORDER BY lsn"
            };
            let mut stmt = conn.prepare_cached(sql).map_err(db("scan"))?;
            let mut rows = stmt.query([from as i64, upto as i64]).map_err(db("scan"))?;
            let mut next = from;
            while let Some(row) = rows.next().map_err(db("scan"))? {
                let lsn: i64 = row.get(0).map_err(db("scan"))?;
                if lsn != next as i64 {
                    return Err(StoreError::Corrupt {
                        lsn: next,
                        detail: format!("missing; the next row has LSN {lsn}"),
                    });
                }
                let body: ValueRef<'_> = row.get_ref(3).map_err(db("scan"))?;
                let (event, bytes) =
                    check::check_row(row.get_ref(1).map_err(db("scan"))?, row.get_ref(2).map_err(db("scan"))?, body)
                        .map_err(|detail| StoreError::Corrupt { lsn: next, detail })?;
                if let Some(p) = prev {
                    let (c, linked) = check::check_chain(&p, next, bytes, row.get_ref(4).map_err(db("scan"))?);
                    linked.map_err(|detail| StoreError::Corrupt { lsn: next, detail })?;
                    prev = if next + 1 >= self.checked_from { None } else { Some(c) };
                }
                next += 1;
                if !visit(lsn as Lsn, &event) {
                    return Ok((next, true));
                }
            }
            Ok((next, false))
        })
    }
}
