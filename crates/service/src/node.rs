//! The node: the catalog and the tenants one process serves, opened on demand, the tasks it
//! owns (settlement work a caller that goes away must not cancel), authentication of API keys
//! and an orderly close. A front door holds one [`Service`] and reaches tenants only through
//! it.
//!
//! A tenant whose ledger store fences the node's engine out (another node took the tenant
//! over) is dropped: its engine, background tasks and review manager are stopped, it leaves the
//! node's tenants, and every later request for it answers
//! [`ServiceError::TenantUnavailable`] (retryable: another node serves it) until the fenced
//! engine is released; on a shared (PostgreSQL) store the stream's lease decides from then
//! on, as for any tenant (crate::cluster). The other tenants are not touched.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::{Role, parse_key, secret_matches};
use crate::catalog::{Catalog, KeyRecord, SqliteCatalog};
use crate::error::{Result, ServiceError};
use crate::metrics::{Metrics, Snapshot};
use crate::tenant::{Tenant, TenantSettings, TenantStatus};
use tidegate_runtime::StoreUrl;

/// This node and who serves a tenant ([`Service::cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// This node's id.
    pub node_id: String,
    /// Whether the store is shared by several nodes (PostgreSQL).
    pub shared: bool,
    /// Whether this node serves the tenant now.
    pub serving_here: bool,
    /// The tenant's stream (PostgreSQL): its owner, token and lease.
    pub stream: Option<StreamView>,
    /// The registered nodes and the lease holders, by id, with how many tenants each holds.
    pub nodes: Vec<NodeView>,
}

/// A tenant's ledger stream as the database shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamView {
    /// The node that took it last (`None`: an unnamed process).
    pub owner: Option<String>,
    /// Where that node answers, if it registered an address.
    pub owner_address: Option<String>,
    /// The owner token.
    pub token: u64,
    /// How long the owner's lease still runs (`None`: none, or it ran out).
    pub lease_left_ms: Option<u64>,
    /// The last acknowledged LSN.
    pub last_lsn: u64,
}

/// A node of the cluster: registered, or holding leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Its id.
    pub id: String,
    /// Where it answers, if it said.
    pub address: Option<String>,
    /// Whether it said it was alive recently (three of its rounds).
    pub live: bool,
    /// How long ago it last said so (`None`: it never registered).
    pub seen_ms_ago: Option<u64>,
    /// How many tenants it holds under live leases.
    pub tenants: u64,
}

/// What a node is opened with.
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Every tenant's settings (where ledgers live among them).
    pub tenant: TenantSettings,
    /// How long a looked-up API key is trusted before the catalog is asked again.
    pub key_cache_ttl: Duration,
    /// Where this node answers (a base URL), registered with the cluster on a PostgreSQL store
    /// so that a node that does not serve a tenant can send its clients here. `None`: not
    /// registered with an address (the node still counts as live).
    pub advertise: Option<String>,
}

/// Who a presented API key is.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The key's tenant, opened.
    pub tenant: Arc<Tenant>,
    /// The key's role.
    pub role: Role,
    /// The key's id.
    pub key_id: String,
}

/// Why a presented API key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// Not a key of this node (malformed, unknown, wrong secret, revoked): never retryable.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The catalog could not be read: retryable.
    #[error("the catalog cannot be read: {0}")]
    CatalogUnavailable(String),
    /// The key's tenant could not be opened: retryable.
    #[error("the tenant's engine could not be opened: {0}")]
    TenantUnavailable(String),
    /// This node dropped the key's tenant (its store fenced the node out): what
    /// [`ServiceError::TenantUnavailable`] says. Retryable: another node serves it.
    #[error("tenant `{tenant}` is not served by this node: {reason}")]
    NotServed {
        /// The tenant.
        tenant: String,
        /// Why (the fence).
        reason: String,
    },
    /// Another node holds the key's tenant under a live lease (a PostgreSQL cluster): send
    /// the request there. Retryable: this node may take the tenant once the lease runs out.
    #[error("{detail}")]
    ServedElsewhere {
        /// The node serving the tenant.
        owner: String,
        /// Where it answers, if it registered an address.
        address: Option<String>,
        /// How long its lease still runs.
        remaining_ms: u64,
        /// The whole refusal.
        detail: String,
    },
}

