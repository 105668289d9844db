//! Group commit: the queue shared by appenders and waiters, and the single writer thread.
//!
//! ```text
//!  appenders (engine lock held)        writer thread                      waiters
//!  append(b1) ─► queue [b1]                                               wait_durable(l1) ─► wanted = l1
//!  append(b2) ─► queue [b1 b2]   ◄── woken: someone wants an LSN ──────────────────────────┘
//!                                    inflight = [b1 b2], queue = []
//!  append(b3) ─► queue [b3]          BEGIN; INSERT b1, b2; COMMIT (one fsync)
//!                                    durable = last(b2); inflight = [] ──► wake the waiters ≤ durable
//! ```
//!
//! A commit is started when a waiter wants an LSN that is not durable, when the queue holds
//! [`Options::max_batch_rows`](super::Options::max_batch_rows) rows, when the oldest queued batch has waited
//! [`Options::idle_flush_ms`](super::Options::idle_flush_ms), or when the store closes. Everything queued goes into that
//! one transaction, so concurrent appenders share one sync.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rusqlite::{Connection, TransactionBehavior, params};
use tidegate_core::Event;

use super::Options;
use tidegate_storage::{Lsn, StoreError};

/// One encoded event.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) tx: i64,
    /// The JSON text of the event.
    pub(super) body: String,
    /// Where the `"event"` tag's value sits in `body`.
    kind: std::ops::Range<usize>,
}

impl Row {
    /// Encodes the `index`-th event of a batch.
    pub(super) fn encode(index: usize, event: &Event) -> Result<Row, StoreError> {
        let tx = event.tx().0;
        let tx = i64::try_from(tx).map_err(|_| StoreError::InvalidArgument {
            field: "event.tx",
            value: tx.to_string(),
            expected: "a transaction id ≤ 2^63 - 1",
        })?;
        let body = serde_json::to_string(event).map_err(|e| StoreError::Encode { index, detail: e.to_string() })?;
        let kind = kind_range(&body).ok_or_else(|| StoreError::Encode {
            index,
            detail: format!("the JSON does not start with an \"event\" tag: {}", preview(&body)),
        })?;
        Ok(Row { tx, body, kind })
    }

    pub(super) fn kind(&self) -> &str {
        self.body.get(self.kind.clone()).unwrap_or("")
    }

    pub(super) fn decode(&self, lsn: Lsn) -> Result<Event, StoreError> {
        serde_json::from_str(&self.body).map_err(|e| StoreError::Corrupt { lsn, detail: format!("queued event: {e}") })
    }
}

/// The `"event"` tag of an encoded event. Serde writes an internally tagged enum's tag
/// first, so it is found without parsing the whole body.
pub(super) fn kind_range(body: &str) -> Option<std::ops::Range<usize>> {
    const PREFIX: &str = "{\"event\":\"";
    let rest = body.strip_prefix(PREFIX)?;
    let len = rest.find('"')?;
    Some(PREFIX.len()..PREFIX.len() + len)
}

/// At most the first 80 characters of `s`, for error messages.
pub(super) fn preview(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Consecutive events appended by one call.
#[derive(Debug)]
pub(super) struct Batch {
    pub(super) first: Lsn,
    pub(super) rows: Vec<Row>,
}

impl Batch {
    pub(super) fn last(&self) -> Lsn {
        self.first + self.rows.len() as Lsn - 1
    }
}

/// Everything appenders, waiters and the writer share, behind one lock.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Batches appended and not yet taken by the writer, in LSN order.
    pub(super) queue: Vec<Arc<Batch>>,
    /// Batches the writer is committing (kept so `scan` sees them).
    pub(super) inflight: Vec<Arc<Batch>>,
    pub(super) queued_rows: usize,
    /// When the oldest queued batch was appended.
    pub(super) oldest: Option<Instant>,
    /// The highest LSN a waiter is waiting for.
    pub(super) wanted: Lsn,
    /// Every event up to here is committed (mirrored in [`Shared::durable`]).
    pub(super) durable: Lsn,
    pub(super) appends: u64,
    pub(super) syncs: u64,
    pub(super) failed: Option<Arc<StoreError>>,
    pub(super) closing: bool,
    /// Waiters by the LSN they wait for (blocking waiters park behind a thread-unparking
    /// waker), so a commit wakes exactly the waiters it satisfies.
    pub(super) wakers: BTreeMap<Lsn, Vec<Waker>>,
    /// A checkpoint to write with the next commit (a newer one replaces an older one not
    /// yet written), and the sequence number of the request.
    pub(super) checkpoint: Option<(u64, Lsn, Arc<[u8]>)>,
    /// Requests made so far, and the newest one written.
    pub(super) checkpoint_requested: u64,
    pub(super) checkpoint_written: u64,
}

impl State {
    pub(super) fn failure(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(cause) => Err(StoreError::Failed { cause: cause.clone() }),
            None => Ok(()),
        }
    }
}

/// The state plus the signals around it.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// The writer waits here for work.
    pub(super) work: Condvar,
    /// `put_checkpoint` waits here for its checkpoint to be written (or the store to fail).
    pub(super) checkpointed: Condvar,
    /// Every event up to here is durable; read without the lock by `is_durable`.
    pub(super) durable: AtomicU64,
    /// The last LSN assigned.
    pub(super) last: AtomicU64,
    /// The database file, for error messages.
    pub(super) path: PathBuf,
}

impl Shared {
    pub(super) fn new(path: PathBuf, last: Lsn) -> Shared {
        Shared {
            state: Mutex::new(State { durable: last, ..State::default() }),
            work: Condvar::new(),
            checkpointed: Condvar::new(),
            durable: AtomicU64::new(last),
            last: AtomicU64::new(last),
            path,
        }
    }

