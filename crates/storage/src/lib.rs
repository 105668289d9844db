//! The ledger storage contract ([`LedgerStore`]) and its backends.
//!
//! The engine appends every fact it decides to one ledger; every other piece of state is a
//! projection rebuilt from it. This crate owns the contract between the runtime and a
//! backend, and the backends:
//!
//! * [`MemoryStore`]: in memory, for tests, benchmarks and embedding without durability;
//! * [`FaultyStore`]: a wrapper that simulates group commit over any store and "crashes" at
//!   the N-th append or sync, for crash tests.
//!
//! Durable backends are sibling crates that implement [`LedgerStore`] and pass the same
//! `conformance` suite: `tidegate-sqlite` (the embedded default: SQLite in WAL mode with
//! group commit, in a data directory) today, a PostgreSQL backend later. A user of the
//! contract compiles no database.
//!
//! [`fsync_per_s`] measures the disk's physical sync rate, the ceiling a durable store is
//! compared against. With the `conformance` feature, `conformance` is the suite every
//! backend must pass. This crate must not know about tools, clocks or the async runtime.
//! The ledger's record format and the contract are specified in `docs/ledger.md`.

#![deny(missing_docs)]

mod bench;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod faulty;
mod memory;
pub mod wire;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub use bench::fsync_per_s;
pub use error::{Result, StoreError};
pub use faulty::{FaultOptions, FaultyStore};
pub use memory::MemoryStore;

use tidegate_core::{Batch, Event};

/// A position in the ledger. The first event has LSN 1; 0 means "nothing".
pub type Lsn = u64;

/// Who may append to a ledger stream: the stream's name and the fencing token of the handle.
///
/// A *ledger stream* is one ledger (one per tenant: docs/deployment.md). At any time one owner
/// holds it; every change of owner gives the new owner a token larger than every earlier one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ownership {
    /// The stream, in the backend's terms (a data directory, a tenant's stream id).
    pub stream: Arc<str>,
    /// The fencing token this handle appends with.
    pub token: u64,
}

impl std::fmt::Display for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {} (owner token {})", self.stream, self.token)
    }
}

/// The storage contract.
///
/// ```text
///   runtime (holding the engine lock)          backend
///   ── append([e1, e2]) ──────────────────────► ordered, atomic: both or neither; LSNs n+1, n+2
///   ◄─ Ok(n+2) ───────────────────────────────  (queued for the next group commit, no I/O yet)
///   (lock released)
///   ── durable(store, n+2).await ─────────────► resolves once e1, e2 (and all before) survive a crash
///      (or is_durable / wait_durable)            one sync covers every batch queued before it
/// ```
///
/// * `append` MUST be atomic per call (all events of the batch or none become visible and,
///   later, durable) and MUST preserve call order: the runtime calls it while holding the
///   engine lock, so ledger order equals decision order. LSNs are consecutive, the first
///   event of a ledger has LSN 1, and a batch's events get consecutive LSNs. It MUST NOT wait
///   for I/O: a durable backend, local or across a network, assigns the LSNs itself (it is the
///   stream's only owner, see below), queues the batch for its group commit and returns. The
///   returned LSN is a promise whose fulfilment is the future [`durable`] (built on
///   [`Self::poll_durable`]); the runtime awaits it after releasing the engine lock. An empty
///   batch appends nothing and returns the current last LSN.
/// * `wait_durable(lsn)` / `durable(store, lsn)` MUST NOT resolve before every event up to
///   `lsn` is durable. Several waiters share one sync (group commit). Nothing is acknowledged
///   to an agent before its events are durable. `lsn == 0` resolves at once; an `lsn` beyond
///   [`Self::last_lsn`] fails with [`StoreError::BeyondEnd`] instead of blocking forever.
/// * Durability is a prefix: if `lsn` is durable, so is every smaller LSN, and it stays so.
/// * A failed `append` leaves nothing of the batch behind. If the error is
///   [`StoreError::retryable`] the caller may retry it.
/// * If a write fails after `append` returned (the disk is full, the process "crashes"), the
///   store stops: every later call fails with [`StoreError::Failed`], every waiter is woken
///   with it, events that were not durable are dropped (reopen shows none of them), and no
///   durable event is lost. Nothing that was not written is ever reported durable.
/// * **Ownership and fencing** ([`Self::ownership`]). A handle is opened for one ledger stream
///   by one owner, with a fencing token larger than every earlier owner's. Every write carries
///   the handle's token and the backend checks it atomically with the write (in the same
///   database transaction). Once a newer owner holds the stream, the older handle's writes MUST
///   be refused with [`StoreError::Fenced`] (not retryable): its events not yet durable never
///   become durable, its waits for them fail with `Fenced`, and it stays refused, so a paused
///   old owner that wakes up can never append. A backend whose exclusive lock keeps a second
///   owner out while the first lives (the SQLite directory lock) refuses the second *open*
///   instead ([`StoreError::Locked`]); it still checks the token on every write.
/// * `scan` returns events in LSN order, including ones not yet durable.
/// * A durable backend, reopened after `wait_durable(n)` returned, shows at least the events
///   `1..=n`, unchanged, with the same LSNs; reopened after a clean close, it shows every
///   event appended. If it cannot show them (its files were shortened, damaged or reordered
///   from outside), opening MUST fail with an error naming what is wrong, never present a
///   shorter or altered ledger as whole.
/// * Checkpoints ([`Self::put_checkpoint`], [`Self::checkpoint`]): the backend keeps the
///   latest one, opaque bytes tagged with the LSN they summarise. A stored checkpoint at LSN
///   `l` is never durable without the events `1..=l` (it rides the same sync or a later
///   one); replacing it is atomic (after a crash, the old or the new one, never a mix and
///   never none once one was stored). Backends without checkpoints keep the defaults:
///   nothing is stored and every reopen replays the whole ledger.
///
/// ```text
///   events  1 ─────────────── l ───────── n        reopen = load checkpoint(l)
///   checkpoint(l) ───────────┘                              + replay scan(l + 1 ..= n)
/// ```
pub trait LedgerStore: Send + Sync + std::fmt::Debug {
    /// Appends a batch atomically, in order. Returns the LSN of its last event (the current
    /// last LSN if the batch is empty). The batch is shared, not copied: the engine hands the
    /// same `Arc` to its append observers, and a backend MAY keep it (to encode it on its own
    /// writer thread, or to serve `scan` before it is durable) instead of copying the events.
    /// The engine calls this under its lock, so a backend SHOULD do no more here than queue
    /// the batch (encoding and I/O belong on its writer).
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError>;

