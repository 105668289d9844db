//! The server: shared state, tenants opened on demand, serving and graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::api::extract::AuthContext;
use crate::api::problem::ApiError;
use crate::config::Config;
use crate::error::Result;
use tidegate_service::catalog::Catalog;
use tidegate_service::metrics::{Metrics, Snapshot};
use tidegate_service::tenant::Tenant;
use tidegate_service::{AuthError, Service, ServiceSettings};

pub(crate) struct Inner {
    config: Config,
    /// The node: catalog, tenants, owned tasks, authentication.
    service: Service,
    pub(crate) global: Arc<Semaphore>,
    pub(crate) waiters: Arc<Semaphore>,
}

/// The state every handler shares: the service and what HTTP adds to it (the configuration,
/// request and waiter limits). Cheap to clone.
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("service", &self.0.service).finish_non_exhaustive()
    }
}

impl AppState {
    /// Opens the service: the catalog and every tenant in it (their recovery runs in the
    /// background). On a PostgreSQL store the node joins the cluster without an address
    /// ([`AppState::open_at`] gives one).
    pub async fn open(config: Config) -> Result<AppState> {
        AppState::open_with(config, None).await
    }

    /// [`AppState::open`] for a node that answers at `bound` (its listener's address): on a
    /// PostgreSQL store the node registers [`Config::advertise_url`] with the cluster.
    pub async fn open_at(config: Config, bound: std::net::SocketAddr) -> Result<AppState> {
        let advertise = config.advertise_url(bound);
        AppState::open_with(config, Some(advertise)).await
    }

    async fn open_with(config: Config, advertise: Option<String>) -> Result<AppState> {
        config.validate()?;
        tidegate_service::review::check_postgres_admins(&config.review).await?;
        let settings = ServiceSettings {
            tenant: config.tenant_settings()?,
            key_cache_ttl: Duration::from_millis(config.auth.cache_ttl_ms),
            advertise,
        };
        let service = Service::open(settings).await?;
        Ok(AppState(Arc::new(Inner {
            global: Arc::new(Semaphore::new(config.limits.max_concurrent_requests)),
            waiters: Arc::new(Semaphore::new(config.limits.max_waiters)),
            config,
            service,
        })))
    }

    /// The service this front door adapts.
    pub fn service(&self) -> &Service {
        &self.0.service
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.0.config
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        self.0.service.catalog()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.0.service.metrics()
    }

    /// Resolved when shutdown begins; waits end on it.
    pub fn shutdown_token(&self) -> &CancellationToken {
        self.0.service.shutdown_token()
    }

    /// Runs `f` on a task the service owns (see [`Service::spawn`]).
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0.service.spawn(f)
    }

    /// Every open tenant.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.0.service.tenants()
    }

    /// Authenticates `Authorization` header contents; opens the key's tenant if needed.
    pub async fn authenticate(&self, header: &str) -> std::result::Result<AuthContext, ApiError> {
        let token = match header.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => return Err(ApiError::unauthenticated("the Authorization header is not `Bearer <key>`")),
        };
        match self.0.service.authenticate(token).await {
            Ok(a) => Ok(AuthContext { tenant: a.tenant, role: a.role, key_id: a.key_id }),
            Err(AuthError::Unauthenticated(why)) => Err(ApiError::unauthenticated(why)),
            Err(AuthError::CatalogUnavailable(e)) => {
                Err(ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "catalog_unavailable", e).retry_after(1))
            }
            Err(AuthError::TenantUnavailable(e)) => Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "tenant_unavailable",
                format!("the tenant's engine could not be opened: {e}"),
            )
            .retry_after(5)),
            // Another node serves the tenant: say which and where (docs/deployment.md).
            Err(AuthError::ServedElsewhere { owner, address, remaining_ms, detail }) => {
                Err(ApiError::served_elsewhere(&owner, address.as_deref(), remaining_ms, detail))
            }
            // The node dropped the key's tenant (its store fenced the node out).
            Err(AuthError::NotServed { tenant, reason }) => {
                Err(tidegate_service::ServiceError::TenantUnavailable { tenant, reason }.into())
            }
            Err(e) => Err(ApiError::unauthenticated(e.to_string())),
        }
    }

    /// Drops a key from the lookup cache (after a revocation).
    pub fn forget_key(&self, id: &str) {
        self.0.service.forget_key(id);
    }

    /// Scrape-time values.
    pub fn snapshot(&self) -> Snapshot {
        self.0.service.snapshot()
    }

    /// `(catalog ok, open, recovering, failed)`.
    pub fn readiness(&self) -> (bool, usize, usize, usize) {
        self.0.service.readiness()
    }

    /// Ends waits, waits up to `drain` for the service's settlement tasks, then checkpoints
    /// and syncs every tenant's ledger. Returns problems met.
    pub async fn close(&self, drain: Duration) -> Vec<String> {
        self.0.service.close(drain).await
    }
}
