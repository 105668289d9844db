//! `tidegate._native`: the PyO3 binding of the Tidegate engine. The pure-Python package
//! `tidegate` wraps it; see `python/docs/DESIGN.md`.
//!
//! Threading: the binding owns one tokio runtime per process. Sync methods release the
//! interpreter (`Python::detach`) and drive the engine's future on the calling thread; the
//! engine calls Python callbacks on that same thread, re-attaching. Async methods spawn the
//! future on the runtime and resolve an asyncio future through `call_soon_threadsafe`.

mod calls;
mod convert;
mod errors;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use serde_json::Value;
use tidegate_core::scope::{CaseRule, PathStyle, ScopeRule};
use tidegate_runtime::{
    Ack, CallOptions, CommitOptions, Compensation, EffectClass, Error, Ordering, Outcome, Probe, RetryPolicy,
    ScopeRegistry, Speculation, Tidegate, Tool, ToolError, Transaction, TxOptions, TxState,
};

use crate::calls::{Aio, ArgBuilder, CTX, CallCtx, PyHook, bridge, current, describe, invoke, is_error};
use crate::convert::{bind_args, output_to_json, to_json, to_py, unbind_args};
use crate::errors::{invalid, to_pyerr};

static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();

fn runtime(py: Python<'_>) -> PyResult<&'static tokio::runtime::Runtime> {
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tidegate")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    rt.as_ref().map_err(|e| errors::invalid(py, "runtime", e, "a tokio runtime that can start"))
}

/// Runs an engine future on the calling thread with the interpreter released.
fn block<F: Future + Send>(py: Python<'_>, ctx: Arc<CallCtx>, fut: F) -> PyResult<F::Output>
where
    F::Output: Send,
{
    let rt = runtime(py)?;
    Ok(py.detach(|| rt.block_on(CTX.scope(ctx, fut))))
}

/// Runs an engine future on the calling thread keeping the interpreter attached. Only for
/// operations that never wait for another thread that may need the interpreter (an eager call
/// on an in-memory engine: its only waits are the tool itself and retry backoff).
fn block_attached<F: Future>(py: Python<'_>, ctx: Arc<CallCtx>, fut: F) -> PyResult<F::Output> {
    let rt = runtime(py)?;
    Ok(rt.block_on(CTX.scope(ctx, fut)))
}

/// Spawns an engine future for an asyncio caller and resolves `future` on `event_loop`.
fn spawn<F, T, C>(py: Python<'_>, ctx: Arc<CallCtx>, fut: F, finish: C, future: Py<PyAny>) -> PyResult<()>
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
        Python::attach(|py| {
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

fn aio_ctx(event_loop: Py<PyAny>, context: Py<PyAny>) -> CallCtx {
    CallCtx { aio: Some(Aio { event_loop, context }), ..CallCtx::default() }
}

fn parse_class(py: Python<'_>, effect: &str) -> PyResult<EffectClass> {
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

fn duration(py: Python<'_>, field: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid(py, field, &seconds.to_string(), "a non-negative number of seconds"))
}

fn outcome_to_py(py: Python<'_>, o: &Outcome) -> PyResult<Py<PyAny>> {
    let v = serde_json::to_value(o).unwrap_or_default();
    Ok(to_py(py, &v)?.unbind())
}

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

/// Live Python objects of an executed call, for its compensation (keyed by the address of
/// the output the engine holds; the `Arc` is kept so the address cannot be reused).
struct Side {
    _keep: Arc<Value>,
    output: Py<PyAny>,
    args: Py<PyTuple>,
    kwargs: Option<Py<PyDict>>,
}

#[derive(Default)]
struct Shared {
    side: Mutex<HashMap<usize, Side>>,
}

/// A declared tool registered with one engine.
#[pyclass(frozen, module = "tidegate._native")]
struct ToolHandle {
    tool: Tool,
    names: Arc<Vec<String>>,
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    effect: String,
}

#[pymethods]
impl ToolHandle {
    fn __repr__(&self) -> String {
        format!("<tidegate tool {:?} ({})>", self.name, self.effect)
    }
}

/// The engine: one per `tidegate.open()`.
#[pyclass(frozen, module = "tidegate._native")]
struct Engine {
    tg: RwLock<Option<Tidegate>>,
    shared: Arc<Shared>,
    /// Whether the ledger is durable (calls then wait for syncs: release the interpreter).
    durable: bool,
}

impl Engine {
    fn tg(&self, py: Python<'_>) -> PyResult<Tidegate> {
        self.tg.read().clone().ok_or_else(|| to_pyerr(py, &Error::Store(tidegate_storage::StoreError::Closed), None))
    }
}

fn registry() -> ScopeRegistry {
    let mut reg = ScopeRegistry::default();
    // Scopes of tools without a declared scope (LangGraph tools run undeclared).
    let _ = reg.register("tool", ScopeRule { style: PathStyle::Colon, case: CaseRule::Sensitive });
    reg
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (data_dir=None, lease=30.0, first_committer_wins=false, retry_attempts=4, retry_backoff=0.02))]
    fn new(
        py: Python<'_>,
        data_dir: Option<PathBuf>,
        lease: f64,
        first_committer_wins: bool,
        retry_attempts: u32,
        retry_backoff: f64,
    ) -> PyResult<Engine> {
        let lease_d = duration(py, "lease", lease)?;
        if lease_d.is_zero() {
            return Err(invalid(py, "lease", &lease.to_string(), "a positive number of seconds"));
        }
        if retry_attempts == 0 {
            return Err(invalid(py, "retry_attempts", "0", "at least 1"));
        }
        let backoff = duration(py, "retry_backoff", retry_backoff)?;
        let rt = runtime(py)?;
        let _guard = rt.enter();
        let mut b = Tidegate::builder()
            .lease(lease_d)
            .scopes(registry())
            .ordering(if first_committer_wins { Ordering::FirstCommitterWins } else { Ordering::EpochOrder })
            .retry(RetryPolicy {
                attempts: retry_attempts,
                initial_backoff: backoff,
                max_backoff: backoff.max(Duration::from_secs(1)),
            });
        if let Some(dir) = &data_dir {
            let store = py
                .detach(|| tidegate_sqlite::SqliteStore::open(dir))
                .map_err(|e| to_pyerr(py, &Error::Store(e), None))?;
            b = b.store(Arc::new(store));
        }
        let tg = b.build().map_err(|e| to_pyerr(py, &e, None))?;
        tg.spawn_reaper();
        Ok(Engine { tg: RwLock::new(Some(tg)), shared: Arc::default(), durable: data_dir.is_some() })
    }

    /// Declares a tool with this engine. All arguments are validated before anything is
    /// registered.
    #[pyo3(signature = (name, effect, call, names, call_async=false, compensate=None, compensate_async=false, probe=None, probe_async=false))]
    #[allow(clippy::too_many_arguments)]
    fn tool(
        &self,
        py: Python<'_>,
        name: String,
        effect: &str,
        call: Py<PyAny>,
        names: Vec<String>,
        call_async: bool,
        compensate: Option<Py<PyAny>>,
        compensate_async: bool,
        probe: Option<Py<PyAny>>,
        probe_async: bool,
    ) -> PyResult<ToolHandle> {
        let class = parse_class(py, effect)?;
        if !call.bind(py).is_callable() {
            return Err(invalid(py, "call", &repr(call.bind(py)), "a callable"));
        }
        if let Some(c) = &compensate
            && !c.bind(py).is_callable()
        {
            return Err(invalid(py, "compensate", &repr(c.bind(py)), "a callable or None"));
        }
        if let Some(p) = &probe
            && !p.bind(py).is_callable()
        {
            return Err(invalid(py, "probe", &repr(p.bind(py)), "a callable or None"));
        }
        let tg = self.tg(py)?;
        let names = Arc::new(names);
        let call = Arc::new(call);
        let tool_name = name.clone();
        let n1 = names.clone();
        let mut builder = Tool::builder(name.clone(), class)
            // Scopes are computed by the binding and passed with every call.
            .scope(move |_| format!("tool:{tool_name}"))
            .call(move |args: Arc<Value>| {
                let ctx = current();
                let f = call.clone();
                let names = n1.clone();
                async move { run_call(f, call_async, args, names, ctx).await }
            });
        if let Some(comp) = compensate {
            let comp = Arc::new(comp);
            let shared = self.shared.clone();
            let names = names.clone();
            builder = builder.compensate(move |args: Arc<Value>, output: Arc<Value>| {
                let ctx = current();
                let f = comp.clone();
                let shared = shared.clone();
                let names = names.clone();
                async move { run_compensation(f, compensate_async, args, output, names, shared, ctx).await }
            });
        }
        if let Some(p) = probe {
            let p = Arc::new(p);
            let names = names.clone();
            builder = builder.probe(move |args: Arc<Value>| {
                let ctx = current();
                let f = p.clone();
                let names = names.clone();
                async move { run_probe(f, probe_async, args, names, ctx).await }
            });
        }
        let tool = builder.build().map_err(|e| to_pyerr(py, &e, None))?;
        tg.register(&tool).map_err(|e| to_pyerr(py, &e, None))?;
        Ok(ToolHandle { tool, names, name, effect: effect.to_owned() })
    }

    /// Begins a transaction.
    #[pyo3(signature = (agent="agent", may_touch=None, lease=None))]
    fn begin(&self, py: Python<'_>, agent: &str, may_touch: Option<Vec<String>>, lease: Option<f64>) -> PyResult<Tx> {
        let tg = self.tg(py)?;
        let mut opts = TxOptions::agent(agent);
        opts.may_touch = may_touch;
        if let Some(l) = lease {
            opts.lease = Some(duration(py, "lease", l)?);
        }
        let tx = tg.begin_with(opts).map_err(|e| to_pyerr(py, &e, None))?;
        Ok(Tx { tx, shared: self.shared.clone(), side_keys: Mutex::new(Vec::new()), durable: self.durable })
    }

    /// Begins a speculation group of `branches` transactions sharing one epoch.
    #[pyo3(signature = (branches, agent="agent", may_touch=None))]
    fn speculate(
        &self,
        py: Python<'_>,
        branches: usize,
        agent: &str,
        may_touch: Option<Vec<String>>,
    ) -> PyResult<Spec> {
        if branches == 0 {
            return Err(invalid(py, "branches", "0", "at least one branch"));
        }
        let tg = self.tg(py)?;
        let mut opts = TxOptions::agent(agent);
        opts.may_touch = may_touch;
        let spec = tg.speculate(opts, branches).map_err(|e| to_pyerr(py, &e, None))?;
        Ok(Spec { spec, shared: self.shared.clone(), durable: self.durable })
    }

    /// Finishes what a previous process left unfinished (register every tool first).
    fn recover(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let tg = self.tg(py)?;
        let ctx = Arc::new(CallCtx::default());
        let report = block(py, ctx.clone(), async move { tg.recover().await })?
            .map_err(|e| to_pyerr(py, &e, ctx.error.lock().take()))?;
        let d = PyDict::new(py);
        let pairs = |v: &[(tidegate_runtime::TxId, tidegate_runtime::EffectId)]| {
            v.iter().map(|(t, e)| (t.0, e.0)).collect::<Vec<_>>()
        };
        d.set_item("events", report.events)?;
        d.set_item("unfinished", report.unfinished)?;
        d.set_item("probed_happened", pairs(&report.probed_happened))?;
        d.set_item("probed_not_happened", pairs(&report.probed_not_happened))?;
        d.set_item("unresolved", pairs(&report.unresolved))?;
        d.set_item("commits_resumed", report.commits_resumed.iter().map(|t| t.0).collect::<Vec<_>>())?;
        d.set_item("aborts_resumed", report.aborts_resumed.iter().map(|t| t.0).collect::<Vec<_>>())?;
        d.set_item("expired", report.expired.iter().map(|t| t.0).collect::<Vec<_>>())?;
        d.set_item("orphans", report.orphans.iter().map(|t| t.0).collect::<Vec<_>>())?;
        Ok(d.into_any().unbind())
    }

    /// The committed version of a scope.
    fn version(&self, py: Python<'_>, scope: &str) -> PyResult<u64> {
        self.tg(py)?.version(scope).map(|v| v.0).map_err(|e| to_pyerr(py, &e, None))
    }

    /// Monitoring counters.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = serde_json::to_value(self.tg(py)?.stats()).unwrap_or_default();
        Ok(to_py(py, &v)?.unbind())
    }

    /// The engine's integrity check; raises `TidegateError` naming the violated invariant.
    fn check_integrity(&self, py: Python<'_>) -> PyResult<()> {
        self.tg(py)?.check_integrity().map_err(|msg| {
            let e = Error::InvalidArgument {
                field: "engine state",
                value: msg,
                expected: "the engine's invariants to hold",
            };
            to_pyerr(py, &e, None)
        })
    }

    /// Adds a pre-commit hook run on every transaction.
    #[pyo3(signature = (name, hook, is_async=false))]
    fn add_hook(&self, py: Python<'_>, name: String, hook: Py<PyAny>, is_async: bool) -> PyResult<()> {
        if !hook.bind(py).is_callable() {
            return Err(invalid(py, "hook", &repr(hook.bind(py)), "a callable"));
        }
        self.tg(py)?.add_hook(Arc::new(PyHook { name, f: Arc::new(hook), is_async }));
        Ok(())
    }

    /// Drops this handle's reference to the engine (the store closes once no transaction
    /// holds it any more).
    fn close(&self) {
        self.tg.write().take();
    }
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unrepresentable>".to_owned())
}

fn tool_error(py: Python<'_>, exc: &Py<PyAny>) -> ToolError {
    let msg = describe(py, exc);
    if is_error(py, exc, "TransientError") {
        ToolError::transient(msg)
    } else if is_error(py, exc, "OutcomeUnknown") {
        ToolError::unknown(msg)
    } else {
        ToolError::failed(msg)
    }
}

async fn run_call(
    f: Arc<Py<PyAny>>,
    is_async: bool,
    args: Arc<Value>,
    names: Arc<Vec<String>>,
    ctx: Option<Arc<CallCtx>>,
) -> Result<Value, ToolError> {
    let live = ctx.as_ref().and_then(|c| {
        c.live.as_ref().map(|(a, k)| Python::attach(|py| (a.clone_ref(py), k.as_ref().map(|k| k.clone_ref(py)))))
    });
    let is_release = live.is_none();
    let build: ArgBuilder = Box::new(move |py| match live {
        Some(l) => Ok(l),
        None => {
            let (a, k) = unbind_args(py, &args, &names)?;
            Ok((a.unbind(), Some(k.unbind())))
        }
    });
    match invoke(f, is_async, build, ctx.clone()).await {
        Ok(out) => Python::attach(|py| {
            let json = output_to_json(out.bind(py));
            if let Some(c) = &ctx {
                if is_release {
                    c.released.lock().push((String::new(), out));
                } else {
                    *c.output.lock() = Some(out);
                }
            }
            Ok(json)
        }),
        Err(exc) => Err(Python::attach(|py| {
            let e = tool_error(py, &exc);
            if let Some(c) = &ctx {
                *c.error.lock() = Some(exc);
            }
            e
        })),
    }
}

async fn run_compensation(
    f: Arc<Py<PyAny>>,
    is_async: bool,
    args: Arc<Value>,
    output: Arc<Value>,
    names: Arc<Vec<String>>,
    shared: Arc<Shared>,
    ctx: Option<Arc<CallCtx>>,
) -> Result<Compensation, ToolError> {
    let build: ArgBuilder = Box::new(move |py| {
        let key = Arc::as_ptr(&output) as usize;
        let side = shared
            .side
            .lock()
            .get(&key)
            .map(|s| (s.output.clone_ref(py), s.args.clone_ref(py), s.kwargs.as_ref().map(|k| k.clone_ref(py))));
        let (out, a, k) = match side {
            Some(s) => s,
            None => {
                let (a, k) = unbind_args(py, &args, &names)?;
                (to_py(py, &output)?.unbind(), a.unbind(), Some(k.unbind()))
            }
        };
        let mut items = vec![out.into_bound(py)];
        items.extend(a.bind(py).iter());
        Ok((PyTuple::new(py, items)?.unbind(), k))
    });
    match invoke(f, is_async, build, ctx.clone()).await {
        Ok(v) => Python::attach(|py| {
            let v = v.bind(py);
            match v.extract::<String>() {
                Ok(residue) => Ok(Compensation::with_residue(residue)),
                Err(_) => Ok(Compensation::clean()),
            }
        }),
        Err(exc) => Err(Python::attach(|py| {
            let e = ToolError::failed(format!("compensation raised {}", describe(py, &exc)));
            if let Some(c) = &ctx {
                *c.error.lock() = Some(exc);
            }
            e
        })),
    }
}

async fn run_probe(
    f: Arc<Py<PyAny>>,
    is_async: bool,
    args: Arc<Value>,
    names: Arc<Vec<String>>,
    ctx: Option<Arc<CallCtx>>,
) -> Probe {
    let build: ArgBuilder = Box::new(move |py| {
        let (a, k) = unbind_args(py, &args, &names)?;
        Ok((a.unbind(), Some(k.unbind())))
    });
    match invoke(f, is_async, build, ctx).await {
        Ok(v) => Python::attach(|py| {
            let v = v.bind(py);
            if v.is_none() {
                return Probe::Unknown;
            }
            if let Ok(out) = v.getattr("_tidegate_happened") {
                return Probe::Happened(output_to_json(&out));
            }
            match v.is_truthy() {
                Ok(true) => Probe::Happened(Value::Null),
                Ok(false) => Probe::DidNotHappen,
                Err(_) => Probe::Unknown,
            }
        }),
        Err(_) => Probe::Unknown,
    }
}

/// A transaction.
#[pyclass(frozen, module = "tidegate._native")]
struct Tx {
    tx: Transaction,
    shared: Arc<Shared>,
    side_keys: Mutex<Vec<usize>>,
    durable: bool,
}

impl Tx {
    fn forget_side(&self) {
        let keys = std::mem::take(&mut *self.side_keys.lock());
        if keys.is_empty() {
            return;
        }
        let mut side = self.shared.side.lock();
        for k in keys {
            side.remove(&k);
        }
    }

    fn prepare_call(
        &self,
        py: Python<'_>,
        handle: &ToolHandle,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        scopes: Vec<String>,
        key: Option<String>,
    ) -> PyResult<(Value, CallOptions)> {
        let json = bind_args(args, kwargs, &handle.names).map_err(|e| {
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
        Ok((json, CallOptions { key, scopes: Some(scopes) }))
    }

    fn finish_call(&self, py: Python<'_>, ack: Result<Ack, Error>, ctx: &CallCtx) -> PyResult<Py<PyAny>> {
        match ack {
            Ok(Ack::Executed { effect, output }) => {
                let live = ctx.output.lock().take();
                let out = match live {
                    Some(o) => o,
                    None => to_py(py, &output)?.unbind(),
                };
                if let Some((a, k)) = &ctx.live {
                    let key = Arc::as_ptr(&output) as usize;
                    self.shared.side.lock().insert(
                        key,
                        Side {
                            _keep: output.clone(),
                            output: out.clone_ref(py),
                            args: a.clone_ref(py),
                            kwargs: k.as_ref().map(|k| k.clone_ref(py)),
                        },
                    );
                    self.side_keys.lock().push(key);
                }
                Ok((0u8, effect.0, out).into_pyobject(py)?.into_any().unbind())
            }
            Ok(Ack::Staged { effect }) => Ok((1u8, effect.0, py.None()).into_pyobject(py)?.into_any().unbind()),
            Ok(Ack::Queued { effect }) => Ok((2u8, effect.0, py.None()).into_pyobject(py)?.into_any().unbind()),
            Ok(Ack::Replayed { effect, output }) => {
                Ok((3u8, effect.0, to_py(py, &output)?).into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => {
                if e.outcome().is_some() {
                    self.forget_side();
                }
                Err(to_pyerr(py, &e, ctx.error.lock().take()))
            }
        }
    }

    fn finish_settle(&self, py: Python<'_>, r: Result<Outcome, Error>, ctx: &CallCtx) -> PyResult<Py<PyAny>> {
        self.forget_side();
        match r {
            Ok(o) => {
                let released: Vec<Py<PyAny>> = ctx.released.lock().drain(..).map(|(_, o)| o).collect();
                Ok((outcome_to_py(py, &o)?, released).into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }
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

    /// Calls a tool through the engine. Returns `(kind, effect, output)` with kind 0 executed,
    /// 1 staged, 2 queued, 3 replayed.
    #[pyo3(signature = (handle, args, kwargs, scopes, key=None))]
    fn call(
        &self,
        py: Python<'_>,
        handle: &ToolHandle,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        scopes: Vec<String>,
        key: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let (json, opts) = self.prepare_call(py, handle, args, kwargs, scopes, key)?;
        let ctx = Arc::new(CallCtx {
            live: Some((args.clone().unbind(), kwargs.map(|k| k.clone().unbind()))),
            ..CallCtx::default()
        });
        let tx = self.tx.clone();
        let tool = handle.tool.clone();
        let fut = async move { tx.call_with(&tool, json, opts).await };
        let ack = if self.durable { block(py, ctx.clone(), fut)? } else { block_attached(py, ctx.clone(), fut)? };
        self.finish_call(py, ack, &ctx)
    }

    /// The asyncio form of `call`: resolves `future` on `event_loop`.
    #[pyo3(signature = (handle, args, kwargs, scopes, key, event_loop, context, future))]
    #[allow(clippy::too_many_arguments)]
    fn call_async(
        slf: Bound<'_, Self>,
        handle: &ToolHandle,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        scopes: Vec<String>,
        key: Option<String>,
        event_loop: Py<PyAny>,
        context: Py<PyAny>,
        future: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (json, opts) = this.prepare_call(py, handle, args, kwargs, scopes, key)?;
        let mut ctx = aio_ctx(event_loop, context);
        ctx.live = Some((args.clone().unbind(), kwargs.map(|k| k.clone().unbind())));
        let ctx = Arc::new(ctx);
        let tx = this.tx.clone();
        let tool = handle.tool.clone();
        let me = slf.unbind();
        spawn(
            py,
            ctx,
            async move { tx.call_with(&tool, json, opts).await },
            move |py, ack, ctx| me.get().finish_call(py, ack, ctx),
            future,
        )
    }

    /// Freezes the footprint.
    fn seal(&self, py: Python<'_>) -> PyResult<()> {
        self.tx.seal().map_err(|e| to_pyerr(py, &e, None))
    }

    /// Seals (if open) and commits. Returns `(outcome, released outputs)`.
    #[pyo3(signature = (wait_timeout=None))]
    fn commit(&self, py: Python<'_>, wait_timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let opts = CommitOptions { wait_timeout: wait_timeout.map(|t| duration(py, "wait_timeout", t)).transpose()? };
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
        let opts = CommitOptions { wait_timeout: wait_timeout.map(|t| duration(py, "wait_timeout", t)).transpose()? };
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

    /// Aborts: compensates executed effects in reverse order, drops held ones. Returns
    /// `(outcome, [])`.
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
        if !hook.bind(py).is_callable() {
            return Err(invalid(py, "hook", &repr(hook.bind(py)), "a callable"));
        }
        self.tx.add_hook(Arc::new(PyHook { name, f: Arc::new(hook), is_async }));
        Ok(())
    }
}

async fn commit(tx: Transaction, opts: CommitOptions) -> Result<Outcome, Error> {
    if tx.state()? == TxState::Open {
        tx.seal()?;
    }
    tx.commit_with(opts).await
}

/// A speculation group.
#[pyclass(frozen, module = "tidegate._native")]
struct Spec {
    spec: Speculation,
    shared: Arc<Shared>,
    durable: bool,
}

#[pymethods]
impl Spec {
    /// The branches, one transaction each.
    fn branches(&self) -> Vec<Tx> {
        self.spec
            .branches()
            .iter()
            .map(|t| Tx {
                tx: t.clone(),
                shared: self.shared.clone(),
                side_keys: Mutex::new(Vec::new()),
                durable: self.durable,
            })
            .collect()
    }

    /// Chooses branch `winner` (an index), aborts the others, commits the winner.
    /// Returns `(winner outcome, [loser outcomes], released outputs)`.
    fn commit(&self, py: Python<'_>, winner: usize) -> PyResult<Py<PyAny>> {
        let Some(w) = self.spec.branches().get(winner).map(Transaction::id) else {
            return Err(invalid(
                py,
                "winner",
                &winner.to_string(),
                &format!("a branch index below {}", self.spec.branches().len()),
            ));
        };
        let ctx = Arc::new(CallCtx::default());
        let spec = self.spec.clone();
        let r = block(py, ctx.clone(), async move { spec.commit_winner(w).await })?;
        match r {
            Ok(o) => {
                let losers = o.losers.iter().map(|l| outcome_to_py(py, l)).collect::<PyResult<Vec<_>>>()?;
                let released: Vec<Py<PyAny>> = ctx.released.lock().drain(..).map(|(_, o)| o).collect();
                Ok((outcome_to_py(py, &o.winner)?, losers, released).into_pyobject(py)?.into_any().unbind())
            }
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }

    /// Aborts every branch. Returns their outcomes.
    fn abort(&self, py: Python<'_>, reason: String) -> PyResult<Vec<Py<PyAny>>> {
        let ctx = Arc::new(CallCtx::default());
        let spec = self.spec.clone();
        let r = block(py, ctx.clone(), async move { spec.abort(reason).await })?;
        match r {
            Ok(outs) => outs.iter().map(|o| outcome_to_py(py, o)).collect(),
            Err(e) => Err(to_pyerr(py, &e, ctx.error.lock().take())),
        }
    }
}

/// Converts a Python value to JSON, or raises `InvalidArgument` naming `field`.
#[pyfunction]
fn check_json(py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    to_json(value).map(|_| ()).map_err(|e| {
        invalid(py, field, &format!("{} = <{}>", if e.path.is_empty() { "value" } else { &e.path }, e.type_name), e.why)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Tx>()?;
    m.add_class::<Spec>()?;
    m.add_class::<ToolHandle>()?;
    m.add_class::<calls::Completion>()?;
    m.add_function(wrap_pyfunction!(check_json, m)?)?;
    Ok(())
}
