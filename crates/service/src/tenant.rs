//! One tenant: its engine and ledger, ledger index, registry, dispatcher, worker queue, live
//! transaction handles, groups and idempotency records. Nothing here is shared with another
//! tenant.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tidegate_runtime::{
    CheckpointPolicy, Level, Ordering, RetryPolicy, Speculation, StoreUrl, Tidegate, Transaction, TxId,
};
use tidegate_sqlite::SqliteStore;
use tidegate_storage::LedgerStore;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::catalog::{Catalog, TenantRecord};
use crate::dispatch::Dispatcher;
use crate::error::{Result, ServiceError};
use crate::idempotency::Recorded;
use crate::index::LedgerIndex;
use crate::metrics::Metrics;
use crate::registry::{CapabilitySpec, ToolDef};
use crate::settings::{DispatchSection, ReviewSection};
use crate::state::{IdempotencyStore, Limits, TenantState};
use crate::tap::TimedStore;
use crate::tools::ServerTool;

/// What every tenant's engine is built with (a front door's configuration fills it in).
#[derive(Debug, Clone)]
pub struct TenantSettings {
    /// Where the node keeps its catalog and the tenants' ledgers (`StoreUrl`: `memory:`, a
    /// SQLite directory holding `catalog.db` and `tenants/<name>/`, or a PostgreSQL database
    /// holding the catalog, each tenant's ledger stream and state).
    pub store: StoreUrl,
    /// This node's id: the owner a PostgreSQL stream's lease names (docs/deployment.md).
    pub node_id: String,
    /// How long a node's ownership of a tenant's PostgreSQL stream lasts without renewal (the
    /// store renews it every third); a node that dies keeps its tenants that long.
    pub ownership_lease: Duration,
    /// Default lease.
    pub lease: Duration,
    /// Level.
    pub level: Level,
    /// Ordering.
    pub ordering: Ordering,
    /// Checkpoint interval (0: only at close).
    pub checkpoint_every: u64,
    /// Settled transactions kept in memory.
    pub retain: usize,
    /// Concurrent requests per tenant.
    pub max_concurrent: usize,
    /// Idempotency records: TTL and count.
    pub idempotency_ttl: Duration,
    /// Idempotency records per tenant.
    pub idempotency_max: usize,
    /// Dispatch defaults.
    pub dispatch: DispatchSection,
    /// Scope types.
    pub scopes: tidegate_runtime::ScopeRegistry,
    /// The review middleware (`[review]`).
    pub review: ReviewSection,
}

/// The result of a settlement operation the server runs on its own task: `Ok` once the
/// engine settled the transaction (its outcome is in the ledger index), or the refusal.
pub type OpResult = Option<std::result::Result<(), ServiceError>>;

/// A settlement operation in progress (commit or abort of a transaction or group).
#[derive(Debug, Clone)]
pub struct SettleOp {
    /// `commit` or `abort`.
    pub kind: &'static str,
    /// Becomes `Some` when the operation ends.
    pub done: watch::Receiver<OpResult>,
}

/// A transaction begun through this server process.
#[derive(Debug)]
pub struct LiveTx {
    /// The runtime handle.
    pub handle: Transaction,
    /// Its speculation group.
    pub group: Option<u64>,
    /// The commit or abort running for it.
    pub settle: Mutex<Option<SettleOp>>,
    /// Tickets of its client-executed effects, by effect number.
    pub tickets: crate::tickets::Tickets,
}

/// A speculation group begun through this server process.
#[derive(Debug)]
pub struct LiveGroup {
    /// The runtime handle.
    pub spec: Speculation,
    /// The commit or abort running for it.
    pub settle: Mutex<Option<SettleOp>>,
}

/// Where a tenant's engine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantStatus {
    /// Open; recovery of the previous process's work is running.
    Recovering,
    /// Open and recovered.
    Ready,
    /// Recovery failed (the engine still serves; unfinished work waits for an operator).
    Failed(String),
}

