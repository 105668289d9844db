//! Engine values handed to Python: a sealed transaction's view (for hooks) and outcomes.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tidegate_runtime::Outcome;

use crate::convert::to_py;

/// An outcome as the dict `tidegate.Outcome._from_dict` reads (the engine's serde form).
pub(crate) fn outcome_to_py(py: Python<'_>, o: &Outcome) -> PyResult<Py<PyAny>> {
    let v = serde_json::to_value(o).unwrap_or_default();
    Ok(to_py(py, &v)?.unbind())
}

/// The sealed footprint a pre-commit hook judges: `{"tx", "epoch", "agent", "reads":
/// [(scope, version)], "effects": [{"id", "tool", "effect", "scopes", "args", "output"}]}`.
pub(crate) fn view_to_py(py: Python<'_>, view: &tidegate_core::engine::SealedView) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    d.set_item("tx", view.tx.0)?;
    d.set_item("epoch", view.epoch.0)?;
    d.set_item("agent", &*view.agent)?;
    let reads = PyList::empty(py);
    for (s, v) in &view.reads {
        reads.append((s.as_str(), v.0))?;
    }
    d.set_item("reads", reads)?;
    let effects = PyList::empty(py);
    for e in &view.effects {
        let ed = PyDict::new(py);
        ed.set_item("id", e.id.0)?;
        ed.set_item("tool", &*e.tool)?;
        ed.set_item("effect", e.class.as_str())?;
        ed.set_item("scopes", e.scopes.iter().map(|s| s.as_str().to_owned()).collect::<Vec<_>>())?;
        ed.set_item("args", to_py(py, &e.args)?)?;
        match &e.output {
            Some(o) => ed.set_item("output", to_py(py, o)?)?,
            None => ed.set_item("output", py.None())?,
        }
        effects.append(ed)?;
    }
    d.set_item("effects", effects)?;
    Ok(d.into_any().unbind())
}
