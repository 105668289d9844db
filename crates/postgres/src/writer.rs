//! Group commit: the queue appenders fill, the waiters, and the writer thread that sends
//! everything queued as one `tidegate_append` call.
//!
//! ```text
//!  appenders (engine lock held)      writer thread                              waiters
//!  append(b1) ─► queue [b1]  ─────►  woken: the queue is not empty              durable(l1)
//!  append(b2) ─► queue [b1 b2]       inflight = [b1 b2], queue = []
//!  append(b3) ─► queue [b3]          encode, chain ─► SELECT tidegate_append(…)  (one round trip)
//!                                    durable = last(b2); inflight = [] ─► wake waiters ≤ durable
//! ```
//!
//! A commit starts when somebody waits for an LSN that is not durable, when [`MAX_ROWS`] rows
//! are queued, when the oldest queued batch has waited [`IDLE_FLUSH`], or when the store
//! closes (the rule of the SQLite store). Events nobody waits for yet (a call recorded before
//! the transaction's decision) ride the next commit instead of costing a round trip of their
//! own; while a commit is on the wire the next batches gather, so concurrent appenders share a
//! round trip and a WAL flush.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use postgres::Client;
use tidegate_core::Batch;
use tidegate_storage::wire::{self, Chain};
use tidegate_storage::{Lsn, StoreError};

use crate::error::{FENCED, NO_STREAM, NOT_NEXT, database, state_of};

/// Commit as soon as this many rows are queued, even if nobody waits.
pub(crate) const MAX_ROWS: usize = 16_384;
/// Commit queued rows nobody waits for after this long.
pub(crate) const IDLE_FLUSH: Duration = Duration::from_millis(100);

/// Consecutive events appended by one call, shared with the engine (not copied).
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) first: Lsn,
    pub(crate) events: Batch,
}

/// What appenders, waiters and the writer share, behind one lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Appended, not yet taken by the writer, in LSN order.
    pub(crate) queue: Vec<Queued>,
    /// Being committed (kept so `scan` sees them).
    pub(crate) inflight: Vec<Queued>,
    pub(crate) queued_rows: usize,
    /// When the oldest queued batch was appended.
    pub(crate) oldest: Option<Instant>,
    /// The highest LSN a waiter waits for.
    pub(crate) wanted: Lsn,
    /// Every event up to here is committed.
    pub(crate) durable: Lsn,
    pub(crate) failed: Option<Arc<StoreError>>,
    pub(crate) closing: bool,
    /// Waiters by the LSN they wait for.
    pub(crate) wakers: BTreeMap<Lsn, Vec<Waker>>,
    pub(crate) commits: u64,
    pub(crate) appends: u64,
    pub(crate) renewals: u64,
}

impl State {
    pub(crate) fn failure(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(cause) => Err(StoreError::Failed { cause: cause.clone() }),
            None => Ok(()),
        }
    }
}

/// The state plus what is read without its lock.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) work: parking_lot::Condvar,
    /// Every event up to here is durable (mirrors `State::durable`).
    pub(crate) durable: AtomicU64,
    /// The last LSN assigned.
    pub(crate) last: AtomicU64,
    /// Where the ledger is, for errors.
    pub(crate) location: PathBuf,
}

impl Shared {
    pub(crate) fn new(location: PathBuf, last: Lsn) -> Shared {
        Shared {
            state: Mutex::new(State { durable: last, ..State::default() }),
            work: parking_lot::Condvar::new(),
            durable: AtomicU64::new(last),
            last: AtomicU64::new(last),
            location,
        }
    }

    /// Stops the handle: drops what is not durable, wakes every waiter with the failure.
    pub(crate) fn fail(&self, mut st: MutexGuard<'_, State>, cause: StoreError) -> StoreError {
        if let Some(earlier) = &st.failed {
            return StoreError::Failed { cause: earlier.clone() };
        }
        let cause = Arc::new(cause);
        st.failed = Some(cause.clone());
        st.queue = Vec::new();
        st.inflight = Vec::new();
        st.queued_rows = 0;
        st.oldest = None;
        let wakers = std::mem::take(&mut st.wakers);
        drop(st);
        self.work.notify_all();
        wakers.into_values().flatten().for_each(Waker::wake);
        StoreError::Failed { cause }
    }
}

/// The writer's connection and where its chain stands.
pub(crate) struct Writer {
    pub(crate) client: Client,
    pub(crate) shared: Arc<Shared>,
    pub(crate) stream: String,
    pub(crate) token: u64,
    /// The chain value at the durable LSN.
    pub(crate) chain: Chain,
    /// The lease this handle holds and renews every third of it (`None`: no lease).
    pub(crate) lease: Option<Duration>,
    /// Opens a new connection (after the writer's was lost).
    pub(crate) connect: Box<dyn Fn() -> Result<Client, StoreError> + Send>,
}