impl AuthError {
    /// Whether presenting the same key later may succeed.
    pub fn retryable(&self) -> bool {
        !matches!(self, AuthError::Unauthenticated(_))
    }
}

struct Inner {
    catalog: Arc<dyn Catalog>,
    tenants: RwLock<HashMap<String, Arc<Tenant>>>,
    opening: tokio::sync::Mutex<()>,
    failed: Mutex<HashMap<String, String>>,
    /// Tenants dropped because their store fenced this node out, with the refusal to give
    /// (on a shared store only until the fenced engine is released; then the stream's lease
    /// decides, like for any tenant this node does not serve).
    dropped: Mutex<HashMap<String, ServiceError>>,
    /// This node's presence in the cluster (PostgreSQL store only); dropped at close.
    registry: Mutex<Option<tidegate_postgres::NodeRegistry>>,
    settings: ServiceSettings,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
    shutdown: CancellationToken,
    /// Cancels the node's tasks still running after the drain.
    hard_stop: CancellationToken,
    tracker: TaskTracker,
    key_cache: Mutex<HashMap<String, (KeyRecord, Instant)>>,
}

/// One node's service: cheap to clone, every clone is the same node.
#[derive(Clone)]
pub struct Service(Arc<Inner>);

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("tenants", &self.0.tenants.read().len()).finish_non_exhaustive()
    }
}

