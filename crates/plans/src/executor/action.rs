//! What a decision asks of the dispatcher, in the dispatch vocabulary every layer shares
//! (`tidegate_core::dispatch`: [`Operation`], [`DispatchRequest`], `CallOutcome`): the
//! [`Action`]s [`Executor::decide`] returns with the facts that announce them, and how a
//! dispatch's outcome becomes the fact that records it.
//!
//! [`Executor::decide`]: super::Executor::decide

pub use tidegate_core::{CallOutcome, DispatchKey, DispatchRequest, Operation};

use crate::fact::{CompResult, PlanFact, PlanId, Seq, Touch};

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
    pub fn result_fact(&self, result: CallOutcome) -> PlanFact {
        let happened = |r: &CallOutcome| match r {
            CallOutcome::Done { .. } => Some(true),
            CallOutcome::NotApplied { .. } => Some(false),
            CallOutcome::Unknown { .. } => None,
        };
        match self {
            Action::Compensate { plan, seq, depth, .. } => {
                let (result, output, residue, error) = match result {
                    CallOutcome::Done { output, residue } => {
                        (CompResult::Done, Some(std::sync::Arc::unwrap_or_clone(output)), residue, None)
                    }
                    CallOutcome::NotApplied { message, .. } => (CompResult::NotApplied, None, None, Some(message)),
                    CallOutcome::Unknown { message } => (CompResult::Unknown, None, None, Some(message)),
                };
                PlanFact::CompDone { plan: *plan, seq: *seq, result, output, residue, error, depth: *depth }
            }
            Action::ProbeForward { plan, seq, .. } => {
                let output = match &result {
                    CallOutcome::Done { output, .. } => Some((**output).clone()),
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