impl Writer {
    /// Commits until the handle closes (after committing what is queued, then giving up its
    /// lease) or fails.
    pub(crate) fn run(mut self) {
        if self.serve() {
            self.release();
        }
    }

    /// The writer's loop; `true` on a clean close.
    fn serve(&mut self) -> bool {
        let mut renew_at = self.lease.map(|l| Instant::now() + l / 3);
        loop {
            let mut st = self.shared.state.lock();
            let batches = loop {
                if st.failed.is_some() {
                    return false;
                }
                if st.closing && st.queue.is_empty() {
                    return true;
                }
                let now = Instant::now();
                if renew_at.is_some_and(|r| r <= now) {
                    break None;
                }
                let due = st.oldest.map(|t| t + IDLE_FLUSH);
                if !st.queue.is_empty()
                    && (st.wanted > st.durable
                        || st.queued_rows >= MAX_ROWS
                        || st.closing
                        || due.is_some_and(|d| d <= now))
                {
                    st.queued_rows = 0;
                    st.oldest = None;
                    let batches = std::mem::take(&mut st.queue);
                    st.inflight.clone_from(&batches);
                    break Some(batches);
                }
                match [due, renew_at].into_iter().flatten().min() {
                    Some(d) => {
                        self.shared.work.wait_until(&mut st, d);
                    }
                    None => self.shared.work.wait(&mut st),
                }
            };
            drop(st);
            let Some(batches) = batches else {
                match self.renew() {
                    Ok(()) => renew_at = self.lease.map(|l| Instant::now() + l / 3),
                    Err(e) => {
                        let st = self.shared.state.lock();
                        self.shared.fail(st, e);
                        return false;
                    }
                }
                continue;
            };
            match self.commit(&batches) {
                Ok((last, chain)) => {
                    self.chain = chain;
                    let mut st = self.shared.state.lock();
                    st.durable = last;
                    st.commits += 1;
                    st.inflight.clear();
                    self.shared.durable.store(last, Ordering::Release);
                    let later = st.wakers.split_off(&(last + 1));
                    let ready = std::mem::replace(&mut st.wakers, later);
                    drop(st);
                    ready.into_values().flatten().for_each(Waker::wake);
                }
                Err(e) => {
                    let st = self.shared.state.lock();
                    self.shared.fail(st, e);
                    return false;
                }
            }
        }
    }

    /// Extends the lease from the database's `now()`, if this handle still holds the stream.
    fn renew(&mut self) -> Result<(), StoreError> {
        let lease = self.lease.map_or(0, |l| i64::try_from(l.as_millis()).unwrap_or(i64::MAX));
        let token = i64::try_from(self.token).unwrap_or(i64::MAX);
        let mut retries = 0;
        let renewed = loop {
            let r = self.client.execute(
                "UPDATE tidegate_streams SET lease_until = now() + $3::bigint * interval '1 millisecond' \
                 WHERE stream = $1 AND token = $2",
                &[&self.stream, &token, &lease],
            );
            match r {
                // A renewal is safe to repeat: reconnect and send it again.
                Err(e) if connection_lost(&e) && retries < RECONNECTS.len() => {
                    std::thread::sleep(RECONNECTS[retries]);
                    retries += 1;
                    if let Ok(c) = (self.connect)() {
                        self.client = c;
                    }
                }
                other => break other.map_err(|e| database("renew the lease", &self.shared.location, e))?,
            }
        };
        if renewed == 1 {
            self.shared.state.lock().renewals += 1;
            return Ok(());
        }
        let current = self
            .client
            .query_opt("SELECT token FROM tidegate_streams WHERE stream = $1", &[&self.stream])
            .ok()
            .flatten()
            .and_then(|r| u64::try_from(r.get::<_, i64>(0)).ok())
            .unwrap_or(0);
        Err(StoreError::Fenced { stream: self.stream.clone(), token: self.token, current })
    }

    /// On a clean close, ends the lease now, so another node may take the stream at once
    /// (a drain). Best effort: a lease not released runs out by itself.
    fn release(&mut self) {
        if self.lease.is_none() {
            return;
        }
        let token = i64::try_from(self.token).unwrap_or(i64::MAX);
        // The other nodes' registries listen: they look for the stream at once.
        let _ = self.client.execute(
            "WITH released AS (UPDATE tidegate_streams SET lease_until = now() WHERE stream = $1 AND token = $2 \
             RETURNING stream) SELECT pg_notify('tidegate_cluster', stream) FROM released",
            &[&self.stream, &token],
        );
    }