/// One tenant.
pub struct Tenant {
    /// Name.
    pub name: String,
    /// Tag of every public id.
    pub tag: String,
    /// The engine.
    pub engine: Tidegate,
    /// The real ledger store (scans bypass the tap).
    pub store: Arc<dyn LedgerStore>,
    sqlite: Option<Arc<SqliteStore>>,
    /// The ledger index.
    pub index: Arc<LedgerIndex>,
    /// Capability dispatch.
    pub dispatcher: Arc<Dispatcher>,
    tools: RwLock<HashMap<String, Arc<ServerTool>>>,
    removed: RwLock<HashMap<String, ToolDef>>,
    live: Mutex<HashMap<TxId, Arc<LiveTx>>>,
    groups: Mutex<HashMap<u64, Arc<LiveGroup>>>,
    /// Idempotency records (in its state).
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// What must outlive the process: idempotency records, worker tasks, attempts (durable
    /// beside the ledger when the store is durable, else in memory).
    state: TenantState,
    /// Requests in progress for this tenant.
    pub permits: Arc<Semaphore>,
    status: Mutex<TenantStatus>,
    catalog: Arc<dyn Catalog>,
    background: Mutex<Vec<JoinHandle<()>>>,
    settings: TenantSettings,
    /// The review manager (opened at the first `/v1/review` request).
    pub review: crate::review::TenantReview,
    /// Where the review manager is opened from.
    pub review_place: crate::review::ReviewPlace,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.name).field("tag", &self.tag).finish_non_exhaustive()
    }
}

