//! What a call and a settlement return to Python.

use pyo3::prelude::*;
use pyo3::types::PyList;

/// The engine's answer to one tool call (`tidegate_runtime::Ack`).
///
/// `kind` is `"executed"` (an eager call ran; `output` is the tool's live return value),
/// `"replayed"` (its idempotency key had already executed; `output` is the recorded value),
/// `"staged"` (bufferable) or `"queued"` (gated): held until commit, `output` is `None`.
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Ack {
    /// `"executed"`, `"replayed"`, `"staged"` or `"queued"`.
    #[pyo3(get)]
    pub(crate) kind: &'static str,
    /// The effect's id (its issuance position in the engine).
    #[pyo3(get)]
    pub(crate) effect: u64,
    /// The output, for executed and replayed calls.
    #[pyo3(get)]
    pub(crate) output: Py<PyAny>,
}

#[pymethods]
impl Ack {
    /// Whether the effect is held until commit (staged or queued).
    #[getter]
    fn held(&self) -> bool {
        matches!(self.kind, "staged" | "queued")
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let out = self.output.bind(py).repr().map(|r| r.to_string()).unwrap_or_default();
        format!("Ack(kind={:?}, effect={}, output={out})", self.kind, self.effect)
    }
}

/// A settlement: the outcome (the engine's serde form as a dict) and the return values of the
/// held effects the commit released, in release (issuance) order.
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Settled {
    /// The outcome, as `tidegate.Outcome._from_dict` reads it.
    #[pyo3(get)]
    pub(crate) outcome: Py<PyAny>,
    /// Return values of the released held effects.
    #[pyo3(get)]
    pub(crate) released: Py<PyList>,
}