impl Service {
    /// Opens the catalog (in memory, or `catalog.db` in the data directory) and every tenant
    /// in it (their recovery runs in the background). A tenant that cannot be opened is
    /// logged and reported by [`Service::readiness`]; the others serve.
    pub async fn open(settings: ServiceSettings) -> Result<Service> {
        let catalog = match &settings.tenant.store {
            StoreUrl::Memory => Arc::new(SqliteCatalog::in_memory()?) as Arc<dyn Catalog>,
            StoreUrl::Sqlite(dir) => {
                let dir: PathBuf = dir.clone();
                Arc::new(
                    tokio::task::spawn_blocking(move || SqliteCatalog::open(&dir))
                        .await
                        .map_err(|e| ServiceError::io("open the catalog", std::io::Error::other(e)))??,
                )
            }
            StoreUrl::Postgres { url, .. } => {
                let url = url.clone();
                Arc::new(
                    tokio::task::spawn_blocking(move || crate::catalog_postgres::PgCatalog::open(&url))
                        .await
                        .map_err(|e| ServiceError::io("open the catalog", std::io::Error::other(e)))??,
                )
            }
            other => {
                return Err(ServiceError::invalid(
                    "server.store",
                    other.to_string(),
                    "`memory:`, a SQLite directory or a `postgres://` URL",
                ));
            }
        };
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tidegate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ServiceError::HttpClient(Arc::new(e)))?;
        let service = Service(Arc::new(Inner {
            catalog,
            tenants: RwLock::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
            failed: Mutex::new(HashMap::new()),
            dropped: Mutex::new(HashMap::new()),
            registry: Mutex::new(None),
            settings,
            metrics: Arc::new(Metrics::new()),
            http,
            shutdown: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            key_cache: Mutex::new(HashMap::new()),
        }));
        if let StoreUrl::Postgres { url, .. } = &service.0.settings.tenant.store {
            // Several nodes may share the database: take this node's share of the tenants
            // nobody serves, now and every round (crate::cluster).
            service.join_cluster(url.clone()).await?;
            return Ok(service);
        }
        for t in service.0.catalog.tenants()? {
            match service.open_tenant(&t.name).await {
                Ok(_) => {}
                // Another node holds the tenant under a live lease: it serves it; this node
                // opens it on a request once the lease ran out. Not a failure of this node.
                Err(e) if e.is_served_elsewhere() => tracing::info!(tenant = %t.name, "served by another node: {e}"),
                Err(e) => {
                    tracing::error!(tenant = %t.name, "could not open: {e}");
                    service.0.failed.lock().insert(t.name.clone(), e.to_string());
                }
            }
        }
        Ok(service)
    }

    /// Registers this node with the cluster, takes its share of the orphaned tenants, and
    /// keeps doing both every round until shutdown.
    async fn join_cluster(&self, url: String) -> Result<()> {
        let t = &self.0.settings.tenant;
        let (node, advertise, every) =
            (t.node_id.clone(), self.0.settings.advertise.clone(), crate::cluster::round_interval(t.ownership_lease));
        let registry = tokio::task::spawn_blocking(move || {
            tidegate_postgres::NodeRegistry::start(&url, &node, advertise.as_deref(), every)
        })
        .await
        .map_err(|e| ServiceError::io("join the cluster", std::io::Error::other(e)))?
        .map_err(|e| ServiceError::Unavailable {
            code: "store_unavailable",
            detail: format!("joining the cluster's database: {e}"),
            retry_after: Some(1),
        })?;
        let mut rounds = registry.watch();
        let first = registry.latest();
        *self.0.registry.lock() = Some(registry);
        let mut waited = HashMap::new();
        if let Some(snapshot) = first {
            crate::cluster::adopt(self, &snapshot, &mut waited).await;
        }
        let (service, stop) = (Arc::downgrade(&self.0), self.0.shutdown.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = rounds.changed() => if changed.is_err() { return },
                }
                let snapshot = rounds.borrow_and_update().clone();
                let (Some(inner), Some(snapshot)) = (service.upgrade(), snapshot) else { return };
                crate::cluster::adopt(&Service(inner), &snapshot, &mut waited).await;
            }
        });
        Ok(())
    }

    /// Records that `tenant` could not be opened (readiness counts it until an open succeeds).
    pub(crate) fn note_failed(&self, tenant: &str, e: &ServiceError) {
        self.0.failed.lock().insert(tenant.to_owned(), e.to_string());
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.0.shutdown.is_cancelled()
    }

    /// The settings the node was opened with.
    pub fn settings(&self) -> &ServiceSettings {
        &self.0.settings
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.0.catalog
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.0.metrics
    }

    /// Resolved when the node begins to close; waits end on it.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.0.shutdown
    }

    /// Runs `f` on a task the node owns (settlement work a caller's going away must not
    /// cancel). Closing waits for these tasks up to the drain deadline, then drops them
    /// (`None`): their work is the next start's recovery.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let hard = self.0.hard_stop.clone();
        // Boxed first: the batch and settlement futures are kilobytes, and the task tracker,
        // the select and tokio's task cell would each move them by value (the server's
        // profile showed these copies at about 15,000 instructions per transaction).
        let f = Box::pin(f);
        self.0.tracker.spawn(async move {
            tokio::select! {
                r = f => Some(r),
                _ = hard.cancelled() => None,
            }
        })
    }

    /// Every open tenant.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.0.tenants.read().values().cloned().collect()
    }

    /// The tenant `name`, opened if it is in the catalog and not open yet. A tenant this node
    /// dropped because its store fenced it out is [`ServiceError::TenantUnavailable`].
    pub async fn open_tenant(&self, name: &str) -> Result<Arc<Tenant>> {
        if let Some(t) = self.serving(name)? {
            return Ok(t);
        }
        if let Some(refusal) = self.leased_elsewhere(name) {
            return Err(refusal);
        }
        let _guard = self.0.opening.lock().await;
        if let Some(t) = self.serving(name)? {
            return Ok(t);
        }
        let Some(record) = self.0.catalog.tenant(name)? else {
            return Err(ServiceError::NotFound { what: "tenant", name: name.to_owned() });
        };
        let (settings, catalog, http, metrics) =
            (self.0.settings.tenant.clone(), self.0.catalog.clone(), self.0.http.clone(), self.0.metrics.clone());
        let tenant = tokio::task::spawn_blocking(move || Tenant::open(&record, &settings, catalog, http, metrics))
            .await
            .map_err(|e| ServiceError::io(format!("open tenant {name}"), std::io::Error::other(e)))??;
        tenant.start();
        self.watch_fence(&tenant);
        self.0.tenants.write().insert(name.to_owned(), tenant.clone());
        self.0.failed.lock().remove(name);
        Ok(tenant)
    }

    /// The refusal for a tenant that the latest cluster reading shows under another node's
    /// live lease (with the time since the reading taken off), without asking the database:
    /// a node that does not serve a tenant answers its requests from memory. Only a refusal
    /// is ever decided here; taking a tenant is always the database's decision. A reading
    /// misses a release for at most a round (a release notifies the registry, which reads at
    /// once).
    fn leased_elsewhere(&self, name: &str) -> Option<ServiceError> {
        let snapshot = self.0.registry.lock().as_ref()?.latest()?;
        let stream = snapshot.streams.iter().find(|s| s.stream == name)?;
        let owner = stream.owner.as_deref()?;
        if owner == self.0.settings.tenant.node_id {
            return None;
        }
        let age = u64::try_from(snapshot.taken_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let remaining_ms = stream.lease_left_ms?.checked_sub(age).filter(|ms| *ms > 50)?;
        let leased = tidegate_storage::StoreError::Leased {
            stream: name.to_owned(),
            owner: owner.to_owned(),
            address: snapshot.address(owner).map(str::to_owned),
            remaining_ms,
        };
        Some(ServiceError::Tenant {
            tenant: name.to_owned(),
            what: "open the ledger",
            source: Arc::new(tidegate_runtime::Error::Store(leased)),
        })
    }

    /// The open tenant `name`, if this node serves it; the refusal if it dropped it. A tenant
    /// whose engine was fenced out is dropped here at once (its watcher may not have run yet).
    fn serving(&self, name: &str) -> Result<Option<Arc<Tenant>>> {
        if let Some(refusal) = self.0.dropped.lock().get(name) {
            return Err(refusal.clone());
        }
        let Some(t) = self.0.tenants.read().get(name).cloned() else { return Ok(None) };
        match t.engine.fenced() {
            None => Ok(Some(t)),
            Some(fence) => {
                self.drop_fenced(&t, &fence);
                Err(ServiceError::fenced(&fence))
            }
        }
    }

    /// Drops `tenant` from the node when its engine is fenced out, whatever operation (or
    /// background task) met the fence.
    fn watch_fence(&self, tenant: &Arc<Tenant>) {
        let fenced = tenant.engine.when_fenced();
        let (node, weak) = (Arc::downgrade(&self.0), Arc::downgrade(tenant));
        tenant.add_background(tokio::spawn(async move {
            let Some(fence) = fenced.await else { return };
            if let (Some(node), Some(tenant)) = (node.upgrade(), weak.upgrade()) {
                Service(node).drop_fenced(&tenant, &fence);
            }
        }));
    }

    /// Drops a tenant whose engine was fenced out (see the module documentation): it answers
    /// [`ServiceError::TenantUnavailable`] from now on, and its engine, background tasks and
    /// review manager are stopped (on a blocking thread: the review database's client must
    /// not be dropped on a runtime worker). Idempotent.
    fn drop_fenced(&self, tenant: &Arc<Tenant>, fence: &tidegate_runtime::Fence) {
        let refusal = ServiceError::fenced(fence);
        self.0.dropped.lock().entry(tenant.name.clone()).or_insert_with(|| refusal.clone());
        let removed = {
            let mut tenants = self.0.tenants.write();
            match tenants.get(&tenant.name) {
                Some(t) if Arc::ptr_eq(t, tenant) => tenants.remove(&tenant.name),
                _ => None,
            }
        };
        let Some(t) = removed else { return };
        tracing::warn!(tenant = %t.name, "dropped from this node: {refusal}");
        self.0.metrics.tenants_fenced.inc();
        let name = t.name.clone();
        let release = tokio::task::spawn_blocking(move || t.release_fenced());
        let shared = matches!(self.0.settings.tenant.store, StoreUrl::Postgres { .. });
        let node = Arc::downgrade(&self.0);
        tokio::spawn(async move {
            if let Err(e) = release.await {
                tracing::error!(tenant = %name, "releasing the fenced tenant failed: {e}");
            }
            // On a shared store the stream's lease decides from now on: requests are sent to
            // its owner, and this node may take the tenant again once that owner is gone.
            if shared && let Some(node) = node.upgrade() {
                node.dropped.lock().remove(&name);
            }
        });
    }

    /// This node and who serves `tenant` (`GET /v1/cluster`): on a PostgreSQL store the owner,
    /// token and lease of the tenant's stream and every registered node with where it answers,
    /// whether it is live and how many tenants it holds (counts only: no other tenant's name
    /// leaves the database). A fresh reading is taken (on a blocking thread).
    pub async fn cluster(&self, tenant: &str) -> Result<ClusterView> {
        let node_id = self.0.settings.tenant.node_id.clone();
        let serving_here = self.0.tenants.read().contains_key(tenant);
        let StoreUrl::Postgres { url, .. } = &self.0.settings.tenant.store else {
            return Ok(ClusterView { node_id, shared: false, serving_here, stream: None, nodes: Vec::new() });
        };
        let url = url.clone();
        let snapshot = tokio::task::spawn_blocking(move || tidegate_postgres::NodeRegistry::read(&url))
            .await
            .map_err(|e| ServiceError::io("read the cluster", std::io::Error::other(e)))?
            .map_err(|e| ServiceError::Unavailable {
                code: "store_unavailable",
                detail: format!("the cluster's database: {e}"),
                retry_after: Some(1),
            })?;
        let window = crate::cluster::live_window(self.0.settings.tenant.ownership_lease);
        let mut held: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for o in &snapshot.streams {
            if let (Some(owner), Some(_)) = (&o.owner, o.lease_left_ms) {
                *held.entry(owner).or_default() += 1;
            }
        }
        let live: Vec<&str> = snapshot.alive(window).map(|n| n.node.as_str()).collect();
        let mut nodes: Vec<NodeView> = snapshot
            .nodes
            .iter()
            .map(|n| NodeView {
                id: n.node.clone(),
                address: n.address.clone(),
                live: live.contains(&n.node.as_str()),
                seen_ms_ago: Some(n.seen_ms_ago),
                tenants: held.get(n.node.as_str()).copied().unwrap_or(0),
            })
            .collect();
        // Owners that never registered (an embedded engine, a CLI command) still hold leases.
        for (owner, count) in &held {
            if !nodes.iter().any(|n| n.id == *owner) {
                nodes.push(NodeView {
                    id: (*owner).to_owned(),
                    address: None,
                    live: false,
                    seen_ms_ago: None,
                    tenants: *count,
                });
            }
        }
        let stream = snapshot.streams.iter().find(|o| o.stream == tenant).map(|o| StreamView {
            owner: o.owner.clone(),
            owner_address: o.owner.as_deref().and_then(|n| snapshot.address(n)).map(str::to_owned),
            token: o.token,
            lease_left_ms: o.lease_left_ms,
            last_lsn: o.last_lsn,
        });
        Ok(ClusterView { node_id, shared: true, serving_here, stream, nodes })
    }

    /// The tenants this node dropped because their stores fenced it out, with why.
    pub fn dropped_tenants(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self
            .0
            .dropped
            .lock()
            .iter()
            .map(|(name, e)| {
                let reason = match e {
                    ServiceError::TenantUnavailable { reason, .. } => reason.clone(),
                    other => other.to_string(),
                };
                (name.clone(), reason)
            })
            .collect();
        v.sort();
        v
    }

    /// Authenticates a presented API key (`tgk_<id>_<secret>`); opens its tenant if needed.
    /// Lookups are cached for [`ServiceSettings::key_cache_ttl`] (a revocation through this
    /// node takes effect at once: [`Service::forget_key`]).
    pub async fn authenticate(&self, token: &str) -> std::result::Result<Authenticated, AuthError> {
        let (id, secret) = parse_key(token).ok_or(AuthError::Unauthenticated("the API key is malformed"))?;
        let ttl = self.0.settings.key_cache_ttl;
        let cached = self.0.key_cache.lock().get(id).filter(|(_, at)| at.elapsed() < ttl).map(|(r, _)| r.clone());
        let record = match cached {
            Some(r) => Some(r),
            None => {
                let (cat, id2) = (self.0.catalog.clone(), id.to_owned());
                let r = tokio::task::spawn_blocking(move || cat.key(&id2))
                    .await
                    .map_err(|e| AuthError::CatalogUnavailable(e.to_string()))?
                    .map_err(|e| AuthError::CatalogUnavailable(e.to_string()))?;
                if let Some(rec) = &r {
                    self.0.key_cache.lock().insert(id.to_owned(), (rec.clone(), Instant::now()));
                }
                r
            }
        };
        let Some(record) = record else { return Err(AuthError::Unauthenticated("unknown API key")) };
        if !secret_matches(secret, &record.hash) {
            return Err(AuthError::Unauthenticated("unknown API key"));
        }
        if record.revoked_at_ms.is_some() {
            return Err(AuthError::Unauthenticated("the API key was revoked"));
        }
        let tenant = self.open_tenant(&record.tenant).await.map_err(|e| match e {
            ServiceError::TenantUnavailable { tenant, reason } => AuthError::NotServed { tenant, reason },
            e => match e.served_elsewhere() {
                Some((owner, address, remaining_ms)) => AuthError::ServedElsewhere {
                    owner: owner.to_owned(),
                    address: address.map(str::to_owned),
                    remaining_ms,
                    detail: e.to_string(),
                },
                None => AuthError::TenantUnavailable(e.to_string()),
            },
        })?;
        Ok(Authenticated { tenant, role: record.role, key_id: record.id })
    }

    /// Drops a key from the lookup cache (after a revocation).
    pub fn forget_key(&self, id: &str) {
        self.0.key_cache.lock().remove(id);
    }

    /// Scrape-time values.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        for t in self.tenants() {
            let (waits, wait) = t.engine.wait_stats();
            s.commit_waits += waits;
            s.commit_wait_seconds += wait.as_secs_f64();
            let st = t.engine.stats();
            s.unfinished += st.unfinished as u64;
            s.waiting += st.waiting as u64;
            let (q, l) = t.dispatcher.queue().depth();
            s.queued_tasks += q;
            s.leased_tasks += l;
            s.ledger_syncs += t.ledger_syncs();
            s.tenants += 1;
        }
        s
    }

    /// `(catalog ok, open, recovering, failed)`.
    pub fn readiness(&self) -> (bool, usize, usize, usize) {
        let catalog = self.0.catalog.ping().is_ok();
        let tenants = self.tenants();
        let recovering = tenants.iter().filter(|t| t.status() == TenantStatus::Recovering).count();
        let failed = tenants.iter().filter(|t| matches!(t.status(), TenantStatus::Failed(_))).count()
            + self.0.failed.lock().len();
        (catalog, tenants.len(), recovering, failed)
    }

    /// Ends waits, waits up to `drain` for the node's tasks, then checkpoints and syncs every
    /// tenant's ledger. Returns problems met.
    pub async fn close(&self, drain: Duration) -> Vec<String> {
        self.0.shutdown.cancel();
        for t in self.tenants() {
            // Wakes the pollers; a dispatch the drain cuts off leaves its task in the tenant's
            // state for the next start.
            t.dispatcher.queue().close();
        }
        self.0.tracker.close();
        if tokio::time::timeout(drain, self.0.tracker.wait()).await.is_err() {
            tracing::warn!("settlement tasks still running after the drain; recovery finishes them at the next start");
            self.0.hard_stop.cancel();
            self.0.tracker.wait().await;
        }
        let mut problems = Vec::new();
        for t in self.tenants() {
            let t2 = t.clone();
            match tokio::task::spawn_blocking(move || t2.close()).await {
                Ok(Ok(())) => tracing::info!(tenant = %t.name, "closed"),
                Ok(Err(e)) => problems.push(format!("tenant `{}`: {e}", t.name)),
                Err(e) => problems.push(format!("tenant {}: {e}", t.name)),
            }
        }
        self.0.tenants.write().clear();
        // Leave the cluster last: the leases are ended, so the other nodes take the tenants
        // at their next round.
        let registry = self.0.registry.lock().take();
        if let Some(r) = registry {
            let _ = tokio::task::spawn_blocking(move || drop(r)).await;
        }
        problems
    }
}
