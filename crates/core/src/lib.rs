//! Tidegate's foundation: plain types, scopes, ledger events and the pure settlement state
//! machine ([`engine::Core`]).
//!
//! Nothing in this crate blocks, sleeps, reads a clock or performs I/O: time is passed in, and
//! the work to perform (call a tool, run a compensation, wake a waiter) is returned. The async
//! runtime in `tidegate-runtime` executes it. See `docs/engine.md` for the definitions and
//! invariants.

#![deny(missing_docs)]

pub mod dispatch;
pub mod effect;
pub mod engine;
pub mod error;
pub mod ids;
mod index;
pub mod ledger;
pub mod scope;
mod text;
pub mod trace;

pub use dispatch::{BoxFuture, Clock, DEFAULT_DISPATCH_DEADLINE, Dispatch, DispatchKey, DispatchRequest, Operation};
pub use effect::{
    AbortReason, CallOutcome, Disposition, EffectClass, EffectDecl, EffectOutcome, HeldAck, Outcome, PartialCommit, Tag,
};
pub use engine::{Ablation, Action, Core, CoreConfig, Isolation, Level, Ordering};
pub use error::{EngineError, TxState};
pub use ids::{EffectId, Epoch, GroupId, Timestamp, TxId, Version};
pub use ledger::{Batch, Event};
pub use scope::{Scope, ScopeError, ScopeRegistry};
pub use trace::TraceRecord;