    /// Whether every event up to `lsn` is durable. Cheap (an atomic load); lets callers skip
    /// waiting.
    fn is_durable(&self, lsn: Lsn) -> bool;

    /// Blocks the calling thread until every event up to `lsn` is durable.
    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError>;

    /// The async form of [`Self::wait_durable`]: `Ready` once every event up to `lsn` is
    /// durable (or the store failed); otherwise registers `cx`'s waker, which the backend
    /// wakes when the LSN becomes durable or the store fails, and returns `Pending`.
    ///
    /// Backends with a background writer SHOULD override this. The default blocks the
    /// polling thread in [`Self::wait_durable`], which is correct but ties up an executor
    /// thread. [`durable`] turns it into a future.
    fn poll_durable(&self, lsn: Lsn, cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        let _ = cx;
        if self.is_durable(lsn) {
            return Poll::Ready(Ok(()));
        }
        Poll::Ready(self.wait_durable(lsn))
    }

    /// The last LSN appended.
    fn last_lsn(&self) -> Lsn;

    /// The stream this handle writes and the fencing token its writes carry.
    fn ownership(&self) -> Ownership;

    /// Visits events with LSN ≥ `from`, in order, until `visit` returns `false`. `from == 0`
    /// is read as 1.
    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError>;

    /// Stores `bytes` as the latest checkpoint, a summary of the events `1..=lsn`, replacing
    /// the previous one. Blocks until the checkpoint is durable; when it returns, the events
    /// `1..=lsn` are durable too. `lsn` beyond [`Self::last_lsn`] fails with
    /// [`StoreError::BeyondEnd`]. A failure while writing stops the store like any failed
    /// write. Idempotent: storing the same checkpoint twice is harmless.
    ///
    /// The default refuses with [`StoreError::Unsupported`] (a backend without checkpoints).
    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        let _ = (lsn, bytes);
        Err(StoreError::Unsupported { op: "put_checkpoint" })
    }

    /// The latest durable checkpoint, if any: its LSN is at most [`Self::last_lsn`] unless
    /// the ledger was cut below it from outside (callers check, and replay in full then).
    /// The default has none.
    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        Ok(None)
    }
}

/// A checkpoint as a store keeps it: opaque bytes (the engine's format, versioned by the
/// engine) summarising the events `1..=lsn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// The last event the checkpoint covers.
    pub lsn: Lsn,
    /// The encoded checkpoint.
    pub bytes: Vec<u8>,
}

/// A future resolving once every event up to an LSN is durable: the async counterpart of
/// [`LedgerStore::wait_durable`], built on [`LedgerStore::poll_durable`]. It needs no
/// particular executor and no blocking thread (for backends that override `poll_durable`).
///
/// ```
/// # use tidegate_storage::{durable, LedgerStore, MemoryStore};
/// # async fn f(store: &dyn LedgerStore) -> Result<(), tidegate_storage::StoreError> {
/// durable(store, store.last_lsn()).await?;
/// # Ok(()) }
/// ```
pub fn durable<S: LedgerStore + ?Sized>(store: &S, lsn: Lsn) -> Durable<'_, S> {
    Durable { store, lsn }
}

/// The future returned by [`durable`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Durable<'a, S: ?Sized> {
    store: &'a S,
    lsn: Lsn,
}

impl<S: LedgerStore + ?Sized> Future for Durable<'_, S> {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.store.poll_durable(self.lsn, cx)
    }
}
