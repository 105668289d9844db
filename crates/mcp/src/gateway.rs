//! The gateway: the upstreams, the policy bound to their tools, and the engine that governs
//! the calls.
//!
//! Start ([`Gateway::start`]): read the policy → start every upstream and list its tools →
//! check the policy against them ([`Policy::bind`]) → one runtime [`Tool`] per governed
//! upstream tool, whose handlers call the upstream → the engine, built with every tool in
//! place (so that a restart settles what an earlier process left open with the same
//! handlers). Sessions ([`crate::session`]) then drive turns on the engine.
//!
//! A governed tool's ledger name is `<upstream>.<tool>`; what it records as arguments is
//! `{"arguments": <the agent's arguments>, "snapshot": <the snapshot, when the policy takes
//! one>}`, so that a compensation run by a later process still has both.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use tidegate_runtime::{CallCtx, Compensation, EffectClass, Probe, Tidegate, Tool, ToolError};

use crate::attached::{RemoteTool, Server};
use crate::error::GatewayError;
use crate::policy::{CallSpec, Class, DefaultRule, Policy, Rule, SnapshotFailed};
use crate::template::{Inputs, Template, answer_text, result_value};
use crate::upstream::{Called, Upstream};

/// The gateway's own tools.
pub const COMMIT_TOOL: &str = "tidegate_commit";
/// Ends the turn by aborting it.
pub const ABORT_TOOL: &str = "tidegate_abort";
/// Says what the open turn holds.
pub const STATUS_TOOL: &str = "tidegate_status";

/// What the gateway does with one agent-facing tool.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Registers its scopes as reads, then calls the upstream.
    Read {
        /// Scope templates.
        scopes: Vec<Template>,
    },
    /// An effect through the engine.
    Effect(Box<EffectTool>),
    /// Never called.
    Refused(String),
}

/// A governed effect tool.
#[derive(Debug, Clone)]
pub struct EffectTool {
    /// The runtime tool.
    pub tool: Tool,
    /// Its class.
    pub class: EffectClass,
    /// Scope templates (an undeclared tool held by `default = "gated"` has one fixed scope).
    pub scopes: Vec<Template>,
    /// Key template.
    pub key: Option<Template>,
    /// The snapshot taken before each call.
    pub snapshot: Option<CallSpec>,
    /// The compensation's upstream tool, for descriptions.
    pub compensated_by: Option<String>,
    /// Whether each call waits for a person's approval first.
    pub approval: bool,
    /// The compensation (attached mode runs it from a worker task).
    pub compensate: Option<CallSpec>,
    /// The probe.
    pub probe: Option<CallSpec>,
}

/// One tool as the agent sees it.
#[derive(Debug, Clone)]
pub struct Exposed {
    /// The name the agent calls.
    pub name: String,
    /// The upstream (index into [`Gateway::upstreams`]).
    pub upstream: usize,
    /// The upstream's name for it.
    pub tool: String,
    /// What the gateway does with it.
    pub kind: Kind,
    /// Its listing (the upstream's, renamed, with what the gateway does said in the
    /// description).
    pub listing: rmcp::model::Tool,
}

/// The agent-facing tools at one moment.
#[derive(Debug)]
pub struct Catalog {
    /// Each upstream's tools, as it last listed them.
    pub lists: Vec<Vec<rmcp::model::Tool>>,
    /// The agent-facing tools.
    pub exposed: Vec<Exposed>,
    index: HashMap<String, usize>,
}

impl Catalog {
    /// The agent-facing tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Exposed> {
        self.index.get(name).map(|i| &self.exposed[*i])
    }
}

/// Where the gateway's transactions live.
#[derive(Debug)]
pub enum Backend {
    /// The runtime's engine on the gateway's own store (the default).
    Embedded(Tidegate),
    /// A Tidegate server (`[gateway] server`): its ledger, console and attention queue.
    Attached {
        /// The server.
        server: Arc<Server>,
        /// Stops the task worker.
        stop: tokio_util::sync::CancellationToken,
        /// The worker's room for running tasks (each holds a permit).
        running: Arc<tokio::sync::Semaphore>,
    },
}

