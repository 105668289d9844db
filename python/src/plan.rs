//! Plans (docs/plans.md) for Python: the `Plan` handle, plan views, and capability handlers.
//!
//! ```text
//!  Engine.plan(owner, deadline, …) ─► Tidegate::plan ─► Plan (this module's pyclass)
//!  Plan.begin(…)                    ─► Plan::begin    ─► Tx (a step; calls carry the tool's descriptor)
//!  Engine.capability(name, fn)      ─► Caps (for in-process aborts of descriptor tools, tool.rs)
//!                                   └► Tidegate::capability (for the plan executor)
//! ```
//!
//! Every plan operation has one method for both callers: without `aio` it drives the engine's
//! future on the calling thread and returns the value; with `aio = (event_loop, context,
//! future)` it spawns the future and resolves `future` on the caller's loop (returns `None`).
//!
//! The executor runs compensations and probes on the runtime's blocking pool, outside any
//! caller's operation: a handler is called inline there (a coroutine function on a private
//! event loop, `_bridge.run_blocking`), never on an asyncio caller's loop, which may be gone.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use serde_json::{Value, json};
use tidegate_runtime::plans::{Forward, Operation, PlanView, Status};
use tidegate_runtime::{CallOutcome, Choice, DispatchRequest, Error, PlanDetail, Predicate, TxId, TxOptions};

use crate::calls::{ArgBuilder, CallCtx, describe, invoke, is_error};
use crate::convert::{output_to_json, to_json, to_py};
use crate::engine::duration;
use crate::errors::{invalid, to_pyerr};
use crate::interp;
use crate::rt::{aio_ctx, block, spawn};
use crate::tool::PyFn;
use crate::tx::Tx;

/// The capability handlers registered on one engine, by name.
pub(crate) type Caps = Arc<RwLock<HashMap<String, PyFn>>>;

/// An asyncio caller's `(event_loop, context, future)`.
pub(crate) type AioArgs = (Py<PyAny>, Py<PyAny>, Py<PyAny>);

/// Drives an engine future for a sync caller (returns `finish`'s value) or an asyncio one
/// (resolves its future with it; returns `None`).
pub(crate) fn drive<F, T, C>(py: Python<'_>, aio: Option<AioArgs>, fut: F, finish: C) -> PyResult<Py<PyAny>>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    match aio {
        None => {
            let ctx = Arc::new(CallCtx::default());
            match block(py, ctx.clone(), fut)? {
                Ok(v) => finish(py, v),
                Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
            }
        }
        Some((event_loop, context, future)) => {
            let ctx = Arc::new(aio_ctx(event_loop, context));
            spawn(
                py,
                ctx,
                fut,
                move |py, r, ctx| match r {
                    Ok(v) => finish(py, v),
                    Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
                },
                future,
            )?;
            Ok(py.None())
        }
    }
}

/// Parses the `triggers` of `Engine.plan` (or one predicate of `Plan.arm`, `field`).
pub(crate) fn predicate(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<Predicate> {
    let json = to_json(value).map_err(|e| {
        invalid(py, field, &format!("<{}> at {}", e.type_name, if e.path.is_empty() { "top" } else { &e.path }), e.why)
    })?;
    serde_json::from_value::<Predicate>(json.clone()).map_err(|e| {
        invalid(
            py,
            field,
            &short(&json.to_string()),
            &format!(
                "a predicate: {{\"tagged\": {{\"tx\", \"effect\", \"tag\"}}}}, {{\"compensated\": {{\"plan\", \"seq\"?}}}}, \
                 {{\"no_commit\": {{\"scope\", \"before_ms\"}}}}, or {{\"all\"|\"any\": [...]}}, {{\"not\": ...}} ({e})"
            ),
        )
    })
}

fn short(s: &str) -> String {
    if s.chars().count() <= 200 { s.to_owned() } else { format!("{}…", s.chars().take(200).collect::<String>()) }
}

fn forward_name(f: Forward) -> &'static str {
    match f {
        Forward::Pending => "pending",
        Forward::Externalised => "externalised",
        Forward::NotApplied => "not_applied",
        Forward::InDoubt => "in_doubt",
    }
}

/// A plan's summary as `tidegate.plans.PlanInfo._from_dict` reads it.
fn view_json(v: &PlanView) -> Value {
    let mut out = json!({
        "plan": v.plan,
        "owner": v.owner,
        "steps": v.steps,
        "held": v.held,
        "depth": null,
        "stuck": null,
        "outcome": null,
    });
    let (status, depth, stuck, outcome) = match &v.status {
        Status::Open => ("open", Value::Null, Value::Null, Value::Null),
        Status::Failing { depth } => ("failing", json!(depth), Value::Null, Value::Null),
        Status::Stuck { reason, depth, .. } => {
            ("stuck", json!(depth), serde_json::to_value(reason).unwrap_or_default(), Value::Null)
        }
        Status::Ended(o) => ("ended", Value::Null, Value::Null, serde_json::to_value(o).unwrap_or_default()),
    };
    out["status"] = json!(status);
    out["depth"] = depth;
    out["stuck"] = stuck;
    out["outcome"] = outcome;
    out
}

