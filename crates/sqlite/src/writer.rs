//! Group commit: the queue shared by appenders and waiters, and the single writer thread.
//!
//! ```text
//!  appenders (engine lock held)        writer thread                      waiters
//!  append(b1) ─► queue [b1]                                               wait_durable(l1) ─► wanted = l1
//!  append(b2) ─► queue [b1 b2]   ◄── woken: someone wants an LSN ──────────────────────────┘
//!                                    inflight = [b1 b2], queue = []
//!  append(b3) ─► queue [b3]          BEGIN; INSERT b1, b2; COMMIT (one fsync)
//!                                    ledger.head ← (last(b2), chain)  (written, not synced)
//!                                    durable = last(b2); inflight = [] ──► wake the waiters ≤ durable
//!                     marker thread: fdatasync(ledger.head) at most every mark_sync_ms; marked = last(b2)
//! ```
//!
//! The queue holds the batches as the engine handed them (the same `tidegate_core::Batch`, not a
//! copy): the writer encodes each event ([`wire::encode`]) as it inserts it, so the
//! appender, which holds the engine's lock, never serialises anything.
//!
//! Each commit also checks the stream's owner token inside its transaction (a newer owner
//! fences this store out) and chains every row it inserts; after the commit it writes the
//! high-water mark and wakes the commit's waiters, and a marker thread syncs the mark behind
//! them (with `Options::ack_after_mark`, the waiters are woken only after that sync).
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
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tidegate_core::Event;
use tidegate_storage::wire::{self, Chain};
use tidegate_storage::{Lsn, StoreError};

use crate::Options;
use crate::head::HeadFile;

/// The `tx` column of an event: its transaction id, which must fit SQLite's signed integer.
/// Checked by `append` (so a bad id fails the append, nothing queued) and again by the
/// writer.
pub(crate) fn tx_column(index: usize, event: &Event) -> Result<i64, StoreError> {
    let tx = event.tx().0;
    i64::try_from(tx).map_err(|_| StoreError::InvalidArgument {
        field: "event.tx",
        value: format!("{tx} (event {index} of the batch)"),
        expected: "a transaction id ≤ 2^63 - 1",
    })
}

/// Consecutive events appended by one call, shared with the engine (not copied); encoded by
/// the writer when it commits them.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) first: Lsn,
    pub(crate) events: tidegate_core::Batch,
}

impl Queued {
    pub(crate) fn last(&self) -> Lsn {
        self.first + self.events.len() as Lsn - 1
    }
}

/// Everything appenders, waiters and the writer share, behind one lock.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Batches appended and not yet taken by the writer, in LSN order.
    pub(super) queue: Vec<Queued>,
    /// Batches the writer is committing (kept so `scan` sees them).
    pub(super) inflight: Vec<Queued>,
    pub(super) queued_rows: usize,
    /// When the oldest queued batch was appended.
    pub(super) oldest: Option<Instant>,
    /// The highest LSN a waiter is waiting for.
    pub(super) wanted: Lsn,
    /// Every event up to here is durable and acknowledged: committed to SQLite (and marked,
    /// with `ack_after_mark`); mirrored in [`Shared::durable`].
    pub(super) durable: Lsn,
    /// Every event up to here is committed to SQLite (the high-water mark may lag).
    pub(super) committed: Lsn,
    /// Every event up to here is covered by the synced high-water mark.
    pub(super) marked: Lsn,
    /// Every event up to here is covered by the mark written (perhaps not yet synced).
    pub(super) mark_written: Lsn,
    /// Sync the mark without waiting for `mark_sync_ms` (`sync()`, a checkpoint).
    pub(super) mark_now: bool,
    /// The newest checkpoint request committed, and the LSN its commit ended at: written once
    /// a mark covering that LSN is synced.
    pub(super) checkpoint_committed: Option<(u64, Lsn)>,
    /// The writer has exited; the marker syncs the last mark and exits too.
    pub(super) writer_done: bool,
    /// The writer sleeps without a deadline on an empty queue: the next append must wake it
    /// (to learn the idle-flush deadline). While it lingers with a deadline after recent work,
    /// appends do not wake it, so a busy store is not woken once per append.
    pub(super) writer_parked: bool,
    pub(super) appends: u64,
    pub(super) syncs: u64,
    /// Syncs of the high-water mark (see `StoreStats::marks`).
    pub(super) marks: u64,
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
    /// The marker waits here for a commit to mark.
    pub(super) marking: Condvar,
    /// `put_checkpoint` and `sync` wait here for a mark (or the store to fail).
    pub(super) marked: Condvar,
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
            state: Mutex::new(State {
                durable: last,
                committed: last,
                marked: last,
                mark_written: last,
                ..State::default()
            }),
            work: Condvar::new(),
            marking: Condvar::new(),
            marked: Condvar::new(),
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
        self.marking.notify_all();
        self.marked.notify_all();
        wakers.into_values().flatten().for_each(Waker::wake);
        StoreError::Failed { cause }
    }
}