/// How one operation of a governed tool ended (a call, a release, a compensation, a probe).
#[derive(Debug, Clone)]
pub enum OpResult {
    /// It took effect (a probe: the call did), with the upstream's answer (a compensation:
    /// its residue).
    Done {
        /// The answer.
        output: Value,
        /// A compensation's residue.
        residue: Option<String>,
    },
    /// It certainly did not take effect (a probe: the call did not).
    Failed(String),
    /// Nobody can tell.
    Unknown(String),
}

/// A started gateway.
#[derive(Debug)]
pub struct Gateway {
    /// The policy.
    pub policy: Arc<Policy>,
    /// Where the transactions live.
    pub backend: Backend,
    /// The upstreams, in policy order.
    pub upstreams: Vec<Arc<Upstream>>,
    /// What the upstreams send toward agents (one for the gateway, shared by its upstreams).
    pub relay: Arc<crate::relay::Relay>,
    catalog: RwLock<Arc<Catalog>>,
    /// Start-up report: undeclared tools and rules that match nothing.
    pub report: Vec<String>,
    sessions: std::sync::atomic::AtomicU64,
    live: Mutex<Vec<std::sync::Weak<crate::session::Session>>>,
}

/// A slot a call's handle carries: the upstream's answer to a held call when it is released
/// at commit, for the commit's reply to the agent.
#[derive(Debug, Default)]
pub struct ReleaseSlot(pub Mutex<Option<Called>>);

impl Gateway {
    /// Starts the upstreams of `policy`, binds it and builds the engine (embedded), or
    /// registers its tools with the server and starts the task worker (attached).
    pub async fn start(policy: Policy) -> Result<Arc<Gateway>, GatewayError> {
        Gateway::start_as(policy, true).await
    }

    /// Starts the upstreams and binds the policy for `tidegate-mcp check`: attached, it only
    /// checks that the server answers the key, and neither registers tools nor takes tasks (a
    /// check never changes what a live server's turns use).
    pub async fn start_checking(policy: Policy) -> Result<Arc<Gateway>, GatewayError> {
        Gateway::start_as(policy, false).await
    }

    async fn start_as(policy: Policy, serve: bool) -> Result<Arc<Gateway>, GatewayError> {
        let policy = Arc::new(policy);
        let timeout = Duration::from_millis(policy.gateway.call_timeout_ms);
        let relay = Arc::new(crate::relay::Relay::default());
        // The server first: a wrong URL or key is said before any upstream starts.
        let server = match &policy.gateway.server {
            Some(s) => Some(Server::connect(s).await?),
            None => None,
        };
        let mut upstreams: Vec<Arc<Upstream>> = Vec::new();
        for spec in &policy.upstreams {
            let up = match Upstream::connect(spec, timeout, relay.clone()).await {
                Ok(u) => u,
                Err(e) => {
                    for u in &upstreams {
                        u.close().await;
                    }
                    return Err(e);
                }
            };
            upstreams.push(up);
        }
        match Gateway::bind(policy, upstreams.clone(), relay.clone(), server, serve).await {
            Ok(g) => {
                let g = Arc::new(g);
                let _ = relay.gateway.set(Arc::downgrade(&g));
                if let (true, Backend::Attached { server, stop, running }) = (serve, &g.backend) {
                    let caps = g.upstreams.iter().map(|u| server.capability(&u.name)).collect();
                    crate::attached::spawn_worker(
                        Arc::downgrade(&g),
                        server.clone(),
                        caps,
                        stop.clone(),
                        running.clone(),
                    );
                }
                Ok(g)
            }
            Err(e) => {
                for u in &upstreams {
                    u.close().await;
                }
                Err(e)
            }
        }
    }