/// A plan in full as `tidegate.plans.PlanDetail._from_dict` reads it.
fn detail_json(d: &PlanDetail) -> Value {
    let mut out = view_json(&d.view);
    out["deadline_ms"] = json!(d.deadline_ms);
    out["cascade_limit"] = json!(d.cascade_limit);
    out["failure"] = match &d.failure {
        None => Value::Null,
        Some((cause, depth)) => json!({"cause": cause, "depth": depth}),
    };
    out["registrations"] = d
        .registrations
        .iter()
        .map(|r| {
            json!({
                "seq": r.seq,
                "tx": r.tx,
                "effect": r.effect,
                "tool": r.tool,
                "key": r.key,
                "descriptor": r.descriptor,
                "forward": forward_name(r.forward),
                "state": r.state,
                "verdict": r.verdict,
                "attempts": r.attempts,
            })
        })
        .collect();
    out["triggers"] =
        d.triggers.iter().map(|t| json!({"kind": t.kind, "detail": t.detail, "value": t.value})).collect();
    out
}

pub(crate) fn views_to_py(py: Python<'_>, views: &[PlanView]) -> PyResult<Py<PyAny>> {
    let v: Vec<Value> = views.iter().map(view_json).collect();
    Ok(to_py(py, &Value::Array(v))?.unbind())
}

pub(crate) fn detail_to_py(py: Python<'_>, d: Option<&PlanDetail>) -> PyResult<Py<PyAny>> {
    match d {
        Some(d) => Ok(to_py(py, &detail_json(d))?.unbind()),
        None => Ok(py.None()),
    }
}

/// The `CapabilityRequest` a handler gets.
fn request_py<'py>(py: Python<'py>, r: &DispatchRequest) -> PyResult<Bound<'py, PyAny>> {
    let cls = py.import("tidegate.plans")?.getattr("CapabilityRequest")?;
    let kw = PyDict::new(py);
    kw.set_item("capability", &r.capability)?;
    kw.set_item("operation", r.operation.as_str())?;
    kw.set_item("tool", &r.tool)?;
    kw.set_item("key", r.key.to_string())?;
    kw.set_item("args", to_py(py, &r.args)?)?;
    kw.set_item(
        "output",
        match &r.output {
            Some(o) => to_py(py, o)?,
            None => py.None().into_bound(py),
        },
    )?;
    cls.call((), Some(&kw))
}

/// What a handler's return value says. A compensation: `None` done, a `str` done with that
/// residue, anything else done with it as output. A probe: `True` / `Happened(output)`
/// happened, `False` did not, `None` unknown.
fn result_of(operation: Operation, v: &Bound<'_, PyAny>) -> CallOutcome {
    match operation {
        Operation::Probe => {
            if v.is_none() {
                return CallOutcome::unknown("the probe could not tell (returned None)");
            }
            if let Ok(out) = v.getattr("_tidegate_happened") {
                return CallOutcome::done(output_to_json(&out));
            }
            match v.is_truthy() {
                Ok(true) => CallOutcome::done(Value::Null),
                Ok(false) => CallOutcome::not_applied("the probe says it did not take effect", false),
                Err(e) => CallOutcome::unknown(format!("the probe's answer has no truth value: {e}")),
            }
        }
        // A compensation (the only other operation a capability handler is sent).
        _ => {
            if v.is_none() {
                CallOutcome::done(Value::Null)
            } else if let Ok(residue) = v.extract::<String>() {
                CallOutcome::done_with_residue(Value::Null, Some(residue))
            } else {
                CallOutcome::done(output_to_json(v))
            }
        }
    }
}

/// Runs a capability handler for `req`. `NotApplied` and `TransientError` raised say it
/// certainly did not take effect; any other exception that the outcome is unknown.
pub(crate) async fn run_capability(f: PyFn, req: DispatchRequest, ctx: Option<Arc<CallCtx>>) -> CallOutcome {
    let op = req.operation;
    let build: ArgBuilder = Box::new(move |py| {
        let r = request_py(py, &req)?;
        Ok((PyTuple::new(py, [r])?.unbind(), None))
    });
    match invoke(f.f, f.is_async, build, ctx).await {
        Ok(v) => interp::attach(|py| result_of(op, v.bind(py))),
        Err(exc) => interp::attach(|py| {
            let msg = describe(py, &exc);
            if is_error(py, &exc, "NotApplied") {
                CallOutcome::not_applied(msg, false)
            } else if is_error(py, &exc, "TransientError") {
                CallOutcome::not_applied(msg, true)
            } else {
                CallOutcome::unknown(msg)
            }
        }),
    }
}

