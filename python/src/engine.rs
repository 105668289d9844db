//! `Engine`: one `tidegate_runtime::Tidegate`, built from `tidegate.open(...)`'s options.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tidegate_core::scope::{CaseRule, PathStyle, ScopeRule};
use tidegate_runtime::trace::TraceSink;
use tidegate_runtime::{Error, FileTrace, Isolation, Level, Ordering, RetryPolicy, ScopeRegistry, Tidegate, TxOptions};

use crate::calls::{CallCtx, is_callable};
use crate::errors::{invalid, to_pyerr};
use crate::hooks::PyHook;
use crate::plan::{AioArgs, Caps, Plan, detail_to_py, drive, predicate, run_for_executor, views_to_py};
use crate::rt::{block, runtime};
use crate::spec::Spec;
use crate::tool::{Declared, PyFn, ToolHandle, WantsId, build, parse_class};
use crate::tx::Tx;

/// Trace files of every engine, flushed at interpreter exit (an engine still referenced from
/// a module global is never dropped, so its `FileTrace` would not flush on drop).
static TRACES: Mutex<Vec<Weak<FileTrace>>> = Mutex::new(Vec::new());

/// Flushes every trace file still open (called at interpreter exit).
pub(crate) fn flush_traces() {
    let traces: Vec<Arc<FileTrace>> = TRACES.lock().iter().filter_map(Weak::upgrade).collect();
    for t in traces {
        let _ = t.flush();
    }
}

pub(crate) fn duration(py: Python<'_>, field: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid(py, field, &seconds.to_string(), "a non-negative number of seconds"))
}

/// The scope registry: the engine's built-in types plus `scope_types`, each `(name, style,
/// case)` with style `"colon"` or `"posix"` and case `"sensitive"` or `"insensitive"`.
fn registry(py: Python<'_>, types: Vec<(String, String, String)>) -> PyResult<ScopeRegistry> {
    let mut reg = ScopeRegistry::default();
    for (name, style, case) in types {
        let style = match style.as_str() {
            "colon" => PathStyle::Colon,
            "posix" => PathStyle::Posix,
            other => {
                return Err(invalid(
                    py,
                    "scope_types",
                    &format!("{name:?}: style {other:?}"),
                    "\"colon\" or \"posix\"",
                ));
            }
        };
        let case = match case.as_str() {
            "sensitive" => CaseRule::Sensitive,
            "insensitive" => CaseRule::Insensitive,
            other => {
                return Err(invalid(
                    py,
                    "scope_types",
                    &format!("{name:?}: case {other:?}"),
                    "\"sensitive\" or \"insensitive\"",
                ));
            }
        };
        reg.register(&name, ScopeRule { style, case })
            .map_err(|e| invalid(py, "scope_types", &format!("{name:?}"), &format!("a valid scope type name ({e})")))?;
    }
    Ok(reg)
}

/// A `tidegate.Compensate` descriptor (its dict form) as the engine's `Descriptor`.
fn parse_descriptor(py: Python<'_>, tool: &str, d: &Bound<'_, PyAny>) -> PyResult<tidegate_runtime::Descriptor> {
    let json = crate::convert::to_json(d).map_err(|e| {
        invalid(
            py,
            "compensate",
            &format!(
                "{} = <{}> in the descriptor of tool `{tool}`",
                if e.path.is_empty() { "?" } else { &e.path },
                e.type_name
            ),
            e.why,
        )
    })?;
    let desc: tidegate_runtime::Descriptor = serde_json::from_value(json).map_err(|e| {
        invalid(
            py,
            "compensate",
            &format!("the descriptor of tool `{tool}`"),
            &format!("{{capability, args, key?, probe?, forward_probe?}} ({e})"),
        )
    })?;
    desc.validate()
        .map_err(|e| invalid(py, "compensate", &format!("the descriptor of tool `{tool}`"), &e.to_string()))?;
    Ok(desc)
}