    async fn bind(
        policy: Arc<Policy>,
        upstreams: Vec<Arc<Upstream>>,
        relay: Arc<crate::relay::Relay>,
        server: Option<Arc<Server>>,
        serve: bool,
    ) -> Result<Gateway, GatewayError> {
        let lists: Vec<Vec<rmcp::model::Tool>> = upstreams.iter().map(|u| u.tools.clone()).collect();
        let (catalog, runtime_tools, report) = expose(&policy, &upstreams, lists)?;
        let backend = match server {
            None => {
                let opened = policy.gateway.store.open()?;
                let engine = Tidegate::builder()
                    .store(opened.store)
                    .level(policy.gateway.level)
                    .tenant("mcp")
                    .lease(turn_lease(&policy))
                    .tools(runtime_tools)
                    .build()?;
                // Turns a crashed gateway left open are aborted (and compensated) once their
                // lease ends; so is a turn whose session stopped calling and whose idle timer
                // could not run.
                engine.spawn_reaper();
                Backend::Embedded(engine)
            }
            Some(server) => {
                if serve {
                    let names: Vec<String> = upstreams.iter().map(|u| u.name.clone()).collect();
                    server
                        .register(&names, &remote_tools(&catalog, &upstreams), task_lease_ms(&policy))
                        .await
                        .map_err(GatewayError::Serve)?;
                }
                Backend::Attached {
                    server,
                    stop: tokio_util::sync::CancellationToken::new(),
                    running: Arc::new(tokio::sync::Semaphore::new(crate::attached::MAX_RUNNING_TASKS)),
                }
            }
        };
        let gw = Gateway {
            policy,
            backend,
            upstreams,
            relay,
            catalog: RwLock::new(Arc::new(catalog)),
            report,
            sessions: Default::default(),
            live: Mutex::new(Vec::new()),
        };
        Ok(gw)
    }

    /// Runs one operation (`call`, `release`, `compensate`, `probe`) of the governed tool
    /// whose ledger name is `tool`, through its upstream: what an attached gateway's worker
    /// does with a task (the embedded engine runs the same functions through its handlers).
    pub async fn run_operation(&self, tool: &str, operation: &str, recorded: &Value, output: &Value) -> OpResult {
        let catalog = self.exposed();
        let found = catalog.exposed.iter().find_map(|x| match &x.kind {
            Kind::Effect(e) if self.ledger_name(x) == tool => Some((x, e)),
            _ => None,
        });
        let Some((x, e)) = found else {
            let why = format!("this gateway (policy {}) governs no tool `{tool}`", self.policy.file.display());
            // A probe that cannot ask does not know.
            return if operation == "probe" { OpResult::Unknown(why) } else { OpResult::Failed(why) };
        };
        let up = &self.upstreams[x.upstream];
        match operation {
            "call" | "release" => op_result(up.call(&x.tool, arguments(recorded)).await),
            "compensate" => match &e.compensate {
                Some(spec) => {
                    match compensate_call(up, spec, recorded, output, e.class == EffectClass::ReversibleWithCost).await
                    {
                        Ok(c) => OpResult::Done { output: Value::Null, residue: c.residue },
                        Err(err) if err.kind == tidegate_runtime::FailureKind::Unknown => {
                            OpResult::Unknown(err.message)
                        }
                        Err(err) => OpResult::Failed(err.message),
                    }
                }
                None => OpResult::Failed(format!("the policy gives `{}` no compensation", x.tool)),
            },
            "probe" => match &e.probe {
                Some(spec) => match probe_call(up, spec, recorded).await {
                    Probe::Happened(answer) => OpResult::Done { output: answer, residue: None },
                    Probe::DidNotHappen => OpResult::Failed("the probe found no trace of the call".into()),
                    _ => OpResult::Unknown("the probe got no answer".into()),
                },
                None => OpResult::Unknown(format!("the policy gives `{}` no probe", x.tool)),
            },
            other => OpResult::Failed(format!("unknown operation `{other}`")),
        }
    }

    /// The name the ledger knows an agent-facing tool by: `<upstream>.<tool>` (embedded),
    /// `<name>.<upstream>.<tool>` (attached).
    pub fn ledger_name(&self, x: &Exposed) -> String {
        let up = &self.upstreams[x.upstream].name;
        match &self.backend {
            Backend::Embedded(_) => format!("{up}.{}", x.tool),
            Backend::Attached { server, .. } => server.tool_name(up, &x.tool),
        }
    }

