//! Declared tools: the engine `Tool` whose call, compensation and probe run Python functions.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use serde_json::Value;
use tidegate_runtime::plans::{Operation, resolve_args};
use tidegate_runtime::{
    CallHandle, CallOutcome, Compensation, Descriptor, DispatchRequest, EffectClass, Probe, ToolError,
};

use crate::calls::{ArgBuilder, CallCtx, current, describe, invoke, is_error};
use crate::convert::{output_to_json, to_py, unbind_args};
use crate::errors::invalid;
use crate::interp;
use crate::live::LiveCall;
use crate::plan::{Caps, run_capability};

/// Which of a tool's functions take the call id (a `call_id` keyword).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WantsId {
    pub(crate) call: bool,
    pub(crate) compensate: bool,
    pub(crate) probe: bool,
}

impl WantsId {
    /// Whether calls of the tool record a call id with their arguments.
    pub(crate) fn any(self) -> bool {
        self.call || self.compensate || self.probe
    }
}

/// A declared tool registered with one engine.
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct ToolHandle {
    pub(crate) tool: tidegate_runtime::Tool,
    pub(crate) names: Arc<Vec<String>>,
    pub(crate) wants: WantsId,
    /// The tool's name.
    #[pyo3(get)]
    pub(crate) name: String,
    /// Its effect class.
    #[pyo3(get)]
    pub(crate) effect: String,
    /// Its compensation descriptor (`@tidegate.tool(compensate=tidegate.Compensate(...))`),
    /// sent with every call (the engine keeps it only inside a plan step).
    pub(crate) descriptor: Option<Descriptor>,
}

#[pymethods]
impl ToolHandle {
    fn __repr__(&self) -> String {
        format!("<tidegate tool {:?} ({})>", self.name, self.effect)
    }
}

pub(crate) fn parse_class(py: Python<'_>, effect: &str) -> PyResult<EffectClass> {
    Ok(match effect {
        "reversible" => EffectClass::Reversible,
        "reversible_with_cost" => EffectClass::ReversibleWithCost,
        "bufferable" => EffectClass::Bufferable,
        "gated" => EffectClass::Gated,
        "idempotent" => EffectClass::Idempotent,
        other => {
            return Err(invalid(
                py,
                "effect",
                &format!("{other:?}"),
                "one of \"reversible\", \"reversible_with_cost\", \"bufferable\", \"gated\", \"idempotent\"",
            ));
        }
    })
}

/// A Python function the engine calls, and how.
#[derive(Clone)]
pub(crate) struct PyFn {
    pub(crate) f: Arc<Py<PyAny>>,
    pub(crate) is_async: bool,
    pub(crate) wants_id: bool,
}

/// Everything `Engine.tool` validated, ready to build the engine's `Tool`.
pub(crate) struct Declared {
    pub(crate) name: String,
    pub(crate) class: EffectClass,
    pub(crate) names: Arc<Vec<String>>,
    pub(crate) call: PyFn,
    pub(crate) compensate: Option<PyFn>,
    pub(crate) probe: Option<PyFn>,
    /// The compensation descriptor, when `compensate` is one instead of a function.
    pub(crate) descriptor: Option<Descriptor>,
    /// The engine's capability handlers (a descriptor's in-process compensation runs one).
    pub(crate) caps: Caps,
}

/// Builds the engine tool. Scopes and keys are computed in Python and passed with every call.
pub(crate) fn build(d: Declared) -> Result<tidegate_runtime::Tool, tidegate_runtime::Error> {
    let comp_tool = d.name.clone();
    let names = d.names.clone();
    let call = d.call;
    // No scope extractor: every call passes the scopes Python computed.
    let mut builder = tidegate_runtime::Tool::builder(d.name, d.class).call_ctx(
        move |engine: tidegate_runtime::CallCtx, args: Arc<Value>| {
            let ctx = current();
            let f = call.clone();
            let names = names.clone();
            let live = LiveCall::in_ctx(&engine);
            async move { run_call(f, args, names, ctx, live).await }
        },
    );
    let builder_lacks_compensation = d.compensate.is_none() && d.descriptor.is_none();
    if let (None, Some(desc)) = (&d.compensate, &d.descriptor) {
        // An aborted transaction (a plan step too: the plan executor leaves aborted steps to
        // the engine) is compensated in this process by the descriptor's capability handler.
        let desc = desc.clone();
        let caps = d.caps.clone();
        let tool = comp_tool;
        builder =
            builder.compensate_ctx(move |engine: tidegate_runtime::CallCtx, args: Arc<Value>, output: Arc<Value>| {
                let ctx = current();
                let (desc, caps, tool) = (desc.clone(), caps.clone(), tool.clone());
                async move { compensate_by_capability(desc, caps, tool, engine, args, output, ctx).await }
            });
    }
    if let Some(comp) = d.compensate {
        let names = d.names.clone();
        builder =
            builder.compensate_ctx(move |engine: tidegate_runtime::CallCtx, args: Arc<Value>, output: Arc<Value>| {
                let ctx = current();
                let f = comp.clone();
                let names = names.clone();
                let live = LiveCall::in_ctx(&engine);
                async move { run_compensation(f, args, output, names, live, ctx).await }
            });
    }
    if builder_lacks_compensation {
        // A Python declaration may leave a reversible tool without `compensate`: its aborted
        // effects are tagged `unresolved` (the package documents it).
        builder = builder.without_compensation();
    }
    if let Some(p) = d.probe {
        let names = d.names.clone();
        builder = builder.probe(move |args: Arc<Value>| {
            let ctx = current();
            let f = p.clone();
            let names = names.clone();
            async move { run_probe(f, args, names, ctx).await }
        });
    }
    builder.build()
}