/// Runs a handler for the plan executor: on the runtime's blocking pool, with no caller.
pub(crate) async fn run_for_executor(f: PyFn, req: DispatchRequest) -> CallOutcome {
    let joined =
        tokio::task::spawn_blocking(move || tokio::runtime::Handle::current().block_on(run_capability(f, req, None)))
            .await;
    joined.unwrap_or_else(|e| CallOutcome::unknown(format!("the capability handler's thread failed: {e}")))
}

/// A plan of an engine (`tidegate.Plan` wraps it).
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Plan {
    pub(crate) plan: tidegate_runtime::Plan,
}

fn choice(py: Python<'_>, s: &str) -> PyResult<Choice> {
    match s {
        "retry" => Ok(Choice::Retry),
        "accept" => Ok(Choice::Accept),
        "unwind" => Ok(Choice::Unwind),
        other => Err(invalid(py, "choice", &format!("{other:?}"), "\"retry\", \"accept\" or \"unwind\"")),
    }
}

fn verdict(py: Python<'_>, s: &str) -> PyResult<tidegate_runtime::plans::Verdict> {
    match s {
        "block" => Ok(tidegate_runtime::plans::Verdict::Block),
        "allow" => Ok(tidegate_runtime::plans::Verdict::Allow),
        other => Err(invalid(py, "verdict", &format!("{other:?}"), "\"block\" or \"allow\"")),
    }
}

fn none(py: Python<'_>, _: ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

#[pymethods]
impl Plan {
    /// The plan's id.
    #[getter]
    fn id(&self) -> u64 {
        self.plan.id()
    }

    /// Begins a transaction as the plan's next step.
    #[pyo3(signature = (agent="agent", may_touch=None, lease=None, aio=None))]
    fn begin(
        &self,
        py: Python<'_>,
        agent: &str,
        may_touch: Option<Vec<String>>,
        lease: Option<f64>,
        aio: Option<AioArgs>,
    ) -> PyResult<Py<PyAny>> {
        let mut opts = TxOptions::agent(agent);
        opts.may_touch = may_touch;
        if let Some(l) = lease {
            opts.lease = Some(duration(py, "lease", l)?);
        }
        let plan = self.plan.clone();
        drive(py, aio, async move { plan.begin(opts).await }, |py, tx| Ok(Py::new(py, Tx::new(tx))?.into_any()))
    }

    /// Commits the plan (retires every held compensation).
    #[pyo3(signature = (aio=None))]
    fn commit(&self, py: Python<'_>, aio: Option<AioArgs>) -> PyResult<Py<PyAny>> {
        let plan = self.plan.clone();
        drive(py, aio, async move { plan.commit().await }, none)
    }

    /// Fails the plan with an explicit signal (the executor unwinds it).
    #[pyo3(signature = (reason, aio=None))]
    fn fail(&self, py: Python<'_>, reason: String, aio: Option<AioArgs>) -> PyResult<Py<PyAny>> {
        let plan = self.plan.clone();
        drive(py, aio, async move { plan.fail(&reason).await }, none)
    }

    /// Posts a compliance verdict (`"block"` or `"allow"`) about effect `effect` of step `tx`.
    #[pyo3(signature = (tx, effect, verdict_, aio=None))]
    fn verdict(
        &self,
        py: Python<'_>,
        tx: u64,
        effect: u32,
        verdict_: &str,
        aio: Option<AioArgs>,
    ) -> PyResult<Py<PyAny>> {
        let v = verdict(py, verdict_)?;
        let plan = self.plan.clone();
        drive(py, aio, async move { plan.verdict(TxId(tx), tidegate_runtime::EffectId(effect), v).await }, none)
    }

    /// Resolves a stuck plan: `"retry"`, `"accept"` or `"unwind"`.
    #[pyo3(signature = (choice_, aio=None))]
    fn resolve(&self, py: Python<'_>, choice_: &str, aio: Option<AioArgs>) -> PyResult<Py<PyAny>> {
        let c = choice(py, choice_)?;
        let plan = self.plan.clone();
        drive(py, aio, async move { plan.resolve(c).await }, none)
    }

    /// Arms a predicate trigger (a JSON predicate, docs/plans.md "Predicates").
    #[pyo3(signature = (predicate_, aio=None))]
    fn arm(&self, py: Python<'_>, predicate_: &Bound<'_, PyAny>, aio: Option<AioArgs>) -> PyResult<Py<PyAny>> {
        let p = predicate(py, "predicate", predicate_)?;
        let plan = self.plan.clone();
        drive(py, aio, async move { plan.arm(p).await }, none)
    }

    /// The plan in full, as a dict.
    fn detail(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let plan = self.plan.clone();
        drive(py, None, async move { plan.detail().await }, |py, d| detail_to_py(py, Some(&d)))
    }

    fn __repr__(&self) -> String {
        format!("<tidegate plan {}>", self.plan.id())
    }
}