    /// The agent-facing tools now.
    pub fn exposed(&self) -> Arc<Catalog> {
        self.catalog.read().clone()
    }

    /// Reads `upstream`'s tools again (it said its list changed) and checks them against the
    /// policy. A list the policy accepts replaces the old one, its new tools are registered
    /// with the engine, and every session is told; a list it refuses (a template over an
    /// argument a tool no longer takes), or a tool whose declaration changed under a name the
    /// ledger knows, keeps the old list, with the reason logged.
    pub async fn refresh(&self, upstream: &str) -> Result<bool, String> {
        let Some(ui) = self.upstreams.iter().position(|u| u.name == upstream) else {
            return Err(format!("no upstream `{upstream}`"));
        };
        let fresh = self.upstreams[ui].list_tools().await.map_err(|e| e.to_string())?;
        let mut lists = self.catalog.read().lists.clone();
        if lists[ui] == fresh {
            return Ok(false);
        }
        lists[ui] = fresh;
        let (catalog, tools, report) = expose(&self.policy, &self.upstreams, lists).map_err(|e| e.to_string())?;
        match &self.backend {
            Backend::Embedded(engine) => {
                for t in &tools {
                    engine.register(t).map_err(|e| format!("tool `{}`: {e}", t.name()))?;
                }
            }
            Backend::Attached { server, .. } => {
                let names: Vec<String> = self.upstreams.iter().map(|u| u.name.clone()).collect();
                server.register(&names, &remote_tools(&catalog, &self.upstreams), task_lease_ms(&self.policy)).await?;
            }
        }
        for line in report {
            tracing::warn!("{line}");
        }
        *self.catalog.write() = Arc::new(catalog);
        let live: Vec<_> = self.live.lock().iter().filter_map(|w| w.upgrade()).collect();
        for s in live {
            s.notify_tool_list_changed().await;
        }
        Ok(true)
    }

    /// A new session's number.
    pub fn next_session(&self) -> u64 {
        self.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// The upstreams whose capabilities (as they said at initialisation) pass `offers`.
    pub fn offering(
        &self,
        offers: impl Fn(&rmcp::model::ServerCapabilities) -> bool,
    ) -> impl Iterator<Item = &Arc<Upstream>> {
        self.upstreams.iter().filter(move |u| u.peer().peer_info().is_some_and(|i| offers(&i.capabilities)))
    }

    /// Keeps track of `session` so that a shutdown can end its turn first.
    pub fn track(&self, session: &Arc<crate::session::Session>) {
        let mut live = self.live.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(session));
    }

    /// Aborts the open turn of every session still alive (the gateway is stopping), then
    /// closes every upstream: no turn is left to the next start's lease.
    pub async fn shutdown(&self) {
        let live: Vec<_> = self.live.lock().drain(..).filter_map(|w| w.upgrade()).collect();
        for s in live {
            s.end("the gateway is shutting down").await;
        }
        // The worker ran the aborts' compensations; it stops polling, and the tasks it is
        // running finish and are reported before the upstreams close (for at most one call's
        // time and a margin).
        if let Backend::Attached { stop, running, .. } = &self.backend {
            stop.cancel();
            let all = u32::try_from(crate::attached::MAX_RUNNING_TASKS).unwrap_or(u32::MAX);
            let wait = Duration::from_millis(self.policy.gateway.call_timeout_ms + 5_000);
            let _ = tokio::time::timeout(wait, running.acquire_many(all)).await;
        }
        self.close_upstreams().await;
    }

    /// Closes every upstream.
    pub async fn close_upstreams(&self) {
        for u in &self.upstreams {
            u.close().await;
        }
    }
}

/// A turn's lease: its idle limit, one upstream call, an approval's wait (when the policy has
/// approvals), and a margin. The idle timer ends a
/// quiet turn first; the lease ends the turns of a gateway that died (after a restart, the
/// engine's reaper aborts them and runs their compensations).
pub fn turn_lease(policy: &Policy) -> Duration {
    // A call that waits for an approval renews nothing while it waits.
    let approval = if policy.rules.iter().any(|r| r.approval) { policy.gateway.approval_timeout_ms } else { 0 };
    Duration::from_millis(policy.turn.idle_ms + policy.gateway.call_timeout_ms + approval + 5_000)
}

