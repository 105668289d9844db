//! One subscription to the ledger: every batch of events the engine appends, shared, in
//! ledger order.
//!
//! ```text
//!  with_core (engine lock) ─ batch: Arc<[Event]> ─► store.append(&batch)
//!                                             └──► plan feed, checkpoint shadow, observers
//! ```
//!
//! The engine collects each transition's events into one `Arc<[Event]>`, hands it to its
//! store, and on success gives the same `Arc` to the plan executor's feed, the checkpoint
//! thread's shadow and every [`AppendObserver`] registered with [`crate::Builder::observer`]
//! (a server's ledger index, say). No listener copies the events.

use std::fmt;
use std::sync::Arc;

use tidegate_core::Event;
use tidegate_storage::Lsn;

/// Sees every batch the engine appends to its ledger.
///
/// Contract:
/// * `appended` is called once per batch the store accepted, in ledger order, with the LSN
///   of the batch's last event, under the engine's lock: an observer that updates a
///   projection there is current when the operation that appended returns.
/// * The batch may not be durable yet (`Tidegate::durable` waits for that).
/// * An observer MUST NOT block, call back into the engine or panic: it runs inside every
///   transition. Work that takes time belongs on the observer's own thread (keep the `Arc`).
/// * A batch the store refused is never observed (the engine then stops accepting work).
pub trait AppendObserver: Send + Sync + fmt::Debug {
    /// `batch` was appended; `last` is the LSN of its last event.
    fn appended(&self, last: Lsn, batch: &Arc<[Event]>);
}
