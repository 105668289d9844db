//! Each tenant's review manager (`tidegate-review`, docs/review.md), behind `/v1/review`.
//!
//! One manager per tenant, opened at the tenant's first review request on the database its
//! configuration names (`[review]`, docs/server.md). Its decision log is kept in the tenant's
//! own ledger as extension records of the stream [`STREAM`] ([`LedgerLog`]), so the manager's
//! buffer, dependency graph and decisions come back from the ledger after a restart (nothing
//! is executed again: the manager settles an action whose outcome was not logged from its
//! marker table).

use parking_lot::Mutex;
use tidegate_review::{DecisionLog, Manager, Options, Record, SqliteDatabase, TemplateSet};
use tidegate_runtime::Tidegate;

use crate::settings::{ReviewDatabase, ReviewSection};

/// The ledger stream holding the review manager's decision log.
pub const STREAM: &str = "review";

/// A decision log in a Tidegate ledger: each record is one extension record of a stream,
/// durable when `append` returns.
#[derive(Debug, Clone)]
pub struct LedgerLog {
    engine: Tidegate,
    stream: String,
}

impl LedgerLog {
    /// The log kept in `engine`'s ledger under `stream`.
    pub fn new(engine: Tidegate, stream: impl Into<String>) -> LedgerLog {
        LedgerLog { engine, stream: stream.into() }
    }
}

fn log_error(e: tidegate_runtime::Error) -> tidegate_review::Error {
    tidegate_review::Error::Log { message: format!("ledger: {e}"), retryable: e.retryable() }
}

impl DecisionLog for LedgerLog {
    fn append(&mut self, record: &Record) -> tidegate_review::Result<()> {
        let body = tidegate_review::log::encode_entry(record)?;
        self.engine.append_extension_blocking(&self.stream, body).map_err(log_error)?;
        Ok(())
    }

    fn read_all(&self) -> tidegate_review::Result<Vec<Record>> {
        let records = self.engine.extension_records(&self.stream).map_err(log_error)?;
        records.iter().map(|(_, body)| tidegate_review::log::decode_entry(body)).collect()
    }
}

/// Where a tenant's review manager is opened from.
#[derive(Debug, Clone)]
pub struct ReviewPlace {
    /// The tenant's name (for per-tenant configuration).
    pub tenant: String,
    /// The tenant's directory (`<data_dir>/tenants/<name>`), `None` in memory.
    pub dir: Option<std::path::PathBuf>,
    /// The configuration.
    pub config: ReviewSection,
}

/// A tenant's review manager, opened on first use. Every method blocks (database, ledger):
/// call it from a blocking thread.
#[derive(Default)]
pub struct TenantReview {
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    manager: Option<Manager>,
    /// Set by [`TenantReview::close`]: the manager is not opened again.
    closed: bool,
}

impl std::fmt::Debug for TenantReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = self.slot.lock();
        f.debug_struct("TenantReview").field("open", &slot.manager.is_some()).field("closed", &slot.closed).finish()
    }
}

/// Why the manager could not be used.
#[derive(Debug)]
pub enum ReviewFailure {
    /// The configuration names no usable database, the database could not be opened with
    /// least privilege, or the server is closing. The text is safe to show the tenant (the
    /// details, which may name other tenants' roles or schemas, are in the server's log).
    Config(String),
    /// The manager refused or failed.
    Review(tidegate_review::Error),
}

impl From<tidegate_review::Error> for ReviewFailure {
    fn from(e: tidegate_review::Error) -> Self {
        ReviewFailure::Review(e)
    }
}

impl TenantReview {
    /// Runs `f` on the manager, opening it first if needed (rebuilt from the ledger).
    pub fn with<R>(
        &self,
        engine: &Tidegate,
        place: &ReviewPlace,
        f: impl FnOnce(&mut Manager) -> tidegate_review::Result<R>,
    ) -> Result<R, ReviewFailure> {
        let mut slot = self.slot.lock();
        if slot.closed {
            return Err(ReviewFailure::Config("the server is shutting down".into()));
        }
        if slot.manager.is_none() {
            slot.manager = Some(open(engine, place).map_err(|e| scrub_failure(place, e))?);
        }
        let m = slot.manager.as_mut().ok_or_else(|| ReviewFailure::Config("the manager did not open".into()))?;
        f(m).map_err(|e| scrub_failure(place, ReviewFailure::Review(e)))
    }

    /// Whether the manager is open.
    pub fn is_open(&self) -> bool {
        self.slot.lock().manager.is_some()
    }

    /// Closes the manager and its database connection (waiting for a call in progress), and
    /// refuses to open it again. Blocking: call it from a blocking thread, as the PostgreSQL
    /// client closes its own runtime.
    pub fn close(&self) {
        let manager = {
            let mut slot = self.slot.lock();
            slot.closed = true;
            slot.manager.take()
        };
        drop(manager);
    }
}