/// An attached gateway's worker task lease: one upstream call and a margin.
fn task_lease_ms(policy: &Policy) -> u64 {
    policy.gateway.call_timeout_ms + 10_000
}

/// The governed tools of `catalog`, as the server registers them.
fn remote_tools(catalog: &Catalog, upstreams: &[Arc<Upstream>]) -> Vec<RemoteTool> {
    catalog
        .exposed
        .iter()
        .filter_map(|x| match &x.kind {
            Kind::Effect(e) => Some(RemoteTool {
                upstream: upstreams[x.upstream].name.clone(),
                tool: x.tool.clone(),
                class: e.class,
                compensate: e.compensate.is_some(),
                probe: e.probe.is_some(),
            }),
            _ => None,
        })
        .collect()
}

fn op_result(called: Called) -> OpResult {
    match called {
        Called::Done(v) => OpResult::Done { output: v, residue: None },
        Called::Failed(m) => OpResult::Failed(m),
        Called::Unknown(m) => OpResult::Unknown(m),
    }
}

fn escape_braces(s: &str) -> String {
    s.replace('{', "{{").replace('}', "}}")
}

fn kind_for(policy: &Policy, r: &Rule, u: &Arc<Upstream>, tool: &str) -> Result<Kind, GatewayError> {
    Ok(match r.class {
        Class::Refuse => Kind::Refused(format!(
            "`{tool}` is refused by the gateway's policy ({}, tools[{}])",
            policy.file.display(),
            r.index
        )),
        Class::Read => Kind::Read { scopes: r.scopes.clone() },
        c => {
            let class = c.effect().ok_or_else(|| GatewayError::Serve(format!("class {c:?} is not an effect")))?;
            Kind::Effect(Box::new(EffectTool {
                tool: runtime_tool(policy, u, tool, class, r.compensate.clone(), r.probe.clone())?,
                class,
                scopes: r.scopes.clone(),
                key: r.key.clone(),
                snapshot: r.snapshot.clone(),
                compensated_by: r.compensate.as_ref().map(|c| c.tool.clone()),
                approval: r.approval,
                compensate: r.compensate.clone(),
                probe: r.probe.clone(),
            }))
        }
    })
}

/// What a handler dispatches: the agent's arguments out of the recorded envelope.
fn arguments(recorded: &Value) -> Value {
    recorded.get("arguments").cloned().unwrap_or(Value::Null)
}

fn runtime_tool(
    policy: &Policy,
    u: &Arc<Upstream>,
    tool: &str,
    class: EffectClass,
    compensate: Option<CallSpec>,
    probe: Option<CallSpec>,
) -> Result<Tool, GatewayError> {
    let call_up = u.clone();
    let call_name = tool.to_string();
    let mut b = Tool::builder(format!("{}.{}", u.name, tool), class).version(policy.version.clone()).call_ctx(
        move |ctx: CallCtx, recorded: Arc<Value>| {
            let up = call_up.clone();
            let name = call_name.clone();
            async move {
                let called = up.call(&name, arguments(&recorded)).await;
                if let Some(slot) = ctx.handle.as_ref().and_then(|h| h.downcast_ref::<ReleaseSlot>()) {
                    *slot.0.lock() = Some(called.clone());
                }
                match called {
                    Called::Done(v) => Ok(v),
                    Called::Failed(m) => Err(ToolError::failed(m)),
                    Called::Unknown(m) => Err(ToolError::unknown(m)),
                }
            }
        },
    );
    match compensate {
        Some(spec) => {
            let up = u.clone();
            let with_cost = class == EffectClass::ReversibleWithCost;
            b = b.compensate(move |recorded: Arc<Value>, output: Arc<Value>| {
                let up = up.clone();
                let spec = spec.clone();
                async move { compensate_call(&up, &spec, &recorded, &output, with_cost).await }
            });
        }
        None if class.executes_eagerly() && class != EffectClass::Idempotent => b = b.without_compensation(),
        None => {}
    }
    if let Some(spec) = probe {
        let up = u.clone();
        b = b.probe(move |recorded: Arc<Value>| {
            let up = up.clone();
            let spec = spec.clone();
            async move { probe_call(&up, &spec, &recorded).await }
        });
    }
    Ok(b.build()?)
}

