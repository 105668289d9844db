//! Engine errors as the Python exceptions of `tidegate.errors`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule};
use tidegate_runtime::{EngineError, Error, PlanError};

use crate::convert::to_py;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    ERRORS.get_or_try_init(py, || Ok(py.import("tidegate.errors")?.unbind())).map(|m| m.bind(py))
}

/// The Python class name and machine kind of an engine error.
fn classify(err: &Error) -> (&'static str, String) {
    match err {
        Error::Aborted(o) => {
            let kind = o.reason.as_ref().map_or("aborted", |r| r.kind());
            let class = match kind {
                "stale_read" => "StaleRead",
                "vetoed" => "Vetoed",
                "protocol_violation" => "ProtocolViolation",
                "tool_failed" | "tool_unavailable" => "ToolFailed",
                "release_failed" => "ReleaseFailed",
                "lost_branch" => "LostBranch",
                "lease_expired" => "LeaseExpired",
                "wait_timeout" => "WaitTimeout",
                _ => "Aborted",
            };
            (class, kind.to_owned())
        }
        Error::Engine(e) => match e {
            EngineError::Scope { .. } => ("InvalidScope", "invalid_scope".into()),
            EngineError::ProtocolViolation { .. } => ("ProtocolViolation", "protocol_violation".into()),
            EngineError::KeyInUse { .. } => ("KeyInUse", "key_in_use".into()),
            EngineError::KeyUnresolved { .. } => ("KeyUnresolved", "key_unresolved".into()),
            EngineError::InvalidArgument { .. } => ("InvalidArgument", "invalid_argument".into()),
            EngineError::InFlight { .. } => ("WrongState", "in_flight".into()),
            EngineError::UnknownGroup { .. }
            | EngineError::NotInGroup { .. }
            | EngineError::BranchOfGroup { .. }
            | EngineError::NoWinner { .. } => ("SpeculationError", "speculation".into()),
            EngineError::Settled { .. } => ("WrongState", "settled".into()),
            EngineError::UnknownTx { .. } => ("WrongState", "unknown_tx".into()),
            EngineError::WrongState { .. } => ("WrongState", "wrong_state".into()),
            // A key names one call: reusing it for another is bad input (`argument` = key).
            EngineError::KeyReused { .. } => ("InvalidArgument", "key_reused".into()),
            EngineError::ArgsTooLarge { .. } => ("InvalidArgument", "args_too_large".into()),
            // Pessimistic locking aborted the transaction; retryable (`retryable` says so).
            EngineError::LockConflict { .. } => ("Aborted", "lock_conflict".into()),
            EngineError::Exhausted { .. } => ("StoreError", "exhausted".into()),
            // EngineError is non-exhaustive: a variant added later is named by its kind.
            _ => ("TidegateError", "engine".into()),
        },
        Error::Finished { .. } => ("WrongState", "settled".into()),
        Error::Store(_) => ("StoreError", "store".into()),
        // Another owner holds the ledger stream: this engine stopped for good.
        Error::Fenced(_) => ("StoreError", "fenced".into()),
        Error::InvalidArgument { .. } => ("InvalidArgument", "invalid_argument".into()),
        Error::UnknownTool { .. } => ("UnknownTool", "unknown_tool".into()),
        Error::CallInterrupted { .. } => ("WrongState", "settled".into()),
        // A ticket reported twice, for a held effect, or to another transaction: the
        // operation does not fit the ticket's state; nothing was recorded.
        Error::TicketMisuse { .. } => ("WrongState", "ticket_misuse".into()),
        Error::Trace { .. } => ("TidegateError", "trace".into()),
        Error::MissingDescriptor { .. } => ("MissingDescriptor", "missing_descriptor".into()),
        Error::Plan(p) => match p {
            PlanError::Invalid { .. } => ("InvalidArgument", "invalid_argument".into()),
            PlanError::CrossTenant { .. } => ("CrossTenant", "cross_tenant".into()),
            PlanError::UnknownPlan { .. } => ("PlanError", "unknown_plan".into()),
            PlanError::WrongState { .. } => ("PlanError", "plan_state".into()),
            PlanError::StepUnsettled { .. } => ("PlanError", "step_unsettled".into()),
            PlanError::NewerFormat { .. } => ("PlanError", "newer_format".into()),
            PlanError::Snapshot { .. } => ("StoreError", "plan_snapshot".into()),
            PlanError::Log { .. } | PlanError::Stopped { .. } => ("StoreError", "plan_log".into()),
            // PlanError is non-exhaustive: a refusal added later is a plain PlanError.
            _ => ("PlanError", "plan".into()),
        },
        // Error is non-exhaustive: a variant added later is a plain TidegateError.
        _ => ("TidegateError", "engine".into()),
    }
}

/// The message of `err` for Python callers (the engine's own names Rust API).
fn message(err: &Error) -> String {
    match err {
        Error::MissingDescriptor { tool, plan } => format!(
            "tool `{tool}` is reversible and its call is a step of plan {plan}: declare it with \
             @tidegate.tool(compensate=tidegate.Compensate(\"<capability>\", ...)) so that a plan failure can undo \
             it after this process is gone; nothing was recorded"
        ),
        e => e.to_string(),
    }
}

