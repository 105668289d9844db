//! Plans and the durable compensation executor (docs/plans.md).
//!
//! A plan groups steps (committed engine transactions) that all stand or are all undone. Each
//! effect of a step registers a compensation *descriptor* (capability + JSON arguments +
//! idempotency key) that is held until the plan commits and unwound last-in-first-out when
//! it fails, by a per-tenant executor that rebuilds itself from the log.
//!
//! ```text
//!  commands (open, step, commit, signal, verdict, resolve) ─┐
//!  engine facts (Observation) ───────────────────────────────┼─► Executor::apply (the fold)
//!  log (PlanLog::read_all at start) ─────────────────────────┘        │
//!                                   Executor::decide(now) ◄─────────── wheel, agenda
//!                                      │ facts (appended durably)  + actions
//!                                      ▼                              ▼
//!                                   PlanLog::append           Dispatch::dispatch ─► result fact
//! ```
//!
//! This crate imports only the dispatch vocabulary of `tidegate-core` (`CallOutcome`,
//! `DispatchRequest`, `DispatchKey`, `Dispatch`, `Clock`); the binding to the engine's ledger, runtime and
//! server is described in docs/plans.md ("Binding").

#![deny(missing_docs)]

pub mod bench;
mod driver;
mod error;
mod executor;
mod fact;
mod predicate;
mod wheel;

pub use driver::{Clock, Dispatch, MemoryLog, PlanLog, Plans, TokioClock};
pub use error::{PlanError, SharedError};
pub use executor::{
    Action, CallOutcome, Decision, DispatchKey, DispatchRequest, Executor, Forward, Operation, PLAN_SNAPSHOT_VERSION,
    PlanDetail, PlanView, RegistrationView, Status, TriggerView, resolve_args,
};
pub use fact::{
    Cause, Choice, CompResult, DEFAULT_CASCADE_LIMIT, Descriptor, EffectId, Entry, MAX_CASCADE_LIMIT,
    MAX_DESCRIPTOR_BYTES, Observation, Outcome, PLAN_FORMAT_VERSION, PlanFact, PlanId, STREAM, Seq, SkipReason,
    StuckReason, Touch, TxId, Verdict,
};
pub use predicate::{Compensated, MAX_ATOMS, MAX_DEPTH, NoCommit, Predicate, Tagged, Tri};
pub use tidegate_core::DEFAULT_DISPATCH_DEADLINE;
pub use wheel::Wheel;
