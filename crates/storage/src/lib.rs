//! The ledger storage contract ([`LedgerStore`]) and the in-memory store.
//!
//! The engine appends every fact it decides to one ledger; every other piece of state is a
//! projection rebuilt from it. This crate owns the contract between the runtime and a
//! backend, and the in-memory backend used by tests, benchmarks and embedding without
//! durability. It must not know about tools, clocks or the async runtime.

#![deny(missing_docs)]

mod memory;

pub use memory::MemoryStore;

use tidegate_core::Event;

/// A position in the ledger. The first event has LSN 1; 0 means "nothing".
pub type Lsn = u64;

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O failure; the operation may succeed if retried.
    #[error("ledger I/O failed during {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The ledger is corrupt at the given position.
    #[error("ledger is corrupt at LSN {lsn}: {detail}")]
    Corrupt {
        /// Where.
        lsn: Lsn,
        /// What is wrong.
        detail: String,
    },
    /// The store was closed.
    #[error("ledger store is closed")]
    Closed,
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, StoreError::Io { .. })
    }
}

/// The storage contract.
///
/// ```text
///   runtime (holding the engine lock)          backend
///   ── append([e1, e2]) ──────────────────────► ordered, atomic: both or neither; LSNs n+1, n+2
///   ◄─ Ok(n+2) ───────────────────────────────
///   (lock released)
///   ── is_durable(n+2)? / wait_durable(n+2) ──► resolves once e1, e2 (and all before) survive a crash
/// ```
///
/// * `append` MUST be atomic per call (all events of the batch or none become visible and,
///   later, durable) and MUST preserve call order: the runtime calls it while holding the
///   engine lock, so ledger order equals decision order. It SHOULD NOT block on I/O; a
///   durable backend enqueues the batch for its group commit and returns the LSN.
/// * `wait_durable(lsn)` MUST NOT resolve before every event up to `lsn` is durable. Several
///   waiters share one sync (group commit). Nothing is acknowledged to an agent before its
///   events are durable.
/// * A failed `append` leaves nothing of the batch behind; the caller may retry it.
/// * `scan` returns events in LSN order, including ones not yet durable.
pub trait LedgerStore: Send + Sync + std::fmt::Debug {
    /// Appends a batch atomically, in order. Returns the LSN of its last event (the current
    /// last LSN if the batch is empty).
    fn append(&self, events: &mut dyn Iterator<Item = Event>) -> Result<Lsn, StoreError>;

    /// Whether every event up to `lsn` is durable. Cheap; lets callers skip waiting.
    fn is_durable(&self, lsn: Lsn) -> bool;

    /// Blocks the calling thread until every event up to `lsn` is durable.
    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError>;

    /// The last LSN appended.
    fn last_lsn(&self) -> Lsn;

    /// Visits events with LSN ≥ `from`, in order, until `visit` returns `false`.
    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError>;
}