    /// Stops the store: drops every batch not yet durable, wakes every waiter with the
    /// failure, tells the writer to exit. Returns the error for the caller.
    pub(super) fn fail(&self, mut st: MutexGuard<'_, State>, cause: StoreError) -> StoreError {
        if let Some(earlier) = &st.failed {
            return StoreError::Failed { cause: earlier.clone() };
        }
        let cause = Arc::new(cause);
        st.failed = Some(cause.clone());
        st.queue = Vec::new();
        st.inflight = Vec::new();
        st.queued_rows = 0;
        st.oldest = None;
        st.checkpoint = None;
        let wakers = std::mem::take(&mut st.wakers);
        drop(st);
        self.work.notify_all();
        self.checkpointed.notify_all();
        wakers.into_values().flatten().for_each(Waker::wake);
        StoreError::Failed { cause }
    }
}

/// What the writer needs from [`Options`].
#[derive(Debug, Clone)]
pub(super) struct WriterConfig {
    pub(super) max_batch_rows: usize,
    pub(super) idle_flush: Option<Duration>,
    pub(super) crash_after_syncs: Option<u64>,
}

impl WriterConfig {
    pub(super) fn new(o: &Options, crash_after_syncs: Option<u64>) -> WriterConfig {
        WriterConfig {
            max_batch_rows: o.max_batch_rows.max(1),
            idle_flush: o.idle_flush_ms.map(Duration::from_millis),
            crash_after_syncs,
        }
    }
}

/// Marks the store failed if the writer thread exits without a clean close (an error it
/// could not report otherwise, or a panic), so no waiter blocks forever.
struct ExitGuard<'a>(&'a Shared);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        let st = self.0.state.lock();
        if st.failed.is_none() && !(st.closing && st.queue.is_empty() && st.checkpoint.is_none()) {
            let e =
                StoreError::Io { op: "run the ledger writer", source: std::io::Error::other("writer thread exited") };
            self.0.fail(st, e);
        }
    }
}

/// The writer thread's body: commits queued batches until the store closes or fails.
pub(super) fn run(shared: &Shared, mut conn: Connection, cfg: &WriterConfig) {
    let _guard = ExitGuard(shared);
    loop {
        let mut st = shared.state.lock();
        // Wait until a commit is due.
        loop {
            if st.failed.is_some() {
                return;
            }
            if st.queue.is_empty() && st.checkpoint.is_none() {
                if st.closing {
                    return;
                }
                shared.work.wait(&mut st);
                continue;
            }
            let due_at = match (cfg.idle_flush, st.oldest) {
                (Some(d), Some(t)) => Some(t + d),
                _ => None,
            };
            if st.closing
                || st.checkpoint.is_some()
                || st.wanted > st.durable
                || st.queued_rows >= cfg.max_batch_rows
                || due_at.is_some_and(|t| t <= Instant::now())
            {
                break;
            }
            match due_at {
                Some(t) => {
                    shared.work.wait_until(&mut st, t);
                }
                None => shared.work.wait(&mut st),
            }
        }
        let batches = std::mem::take(&mut st.queue);
        let checkpoint = st.checkpoint.take();
        st.queued_rows = 0;
        st.oldest = None;
        if cfg.crash_after_syncs.is_some_and(|n| st.syncs >= n) {
            let n = st.syncs + 1;
            shared.fail(st, StoreError::InjectedCrash { what: "sync", n });
            return;
        }
        st.inflight.clone_from(&batches);
        drop(st);

        let written = commit(&mut conn, &batches, checkpoint.as_ref().map(|(_, l, b)| (*l, &**b)));

        let mut st = shared.state.lock();
        if st.failed.is_some() {
            // Failed meanwhile (crash_now, a crash at an append): the waiters were told.
            return;
        }
        match written {
            Ok(()) => {
                let durable = batches.last().map_or(st.durable, |b| b.last());
                debug_assert!(durable >= st.durable, "durability went backwards");
                st.durable = durable;
                shared.durable.store(durable, Ordering::Release);
                st.inflight.clear();
                st.syncs += 1;
                if let Some((seq, _, _)) = checkpoint {
                    st.checkpoint_written = st.checkpoint_written.max(seq);
                    shared.checkpointed.notify_all();
                }
                let later = st.wakers.split_off(&(durable + 1));
                let ready = std::mem::replace(&mut st.wakers, later);
                drop(st);
                ready.into_values().flatten().for_each(Waker::wake);
            }
            Err(e) => {
                let e = crate::error::database("commit queued events", &shared.path, e);
                shared.fail(st, e);
                return;
            }
        }
    }
}

/// Writes `batches`, then the checkpoint if one is due, in one transaction and commits it
/// (durably: `synchronous=FULL`). The checkpoint's LSN is at most the last LSN appended when
/// it was requested, so its events are already durable or in this very transaction.
fn commit(conn: &mut Connection, batches: &[Arc<Batch>], checkpoint: Option<(Lsn, &[u8])>) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut insert = tx.prepare_cached("INSERT INTO events (lsn, tx, kind, body) VALUES (?1, ?2, ?3, ?4)")?;
        for b in batches {
            for (i, row) in b.rows.iter().enumerate() {
                // LSNs were checked to fit in an i64 when they were assigned.
                let lsn = (b.first + i as Lsn) as i64;
                insert.execute(params![lsn, row.tx, row.kind(), row.body])?;
            }
        }
    }
    if let Some((lsn, body)) = checkpoint {
        let by = concat!("tidegate-storage ", env!("CARGO_PKG_VERSION"));
        tx.execute(
            "INSERT OR REPLACE INTO checkpoint (id, lsn, body, written_by) VALUES (1, ?1, ?2, ?3)",
            params![lsn as i64, body, by],
        )?;
    }
    tx.commit()
}