impl Tenant {
    /// Opens the tenant's ledger and engine, rebuilds its index and registers its tools.
    /// Blocking (SQLite, replay): call it from a blocking thread inside a tokio runtime.
    pub fn open(
        record: &TenantRecord,
        settings: &TenantSettings,
        catalog: Arc<dyn Catalog>,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Tenant>> {
        let name = record.name.clone();
        let tenant_err = |what, source| ServiceError::Tenant { tenant: name.clone(), what, source: Arc::new(source) };
        // The backend is the node's store URL, for this tenant (one way to name it for every
        // front door: `tidegate_runtime::StoreUrl`).
        let place = settings.store.for_tenant(&record.name);
        let tenant_dir = place.dir().map(Path::to_path_buf);
        let opened = place
            .open_owned(Some((&settings.node_id, settings.ownership_lease)))
            .map_err(|e| tenant_err("open the ledger", e))?;
        let (store, sqlite): (Arc<dyn LedgerStore>, Option<Arc<SqliteStore>>) = (opened.store, opened.sqlite);
        // The state that must outlive the process lives beside the ledger when that is durable
        // (`state.db` in the tenant's directory), else in memory. Opened after the ledger, whose
        // directory lock makes this process the only writer.
        let limits = Limits {
            idempotency_ttl_ms: u64::try_from(settings.idempotency_ttl.as_millis()).unwrap_or(u64::MAX),
            idempotency_max: settings.idempotency_max,
            attempts_retained: settings.dispatch.attempts_retained,
        };
        let state = match (&tenant_dir, &place) {
            (Some(dir), _) => TenantState::open_sqlite(dir, limits, &record.name)?,
            (None, StoreUrl::Postgres { url, .. }) => TenantState::open_postgres(url, limits, &record.name)?,
            (None, _) => TenantState::memory(limits),
        };
        let index = Arc::new(LedgerIndex::new(settings.retain.max(1), metrics.clone()));
        // Indexed before the engine opens: the engine's first change (defining new tools, the
        // aborts of leases that ran out while the ledger was closed) happens inside its build,
        // and the index sees it as an append observer, after what the ledger already held.
        index.rebuild(&*store).map_err(|e| tenant_err("index the ledger", e.into()))?;
        let timed = Arc::new(TimedStore::new(store.clone(), metrics.clone()));
        let checkpoints = if !settings.store.is_durable() {
            CheckpointPolicy::never()
        } else {
            CheckpointPolicy {
                every_events: (settings.checkpoint_every > 0).then_some(settings.checkpoint_every),
                on_close: true,
            }
        };
        // The dispatcher and the tools first: the engine opens with every tool in place, so
        // that the aborts of leases that ran out while nobody held the ledger find their
        // compensations (tidegate_runtime::Builder::tools).
        let dispatcher = Arc::new(Dispatcher::new(http, &state, &record.tag, settings.dispatch.clone(), metrics));
        for (cap, spec) in catalog.capabilities(&record.name)? {
            dispatcher.put_capability(&cap, spec);
        }
        let mut tools = HashMap::new();
        let mut removed = HashMap::new();
        for t in catalog.tools(&record.name)? {
            if t.removed {
                removed.insert(t.name.clone(), t.def.clone());
                continue;
            }
            let Ok(st) = ServerTool::build(&t.name, &t.def, &dispatcher, &record.tag) else { continue };
            tools.insert(t.name.clone(), Arc::new(st));
        }
        let engine = Tidegate::builder()
            .store(timed)
            .tools(tools.values().map(|st| st.tool.clone()))
            // The index follows the ledger as an append observer (under the engine lock, so
            // in ledger order and current when an operation returns).
            .observer(index.clone())
            .scopes(settings.scopes.clone())
            .lease(settings.lease)
            .level(settings.level)
            .ordering(settings.ordering)
            // The capability's retry policy is the only one (docs/server.md, invariant 6).
            .retry(RetryPolicy { attempts: 1, ..RetryPolicy::default() })
            .checkpoints(checkpoints)
            // The tenant's plan executor refuses triggers naming another tenant.
            .tenant(record.name.clone())
            // Keys the engine derives are recorded (and dispatched) in the public form
            // `tx_<tag>_<n>:<tool>:<effect>` (tools::effect_key renders the same).
            .derived_key_prefix(crate::ids::tx_prefix(&record.tag))
            .build()
            .map_err(|e| tenant_err("build the engine", e))?;

        // Plan compensations and probes go through the same dispatcher as the tools' calls.
        engine.set_plan_dispatch(Arc::new(PlanDispatcher(dispatcher.clone())));
        Ok(Arc::new(Tenant {
            name: record.name.clone(),
            tag: record.tag.clone(),
            engine,
            store,
            sqlite,
            index,
            dispatcher,
            tools: RwLock::new(tools),
            removed: RwLock::new(removed),
            live: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
            idempotency: state.idempotency.clone(),
            state,
            permits: Arc::new(Semaphore::new(settings.max_concurrent)),
            status: Mutex::new(TenantStatus::Recovering),
            catalog,
            background: Mutex::new(Vec::new()),
            settings: settings.clone(),
            review: crate::review::TenantReview::default(),
            review_place: crate::review::ReviewPlace {
                tenant: record.name.clone(),
                dir: tenant_dir,
                config: settings.review.clone(),
            },
        }))
    }

    /// Starts the lease reaper, the worker-queue sweeper and the recovery of the previous
    /// process's unfinished work (which may wait for webhooks or workers, so it runs in the
    /// background; [`Tenant::status`] reports it).
    pub fn start(self: &Arc<Self>) {
        let mut bg = self.background.lock();
        bg.push(self.engine.spawn_reaper());
        let weak = Arc::downgrade(self);
        bg.push(tokio::spawn(async move {
            loop {
                let Some(t) = weak.upgrade() else { return };
                let queue = t.dispatcher.queue().clone();
                if let Err(e) = queue.sweep().await {
                    tracing::warn!(tenant = %t.name, "sweeping the worker queue: {e}");
                }
                t.prune();
                // The console's per-minute wait figures (crate::console::Series).
                t.index.sample_waits(t.engine.wait_stats().0, t.engine.stats().waiting as u64);
                let next = queue.next_expiry().await.ok().flatten();
                drop(t);
                let cap = tokio::time::Instant::now() + Duration::from_millis(250);
                tokio::time::sleep_until(next.map_or(cap, |n| n.min(cap))).await;
            }
        }));
        let me = self.clone();
        bg.push(tokio::spawn(async move { me.recover().await }));
    }

    async fn recover(&self) {
        let mut brought_back = Vec::new();
        let status = loop {
            match self.engine.recover_keeping_open().await {
                Ok(report) => {
                    tracing::info!(
                        tenant = %self.name,
                        events = report.events,
                        unfinished = report.unfinished,
                        resumed_commits = report.commits_resumed.len(),
                        resumed_aborts = report.aborts_resumed.len(),
                        unresolved = report.unresolved.len(),
                        kept_open = report.orphans.len(),
                        "recovered"
                    );
                    break TenantStatus::Ready;
                }
                Err(tidegate_runtime::Error::UnknownTool { name, .. }) if brought_back.len() < 1024 => {
                    // A removed tool with unsettled effects: register its last definition
                    // again so they can settle, then remove it from the registry again.
                    let def = self.removed.read().get(&name).cloned();
                    let built = def.and_then(|d| ServerTool::build(&name, &d, &self.dispatcher, &self.tag).ok());
                    match built {
                        Some(st) if self.engine.register(&st.tool).is_ok() => brought_back.push(name),
                        _ => break TenantStatus::Failed(format!("recovery needs tool `{name}`, which is not defined")),
                    }
                }
                Err(e) => break TenantStatus::Failed(e.to_string()),
            }
        };
        for name in brought_back {
            let _ = self.engine.remove_tool(&name);
        }
        // Recovery has dispatched again whatever it resumes: tasks carried over from the
        // previous process that no dispatch adopted are dropped once their lease ends (a
        // started release or eager call is asked about by a probe, never sent twice).
        match self.dispatcher.queue().end_carry_over().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(tenant = %self.name, dropped = n, "carried-over worker tasks nobody waits for"),
            Err(e) => tracing::warn!(tenant = %self.name, "dropping carried-over worker tasks: {e}"),
        }
        if let TenantStatus::Failed(why) = &status {
            tracing::error!(tenant = %self.name, "recovery failed: {why}");
        }
        *self.status.lock() = status;
    }

