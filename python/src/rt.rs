//! The binding's tokio runtime and the two ways Python drives an engine future: on the
//! calling thread with the interpreter released ([`block`]; never attached, since settlement
//! and a failed call's compensations run in the engine's tasks on other threads and may need
//! the interpreter), or spawned for an asyncio caller ([`spawn`]).

use std::future::Future;
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;

use crate::calls::{Aio, CTX, CallCtx, bridge};
use crate::errors::invalid;
use crate::interp;

static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();

/// The process's runtime (2 workers), started on first use. Its threads enter the
/// interpreter only through [`interp::attach`].
pub(crate) fn runtime(py: Python<'_>) -> PyResult<&'static tokio::runtime::Runtime> {
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tidegate")
            .on_thread_start(interp::mark_runtime_thread)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    rt.as_ref().map_err(|e| invalid(py, "runtime", e, "a tokio runtime that can start"))
}

/// Runs an engine future on the calling thread with the interpreter released.
pub(crate) fn block<F: Future + Send>(py: Python<'_>, ctx: Arc<CallCtx>, fut: F) -> PyResult<F::Output>
where
    F::Output: Send,
{
    let rt = runtime(py)?;
    Ok(py.detach(|| rt.block_on(CTX.scope(ctx, fut))))
}

/// Spawns an engine future for an asyncio caller; `finish` converts its output (on a runtime
/// thread, attached) and the result resolves `future` on the caller's loop.
pub(crate) fn spawn<F, T, C>(py: Python<'_>, ctx: Arc<CallCtx>, fut: F, finish: C, future: Py<PyAny>) -> PyResult<()>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: FnOnce(Python<'_>, T, &CallCtx) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let rt = runtime(py)?;
    let Some(aio) = ctx.aio.as_ref() else {
        return Err(invalid(py, "event_loop", "None", "the running asyncio loop"));
    };
    let event_loop = aio.event_loop.clone_ref(py);
    let ctx2 = ctx.clone();
    rt.spawn(async move {
        let out = CTX.scope(ctx2.clone(), fut).await;
        interp::attach(|py| {
            let (ok, value) = match finish(py, out, &ctx2) {
                Ok(v) => (true, v),
                Err(e) => (false, e.into_value(py).into_any()),
            };
            if let Ok(b) = bridge(py) {
                let _ = b.getattr("resolve_threadsafe").and_then(|r| r.call1((event_loop, future, ok, value)));
            }
        });
    });
    Ok(())
}

/// The call context of an asyncio caller.
pub(crate) fn aio_ctx(event_loop: Py<PyAny>, context: Py<PyAny>) -> CallCtx {
    CallCtx { aio: Some(Aio { event_loop, context }), ..CallCtx::default() }
}
