//! Typed errors: each names the field or id, the value, and what was expected; a log failure
//! keeps the log's own error as its source. [`PlanError::retryable`] says whether the same
//! call may succeed if made again.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::fact::{PlanId, TxId};

/// Everything the plans API refuses, and the failures of the log under it.
///
/// Classification ([`PlanError::retryable`]):
///
/// | variant | retryable | why |
/// |---|---|---|
/// | `Invalid`, `CrossTenant`, `UnknownPlan` | no | the same input is refused again |
/// | `WrongState` | no | the plan must move first (its owner resolves it, its unwind or a blocked effect's compensation ends): read it, then decide |
/// | `StepUnsettled` | yes | the step settles on its own (commit, abort or lease expiry); the same commit may then succeed |
/// | `NewerFormat` | no | only a newer build reads the record |
/// | `Snapshot` | no | the same bytes are refused again; the caller folds the log instead |
/// | `Log` | as the log said (its `retryable`) | a transient store failure may pass; a closed, fenced or corrupt store will not |
/// | `Stopped` | no | the handle refuses every call until rebuilt ([`Plans::start`](crate::Plans::start), a reopen of the engine) |
///
/// A log failure during a command or a decision also stops the handle (the executor applied
/// what it failed to append): that call answers `Log` with its cause's classification, every
/// later call `Stopped`, as the engine does when its own append fails.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
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
    /// The log could not be appended to or read. Built by a [`PlanLog`](crate::PlanLog) with
    /// [`PlanError::log`].
    #[error("the plan log failed to {op}: {source}")]
    Log {
        /// What was being done, as a verb phrase (`append`, `read the ledger`, ...).
        op: &'static str,
        /// Whether the log said the cause is transient (the ledger-backed log passes its
        /// store's or engine's own `retryable()`).
        retryable: bool,
        /// The log's own error.
        #[source]
        source: SharedError,
    },
    /// An earlier append (or the fold of a dispatch's result) failed after the executor had
    /// applied it, so the executor and the log may differ: this handle refuses every call
    /// until it is rebuilt from the log ([`Plans::start`](crate::Plans::start)).
    #[error("the plan executor stopped after an earlier failure ({cause}); restart it to rebuild from the log")]
    Stopped {
        /// The failure that stopped it (a [`PlanError`]: `cause.downcast_ref::<PlanError>()`).
        #[source]
        cause: SharedError,
    },
}

impl PlanError {
    /// Whether making the same call again may succeed (see the table on [`PlanError`]).
    pub fn retryable(&self) -> bool {
        match self {
            PlanError::StepUnsettled { .. } => true,
            PlanError::Log { retryable, .. } => *retryable,
            PlanError::Invalid { .. }
            | PlanError::CrossTenant { .. }
            | PlanError::UnknownPlan { .. }
            | PlanError::WrongState { .. }
            | PlanError::NewerFormat { .. }
            | PlanError::Snapshot { .. }
            | PlanError::Stopped { .. } => false,
        }
    }

    /// A failure of the log while it did `op` (a verb phrase: `append`, `read the ledger`),
    /// keeping `source`; `retryable` is the log's own classification of it.
    pub fn log(
        op: &'static str,
        retryable: bool,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> PlanError {
        PlanError::Log { op, retryable, source: SharedError(Arc::from(source.into())) }
    }

    /// The refusal of a handle that `cause` stopped.
    pub(crate) fn stopped(cause: PlanError) -> PlanError {
        PlanError::Stopped { cause: SharedError(Arc::new(cause)) }
    }

    pub(crate) fn invalid(field: &str, value: impl ToString, expected: impl ToString) -> PlanError {
        PlanError::Invalid { field: field.to_owned(), value: value.to_string(), expected: expected.to_string() }
    }
}

/// An error kept whole and shared: the cause a [`PlanError`] carries (shared so that the
/// error stays [`Clone`], and the driver can keep the failure that stopped it while the
/// caller gets it too). It dereferences to the error itself, so `downcast_ref` reaches the
/// cause's own type, through the field or through [`std::error::Error::source`].
#[derive(Clone)]
pub struct SharedError(Arc<dyn std::error::Error + Send + Sync>);

impl Deref for SharedError {
    type Target = dyn std::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::error::Error as _;

    use super::*;

    /// A store-like error that says whether it is transient, as `StoreError` does.
    #[derive(Debug, thiserror::Error)]
    #[error("ledger I/O failed during sync: disk busy")]
    struct Busy;

    #[test]
    fn only_an_unsettled_step_and_a_transient_log_failure_are_retryable() {
        let refused = [
            PlanError::invalid("owner", "\"\"", "1 to 256 characters"),
            PlanError::CrossTenant { field: "tenant".into(), found: "globex".into(), tenant: "acme".into() },
            PlanError::UnknownPlan { plan: 9 },
            PlanError::WrongState { plan: 1, operation: "commit", state: "stuck".into(), expected: "open" },
            PlanError::NewerFormat { found: 2, supported: 1 },
            PlanError::Snapshot { detail: "3 bytes after the executor".into() },
            PlanError::log("append", false, "ledger store is closed"),
        ];
        for e in &refused {
            assert!(!e.retryable(), "{e:?} must not be retryable");
        }
        assert!(PlanError::StepUnsettled { plan: 1, tx: 2 }.retryable());
        assert!(PlanError::log("append", true, Busy).retryable());
    }

    #[test]
    fn a_log_failure_keeps_its_cause_as_the_source() {
        let e = PlanError::log("read the ledger", true, Busy);
        assert_eq!(e.to_string(), "the plan log failed to read the ledger: ledger I/O failed during sync: disk busy");
        assert!(e.source().unwrap().downcast_ref::<Busy>().is_some(), "the source is the cause, with its type");
        let PlanError::Log { source, .. } = &e else { panic!("{e:?}") };
        assert!(source.downcast_ref::<Busy>().is_some(), "and so is the field");
        let copy = e.clone();
        assert!(copy.source().unwrap().downcast_ref::<Busy>().is_some(), "a clone shares the cause");
    }

    #[test]
    fn a_stopped_executor_is_not_retryable_even_when_its_cause_was() {
        let cause = PlanError::log("append", true, Busy);
        let e = PlanError::stopped(cause);
        assert!(!e.retryable());
        assert!(e.to_string().contains("restart"), "{e}");
        assert!(e.to_string().contains("disk busy"), "the cause is named: {e}");
        let first = e.source().unwrap().downcast_ref::<PlanError>();
        assert!(matches!(first, Some(PlanError::Log { retryable: true, .. })), "{first:?}");
        assert!(e.source().unwrap().source().unwrap().downcast_ref::<Busy>().is_some(), "the chain reaches the store");
    }
}