/// Opens the ledger `place` names: a directory (the embedded SQLite ledger) or a store URL
/// (`memory:`, `sqlite:DIR`), read as every front door reads it (`tidegate_runtime::StoreUrl`).
fn open_store(place: &std::path::Path) -> Result<Arc<dyn tidegate_storage::LedgerStore>, Error> {
    let url = match place.to_str() {
        Some(text) => text.parse::<tidegate_runtime::StoreUrl>()?,
        // Not UTF-8: only a directory can be named so.
        None => tidegate_runtime::StoreUrl::sqlite(place),
    };
    Ok(url.open()?.store)
}

/// The engine: one per `tidegate.open()`.
#[pyclass(frozen, module = "tidegate._native")]
pub(crate) struct Engine {
    tg: RwLock<Option<Tidegate>>,
    trace: Option<Arc<FileTrace>>,
    scopes: ScopeRegistry,
    level: Level,
    isolation: Isolation,
    caps: Caps,
}

impl Engine {
    fn tg(&self, py: Python<'_>) -> PyResult<Tidegate> {
        self.tg.read().clone().ok_or_else(|| to_pyerr(py, &Error::Store(tidegate_storage::StoreError::Closed), None))
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (data_dir=None, lease=30.0, first_committer_wins=false, retry_attempts=4, retry_backoff=0.02,
                        level="L4", isolation="serializable", trace=None, scope_types=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        data_dir: Option<PathBuf>,
        lease: f64,
        first_committer_wins: bool,
        retry_attempts: u32,
        retry_backoff: f64,
        level: &str,
        isolation: &str,
        trace: Option<PathBuf>,
        scope_types: Vec<(String, String, String)>,
    ) -> PyResult<Engine> {
        let lease_d = duration(py, "lease", lease)?;
        if lease_d.is_zero() {
            return Err(invalid(py, "lease", &lease.to_string(), "a positive number of seconds"));
        }
        if retry_attempts == 0 {
            return Err(invalid(py, "retry_attempts", "0", "at least 1"));
        }
        let backoff = duration(py, "retry_backoff", retry_backoff)?;
        let level: Level = level.parse().map_err(|e| to_pyerr(py, &Error::Engine(e), None))?;
        let isolation: Isolation = isolation.parse().map_err(|e| to_pyerr(py, &Error::Engine(e), None))?;
        let scopes = registry(py, scope_types)?;
        let rt = runtime(py)?;
        let _guard = rt.enter();
        let mut b = Tidegate::builder()
            .lease(lease_d)
            .scopes(scopes.clone())
            .level(level)
            .isolation(isolation)
            .ordering(if first_committer_wins { Ordering::FirstCommitterWins } else { Ordering::EpochOrder })
            .retry(RetryPolicy {
                attempts: retry_attempts,
                initial_backoff: backoff,
                max_backoff: backoff.max(Duration::from_secs(1)),
            })
            // Settlement runs in tasks of the engine's own: they keep the operation's context
            // (asyncio loop, released outputs, the exception a callback raised).
            .task_scope(Arc::new(|| {
                let ctx = crate::calls::current();
                Box::new(move |fut: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| match ctx {
                    Some(c) => Box::pin(crate::calls::CTX.scope(c, fut))
                        as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
                    None => fut,
                })
            }));
        let trace = match &trace {
            Some(path) => {
                let t = Arc::new(FileTrace::create(path).map_err(|e| {
                    invalid(
                        py,
                        "trace",
                        &format!("{:?}", path.display().to_string()),
                        &format!("a file that can be created ({e})"),
                    )
                })?);
                TRACES.lock().push(Arc::downgrade(&t));
                b = b.trace(t.clone());
                Some(t)
            }
            None => None,
        };
        if let Some(dir) = &data_dir {
            let store = py.detach(|| open_store(dir)).map_err(|e| to_pyerr(py, &e, None))?;
            b = b.store(store);
        }
        let tg = b.build().map_err(|e| to_pyerr(py, &e, None))?;
        tg.spawn_reaper();
        Ok(Engine { tg: RwLock::new(Some(tg)), trace, scopes, level, isolation, caps: Caps::default() })
    }

    /// Declares a tool with this engine. All arguments are validated before anything is
    /// registered. `wants_call_id` says which of (call, compensate, probe) take `call_id`.
    #[pyo3(signature = (name, effect, call, names, call_async=false, compensate=None, compensate_async=false,
                        probe=None, probe_async=false, wants_call_id=(false, false, false), descriptor=None))]
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
        wants_call_id: (bool, bool, bool),
        descriptor: Option<Bound<'_, PyAny>>,
    ) -> PyResult<ToolHandle> {
        let class = parse_class(py, effect)?;
        let descriptor = match &descriptor {
            Some(d) => Some(parse_descriptor(py, &name, d)?),
            None => None,
        };
        if descriptor.is_some() && compensate.is_some() {
            return Err(invalid(
                py,
                "compensate",
                &format!("both a function and a descriptor for tool `{name}`"),
                "one of them: a tidegate.Compensate descriptor or a function",
            ));
        }
        if descriptor.is_some() && class == tidegate_runtime::EffectClass::Gated {
            return Err(invalid(
                py,
                "compensate",
                &format!("a descriptor for gated tool `{name}`"),
                "no compensation: a gated effect is irreversible",
            ));
        }
        is_callable(py, "call", &call, false)?;
        if let Some(c) = &compensate {
            is_callable(py, "compensate", c, true)?;
        }
        if let Some(p) = &probe {
            is_callable(py, "probe", p, true)?;
        }
        let tg = self.tg(py)?;
        let wants = WantsId { call: wants_call_id.0, compensate: wants_call_id.1, probe: wants_call_id.2 };
        let names = Arc::new(names);
        let declared = Declared {
            name: name.clone(),
            class,
            names: names.clone(),
            call: PyFn { f: Arc::new(call), is_async: call_async, wants_id: wants.call },
            compensate: compensate.map(|f| PyFn {
                f: Arc::new(f),
                is_async: compensate_async,
                wants_id: wants.compensate,
            }),
            probe: probe.map(|f| PyFn { f: Arc::new(f), is_async: probe_async, wants_id: wants.probe }),
            descriptor: descriptor.clone(),
            caps: self.caps.clone(),
        };
        let tool = build(declared).map_err(|e| to_pyerr(py, &e, None))?;
        tg.register(&tool).map_err(|e| to_pyerr(py, &e, None))?;
        Ok(ToolHandle { tool, names, wants, name, effect: effect.to_owned(), descriptor })
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
        Ok(Tx::new(tx))
    }

    /// Begins a speculation group of `branches` transactions sharing one epoch.
    #[pyo3(signature = (branches, agent="agent", may_touch=None, lease=None))]
    fn speculate(
        &self,
        py: Python<'_>,
        branches: usize,
        agent: &str,
        may_touch: Option<Vec<String>>,
        lease: Option<f64>,
    ) -> PyResult<Spec> {
        if branches == 0 {
            return Err(invalid(py, "branches", "0", "at least one branch"));
        }
        let tg = self.tg(py)?;
        let mut opts = TxOptions::agent(agent);
        opts.may_touch = may_touch;
        if let Some(l) = lease {
            opts.lease = Some(duration(py, "lease", l)?);
        }
        let spec = tg.speculate(opts, branches).map_err(|e| to_pyerr(py, &e, None))?;
        Spec::new(py, spec)
    }

    /// Registers the handler of capability `name`: the plan executor sends it every
    /// compensation and probe of that name, and a descriptor tool's in-process compensation
    /// (an aborted transaction) runs it. Replaces an earlier handler of the same name.
    #[pyo3(signature = (name, handler, is_async=false))]
    fn capability(&self, py: Python<'_>, name: String, handler: Py<PyAny>, is_async: bool) -> PyResult<()> {
        is_callable(py, "handler", &handler, false)?;
        if name.is_empty() || name.len() > 128 {
            return Err(invalid(py, "name", &format!("{name:?}"), "a capability name of 1 to 128 bytes (UTF-8)"));
        }
        let tg = self.tg(py)?;
        let f = PyFn { f: Arc::new(handler), is_async, wants_id: false };
        self.caps.write().insert(name.clone(), f.clone());
        tg.capability(name, move |req| run_for_executor(f.clone(), req));
        Ok(())
    }

    /// Opens a plan. `deadline` in seconds from now; `triggers` JSON predicates.
    #[pyo3(signature = (owner, deadline=None, cascade_limit=None, triggers=Vec::new(), aio=None))]
    fn plan(
        &self,
        py: Python<'_>,
        owner: String,
        deadline: Option<f64>,
        cascade_limit: Option<u32>,
        triggers: Vec<Bound<'_, PyAny>>,
        aio: Option<AioArgs>,
    ) -> PyResult<Py<PyAny>> {
        let mut opts = tidegate_runtime::PlanOptions::owner(owner);
        if let Some(d) = deadline {
            opts = opts.deadline(duration(py, "deadline", d)?);
        }
        opts.cascade_limit = cascade_limit;
        for (i, t) in triggers.iter().enumerate() {
            opts = opts.trigger(predicate(py, &format!("triggers[{i}]"), t)?);
        }
        let tg = self.tg(py)?;
        drive(py, aio, async move { tg.plan(opts).await }, |py, plan| Ok(Py::new(py, Plan { plan })?.into_any()))
    }

    /// A handle on an existing plan (refused if this engine has none of that id).
    fn plan_by_id(&self, py: Python<'_>, id: u64) -> PyResult<Py<PyAny>> {
        let tg = self.tg(py)?;
        drive(py, None, async move { tg.plan_by_id(id).await }, |py, plan| Ok(Py::new(py, Plan { plan })?.into_any()))
    }

    /// Every plan of this engine (dicts), by id.
    fn plans(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let tg = self.tg(py)?;
        drive(py, None, async move { tg.plan_list().await }, |py, v| views_to_py(py, &v))
    }

    /// One plan in full (a dict), or `None`.
    fn plan_detail(&self, py: Python<'_>, id: u64) -> PyResult<Py<PyAny>> {
        let tg = self.tg(py)?;
        drive(py, None, async move { tg.plan_detail(id).await }, |py, d| detail_to_py(py, d.as_ref()))
    }

    /// The owner-intervention queue: `[(plan id, reason dict)]`.
    fn stuck_plans(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let tg = self.tg(py)?;
        drive(py, None, async move { tg.stuck_plans().await }, |py, v| {
            let v: Vec<serde_json::Value> =
                v.iter().map(|(id, r)| serde_json::json!([id, serde_json::to_value(r).unwrap_or_default()])).collect();
            Ok(crate::convert::to_py(py, &serde_json::Value::Array(v))?.unbind())
        })
    }

    /// The tenant the plan executor serves.
    fn plan_tenant(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.tg(py)?.plan_tenant().to_owned())
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

    /// The canonical form of a scope (how the engine names it), or `InvalidScope`.
    fn canonical_scope(&self, py: Python<'_>, scope: &str) -> PyResult<String> {
        self.scopes.parse(scope).map(|s| s.as_str().to_owned()).map_err(|e| {
            to_pyerr(py, &Error::Engine(tidegate_core::EngineError::Scope { field: "scope".into(), source: e }), None)
        })
    }

    /// Monitoring counters.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = serde_json::to_value(self.tg(py)?.stats()).unwrap_or_default();
        Ok(crate::convert::to_py(py, &v)?.unbind())
    }

    /// The consistency level and isolation strategy the engine runs at.
    fn settings(&self) -> (&'static str, &'static str) {
        let isolation = match self.isolation {
            Isolation::Serializable => "serializable",
            Isolation::SnapshotIsolation => "snapshot",
            Isolation::Pessimistic => "pessimistic",
        };
        (self.level.as_str(), isolation)
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
        is_callable(py, "hook", &hook, false)?;
        self.tg(py)?.add_hook(Arc::new(PyHook { name, f: Arc::new(hook), is_async }));
        Ok(())
    }

    /// Writes buffered operation records to the trace file.
    fn flush_trace(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(t) = &self.trace {
            t.flush().map_err(|e| {
                invalid(py, "trace", &t.path().display().to_string(), &format!("a writable file ({e})"))
            })?;
        }
        Ok(())
    }

    /// Drops this handle's reference to the engine (the store closes once no transaction
    /// holds it any more) and flushes the trace file.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let tg = self.tg.write().take();
        drop(tg);
        self.flush_trace(py)
    }
}
