//! One subscription to the ledger: every batch of events the engine appends, shared, in
//! ledger order.
//!
//! ```text
//!  with_core (engine lock) ─ batch: Batch ─► store.append(&batch)
//!                                       └──► plan feed, checkpoint shadow, observers
//! ```
//!
//! The engine moves each transition's events into one [`Batch`] (a shared handle: cloning
//! counts a reference), hands it to its store, and on success gives the same handle to the
//! plan executor's feed, the checkpoint thread's shadow and every [`AppendObserver`]
//! registered with [`crate::Builder::observer`] (a server's ledger index, say). No listener
//! copies the events. The engine keeps the last batch: when the next transition finds that no
//! listener kept it, it refills that allocation, so the append path allocates nothing when
//! nobody retains batches (an in-memory store that keeps no events, say).

use std::fmt;

use tidegate_core::Batch;
use tidegate_storage::Lsn;

/// Sees every batch the engine appends to its ledger.
///
/// Contract:
/// * `appended` is called once per batch the store accepted, in ledger order, with the LSN
///   of the batch's last event, under the engine's lock: an observer that updates a
///   projection there is current when the operation that appended returns.
/// * The batch may not be durable yet (`Tidegate::durable` waits for that).
/// * An observer MUST NOT block, call back into the engine or panic: it runs inside every
///   transition. Work that takes time belongs on the observer's own thread (keep a clone of
///   the batch).
/// * A batch the store refused is never observed (the engine then stops accepting work).
pub trait AppendObserver: Send + Sync + fmt::Debug {
    /// `batch` was appended; `last` is the LSN of its last event.
    fn appended(&self, last: Lsn, batch: &Batch);
}