/// What the writer needs: the [`Options`], its ownership, and where the chain stands.
#[derive(Debug)]
pub(super) struct WriterConfig {
    pub(super) max_batch_rows: usize,
    pub(super) idle_flush: Option<Duration>,
    pub(super) crash_after_syncs: Option<u64>,
    /// The stream (the data directory) and this owner's fencing token.
    pub(super) stream: String,
    pub(super) token: u64,
    /// The chain value before the first event (for a checkpoint at LSN 0).
    pub(super) genesis: Chain,
    /// The chain value at the committed LSN.
    pub(super) chain: Chain,
    /// The high-water mark: written by the writer, synced by the marker thread.
    pub(super) head: Arc<Mutex<HeadFile>>,
    /// Wake a commit's waiters only after its mark is synced (`Options::ack_after_mark`).
    pub(super) ack_after_mark: bool,
    /// Sync the mark at most this often (`Options::mark_sync_ms`); ignored with
    /// `ack_after_mark`, which syncs every mark at once.
    pub(super) mark_sync: Duration,
}

impl WriterConfig {
    pub(super) fn new(
        o: &Options,
        crash_after_syncs: Option<u64>,
        chain: (Chain, Chain),
        head: HeadFile,
        stream: String,
        token: u64,
    ) -> WriterConfig {
        WriterConfig {
            max_batch_rows: o.max_batch_rows.max(1),
            idle_flush: o.idle_flush_ms.map(Duration::from_millis),
            crash_after_syncs,
            stream,
            token,
            genesis: chain.0,
            chain: chain.1,
            head: Arc::new(Mutex::new(head)),
            ack_after_mark: o.ack_after_mark,
            mark_sync: Duration::from_millis(o.mark_sync_ms),
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

/// The writer thread's body: commits queued batches until the store closes or fails, writing
/// the high-water mark after each commit, while a marker thread syncs the mark behind it. On a
/// clean close it folds the write-ahead log into the database before its connection (the last
/// one) closes.
///
/// ```text
///  writer:  commit k, write mark k, durable = last(k), wake ≤ it ─ commit k+1, write mark k+1, …
///  marker:      (at most every mark_sync_ms, or at once when asked)  fdatasync ─► marked = last(k+1)
/// ```
///
/// With `ack_after_mark` the marker syncs every mark as soon as it is written, and it, not the
/// writer, publishes the commit as durable and wakes its waiters; its sync of mark k overlaps
/// the SQLite commit of k + 1.
pub(super) fn run(shared: &Shared, mut conn: Connection, mut cfg: WriterConfig) {
    let _guard = ExitGuard(shared);
    let head = cfg.head.clone();
    let (ack_after_mark, interval) = (cfg.ack_after_mark, cfg.mark_sync);
    std::thread::scope(|s| {
        let marker = std::thread::Builder::new()
            .name("tidegate-ledger-marker".into())
            .spawn_scoped(s, move || mark_loop(shared, &head, ack_after_mark, interval));
        commit_loop(shared, &mut conn, &mut cfg);
        shared.state.lock().writer_done = true;
        shared.marking.notify_all();
        let failed = match marker {
            Ok(handle) => handle.join().err().map(|_| StoreError::Io {
                op: "mark the ledger",
                source: std::io::Error::other("the marker thread panicked"),
            }),
            Err(e) => Some(StoreError::Io { op: "start the ledger marker thread", source: e }),
        };
        if let Some(e) = failed {
            shared.fail(shared.state.lock(), e);
        }
    });
    let closed_cleanly = {
        let st = shared.state.lock();
        st.failed.is_none() && st.closing
    };
    if closed_cleanly {
        // TRUNCATE: every frame copied into ledger.db and synced, the log emptied; SQLite
        // removes it when this connection closes.
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
}

/// Publishes every event up to `lsn` as durable (acknowledged): drops the batches `scan` no
/// longer needs from memory and hands back the waiters it satisfies, to be woken once the
/// lock is released.
fn publish_durable(shared: &Shared, st: &mut State, lsn: Lsn) -> Vec<Waker> {
    if lsn <= st.durable {
        return Vec::new();
    }
    st.durable = lsn;
    shared.durable.store(lsn, Ordering::Release);
    st.inflight.retain(|b| b.last() > lsn);
    let later = st.wakers.split_off(&(lsn + 1));
    let ready = std::mem::replace(&mut st.wakers, later);
    ready.into_values().flatten().collect()
}

/// The marker thread's body: syncs the marks the writer wrote, at once with `ack_after_mark`
/// (then publishes them as durable), else when asked (`sync()`, a checkpoint, the writer's
/// exit) or `interval` after the previous sync, so a lone client's commits do not wait for a
/// second sync competing with theirs.
fn mark_loop(shared: &Shared, head: &Mutex<HeadFile>, ack_after_mark: bool, interval: Duration) {
    let mut last_sync = Instant::now();
    loop {
        let mut st = shared.state.lock();
        loop {
            if st.failed.is_some() {
                return;
            }
            let dirty = st.mark_written > st.marked;
            if dirty && (ack_after_mark || st.mark_now || st.writer_done || last_sync.elapsed() >= interval) {
                break;
            }
            if !dirty && st.writer_done {
                return;
            }
            if dirty {
                shared.marking.wait_until(&mut st, last_sync + interval);
            } else {
                shared.marking.wait(&mut st);
            }
        }
        st.mark_now = false;
        drop(st);
        // Every mark written before this sync starts is covered by it.
        let synced = head.lock().sync();
        last_sync = Instant::now();
        let mut st = shared.state.lock();
        if st.failed.is_some() {
            return;
        }
        match synced {
            Ok(lsn) => {
                st.marks += 1;
                debug_assert!(lsn >= st.marked, "the mark went backwards");
                st.marked = st.marked.max(lsn);
                if let Some((seq, at)) = st.checkpoint_committed
                    && at <= st.marked
                {
                    st.checkpoint_written = st.checkpoint_written.max(seq);
                    st.checkpoint_committed = None;
                }
                let marked = st.marked;
                let ready = if ack_after_mark { publish_durable(shared, &mut st, marked) } else { Vec::new() };
                drop(st);
                shared.marked.notify_all();
                ready.into_iter().for_each(Waker::wake);
            }
            Err(e) => {
                shared.fail(st, e);
                return;
            }
        }
    }
}

fn commit_loop(shared: &Shared, conn: &mut Connection, cfg: &mut WriterConfig) {
    loop {
        let mut st = shared.state.lock();
        // After a commit the writer lingers one idle-flush period with a deadline (appends
        // need not wake it), then parks without one.
        let mut lingered = false;
        // Wait until a commit is due.
        loop {
            if st.failed.is_some() {
                return;
            }
            if st.queue.is_empty() && st.checkpoint.is_none() {
                if st.closing {
                    return;
                }
                match cfg.idle_flush {
                    Some(d) if !lingered => {
                        lingered = shared.work.wait_for(&mut st, d).timed_out();
                    }
                    _ => {
                        st.writer_parked = true;
                        shared.work.wait(&mut st);
                        st.writer_parked = false;
                    }
                }
                continue;
            }
            let due_at = match (cfg.idle_flush, st.oldest) {
                (Some(d), Some(t)) => Some(t + d),
                _ => None,
            };
            if st.closing
                || st.checkpoint.is_some()
                || st.wanted > st.committed
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
        // Kept visible to `scan` until they are published as durable.
        st.inflight.extend(batches.iter().cloned());
        drop(st);

        let written = commit(conn, &batches, checkpoint.as_ref().map(|(_, l, b)| (*l, &**b)), cfg);

        let mut st = shared.state.lock();
        if st.failed.is_some() {
            // Failed meanwhile (crash_now, a crash at an append): the waiters were told.
            return;
        }
        match written {
            Ok(chain) => {
                cfg.chain = chain;
                let committed = batches.last().map_or(st.committed, |b| b.last());
                st.committed = committed;
                st.syncs += 1;
                if let Some((seq, _, _)) = checkpoint {
                    st.checkpoint_committed = Some((seq, committed));
                }
                drop(st);
                // The high-water mark follows the commit before anyone hears of it: written
                // here (a few microseconds, no sync), synced by the marker.
                let wrote = {
                    let mut head = cfg.head.lock();
                    if committed > head.lsn() { head.write(committed, chain) } else { Ok(()) }
                };
                let mut st = shared.state.lock();
                if let Err(e) = wrote {
                    shared.fail(st, e);
                    return;
                }
                if st.failed.is_some() {
                    return;
                }
                // The marker sleeps without a deadline while every mark is synced: this one
                // must wake it. Otherwise it wakes on its own deadline.
                let mut wake_marker = cfg.ack_after_mark || st.mark_written == st.marked;
                st.mark_written = st.mark_written.max(committed);
                if checkpoint.is_some() {
                    if st.marked >= committed {
                        // Nothing new to mark (a checkpoint alone): already covered.
                        let seq = st.checkpoint_committed.take().map_or(0, |c| c.0);
                        st.checkpoint_written = st.checkpoint_written.max(seq);
                        shared.marked.notify_all();
                    } else {
                        // Its caller waits for a synced mark covering this commit: ask for one
                        // now that the mark is written (a sync before the write would not do).
                        st.mark_now = true;
                        wake_marker = true;
                    }
                }
                let ready = if cfg.ack_after_mark { Vec::new() } else { publish_durable(shared, &mut st, committed) };
                drop(st);
                if wake_marker {
                    shared.marking.notify_one();
                }
                ready.into_iter().for_each(Waker::wake);
            }
            Err(e) => {
                shared.fail(st, e);
                return;
            }
        }
    }
}

/// Encodes and writes `batches`, then the checkpoint if one is due, in one transaction and
/// commits it (durably: `synchronous=FULL`), after checking that this store still owns the
/// stream. An event that cannot be encoded fails the commit (nothing of it is written) and so
/// stops the store.
/// Returns the chain value of the last row written. The checkpoint's LSN is at most the last
/// LSN appended when it was requested, so its events are already durable or in this very
/// transaction.
fn commit(
    conn: &mut Connection,
    batches: &[Queued],
    checkpoint: Option<(Lsn, &[u8])>,
    cfg: &WriterConfig,
) -> Result<Chain, StoreError> {
    let path = conn.path().map(std::path::PathBuf::from).unwrap_or_default();
    let db = |e| crate::error::database("commit queued events", &path, e);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db)?;
    // Cached: a commit is the hot path, and parsing this query was a third of a commit's
    // own SQLite work.
    let current: Option<String> = tx
        .prepare_cached("SELECT value FROM meta WHERE key = 'owner_token'")
        .and_then(|mut st| st.query_row([], |r| r.get(0)).optional())
        .map_err(db)?;
    let current = current.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(u64::MAX);
    if current != cfg.token {
        return Err(StoreError::Fenced { stream: cfg.stream.clone(), token: cfg.token, current });
    }
    let mut chain = cfg.chain;
    let mut at_checkpoint = None;
    {
        let mut insert = tx
            .prepare_cached("INSERT INTO events (lsn, tx, kind, body, chain) VALUES (?1, ?2, ?3, ?4, ?5)")
            .map_err(db)?;
        for b in batches {
            for (i, event) in b.events.iter().enumerate() {
                let lsn = b.first + i as Lsn;
                let tx = tx_column(i, event)?;
                let body = wire::encode(i, event).map_err(|e| match e {
                    StoreError::Encode { index, detail } => {
                        StoreError::Encode { index, detail: format!("{detail} (LSN {lsn}; the commit was abandoned)") }
                    }
                    other => other,
                })?;
                let kind = wire::kind_range(&body).and_then(|r| body.get(r)).unwrap_or("");
                chain = chain.next(lsn, body.as_bytes());
                if checkpoint.is_some_and(|(c, _)| c == lsn) {
                    at_checkpoint = Some(chain);
                }
                // LSNs were checked to fit in an i64 when they were assigned.
                insert.execute(params![lsn as i64, tx, kind, body, &chain.0[..]]).map_err(db)?;
            }
        }
    }
    if let Some((lsn, body)) = checkpoint {
        let ck_chain = match at_checkpoint {
            Some(c) => Some(c),
            None if lsn == 0 => Some(cfg.genesis),
            None => tx
                .query_row("SELECT chain FROM events WHERE lsn = ?1", [lsn as i64], |r| r.get::<_, Option<Vec<u8>>>(0))
                .optional()
                .map_err(db)?
                .flatten()
                .and_then(|b| Chain::from_slice(&b)),
        };
        tx.execute(
            "INSERT OR REPLACE INTO checkpoint (id, lsn, body, written_by, chain) VALUES (1, ?1, ?2, ?3, ?4)",
            params![lsn as i64, body, crate::schema::WRITTEN_BY, ck_chain.map(|c| c.0.to_vec())],
        )
        .map_err(db)?;
    }
    tx.commit().map_err(db)?;
    Ok(chain)
}