    /// Adds a task stopped with the tenant (when it closes or is dropped).
    pub fn add_background(&self, task: JoinHandle<()>) {
        self.background.lock().push(task);
    }

    /// Stops what is left of a tenant whose engine was fenced out (the node dropped it): its
    /// background tasks, its review manager and any engine work still running, and wakes the
    /// pull workers waiting on its queue. Nothing is checkpointed or synced: the ledger
    /// stream belongs to another owner now, and the engine's state may be ahead of it.
    /// Blocking (the review database's client is closed here).
    pub fn release_fenced(&self) {
        for h in self.background.lock().drain(..) {
            h.abort();
        }
        self.review.close();
        // Tasks stay in the state for the node that serves the tenant now.
        self.dispatcher.queue().close();
        self.engine.stop();
        self.state.close();
        // Handles of live transactions would only answer the fence; let them go.
        self.live.lock().clear();
        self.groups.lock().clear();
    }

    /// Where the tenant's engine is.
    pub fn status(&self) -> TenantStatus {
        self.status.lock().clone()
    }

    /// Forgets live handles of settled transactions and groups.
    fn prune(&self) {
        let settled: Vec<TxId> = {
            let live = self.live.lock();
            live.keys().copied().filter(|tx| self.index.phase(*tx).is_none_or(|p| p.settled())).collect()
        };
        if !settled.is_empty() {
            let mut live = self.live.lock();
            for tx in &settled {
                live.remove(tx);
            }
        }
        let mut groups = self.groups.lock();
        let live = self.live.lock();
        groups.retain(|_, g| g.spec.branches().iter().any(|b| live.contains_key(&b.id())));
    }

