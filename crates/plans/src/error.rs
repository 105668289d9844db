//! Typed errors: each names the field or id, the value, and what was expected.

use crate::fact::{PlanId, TxId};

/// Everything the plans API refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A malformed field.
    #[error("invalid `{field}` = {value}: expected {expected}")]
    Invalid {
        /// The field.
        field: String,
        /// What was given (shortened).
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A reference to another tenant.
    #[error(
        "`{field}` names tenant `{found}`, but this executor serves tenant `{tenant}`; triggers and commands never cross tenants"
    )]
    CrossTenant {
        /// The field.
        field: String,
        /// The tenant named.
        found: String,
        /// The executor's tenant.
        tenant: String,
    },
    /// No such plan in this tenant.
    #[error("unknown plan {plan}")]
    UnknownPlan {
        /// The id.
        plan: PlanId,
    },
    /// The plan is not in a state that allows the operation.
    #[error("plan {plan} is {state}; `{operation}` needs it {expected}")]
    WrongState {
        /// The plan.
        plan: PlanId,
        /// The operation refused.
        operation: &'static str,
        /// Its state.
        state: String,
        /// The state required.
        expected: &'static str,
    },
    /// A step of the plan has not settled.
    #[error("plan {plan} cannot commit: its step transaction {tx} has not settled")]
    StepUnsettled {
        /// The plan.
        plan: PlanId,
        /// The unsettled step.
        tx: TxId,
    },
    /// A record of a newer format.
    #[error("plan record version {found} is newer than this build's {supported}")]
    NewerFormat {
        /// The record's version.
        found: u64,
        /// This build's.
        supported: u32,
    },
    /// An executor snapshot that cannot be used (damaged, another tenant's, a newer build's):
    /// the caller rebuilds from the log instead.
    #[error("the plan executor's snapshot is unusable: {detail}")]
    Snapshot {
        /// What is wrong.
        detail: String,
    },
    /// The log could not be appended to or read.
    #[error("plan log failed: {0}")]
    Log(String),
}

impl PlanError {
    pub(crate) fn invalid(field: &str, value: impl ToString, expected: impl ToString) -> PlanError {
        PlanError::Invalid { field: field.to_owned(), value: value.to_string(), expected: expected.to_string() }
    }
}
