//! `tidegate._native`: the PyO3 binding of the Tidegate engine. The pure-Python package
//! `tidegate` wraps it; see `python/docs/DESIGN.md`.
//!
//! | module | concern |
//! |---|---|
//! | `engine` | `Engine`: building a `Tidegate` from `tidegate.open(...)`'s options, tools, hooks, recovery |
//! | `tx`, `spec` | `Tx` and `Spec`: calls, commit and abort, sync and asyncio |
//! | `tool` | the engine `Tool` whose call, compensation and probe run Python functions |
//! | `hooks` | Python pre-commit hooks |
//! | `calls` | the per-operation call context and how a Python callback is run (inline, on the caller's loop, on the blocking pool) |
//! | `live` | the live Python side of an eager call, carried as its handle to its compensation |
//! | `plan` | plans (`Engine.plan`, `Plan`), their views, and capability handlers for compensation descriptors |
//! | `rt` | the tokio runtime; driving an engine future from sync or asyncio callers |
//! | `interp` | the extension's threads and the interpreter's exit |
//! | `ack`, `view`, `convert`, `errors` | values and errors handed to Python |
//!
//! Threading: the binding owns one tokio runtime per process. Sync methods release the
//! interpreter (`Python::detach`) and drive the engine's future on the calling thread; the
//! engine calls Python callbacks on that same thread, re-attaching. Async methods spawn the
//! future on the runtime and resolve an asyncio future through `call_soon_threadsafe`.

mod ack;
mod calls;
mod convert;
mod engine;
mod errors;
mod hooks;
mod interp;
mod live;
mod plan;
mod rt;
mod spec;
mod tool;
mod tx;
mod view;

use pyo3::prelude::*;

use crate::convert::to_json;
use crate::errors::invalid;

/// Converts a Python value to JSON, or raises `InvalidArgument` naming `field`.
#[pyfunction]
fn check_json(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    to_json(value).map(|_| ()).map_err(|e| {
        invalid(py, field, &format!("{} = <{}>", if e.path.is_empty() { "value" } else { &e.path }, e.type_name), e.why)
    })
}

/// The `atexit` handler: waits for callbacks in progress on the engine's threads (see
/// `interp`), then flushes trace files. Returns how many callbacks were still running.
#[pyfunction]
fn _at_exit(py: Python<'_>) -> usize {
    let left = interp::at_exit(py);
    engine::flush_traces();
    left
}

/// Whether interpreter exit has begun.
#[pyfunction]
fn _exiting() -> bool {
    interp::exiting()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<tx::Tx>()?;
    m.add_class::<plan::Plan>()?;
    m.add_class::<spec::Spec>()?;
    m.add_class::<tool::ToolHandle>()?;
    m.add_class::<ack::Ack>()?;
    m.add_class::<ack::Settled>()?;
    m.add_class::<calls::Completion>()?;
    m.add_function(wrap_pyfunction!(check_json, m)?)?;
    m.add_function(wrap_pyfunction!(_exiting, m)?)?;
    let at_exit = wrap_pyfunction!(_at_exit, m)?;
    m.add_function(at_exit.clone())?;
    // Registered when the module loads, so that it runs before finalisation starts and after
    // every atexit handler registered later (atexit runs handlers last-in, first-out).
    m.py().import("atexit")?.call_method1("register", (at_exit,))?;
    Ok(())
}
