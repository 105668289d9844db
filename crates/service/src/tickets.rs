//! Tickets of client-executed effects (the two-step protocol of `tidegate_runtime::Ticket`):
//! where each ticket of a live transaction is, and the answer its result got, so that the same
//! result reported again gets the same answer and another one a conflict.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde_json::Value;
use tidegate_runtime::{CallOutcome, Ticket};

use crate::error::ServiceError;

/// How the client says its call ended: the dispatch vocabulary's outcome
/// (`tidegate_core::CallOutcome`), with equality over what the client sent (a repeated
/// report is recognised as the same one).
#[derive(Debug, Clone, PartialEq)]
pub enum TicketResult {
    /// The call took effect, with this output (`null` if none was given).
    Done {
        /// The output.
        output: Option<Value>,
    },
    /// The call certainly did not take effect; `retry`: worth trying again.
    NotApplied {
        /// The client's error text.
        error: String,
        /// Whether the call may succeed if run again.
        retry: bool,
    },
    /// The call may or may not have taken effect.
    Unknown {
        /// The client's error text.
        error: String,
    },
}

impl TicketResult {
    /// The outcome the engine is told.
    pub fn outcome(&self) -> CallOutcome {
        match self {
            TicketResult::Done { output } => CallOutcome::done(output.clone().unwrap_or(Value::Null)),
            TicketResult::NotApplied { error, retry } => CallOutcome::not_applied(error.clone(), *retry),
            TicketResult::Unknown { error } => CallOutcome::unknown(error.clone()),
        }
    }

    /// `done`, `not_applied` or `unknown`.
    pub fn kind(&self) -> &'static str {
        match self {
            TicketResult::Done { .. } => "done",
            TicketResult::NotApplied { .. } => "not_applied",
            TicketResult::Unknown { .. } => "unknown",
        }
    }
}

/// What a reported result was answered: the effect executed, with this output.
#[derive(Debug, Clone, PartialEq)]
pub struct Executed {
    /// The output the engine recorded.
    pub output: Option<Value>,
}

/// Where a client-executed effect's ticket is.
#[derive(Debug)]
pub enum TicketSlot {
    /// Waiting for the client's result (dropping it reports the outcome unknown).
    Open(Ticket),
    /// This result is being reported.
    Reporting(TicketResult),
    /// Reported: the result and the answer it got.
    Reported(Box<(TicketResult, Result<Executed, ServiceError>)>),
    /// No result came within the lease: the ticket was dropped (outcome unknown).
    Expired,
}

/// A live transaction's tickets, by effect number.
pub type Tickets = Mutex<HashMap<u32, TicketSlot>>;
