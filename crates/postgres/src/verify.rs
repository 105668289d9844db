//! Reading rows in LSN order, and proving a stream whole against its head.

use std::path::Path;

use postgres::Client;
use tidegate_core::Event;
use tidegate_storage::wire::{self, Chain};
use tidegate_storage::{Lsn, StoreError};

use crate::error::database;
use crate::schema::Head;

/// Rows read per round trip.
pub(crate) const PAGE: i64 = 1_000;

/// One stored row.
pub(crate) struct Row {
    pub(crate) lsn: Lsn,
    pub(crate) body: String,
    pub(crate) chain: Vec<u8>,
}

/// The rows of `stream` with `from ≤ lsn ≤ to`, at most [`PAGE`] of them, in LSN order.
pub(crate) fn page(
    client: &mut Client,
    stream: &str,
    from: Lsn,
    to: Lsn,
    location: &Path,
) -> Result<Vec<Row>, StoreError> {
    let (from, to) = (i64::try_from(from).unwrap_or(i64::MAX), i64::try_from(to).unwrap_or(i64::MAX));
    let rows = client
        .query(
            "SELECT lsn, body, chain FROM tidegate_events WHERE stream = $1 AND lsn >= $2 AND lsn <= $3 \
             ORDER BY lsn LIMIT $4",
            &[&stream, &from, &to, &PAGE],
        )
        .map_err(|e| database("read events", location, e))?;
    Ok(rows
        .into_iter()
        .map(|r| Row { lsn: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0), body: r.get(1), chain: r.get(2) })
        .collect())
}

/// Decodes a stored body.
pub(crate) fn decode(lsn: Lsn, body: &str) -> Result<Event, StoreError> {
    wire::decode(body).map_err(|detail| StoreError::Corrupt { lsn, detail })
}

/// What [`check`] proved.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked {
    pub(crate) rows: u64,
    pub(crate) chain: Chain,
}

/// Reads every row of `stream`, decodes it, recomputes the chain from the ledger's genesis and
/// compares the end with `head`. Refuses a gap, a changed row, rows missing below the head, rows
/// past it, and a head whose chain value is not the rows' (docs/postgres.md, invariant 5).
pub(crate) fn check(client: &mut Client, stream: &str, head: &Head, location: &Path) -> Result<Checked, StoreError> {
    let Some(head_chain) = head.last_chain else {
        return Err(StoreError::Unprovable {
            path: location.to_owned(),
            detail: "the stream's head holds a chain value that is not 32 bytes".into(),
        });
    };
    let mut chain = Chain::genesis(&head.ledger_id);
    let mut next: Lsn = 1;
    loop {
        let rows = page(client, stream, next, Lsn::MAX >> 1, location)?;
        let done = (rows.len() as i64) < PAGE;
        for row in rows {
            if row.lsn != next {
                if next > head.last_lsn {
                    break;
                }
                return Err(StoreError::Corrupt {
                    lsn: next,
                    detail: format!("the row of LSN {next} is missing (the next row is LSN {})", row.lsn),
                });
            }
            decode(row.lsn, &row.body)?;
            let want = chain.next(row.lsn, row.body.as_bytes());
            if Chain::from_slice(&row.chain) != Some(want) {
                return Err(StoreError::Corrupt {
                    lsn: row.lsn,
                    detail: "the row's chain value is not the hash of its body and the chain before it: the row \
                             was changed, moved or copied from another ledger"
                        .into(),
                });
            }
            chain = want;
            next += 1;
        }
        if done {
            break;
        }
    }
    let last = next - 1;
    if last < head.last_lsn {
        return Err(StoreError::Shortened { path: location.to_owned(), acknowledged: head.last_lsn, last });
    }
    if last > head.last_lsn {
        return Err(StoreError::Corrupt {
            lsn: head.last_lsn + 1,
            detail: format!(
                "rows {}..={last} lie past the stream's head (LSN {}): they were never committed by an owner",
                head.last_lsn + 1,
                head.last_lsn
            ),
        });
    }
    if chain != head_chain {
        return Err(StoreError::Unprovable {
            path: location.to_owned(),
            detail: format!(
                "the rows' chain ends at {} but the stream's head says {}: the head or the rows were changed",
                chain.short(),
                head_chain.short()
            ),
        });
    }
    Ok(Checked { rows: last, chain })
}
