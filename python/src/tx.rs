//! `Tx`: one transaction, its calls and its settlement, for the sync and asyncio APIs.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use serde_json::Value;
use tidegate_runtime::{
    Ack as EngineAck, CallHandle, CallOptions, CommitOptions, Error, Outcome, Transaction, TxState,
};

use crate::ack::{Ack, Settled};
use crate::calls::{CallCtx, is_callable};
use crate::convert::{CALL_ID, bind_args, to_py};
use crate::engine::duration;
use crate::errors::{invalid, to_pyerr};
use crate::hooks::PyHook;
use crate::live::LiveCall;
use crate::rt::{aio_ctx, block, spawn};
use crate::tool::ToolHandle;
use crate::view::outcome_to_py;

/// A transaction.
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Tx {
    tx: Transaction,
}

impl Tx {
    pub(crate) fn new(tx: Transaction) -> Tx {
        Tx { tx }
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_call(
        &self,
        py: Python<'_>,
        handle: &ToolHandle,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        scopes: Vec<String>,
        key: Option<String>,
        call_id: Option<String>,
    ) -> PyResult<(Value, CallOptions, CallCtx)> {
        let mut json = bind_args(args, kwargs, &handle.names).map_err(|e| {
            invalid(
                py,
                "arguments",
                &format!(
                    "{} = <{}> in a call of tool `{}`",
                    if e.path.is_empty() { "?" } else { &e.path },
                    e.type_name,
                    handle.name
                ),
                &format!("{} (the ledger records every call's arguments as JSON)", e.why),
            )
        })?;
        if scopes.is_empty() {
            return Err(invalid(py, "scope", "[]", &format!("at least one scope for tool `{}`", handle.name)));
        }
        let handle_descriptor = handle.descriptor.clone();
        let call_id = if handle.wants.any() { call_id } else { None };
        if let (Some(id), Value::Object(map)) = (&call_id, &mut json) {
            map.insert(CALL_ID.to_owned(), Value::String(id.clone()));
        }
        // An eager call carries its live Python side to its compensation (live.rs); a held
        // one is released from its recorded arguments.
        let handle = handle.tool.class().executes_eagerly().then(|| {
            let kwargs = kwargs.map(|k| k.clone().unbind());
            LiveCall { args: args.clone().unbind(), kwargs, call_id, output: Mutex::new(None) }.handle()
        });
        // The descriptor rides every call; the engine records it only inside a plan step.
        let compensate = handle_descriptor;
        let opts = CallOptions { key, scopes: Some(scopes), handle, compensate, ..CallOptions::default() };
        Ok((json, opts, CallCtx::default()))
    }

    fn finish_call(
        &self,
        py: Python<'_>,
        ack: Result<EngineAck, Error>,
        ctx: &CallCtx,
        live: Option<&CallHandle>,
    ) -> PyResult<Py<PyAny>> {
        let made = |kind, effect: tidegate_runtime::EffectId, output| -> PyResult<Py<PyAny>> {
            Ok(Py::new(py, Ack { kind, effect: u64::from(effect.0), output })?.into_any())
        };
        match ack {
            Ok(EngineAck::Executed { effect, output }) => {
                let kept = live.and_then(LiveCall::of).and_then(|l| l.output.lock().as_ref().map(|o| o.clone_ref(py)));
                let out = match kept {
                    Some(o) => o,
                    None => to_py(py, &output)?.unbind(),
                };
                made("executed", effect, out)
            }
            Ok(EngineAck::Staged { effect }) => made("staged", effect, py.None()),
            Ok(EngineAck::Queued { effect }) => made("queued", effect, py.None()),
            Ok(EngineAck::Replayed { effect, output }) => made("replayed", effect, to_py(py, &output)?.unbind()),
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }

    pub(crate) fn finish_settle(
        &self,
        py: Python<'_>,
        r: Result<Outcome, Error>,
        ctx: &CallCtx,
    ) -> PyResult<Py<PyAny>> {
        match r {
            Ok(o) => Ok(settled(py, &o, ctx)?.into_any()),
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }
}

/// The settlement of `o`, with the outputs the commit released (collected in `ctx`).
pub(crate) fn settled(py: Python<'_>, o: &Outcome, ctx: &CallCtx) -> PyResult<Py<Settled>> {
    let released = PyList::new(py, ctx.released.lock().drain(..))?.unbind();
    Py::new(py, Settled { outcome: outcome_to_py(py, o)?, released })
}

fn commit_options(py: Python<'_>, wait_timeout: Option<f64>) -> PyResult<CommitOptions> {
    Ok(CommitOptions { wait_timeout: wait_timeout.map(|t| duration(py, "wait_timeout", t)).transpose()? })
}

async fn commit(tx: Transaction, opts: CommitOptions) -> Result<Outcome, Error> {
    if tx.state()? == TxState::Open {
        tx.seal()?;
    }
    tx.commit_with(opts).await
}

#[pymethods]
impl Tx {
    /// The transaction id.
    #[getter]
    fn id(&self) -> u64 {
        self.tx.id().0
    }

    /// The epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.tx.epoch().0
    }

    /// `"open"`, `"sealed"`, `"waiting"`, `"committing"`, `"aborting"`, or `None` once settled.
    #[getter]
    fn state(&self) -> Option<&'static str> {
        self.tx.state().ok().map(|s| match s {
            TxState::Open => "open",
            TxState::Sealed => "sealed",
            TxState::Waiting => "waiting",
            TxState::Committing => "committing",
            TxState::Aborting => "aborting",
        })
    }

    /// Records a read; returns `(version, staged value or None)`.
    fn read(&self, py: Python<'_>, scope: &str) -> PyResult<(u64, Py<PyAny>)> {
        let r = self.tx.read(scope).map_err(|e| to_pyerr(py, &e, None))?;
        let staged = match &r.staged {
            Some(v) => to_py(py, v)?.unbind(),
            None => py.None(),
        };
        Ok((r.version.0, staged))
    }

    /// Calls a tool through the engine; returns an `Ack`.
    #[pyo3(signature = (handle, args, kwargs, scopes, key=None, call_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        handle: &ToolHandle,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        scopes: Vec<String>,
        key: Option<String>,
        call_id: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let (json, opts, ctx) = self.prepare_call(py, handle, args, kwargs, scopes, key, call_id)?;
        let live = opts.handle.clone();
        let ctx = Arc::new(ctx);
        let tx = self.tx.clone();
        let tool = handle.tool.clone();
        let fut = async move { tx.call_with(&tool, json, opts).await };
        let ack = block(py, ctx.clone(), fut)?;
        self.finish_call(py, ack, &ctx, live.as_ref())
    }