/// The argument a bad-input error names (`may_touch[0]` is `may_touch`).
fn argument_of(err: &Error) -> Option<String> {
    let field = match err {
        Error::Engine(EngineError::Scope { field, .. }) => field.as_str(),
        Error::Engine(EngineError::InvalidArgument { field, .. }) | Error::InvalidArgument { field, .. } => field,
        Error::Engine(EngineError::KeyReused { .. }) => "key",
        Error::Engine(EngineError::ArgsTooLarge { .. }) => "args",
        Error::Plan(PlanError::Invalid { field, .. } | PlanError::CrossTenant { field, .. }) => field.as_str(),
        Error::MissingDescriptor { .. } => "compensate",
        _ => return None,
    };
    Some(field.split(['[', ' ']).next().unwrap_or(field).to_owned())
}

/// Builds the Python exception for `err`, chaining `cause` (the exception a tool raised).
pub(crate) fn to_pyerr(py: Python<'_>, err: &Error, cause: Option<Py<PyAny>>) -> PyErr {
    match build(py, err, cause) {
        Ok(e) => e,
        Err(e) => e,
    }
}

fn build(py: Python<'_>, err: &Error, cause: Option<Py<PyAny>>) -> PyResult<PyErr> {
    let (class, kind) = classify(err);
    let m = module(py)?;
    let cls = m.getattr(class)?;
    let kw = PyDict::new(py);
    kw.set_item("kind", kind)?;
    kw.set_item("retryable", err.retryable())?;
    if let Some(o) = err.outcome() {
        let v = serde_json::to_value(o).unwrap_or_default();
        kw.set_item("outcome", to_py(py, &v)?)?;
    }
    if let Some(field) = argument_of(err) {
        kw.set_item("argument", field)?;
    }
    let exc = cls.call((message(err),), Some(&kw))?;
    match err {
        Error::MissingDescriptor { tool, plan } => {
            exc.setattr("tool", tool)?;
            exc.setattr("plan", *plan)?;
        }
        Error::Plan(p) => {
            let plan = match p {
                PlanError::UnknownPlan { plan }
                | PlanError::WrongState { plan, .. }
                | PlanError::StepUnsettled { plan, .. } => Some(*plan),
                _ => None,
            };
            exc.setattr("plan", plan)?;
        }
        _ => {}
    }
    if let Some(c) = cause {
        exc.setattr("__cause__", c)?;
    }
    Ok(PyErr::from_value(exc))
}

/// An `InvalidArgument` exception naming the argument, the value and what was expected.
pub(crate) fn invalid(py: Python<'_>, field: &str, value: &str, expected: &str) -> PyErr {
    let msg = format!("invalid `{field}` = {value}: expected {expected}");
    let made = (|| -> PyResult<PyErr> {
        let cls = module(py)?.getattr("InvalidArgument")?;
        let kw = PyDict::new(py);
        kw.set_item("kind", "invalid_argument")?;
        kw.set_item("retryable", false)?;
        kw.set_item("argument", field)?;
        Ok(PyErr::from_value(cls.call((msg.clone(),), Some(&kw))?))
    })();
    made.unwrap_or_else(|e| e)
}

#[cfg(test)]
mod tests {
    use tidegate_core::{EffectId, TxId};

    use super::*;

    #[test]
    fn every_runtime_error_has_its_own_class_and_kind() {
        let misuse = Error::TicketMisuse { tx: TxId(3), effect: EffectId(0), detail: "reported twice".into() };
        assert_eq!(classify(&misuse), ("WrongState", "ticket_misuse".to_owned()));
        let trace = Error::Trace { path: "t.jsonl".into(), source: std::io::Error::other("disk full") };
        assert_eq!(classify(&trace), ("TidegateError", "trace".to_owned()));
        let reused = Error::Engine(EngineError::KeyReused {
            key: "k".into(),
            first: "a".into(),
            this: "b".into(),
            differs: "tool".into(),
        });
        assert_eq!(classify(&reused), ("InvalidArgument", "key_reused".to_owned()));
        assert_eq!(argument_of(&reused).as_deref(), Some("key"));
        let big = Error::Engine(EngineError::ArgsTooLarge { tool: "t".into(), bytes: 9, limit: 1 });
        assert_eq!(classify(&big), ("InvalidArgument", "args_too_large".to_owned()));
        assert_eq!(argument_of(&big).as_deref(), Some("args"));
        let lock = Error::Engine(EngineError::LockConflict { tx: TxId(1), scope: "kv:a".into() });
        assert_eq!(classify(&lock), ("Aborted", "lock_conflict".to_owned()));
        let ex = Error::Engine(EngineError::Exhausted { counter: "epoch", value: u64::MAX });
        assert_eq!(classify(&ex), ("StoreError", "exhausted".to_owned()));
    }
}