    /// Encodes and chains `batches` and sends them as one `tidegate_append` call.
    fn commit(&mut self, batches: &[Queued]) -> Result<(Lsn, Chain), StoreError> {
        let first = batches.first().map_or(0, |q| q.first);
        let rows: usize = batches.iter().map(|q| q.events.len()).sum();
        let mut bodies = Vec::with_capacity(rows);
        let mut chains = Vec::with_capacity(rows);
        let mut chain = self.chain;
        let mut lsn = first;
        for q in batches {
            for (i, e) in q.events.iter().enumerate() {
                let body = wire::encode(i, e)?;
                chain = chain.next(lsn, body.as_bytes());
                chains.push(chain.0.to_vec());
                bodies.push(body);
                lsn += 1;
            }
        }
        let last = lsn - 1;
        let location = self.shared.location.clone();
        let location = &location;
        let (Ok(token), Ok(first_col)) = (i64::try_from(self.token), i64::try_from(first)) else {
            return Err(StoreError::InvalidArgument {
                field: "lsn",
                value: first.to_string(),
                expected: "LSNs and tokens that fit in a signed 64-bit integer",
            });
        };
        let mut retries = 0;
        let r = loop {
            let r = self.client.query_one(
                "SELECT tidegate_append($1, $2, $3, $4, $5, $6)",
                &[&self.stream, &token, &first_col, &bodies, &chains, &chain.0.as_slice()],
            );
            match r {
                Err(e) if connection_lost(&e) && retries < RECONNECTS.len() => {
                    // The commit's outcome is unknown: reconnect and read the head, which
                    // only this owner moves. It shows the batch or the LSN before it.
                    std::thread::sleep(RECONNECTS[retries]);
                    retries += 1;
                    match self.after_reconnect(first, last, chain) {
                        Ok(Landed::Yes) => break Ok(()),
                        Ok(Landed::No) | Err(None) => continue,
                        Err(Some(refused)) => return Err(refused),
                    }
                }
                other => break other.map(drop),
            }
        };
        match r {
            Ok(()) => Ok((last, chain)),
            Err(e) => Err(match state_of(&e) {
                Some((code, detail)) if code == FENCED => StoreError::Fenced {
                    stream: self.stream.clone(),
                    token: self.token,
                    current: detail.and_then(|d| d.parse().ok()).unwrap_or(0),
                },
                Some((code, detail)) if code == NOT_NEXT => StoreError::Corrupt {
                    lsn: first,
                    detail: format!(
                        "the stream ends at LSN {} in the database but this owner continued it at LSN {first}: \
                         another writer shares this owner's token",
                        detail.unwrap_or("?")
                    ),
                },
                Some((code, _)) if code == NO_STREAM => StoreError::NotALedger {
                    path: location.clone(),
                    detail: "the stream's head row was deleted while this owner held it".into(),
                },
                _ => database("commit a batch", location, e),
            }),
        }
    }
}

/// How long the writer waits before each reconnection after a lost connection (then it stops
/// the handle, as for any failed write).
const RECONNECTS: [Duration; 4] =
    [Duration::from_millis(50), Duration::from_millis(200), Duration::from_millis(800), Duration::from_millis(2_000)];

/// Whether `e` lost the connection (rather than the database refusing the statement): the
/// client's own errors, connection exceptions (class 08) and the server ending the session
/// (`57P01` admin shutdown, `57P02` crash shutdown, `57P03` cannot connect now).
fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => code.code().starts_with("08") || matches!(code.code(), "57P01" | "57P02" | "57P03"),
        None => e.as_db_error().is_none(),
    }
}

/// Whether a commit whose outcome was unknown landed.
enum Landed {
    Yes,
    No,
}

impl Writer {
    /// Reconnects and reads the head to learn whether the batch `first..=last` (ending at
    /// `chain`) committed. `Err(None)`: could not tell (try again); `Err(Some(e))`: stop with
    /// `e` (fenced, or a head that shows neither outcome).
    fn after_reconnect(&mut self, first: Lsn, last: Lsn, chain: Chain) -> Result<Landed, Option<StoreError>> {
        let location = self.shared.location.clone();
        self.client = (self.connect)().map_err(|_| None)?;
        let row = self
            .client
            .query_opt("SELECT token, last_lsn, last_chain FROM tidegate_streams WHERE stream = $1", &[&self.stream])
            .map_err(|_| None)?
            .ok_or_else(|| {
                Some(StoreError::NotALedger {
                    path: location.clone(),
                    detail: "the stream's head row was deleted while this owner held it".into(),
                })
            })?;
        let token = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let head = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        let head_chain = Chain::from_slice(row.get(2));
        if token != self.token {
            return Err(Some(StoreError::Fenced { stream: self.stream.clone(), token: self.token, current: token }));
        }
        if head == last && head_chain == Some(chain) {
            return Ok(Landed::Yes);
        }
        if head + 1 == first {
            return Ok(Landed::No);
        }
        Err(Some(StoreError::Corrupt {
            lsn: first,
            detail: format!(
                "after a lost connection the stream's head is at LSN {head}, neither before this owner's batch \
                 {first}..={last} nor at its end"
            ),
        }))
    }
}