/// The snapshot value a template's `snapshot` reads: `{"text": .., "value": .., "error": ..}`.
pub fn snapshot_value(called: &Called) -> Value {
    match called {
        Called::Done(v) => json!({"text": answer_text(v), "value": result_value(v), "error": false}),
        Called::Failed(m) | Called::Unknown(m) => json!({"text": "", "value": null, "error": true, "message": m}),
    }
}

/// Asks the upstream whether a call whose outcome is unknown took effect: the probe's answer
/// holds a value at `found` (it did: the answer stands in for the call's), or not (it did not),
/// or the probe got no answer (still unknown).
async fn probe_call(up: &Upstream, spec: &CallSpec, recorded: &Value) -> Probe {
    let args = arguments(recorded);
    let inputs = Inputs { args: &args, result: None, snapshot: recorded.get("snapshot").filter(|s| !s.is_null()) };
    let Ok(call_args) = spec.render(&inputs) else { return Probe::Unknown };
    let Some(found) = &spec.found else { return Probe::Unknown };
    match up.call(&spec.tool, call_args).await {
        Called::Done(answer) => {
            let result = result_value(&answer);
            let probe_inputs = Inputs { args: &args, result: Some(&result), snapshot: None };
            match found.eval(&probe_inputs) {
                Ok(values) if values.iter().any(|v| !v.is_null()) => Probe::Happened(answer),
                _ => Probe::DidNotHappen,
            }
        }
        Called::Failed(_) | Called::Unknown(_) => Probe::Unknown,
    }
}

async fn compensate_call(
    up: &Upstream,
    spec: &CallSpec,
    recorded: &Value,
    output: &Value,
    with_cost: bool,
) -> Result<Compensation, ToolError> {
    let args = arguments(recorded);
    let snapshot = recorded.get("snapshot").filter(|s| !s.is_null());
    if spec.if_snapshot_failed == SnapshotFailed::Skip
        && snapshot.and_then(|s| s.get("error")).and_then(Value::as_bool) == Some(true)
    {
        return Ok(Compensation::with_residue(format!(
            "not undone: the snapshot before the call had failed ({}), so `{}` had nothing to restore",
            snapshot.and_then(|s| s.get("message")).and_then(Value::as_str).unwrap_or("no detail"),
            spec.tool
        )));
    }
    let result = result_value(output);
    let inputs = Inputs { args: &args, result: (!output.is_null()).then_some(&result), snapshot };
    let call_args = spec
        .render(&inputs)
        .map_err(|e| ToolError::failed(format!("the compensation `{}` cannot be built: {e}", spec.tool)))?;
    match up.call(&spec.tool, call_args).await {
        Called::Done(v) if with_cost => {
            Ok(Compensation::with_residue(format!("undone by `{}`: {}", spec.tool, answer_text(&v))))
        }
        Called::Done(_) => Ok(Compensation::clean()),
        Called::Failed(m) => Err(ToolError::failed(format!("`{}`: {m}", spec.tool))),
        Called::Unknown(m) => Err(ToolError::unknown(m)),
    }
}

