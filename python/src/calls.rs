//! Running Python callables (tools, compensations, probes, hooks) from inside the engine.
//!
//! Every engine operation the binding drives runs inside a [`CTX`] scope: the call context
//! tells the callbacks whether they run on the caller's thread (sync API: call the Python
//! function inline, re-attaching to the interpreter) or for an asyncio caller (coroutines go
//! to the caller's event loop, plain functions to tokio's blocking pool), and collects the
//! outputs of released effects and the exception a callback raised. The live Python side of
//! an eager call travels with the call itself, as its handle (live.rs).

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyModule, PyTuple};
use tokio::sync::oneshot;

use crate::interp;

/// The asyncio side of a call: the caller's event loop and its `contextvars` context.
pub(crate) struct Aio {
    pub(crate) event_loop: Py<PyAny>,
    pub(crate) context: Py<PyAny>,
}

/// The context of one engine operation driven from Python.
#[derive(Default)]
pub(crate) struct CallCtx {
    /// The last exception a callback raised (chained as the cause of the engine's error).
    pub(crate) error: Mutex<Option<Py<PyAny>>>,
    /// Outputs of held effects released during a commit, in release (issuance) order.
    pub(crate) released: Mutex<Vec<Py<PyAny>>>,
    /// Set for asyncio callers.
    pub(crate) aio: Option<Aio>,
}

tokio::task_local! {
    pub(crate) static CTX: Arc<CallCtx>;
}

/// The current call context, if the engine operation was started by the binding.
pub(crate) fn current() -> Option<Arc<CallCtx>> {
    CTX.try_with(Arc::clone).ok()
}

static BRIDGE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub(crate) fn bridge(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    BRIDGE.get_or_try_init(py, || Ok(py.import("tidegate._bridge")?.unbind())).map(|m| m.bind(py))
}

/// A callback's result: the value, or the exception it raised.
type PyOutcome = Result<Py<PyAny>, Py<PyAny>>;

/// Receives the result of a coroutine run on the caller's event loop.
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Completion {
    tx: Mutex<Option<oneshot::Sender<PyOutcome>>>,
}

#[pymethods]
impl Completion {
    /// Delivers the outcome: `ok` with the value, or the exception.
    fn finish(&self, ok: bool, value: Py<PyAny>) {
        if let Some(tx) = self.tx.lock().take() {
            let _ = tx.send(if ok { Ok(value) } else { Err(value) });
        }
    }
}

/// Builds a callback's positional and keyword arguments (with the interpreter attached).
pub(crate) type ArgBuilder = Box<dyn FnOnce(Python<'_>) -> PyResult<(Py<PyTuple>, Option<Py<PyDict>>)> + Send>;

fn exception_object(py: Python<'_>, e: PyErr) -> Py<PyAny> {
    e.into_value(py).into_any()
}

/// Runs a Python callable as the call context says. `Err` holds the exception object.
pub(crate) async fn invoke(
    f: Arc<Py<PyAny>>,
    is_async: bool,
    build: ArgBuilder,
    ctx: Option<Arc<CallCtx>>,
) -> Result<Py<PyAny>, Py<PyAny>> {
    let aio = ctx.as_ref().and_then(|c| c.aio.as_ref());
    let Some(aio) = aio else {
        // Sync caller (or no caller: recovery, lease expiry): call inline.
        return interp::attach(|py| {
            let run = || -> PyResult<Py<PyAny>> {
                let (a, k) = build(py)?;
                if is_async {
                    Ok(bridge(py)?.getattr("run_blocking")?.call1((f.as_ref(), a, k))?.unbind())
                } else {
                    Ok(f.bind(py).call(a.bind(py), k.as_ref().map(|k| k.bind(py)))?.unbind())
                }
            };
            run().map_err(|e| exception_object(py, e))
        });
    };
    if is_async {
        let (tx, rx) = oneshot::channel();
        let scheduled = interp::attach(|py| -> Result<(), Py<PyAny>> {
            let go = || -> PyResult<()> {
                let (a, k) = build(py)?;
                let done = Py::new(py, Completion { tx: Mutex::new(Some(tx)) })?;
                bridge(py)?.getattr("schedule")?.call1((
                    aio.event_loop.bind(py),
                    aio.context.bind(py),
                    f.as_ref(),
                    a,
                    k,
                    done,
                ))?;
                Ok(())
            };
            go().map_err(|e| exception_object(py, e))
        });
        scheduled?;
        return match rx.await {
            Ok(r) => r,
            Err(_) => Err(interp::attach(|py| {
                exception_object(py, pyo3::exceptions::PyRuntimeError::new_err("the event loop dropped the call"))
            })),
        };
    }
    let (context, event_loop) = interp::attach(|py| (aio.context.clone_ref(py), aio.event_loop.clone_ref(py)));
    let joined = tokio::task::spawn_blocking(move || {
        interp::attach(|py| {
            let run = || -> PyResult<Py<PyAny>> {
                let (a, k) = build(py)?;
                Ok(bridge(py)?
                    .getattr("call_in")?
                    .call1((context.bind(py), event_loop.bind(py), f.as_ref(), a, k))?
                    .unbind())
            };
            run().map_err(|e| exception_object(py, e))
        })
    })
    .await;
    match joined {
        Ok(r) => r,
        Err(e) => Err(interp::attach(|py| {
            exception_object(py, pyo3::exceptions::PyRuntimeError::new_err(format!("callback thread failed: {e}")))
        })),
    }
}

/// `TypeName: message` of an exception object.
pub(crate) fn describe(py: Python<'_>, exc: &Py<PyAny>) -> String {
    let e = exc.bind(py);
    let ty = e.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".to_owned());
    let msg = e.str().map(|s| s.to_string()).unwrap_or_default();
    if msg.is_empty() { ty } else { format!("{ty}: {msg}") }
}

/// Whether `exc` is an instance of the `tidegate.errors` class `name`.
pub(crate) fn is_error(py: Python<'_>, exc: &Py<PyAny>, name: &str) -> bool {
    py.import("tidegate.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|cls| exc.bind(py).is_instance(&cls))
        .unwrap_or(false)
}

/// `repr()` of a value for error messages.
pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unrepresentable>".to_owned())
}

/// Refuses a non-callable `field` with `InvalidArgument`.
pub(crate) fn is_callable(py: Python<'_>, field: &str, f: &Py<PyAny>, optional: bool) -> PyResult<()> {
    if f.bind(py).is_callable() {
        return Ok(());
    }
    let expected = if optional { "a callable or None" } else { "a callable" };
    Err(crate::errors::invalid(py, field, &repr(f.bind(py)), expected))
}
