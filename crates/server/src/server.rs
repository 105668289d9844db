//! The server: shared state, tenants opened on demand, serving and graceful shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::extract::AuthContext;
use crate::api::problem::ApiError;
use crate::auth::{parse_key, secret_matches};
use crate::catalog::{Catalog, KeyRecord};
use crate::config::Config;
use crate::error::{Result, ServerError};
use crate::metrics::{Metrics, Snapshot};
use crate::tenant::{Tenant, TenantSettings, TenantStatus};

pub(crate) struct Inner {
    config: Config,
    catalog: Arc<Catalog>,
    tenants: RwLock<HashMap<String, Arc<Tenant>>>,
    opening: tokio::sync::Mutex<()>,
    failed: Mutex<HashMap<String, String>>,
    settings: TenantSettings,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
    pub(crate) global: Arc<Semaphore>,
    pub(crate) waiters: Arc<Semaphore>,
    shutdown: CancellationToken,
    /// Cancels the server's tasks still running after the drain.
    hard_stop: CancellationToken,
    tracker: TaskTracker,
    key_cache: Mutex<HashMap<String, (KeyRecord, Instant)>>,
}

/// The state every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("tenants", &self.0.tenants.read().len()).finish_non_exhaustive()
    }
}

impl AppState {
    /// Opens the catalog and every tenant in it (their recovery runs in the background).
    pub async fn open(mut config: Config) -> Result<AppState> {
        config.validate()?;
        crate::review::check_postgres_admins(&config.review).await?;
        let catalog = if config.server.memory {
            Catalog::in_memory()?
        } else {
            let Some(dir) = config.server.data_dir.clone() else {
                return Err(ServerError::InvalidArgument {
                    field: "server.data_dir",
                    value: "(none)".into(),
                    expected: "a data directory, or server.memory = true",
                });
            };
            let dir2 = dir.clone();
            let cat = tokio::task::spawn_blocking(move || Catalog::open(&dir2))
                .await
                .map_err(|e| ServerError::Io { op: "open the catalog".into(), source: std::io::Error::other(e) })??;
            config.server.data_dir = Some(dir);
            cat
        };
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tidegate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ServerError::HttpClient)?;
        let settings = TenantSettings::from_config(&config);
        let state = AppState(Arc::new(Inner {
            global: Arc::new(Semaphore::new(config.limits.max_concurrent_requests)),
            waiters: Arc::new(Semaphore::new(config.limits.max_waiters)),
            config,
            catalog: Arc::new(catalog),
            tenants: RwLock::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
            failed: Mutex::new(HashMap::new()),
            settings,
            metrics: Arc::new(Metrics::new()),
            http,
            shutdown: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            key_cache: Mutex::new(HashMap::new()),
        }));
        for t in state.0.catalog.tenants()? {
            if let Err(e) = state.open_tenant(&t.name).await {
                tracing::error!(tenant = %t.name, "could not open: {e}");
                state.0.failed.lock().insert(t.name.clone(), e.to_string());
            }
        }
        Ok(state)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.0.config
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.0.catalog
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.0.metrics
    }

    /// Resolved when shutdown begins; waits end on it.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.0.shutdown
    }

    /// Runs `f` on a task the server owns (settlement work a client disconnect must not
    /// cancel). Shutdown waits for these tasks up to the drain deadline, then drops them
    /// (`None`): their work is the next start's recovery.
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let hard = self.0.hard_stop.clone();
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

    async fn open_tenant(&self, name: &str) -> Result<Arc<Tenant>> {
        if let Some(t) = self.0.tenants.read().get(name) {
            return Ok(t.clone());
        }
        let _guard = self.0.opening.lock().await;
        if let Some(t) = self.0.tenants.read().get(name) {
            return Ok(t.clone());
        }
        let Some(record) = self.0.catalog.tenant(name)? else {
            return Err(ServerError::NotFound { what: "tenant", name: name.to_owned() });
        };
        let (settings, catalog, http, metrics) =
            (self.0.settings.clone(), self.0.catalog.clone(), self.0.http.clone(), self.0.metrics.clone());
        let tenant = tokio::task::spawn_blocking(move || Tenant::open(&record, &settings, catalog, http, metrics))
            .await
            .map_err(|e| ServerError::Io { op: format!("open tenant {name}"), source: std::io::Error::other(e) })??;
        tenant.start();
        self.0.tenants.write().insert(name.to_owned(), tenant.clone());
        self.0.failed.lock().remove(name);
        Ok(tenant)
    }

    /// Authenticates `Authorization` header contents; opens the key's tenant if needed.
    pub async fn authenticate(&self, header: &str) -> std::result::Result<AuthContext, ApiError> {
        let token = match header.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => return Err(ApiError::unauthenticated("the Authorization header is not `Bearer <key>`")),
        };
        let (id, secret) = parse_key(token).ok_or_else(|| ApiError::unauthenticated("the API key is malformed"))?;
        let ttl = Duration::from_millis(self.0.config.auth.cache_ttl_ms);
        let cached = self.0.key_cache.lock().get(id).filter(|(_, at)| at.elapsed() < ttl).map(|(r, _)| r.clone());
        let record = match cached {
            Some(r) => Some(r),
            None => {
                let (cat, id2) = (self.0.catalog.clone(), id.to_owned());
                let r = tokio::task::spawn_blocking(move || cat.key(&id2))
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .map_err(|e| {
                        ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "catalog_unavailable", e.to_string())
                            .retry_after(1)
                    })?;
                if let Some(rec) = &r {
                    self.0.key_cache.lock().insert(id.to_owned(), (rec.clone(), Instant::now()));
                }
                r
            }
        };
        let Some(record) = record else { return Err(ApiError::unauthenticated("unknown API key")) };
        if !secret_matches(secret, &record.hash) {
            return Err(ApiError::unauthenticated("unknown API key"));
        }
        if record.revoked_at_ms.is_some() {
            return Err(ApiError::unauthenticated("the API key was revoked"));
        }
        let tenant = self.open_tenant(&record.tenant).await.map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "tenant_unavailable",
                format!("the tenant's engine could not be opened: {e}"),
            )
            .retry_after(5)
        })?;
        Ok(AuthContext { tenant, role: record.role, key_id: record.id })
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

    /// Ends waits, waits up to `drain` for the server's settlement tasks, then checkpoints
    /// and syncs every tenant's ledger. Returns problems met.
    pub async fn close(&self, drain: Duration) -> Vec<String> {
        self.0.shutdown.cancel();
        for t in self.tenants() {
            t.dispatcher.queue().wake_all();
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
        problems
    }
}