/// `kwargs` with `call_id` added when the function takes it.
fn with_call_id(
    py: Python<'_>,
    kwargs: Option<Py<PyDict>>,
    call_id: Option<&str>,
    wants: bool,
) -> PyResult<Option<Py<PyDict>>> {
    let (true, Some(id)) = (wants, call_id) else { return Ok(kwargs) };
    let d = match &kwargs {
        Some(k) => k.bind(py).copy()?,
        None => PyDict::new(py),
    };
    d.set_item("call_id", id)?;
    Ok(Some(d.unbind()))
}

/// How a tool call (or a release) that raised `exc` ended. Only an explicit "did not happen"
/// says so: `NotApplied` (final, or retried when its `retry` is true) and `TransientError`
/// (retried). Every other exception, `OutcomeUnknown` or an ordinary one (a `TimeoutError`
/// raised after the provider applied the call), is an unknown outcome: the engine asks the
/// probe and never takes it for proof that nothing happened (docs/engine.md, Failures 11).
fn tool_error(py: Python<'_>, exc: &Py<PyAny>) -> ToolError {
    let msg = describe(py, exc);
    if is_error(py, exc, "NotApplied") {
        let retry = exc.bind(py).getattr("retry").and_then(|r| r.is_truthy()).unwrap_or(false);
        if retry { ToolError::transient(msg) } else { ToolError::failed(msg) }
    } else if is_error(py, exc, "TransientError") {
        ToolError::transient(msg)
    } else {
        ToolError::unknown(msg)
    }
}

/// Runs the tool. An eager call gets the caller's live arguments (from the call's handle) and
/// leaves its live output there; a held effect released at commit gets its recorded JSON
/// arguments, and its return value is collected for the caller's `Held` acknowledgement.
async fn run_call(
    f: PyFn,
    args: Arc<Value>,
    names: Arc<Vec<String>>,
    ctx: Option<Arc<CallCtx>>,
    handle: Option<CallHandle>,
) -> Result<Value, ToolError> {
    let live = handle.as_ref().and_then(LiveCall::of).map(|l| {
        interp::attach(|py| (l.args.clone_ref(py), l.kwargs.as_ref().map(|k| k.clone_ref(py)), l.call_id.clone()))
    });
    let is_release = live.is_none();
    let wants = f.wants_id;
    let build: ArgBuilder = Box::new(move |py| match live {
        Some((a, k, id)) => Ok((a, with_call_id(py, k, id.as_deref(), wants)?)),
        None => {
            let (a, k, id) = unbind_args(py, &args, &names)?;
            Ok((a.unbind(), with_call_id(py, Some(k.unbind()), id.as_deref(), wants)?))
        }
    });
    match invoke(f.f, f.is_async, build, ctx.clone()).await {
        Ok(out) => interp::attach(|py| {
            let json = output_to_json(out.bind(py));
            match handle.as_ref().and_then(LiveCall::of) {
                Some(l) => *l.output.lock() = Some(out),
                None if is_release => {
                    if let Some(c) = &ctx {
                        c.released.lock().push(out);
                    }
                }
                None => {}
            }
            Ok(json)
        }),
        Err(exc) => Err(interp::attach(|py| {
            let e = tool_error(py, &exc);
            if let Some(c) = &ctx {
                *c.error.lock() = Some(exc);
            }
            e
        })),
    }
}

