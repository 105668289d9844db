//! The live Python side of one eager call, carried through the runtime.
//!
//! The engine records a call's arguments and output as JSON, and that JSON is what it hands a
//! compensation after a restart. In the process that made the call, a Python compensation
//! wants the live objects instead: the output exactly as the tool returned it (which may have
//! no JSON form) and the arguments as they were passed. The binding hands them to the runtime
//! as the call's opaque handle (`CallOptions::handle`); the runtime gives the same handle to
//! the tool's call and compensation (`CallCtx::handle`) and drops it when the transaction
//! settles. A compensation with no handle (run by recovery in a later process) gets the
//! recorded JSON instead. Dropping a `Py` without the interpreter attached is safe: PyO3
//! defers the decrement until it is next attached.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tidegate_runtime::{CallCtx as EngineCtx, CallHandle};

/// The live side of one eager call.
pub(crate) struct LiveCall {
    pub(crate) args: Py<PyTuple>,
    pub(crate) kwargs: Option<Py<PyDict>>,
    pub(crate) call_id: Option<String>,
    /// The live output, once the call returned.
    pub(crate) output: Mutex<Option<Py<PyAny>>>,
}

impl LiveCall {
    /// A handle for `CallOptions::handle`.
    pub(crate) fn handle(self) -> CallHandle {
        CallHandle(Arc::new(self))
    }

    /// The live call a handle carries.
    pub(crate) fn of(handle: &CallHandle) -> Option<&LiveCall> {
        handle.downcast_ref::<LiveCall>()
    }

    /// The handle in an engine context, if it carries a live call.
    pub(crate) fn in_ctx(ctx: &EngineCtx) -> Option<CallHandle> {
        ctx.handle.clone().filter(|h| LiveCall::of(h).is_some())
    }
}