/// Replaces the server's directories in `text` (a database's or the ledger's error) with
/// placeholders: error details reach the tenant and must not show the server's paths.
pub fn scrub(place: &ReviewPlace, text: &str) -> String {
    let mut hide: Vec<(String, &str)> = Vec::new();
    let mut note = |p: &std::path::Path, label: &'static str| {
        for q in [Some(p.to_owned()), std::fs::canonicalize(p).ok()].into_iter().flatten() {
            let t = q.to_string_lossy().into_owned();
            if t.len() > 1 && !hide.iter().any(|(h, _)| *h == t) {
                hide.push((t, label));
            }
        }
    };
    if let Some(dir) = &place.dir {
        note(dir, "<tenant directory>");
        if let Some(data) = dir.parent().and_then(std::path::Path::parent) {
            note(data, "<data_dir>");
        }
    }
    if let Ok((ReviewDatabase::Sqlite(p), _, _)) = place.config.for_tenant(&place.tenant) {
        note(&p, "<review database>");
        if let Some(d) = p.parent() {
            note(d, "<review directory>");
        }
    }
    hide.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
    let mut out = text.to_owned();
    for (t, label) in hide {
        out = out.replace(&t, label);
    }
    out
}

fn scrub_failure(place: &ReviewPlace, e: ReviewFailure) -> ReviewFailure {
    use tidegate_review::Error as E;
    match e {
        ReviewFailure::Config(m) => ReviewFailure::Config(scrub(place, &m)),
        ReviewFailure::Review(E::Database { op, message, retryable }) => {
            ReviewFailure::Review(E::Database { op: scrub(place, &op), message: scrub(place, &message), retryable })
        }
        ReviewFailure::Review(E::Log { message, retryable }) => {
            ReviewFailure::Review(E::Log { message: scrub(place, &message), retryable })
        }
        other => other,
    }
}

/// Refuses to start (a configuration error naming the key) when a PostgreSQL review URL
/// connects as a superuser and `review.allow_postgres_superuser` is off, or as a role that
/// cannot create the tenants' roles. A server that does not answer now is only logged: each
/// tenant's first review request checks again.
pub async fn check_postgres_admins(section: &ReviewSection) -> Result<(), crate::error::ConfigError> {
    for (key, url) in section.postgres_urls() {
        let allow = section.allow_postgres_superuser;
        let checked = tokio::task::spawn_blocking(move || {
            tidegate_review::PgDatabase::check_admin(&url, allow, std::time::Duration::from_secs(5))
        })
        .await;
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(e @ tidegate_review::Error::Privilege { .. })) => {
                return Err(crate::error::ConfigError::Invalid {
                    key,
                    detail: format!(
                        "{e} (the URL is the admin connection that creates each tenant's role; docs/server.md, \"Review\"; \
                         `review.allow_postgres_superuser = true` allows a superuser)"
                    ),
                });
            }
            Ok(Err(e)) => {
                tracing::warn!(%key, "the review database could not be checked at start ({e}); each tenant's first review request checks it")
            }
            Err(e) => tracing::warn!(%key, "the review database check failed: {e}"),
        }
    }
    Ok(())
}

/// Opens `place`'s manager over `engine`'s ledger. A database that cannot be opened with least
/// privilege is a [`ReviewFailure::Config`] whose details go to the log, not to the tenant.
pub fn open(engine: &Tidegate, place: &ReviewPlace) -> Result<Manager, ReviewFailure> {
    let (db, strategy, granularity) = place.config.for_tenant(&place.tenant).map_err(ReviewFailure::Config)?;
    let bounds = place.config.bounds();
    let opened: tidegate_review::Result<Box<dyn tidegate_review::Database>> = match db {
        ReviewDatabase::Default => match &place.dir {
            Some(dir) => SqliteDatabase::open_with(&dir.join("review.db"), bounds).map(|d| Box::new(d) as _),
            None => SqliteDatabase::memory_with(bounds).map(|d| Box::new(d) as _),
        },
        ReviewDatabase::Sqlite(path) => SqliteDatabase::open_with(&path, bounds).map(|d| Box::new(d) as _),
        ReviewDatabase::Postgres(url) => {
            // Each tenant in a schema of its own, owned by a login role of its own: tenants
            // sharing one database never share tables, the marker table, or privileges.
            let schema = place.config.pg_schema(&place.tenant).map_err(ReviewFailure::Config)?;
            let options = tidegate_review::PgTenantOptions {
                bounds,
                allow_superuser_admin: place.config.allow_postgres_superuser,
            };
            tidegate_review::PgDatabase::connect_tenant(&url, &schema, &options).map(|d| {
                tracing::info!(tenant = %place.tenant, role = ?d.role(), %schema, "review database: connected as the tenant's role");
                Box::new(d) as _
            })
        }
    };
    let db = match opened {
        Ok(db) => db,
        Err(e) if e.retryable() => {
            tracing::warn!(tenant = %place.tenant, "the review database could not be opened now: {e}");
            return Err(ReviewFailure::Review(tidegate_review::Error::Database {
                op: "open".into(),
                message: "the review database did not answer or was busy; the server's log has the details".into(),
                retryable: true,
            }));
        }
        Err(e) => {
            tracing::error!(tenant = %place.tenant, "the review database could not be opened: {e}");
            let what = match e {
                tidegate_review::Error::Privilege { .. } => {
                    "least privilege could not be set up for it (review.database names an admin connection that \
                     must have CREATEROLE and must not be a superuser unless review.allow_postgres_superuser is set)"
                }
                _ => "it could not be opened",
            };
            return Err(ReviewFailure::Config(format!("{what}; the server's log has the details")));
        }
    };
    let log = LedgerLog::new(engine.clone(), STREAM);
    Ok(Manager::open(TemplateSet::default(), db, Box::new(log), Options { strategy, granularity })?)
}