/// The agent-facing tools for the upstreams' current tool `lists` (one per upstream, in
/// order), the runtime tools they need, and the report (undeclared tools, rules that match
/// nothing).
fn expose(
    policy: &Policy,
    upstreams: &[Arc<Upstream>],
    lists: Vec<Vec<rmcp::model::Tool>>,
) -> Result<(Catalog, Vec<Tool>, Vec<String>), GatewayError> {
    let mut by_name = BTreeMap::new();
    for (u, list) in upstreams.iter().zip(&lists) {
        let tools = list
            .iter()
            .map(|t| (t.name.to_string(), serde_json::to_value(t).unwrap_or(Value::Null)))
            .collect::<Vec<_>>();
        by_name.insert(u.name.clone(), tools);
    }
    let mut report = policy.bind(&by_name)?;

    // Agent-facing names: the upstream's, or `<upstream>__<tool>` where two upstreams
    // (or the gateway's own tools) share one.
    let mut count: HashMap<String, usize> = HashMap::new();
    for list in &lists {
        for t in list {
            *count.entry(t.name.to_string()).or_default() += 1;
        }
    }
    for own in [COMMIT_TOOL, ABORT_TOOL, STATUS_TOOL] {
        *count.entry(own.to_string()).or_default() += 1;
    }

    let mut exposed = Vec::new();
    let mut runtime_tools = Vec::new();
    for (ui, (u, list)) in upstreams.iter().zip(&lists).enumerate() {
        for t in list {
            let name = if count.get(t.name.as_ref()).copied().unwrap_or(0) > 1 {
                format!("{}__{}", u.name, t.name)
            } else {
                t.name.to_string()
            };
            let rule = policy.rule_for(&u.name, &t.name);
            let kind = match rule {
                Some(r) => kind_for(policy, r, u, &t.name)?,
                None => match policy.default {
                    DefaultRule::Refuse => {
                        report.push(format!(
                            "undeclared: `{}` of upstream `{}` (refused: default = \"refuse\")",
                            t.name, u.name
                        ));
                        Kind::Refused(format!(
                            "`{}` is not declared in the gateway's policy ({}), whose default is to refuse it",
                            t.name,
                            policy.file.display()
                        ))
                    }
                    DefaultRule::Gated => {
                        report.push(format!(
                            "undeclared: `{}` of upstream `{}` (held until commit: default = \"gated\")",
                            t.name, u.name
                        ));
                        let scope = Template::parse(&format!("mcp:{}:{}", u.name, escape_braces(&t.name)))
                            .map_err(GatewayError::Serve)?;
                        Kind::Effect(Box::new(EffectTool {
                            tool: runtime_tool(policy, u, &t.name, EffectClass::Gated, None, None)?,
                            class: EffectClass::Gated,
                            scopes: vec![scope],
                            key: None,
                            snapshot: None,
                            compensated_by: None,
                            approval: false,
                            compensate: None,
                            probe: None,
                        }))
                    }
                },
            };
            if let Kind::Effect(e) = &kind {
                runtime_tools.push(e.tool.clone());
            }
            let mut listing = t.clone();
            listing.name = name.clone().into();
            // A held call answers "queued" before the tool runs, and a refused one never
            // runs: neither can return what the upstream's output schema promises.
            if matches!(&kind, Kind::Refused(_)) || matches!(&kind, Kind::Effect(e) if !e.class.executes_eagerly()) {
                listing.output_schema = None;
            }
            let note = match &kind {
                Kind::Read { .. } => "[tidegate: read; the scopes it reads are checked at commit]".to_string(),
                Kind::Refused(_) => "[tidegate: refused by the gateway's policy]".to_string(),
                Kind::Effect(e) if !e.class.executes_eagerly() => {
                    "[tidegate: held until the turn commits (tidegate_commit); the call answers \"queued\" at once]"
                        .to_string()
                }
                Kind::Effect(e) => match &e.compensated_by {
                    Some(c) => format!("[tidegate: runs now; undone by `{c}` if the turn aborts]"),
                    None => "[tidegate: runs now; not undone if the turn aborts]".to_string(),
                },
            };
            let note = match &kind {
                Kind::Effect(e) if e.approval => {
                    format!("{note} [tidegate: each call waits for a person's approval]")
                }
                _ => note,
            };
            let desc = listing.description.as_deref().unwrap_or("").trim().to_string();
            listing.description = Some(if desc.is_empty() { note } else { format!("{desc}\n\n{note}") }.into());
            exposed.push(Exposed { name, upstream: ui, tool: t.name.to_string(), kind, listing });
        }
    }

    let index = exposed.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
    Ok((Catalog { lists, exposed, index }, runtime_tools, report))
}