    /// Registers a live transaction.
    pub fn add_live(&self, handle: Transaction, group: Option<u64>) -> Arc<LiveTx> {
        let lt = Arc::new(LiveTx { handle, group, settle: Mutex::new(None), tickets: Default::default() });
        self.live.lock().insert(lt.handle.id(), lt.clone());
        lt
    }

    /// Registers a transaction resumed by id (begun before a restart), or returns the live
    /// handle a concurrent request registered first.
    pub fn resume_live(&self, handle: Transaction, group: Option<u64>) -> Arc<LiveTx> {
        let mut live = self.live.lock();
        live.entry(handle.id())
            .or_insert_with(|| {
                Arc::new(LiveTx { handle, group, settle: Mutex::new(None), tickets: Default::default() })
            })
            .clone()
    }

    /// A live transaction.
    pub fn live(&self, tx: TxId) -> Option<Arc<LiveTx>> {
        self.live.lock().get(&tx).cloned()
    }

    /// Registers a live group.
    pub fn add_group(&self, spec: Speculation) -> Arc<LiveGroup> {
        let g = Arc::new(LiveGroup { spec, settle: Mutex::new(None) });
        self.groups.lock().insert(g.spec.id().0, g.clone());
        g
    }

    /// Registers a group resumed by id (begun before a restart), or returns the live handle
    /// a concurrent request registered first.
    pub fn resume_group(&self, spec: Speculation) -> Arc<LiveGroup> {
        self.groups
            .lock()
            .entry(spec.id().0)
            .or_insert_with(|| Arc::new(LiveGroup { spec, settle: Mutex::new(None) }))
            .clone()
    }

    /// A live group.
    pub fn group(&self, id: u64) -> Option<Arc<LiveGroup>> {
        self.groups.lock().get(&id).cloned()
    }

    /// A tool of the registry.
    pub fn tool(&self, name: &str) -> Option<Arc<ServerTool>> {
        self.tools.read().get(name).cloned()
    }

