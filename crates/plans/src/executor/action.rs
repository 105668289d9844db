//! What a decision asks of the dispatcher: the dispatch vocabulary ([`Operation`],
//! [`DispatchRequest`], [`CallResult`]), the [`Action`]s [`Executor::decide`] returns with the
//! facts that announce them, and how a dispatch's result becomes the fact that records it.
//!
//! [`Executor::decide`]: super::Executor::decide

use serde_json::Value;

use crate::fact::{CompResult, PlanFact, PlanId, Seq, Touch};

/// What a dispatch asks a capability to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Undo a forward effect.
    Compensate,
    /// Ask whether the operation with this key took effect.
    Probe,
}

/// One dispatch (the server's `DispatchRequest` carries the same fields).
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchRequest {
    /// The capability's name.
    pub capability: String,
    /// The operation.
    pub operation: Operation,
    /// The forward effect's tool.
    pub tool: String,
    /// The idempotency key of every attempt.
    pub key: String,
    /// The arguments (references resolved).
    pub args: Value,
    /// The forward effect's output, if known.
    pub output: Option<Value>,
}

/// How a dispatch ended (a probe: `Done` = happened, `NotApplied` = did not).
#[derive(Debug, Clone, PartialEq)]
pub enum CallResult {
    /// Confirmed.
    Done {
        /// The capability's output.
        output: Value,
        /// Residue a compensation reported.
        residue: Option<String>,
    },
    /// Certainly did not take effect.
    NotApplied(String),
    /// May or may not have taken effect.
    Unknown(String),
}

/// A dispatch the executor decided; run it after the decision's facts are durable, then
/// append [`Action::result_fact`].
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Fire a compensation.
    Compensate {
        /// Plan.
        plan: PlanId,
        /// Registration.
        seq: Seq,
        /// Cascade depth of its outcome.
        depth: u32,
        /// The dispatch.
        request: DispatchRequest,
        /// The scopes it writes: appended as [`Entry::Touch`](crate::fact::Entry::Touch) with
        /// the decision's facts and again with the result.
        touch: Touch,
    },
    /// Ask whether a forward effect took effect.
    ProbeForward {
        /// Plan.
        plan: PlanId,
        /// Registration.
        seq: Seq,
        /// The dispatch.
        request: DispatchRequest,
    },
    /// Ask whether a compensation took effect.
    ProbeCompensation {
        /// Plan.
        plan: PlanId,
        /// Registration.
        seq: Seq,
        /// The dispatch.
        request: DispatchRequest,
    },
}

impl Action {
    /// The scopes this action writes when it runs (a compensation's), if any.
    pub fn touch(&self) -> Option<&Touch> {
        match self {
            Action::Compensate { touch, .. } if !touch.scopes.is_empty() => Some(touch),
            _ => None,
        }
    }

    /// The dispatch to run.
    pub fn request(&self) -> &DispatchRequest {
        match self {
            Action::Compensate { request, .. }
            | Action::ProbeForward { request, .. }
            | Action::ProbeCompensation { request, .. } => request,
        }
    }

    /// The plan it belongs to.
    pub fn plan(&self) -> PlanId {
        match self {
            Action::Compensate { plan, .. }
            | Action::ProbeForward { plan, .. }
            | Action::ProbeCompensation { plan, .. } => *plan,
        }
    }

    /// The fact recording the dispatch's result.
    pub fn result_fact(&self, result: CallResult) -> PlanFact {
        let happened = |r: &CallResult| match r {
            CallResult::Done { .. } => Some(true),
            CallResult::NotApplied(_) => Some(false),
            CallResult::Unknown(_) => None,
        };
        match self {
            Action::Compensate { plan, seq, depth, .. } => {
                let (result, output, residue, error) = match result {
                    CallResult::Done { output, residue } => (CompResult::Done, Some(output), residue, None),
                    CallResult::NotApplied(e) => (CompResult::NotApplied, None, None, Some(e)),
                    CallResult::Unknown(e) => (CompResult::Unknown, None, None, Some(e)),
                };
                PlanFact::CompDone { plan: *plan, seq: *seq, result, output, residue, error, depth: *depth }
            }
            Action::ProbeForward { plan, seq, .. } => {
                let output = match &result {
                    CallResult::Done { output, .. } => Some(output.clone()),
                    _ => None,
                };
                PlanFact::ForwardProbed { plan: *plan, seq: *seq, happened: happened(&result), output }
            }
            Action::ProbeCompensation { plan, seq, .. } => {
                PlanFact::CompProbed { plan: *plan, seq: *seq, happened: happened(&result) }
            }
        }
    }
}

/// What one call of [`Executor::decide`](super::Executor::decide) decided.
#[derive(Debug, Default)]
pub struct Decision {
    /// Facts to append (already applied to the projection): durable before any action runs.
    pub facts: Vec<PlanFact>,
    /// Dispatches to run once the facts are durable.
    pub actions: Vec<Action>,
}