    /// The asyncio form of `call`: resolves `future` on `event_loop` with an `Ack`.
    #[pyo3(signature = (handle, args, kwargs, scopes, key, call_id, event_loop, context, future))]
    #[allow(clippy::too_many_arguments)]
    fn call_async(
        slf: Bound<'_, Self>,
        handle: &ToolHandle,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        scopes: Vec<String>,
        key: Option<String>,
        call_id: Option<String>,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (json, opts, mut ctx) = this.prepare_call(py, handle, args, kwargs, scopes, key, call_id)?;
        let live = opts.handle.clone();
        ctx.aio = aio_ctx(event_loop, context).aio;
        let tx = this.tx.clone();
        let tool = handle.tool.clone();
        let me = slf.unbind();
        spawn(
            py,
            Arc::new(ctx),
            async move { tx.call_with(&tool, json, opts).await },
            move |py, ack, ctx| me.get().finish_call(py, ack, ctx, live.as_ref()),
            future,
        )
    }

    /// Freezes the footprint.
    fn seal(&self, py: Python<'_>) -> PyResult<()> {
        self.tx.seal().map_err(|e| to_pyerr(py, &e, None))
    }

    /// Seals (if open) and commits. Returns a `Settled`.
    #[pyo3(signature = (wait_timeout=None))]
    fn commit(&self, py: Python<'_>, wait_timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let opts = commit_options(py, wait_timeout)?;
        let ctx = Arc::new(CallCtx::default());
        let tx = self.tx.clone();
        let r = block(py, ctx.clone(), async move { commit(tx, opts).await })?;
        self.finish_settle(py, r, &ctx)
    }

    /// The asyncio form of `commit`.
    #[pyo3(signature = (wait_timeout, event_loop, context, future))]
    fn commit_async(
        slf: Bound<'_, Self>,
        wait_timeout: Option<f64>,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let opts = commit_options(py, wait_timeout)?;
        let ctx = Arc::new(aio_ctx(event_loop, context));
        let tx = slf.get().tx.clone();
        let me = slf.unbind();
        spawn(
            py,
            ctx,
            async move { commit(tx, opts).await },
            move |py, r, ctx| me.get().finish_settle(py, r, ctx),
            future,
        )
    }

    /// Aborts: compensates executed effects in reverse order, drops held ones. Returns a
    /// `Settled` (nothing released).
    fn abort(&self, py: Python<'_>, reason: String) -> PyResult<Py<PyAny>> {
        let ctx = Arc::new(CallCtx::default());
        let tx = self.tx.clone();
        let r = block(py, ctx.clone(), async move { tx.abort(reason).await })?;
        self.finish_settle(py, r, &ctx)
    }

    /// The asyncio form of `abort`.
    fn abort_async(
        slf: Bound<'_, Self>,
        reason: String,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let ctx = Arc::new(aio_ctx(event_loop, context));
        let tx = slf.get().tx.clone();
        let me = slf.unbind();
        spawn(
            py,
            ctx,
            async move { tx.abort(reason).await },
            move |py, r, ctx| me.get().finish_settle(py, r, ctx),
            future,
        )
    }

    /// Adds a pre-commit hook for this transaction only.
    #[pyo3(signature = (name, hook, is_async=false))]
    fn add_hook(&self, py: Python<'_>, name: String, hook: Py<PyAny>, is_async: bool) -> PyResult<()> {
        is_callable(py, "hook", &hook, false)?;
        self.tx.add_hook(Arc::new(PyHook { name, f: Arc::new(hook), is_async }));
        Ok(())
    }
}