    /// Every tool, by name.
    pub fn tools(&self) -> Vec<Arc<ServerTool>> {
        let mut v: Vec<_> = self.tools.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Defines or redefines a tool. Returns whether anything changed.
    pub fn put_tool(&self, name: &str, def: ToolDef) -> Result<bool> {
        if let Some(cur) = self.tool(name)
            && cur.def == def
        {
            return Ok(false);
        }
        for (field, cap) in
            [("call", Some(&def.call)), ("compensate", def.compensate.as_ref()), ("probe", def.probe.as_ref())]
        {
            if let Some(c) = cap
                && self.dispatcher.capability(c).is_none()
            {
                return Err(ServiceError::invalid(field, c, "the name of a capability registered with this tenant"));
            }
        }
        let st = ServerTool::build(name, &def, &self.dispatcher, &self.tag)
            .map_err(|(f, v, e)| ServiceError::invalid(f, v, e))?;
        self.catalog.put_tool(&self.name, name, &def)?;
        let mut tools = self.tools.write();
        let existed = tools.contains_key(name) || self.engine.tool_signature(name).is_some();
        let r = if existed { self.engine.redefine_tool(&st.tool) } else { self.engine.register(&st.tool) };
        r?;
        tools.insert(name.to_owned(), Arc::new(st));
        self.removed.write().remove(name);
        Ok(true)
    }

    /// Removes a tool from the registry.
    pub fn remove_tool(&self, name: &str) -> Result<bool> {
        let Some(st) = self.tools.write().remove(name) else { return Ok(false) };
        self.catalog.remove_tool(&self.name, name)?;
        self.removed.write().insert(name.to_owned(), st.def.clone());
        self.engine.remove_tool(name)?;
        Ok(true)
    }

    /// Adds or replaces a capability.
    pub fn put_capability(&self, name: &str, spec: CapabilitySpec) -> Result<()> {
        self.catalog.put_capability(&self.name, name, &spec)?;
        self.dispatcher.put_capability(name, spec);
        Ok(())
    }

    /// Deletes a capability no tool names.
    pub fn delete_capability(&self, name: &str) -> Result<bool> {
        if self.dispatcher.capability(name).is_none() {
            return Ok(false);
        }
        let users: Vec<String> =
            self.tools().iter().filter(|t| t.def.capabilities().any(|c| c == name)).map(|t| t.name.clone()).collect();
        if !users.is_empty() {
            return Err(ServiceError::conflict(
                "capability_in_use",
                format!("capability `{name}` is named by tools {users:?}; change or remove them first"),
            ));
        }
        self.catalog.delete_capability(&self.name, name)?;
        Ok(self.dispatcher.remove_capability(name))
    }

    /// Keeps `response` as the answer of the first use of `key` (docs/server.md, invariant
    /// 7), once everything the request appended to the ledger is durable: a replay after a
    /// crash never names a transaction or effect the ledger lost (a begin's record rides the
    /// next group commit; its 201 does not wait for it).
    pub async fn keep_idempotent_response(&self, key: &str, response: Recorded) -> Result<()> {
        self.engine.appended_durable().await.map_err(ServiceError::engine)?;
        self.idempotency.finish(key, Some(response)).await?;
        Ok(())
    }

    /// The settings the tenant was opened with.
    pub fn settings(&self) -> &TenantSettings {
        &self.settings
    }

    /// Stops background work, stores a checkpoint and syncs the ledger. Blocking.
    pub fn close(&self) -> std::result::Result<(), String> {
        for h in self.background.lock().drain(..) {
            h.abort();
        }
        // The review manager's database connection is closed here, on this blocking thread
        // (a PostgreSQL client dropped later on a tokio worker took the process down with
        // "Cannot start a runtime from within a runtime"), and is not opened again.
        self.review.close();
        // The engine's own settlement tasks outlive the requests that started them: stop them
        // (recovery at the next open finishes what they left), so the ledger is let go. Their
        // worker tasks stay in the state, carried over to the next opening.
        self.dispatcher.queue().close();
        self.engine.stop();
        // Every state operation submitted so far is done; the state file is let go.
        self.state.close();
        let mut problems = Vec::new();
        if self.settings.store.is_durable()
            && self.store.last_lsn() > 0
            && let Err(e) = self.engine.checkpoint_now()
        {
            problems.push(format!("checkpoint: {e}"));
        }
        if let Some(s) = &self.sqlite
            && let Err(e) = s.sync()
        {
            problems.push(format!("sync: {e}"));
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }

    /// Ledger syncs of the embedded store since it opened.
    pub fn ledger_syncs(&self) -> u64 {
        self.sqlite.as_ref().map_or(0, |s| s.stats().syncs)
    }
}

/// The plan executor's dispatch over the tenant's [`Dispatcher`] (webhook or pull worker by
/// capability): `Compensate` and `Probe`, with the dispatcher's own retries, in the one
/// vocabulary (a `not_applied` with `retry: true` is the capability's attempts run out
/// without the effect taking place: to the plan it is not applied, and the plan is stuck
/// until retried).
#[derive(Debug)]
struct PlanDispatcher(Arc<Dispatcher>);

impl tidegate_runtime::Dispatch for PlanDispatcher {
    fn deadline(&self, r: &tidegate_runtime::DispatchRequest) -> std::time::Duration {
        self.0
            .deadline_ms(&r.capability)
            .map_or(tidegate_runtime::DEFAULT_DISPATCH_DEADLINE, std::time::Duration::from_millis)
    }

    fn dispatch(
        &self,
        r: tidegate_runtime::DispatchRequest,
    ) -> tidegate_runtime::BoxFuture<tidegate_runtime::CallOutcome> {
        let d = self.0.clone();
        Box::pin(async move { d.dispatch(r).await })
    }
}