/// Runs a compensation: `compensate(result, *args, **kwargs)` with the live output and
/// arguments when this process made the call, else the recorded ones. `None` is a clean undo,
/// a `str` is residue, an exception a failed compensation.
async fn run_compensation(
    f: PyFn,
    args: Arc<Value>,
    output: Arc<Value>,
    names: Arc<Vec<String>>,
    handle: Option<CallHandle>,
    ctx: Option<Arc<CallCtx>>,
) -> Result<Compensation, ToolError> {
    let wants = f.wants_id;
    let build: ArgBuilder = Box::new(move |py| {
        let live = handle.as_ref().and_then(LiveCall::of).and_then(|l| {
            let out = l.output.lock().as_ref().map(|o| o.clone_ref(py))?;
            Some((out, l.args.clone_ref(py), l.kwargs.as_ref().map(|k| k.clone_ref(py)), l.call_id.clone()))
        });
        let (out, a, k, id) = match live {
            Some(l) => l,
            None => {
                let (a, k, id) = unbind_args(py, &args, &names)?;
                (to_py(py, &output)?.unbind(), a.unbind(), Some(k.unbind()), id)
            }
        };
        let mut items = vec![out.into_bound(py)];
        items.extend(a.bind(py).iter());
        Ok((PyTuple::new(py, items)?.unbind(), with_call_id(py, k, id.as_deref(), wants)?))
    });
    match invoke(f.f, f.is_async, build, ctx.clone()).await {
        Ok(v) => interp::attach(|py| {
            let v = v.bind(py);
            match v.extract::<String>() {
                Ok(residue) => Ok(Compensation::with_residue(residue)),
                Err(_) => Ok(Compensation::clean()),
            }
        }),
        Err(exc) => Err(interp::attach(|py| {
            let e = ToolError::unknown(format!("compensation raised {}", describe(py, &exc)));
            if let Some(c) = &ctx {
                *c.error.lock() = Some(exc);
            }
            e
        })),
    }
}

/// The in-process compensation of a tool declared with a descriptor: the descriptor's
/// arguments resolved against the recorded call (as the plan executor resolves them), sent to
/// this engine's handler for its capability with the compensation key of the forward key (or
/// the descriptor's own). The forward key is the call's idempotency key (a recovery in a later
/// process reads it from the ledger), else the engine's derived `<tool>:<tx>:<effect>`
/// (docs/plans.md).
async fn compensate_by_capability(
    desc: Descriptor,
    caps: Caps,
    tool: String,
    engine: tidegate_runtime::CallCtx,
    args: Arc<Value>,
    output: Arc<Value>,
    ctx: Option<Arc<CallCtx>>,
) -> Result<Compensation, ToolError> {
    let forward_key = match &engine.key {
        Some(k) => k.to_string(),
        None => format!("{tool}:{}:{}", engine.tx.0, engine.effect.0),
    };
    let resolved = resolve_args(&desc.args, &args, Some(&output))
        .map_err(|e| ToolError::failed(format!("the compensation descriptor of tool `{tool}`: {e}")))?;
    let Some(handler) = caps.read().get(&desc.capability).cloned() else {
        return Err(ToolError::failed(format!(
            "no handler for capability `{}` (the compensation of tool `{tool}`) is registered on this engine: \
             register one with @tg.capability({:?})",
            desc.capability, desc.capability
        )));
    };
    let request = DispatchRequest {
        capability: desc.capability.clone(),
        operation: Operation::Compensate,
        tool,
        key: desc.key_for(&forward_key),
        args: Arc::new(resolved),
        output: Some(output),
    };
    match run_capability(handler, request, ctx).await {
        CallOutcome::Done { residue: Some(r), .. } => Ok(Compensation::with_residue(r)),
        CallOutcome::Done { .. } => Ok(Compensation::clean()),
        CallOutcome::NotApplied { message, retry: false } => Err(ToolError::failed(message)),
        CallOutcome::NotApplied { message, retry: true } => Err(ToolError::transient(message)),
        CallOutcome::Unknown { message } => Err(ToolError::unknown(message)),
    }
}

/// Runs a probe: `True` / `Happened(output)` happened, `False` did not, `None` (or an
/// exception) still unknown.
///
/// A release whose call raised and whose probe says it happened is fired with the probe's
/// output, so that output joins the commit's released outputs in the release's place (the
/// caller's `Held` acknowledgements take them in order). A probe of an eager call runs in
/// that call's own context, whose released outputs nothing reads.
async fn run_probe(f: PyFn, args: Arc<Value>, names: Arc<Vec<String>>, ctx: Option<Arc<CallCtx>>) -> Probe {
    let wants = f.wants_id;
    let build: ArgBuilder = Box::new(move |py| {
        let (a, k, id) = unbind_args(py, &args, &names)?;
        Ok((a.unbind(), with_call_id(py, Some(k.unbind()), id.as_deref(), wants)?))
    });
    match invoke(f.f, f.is_async, build, ctx.clone()).await {
        Ok(v) => interp::attach(|py| {
            let v = v.bind(py);
            if v.is_none() {
                return Probe::Unknown;
            }
            let happened = |out: Bound<'_, PyAny>| {
                let json = output_to_json(&out);
                if let Some(c) = &ctx {
                    c.released.lock().push(out.unbind());
                }
                Probe::Happened(json)
            };
            if let Ok(out) = v.getattr("_tidegate_happened") {
                return happened(out);
            }
            match v.is_truthy() {
                Ok(true) => happened(py.None().into_bound(py)),
                Ok(false) => Probe::DidNotHappen,
                Err(_) => Probe::Unknown,
            }
        }),
        Err(_) => Probe::Unknown,
    }
}
