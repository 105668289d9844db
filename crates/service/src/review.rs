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

/// A tenant's registered review templates and the deployment's options.
#[derive(Debug, Clone)]
pub struct TemplatesView {
    /// Whether this registration added anything.
    pub added: bool,
    /// Every registered template's name.
    pub templates: Vec<String>,
    /// The strategy (`buffer_suspicious` or `buffer_compensating`).
    pub strategy: String,
    /// The finest dependency-check granularity.
    pub granularity: String,
}

/// A request for a review transaction.
#[derive(Debug, Clone)]
pub struct ReviewRequest {
    /// The template's name.
    pub template: String,
    /// Its parameters (an object).
    pub params: serde_json::Value,
    /// Who sent it (1 to [`MAX_SENDER_BYTES`]); `None`: the caller.
    pub sender: Option<String>,
    /// Whether it needs review.
    pub suspicious: bool,
}

/// Longest sender name of a review request.
pub const MAX_SENDER_BYTES: usize = 200;

/// One transaction of the review middleware, with public ids (`rv_<tag>_<n>`).
#[derive(Debug, Clone)]
pub struct ReviewTxView {
    /// Its id.
    pub id: String,
    /// The template.
    pub template: String,
    /// The template's SQL statements, in order.
    pub sql: Vec<String>,
    /// The parameters.
    pub params: serde_json::Value,
    /// Who sent it.
    pub sender: String,
    /// Whether it needs review.
    pub suspicious: bool,
    /// Where it stands.
    pub status: tidegate_review::Status,
    /// Whether a reviewer may decide on it now.
    pub reviewable: bool,
    /// The reviewer's decision (`accept` or `remove`), if any.
    pub review: Option<String>,
    /// Buffered transactions it waits for.
    pub waits_for: Vec<String>,
    /// Transactions waiting for it.
    pub waited_by: Vec<String>,
    /// What removing it now would also remove.
    pub removal_cascade: Vec<String>,
    /// The removal it was cascaded from, if any.
    pub cascaded_from: Option<String>,
    /// The database's refusal, if any.
    pub error: Option<String>,
}

/// A reviewer's decision and what followed.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The transaction after the decision.
    pub transaction: ReviewTxView,
    /// The transactions the decision removed with it, in id order.
    pub cascaded: Vec<String>,
}

/// The buffer: transactions not yet final, oldest first.
#[derive(Debug, Clone)]
pub struct ReviewQueue {
    /// The first `limit` of them.
    pub data: Vec<ReviewTxView>,
    /// How many are in the buffer.
    pub total: usize,
    /// How many of them await a reviewer.
    pub reviewable: usize,
}

/// A failure of the review manager, in the service's terms: bad templates or parameters
/// name the field, an unknown transaction is `NotFound`, a database that does not answer is
/// `Unavailable` (retryable when it may answer later), one that refuses the statement is
/// `Refused` (`database_refused`).
pub fn review_error(e: ReviewFailure) -> crate::error::ServiceError {
    use crate::error::ServiceError;
    use tidegate_review::Error as E;
    let unavailable =
        |detail: String, retry_after| ServiceError::Unavailable { code: "review_unavailable", detail, retry_after };
    match e {
        ReviewFailure::Config(detail) => {
            unavailable(format!("the tenant's review database is not usable: {detail}"), None)
        }
        ReviewFailure::Review(e) => match e {
            E::Template { template, field, value, expected } => {
                // Whole-set paths as they are; a template's own fields under its name.
                let field = if ["templates[", "tables", "invariants"].iter().any(|p| field.starts_with(p)) {
                    format!("set.{field}")
                } else {
                    format!("set.templates[{template:?}].{field}")
                };
                ServiceError::invalid(field, value, expected)
            }
            E::UnknownTemplate(name) => {
                ServiceError::invalid("template", name, "the name of a template registered with this tenant")
            }
            E::Param { template, field, value, expected } => {
                let field = if field == "params" { field } else { format!("params.{field}") };
                ServiceError::invalid(field, value, format!("{expected} (template {template:?})"))
            }
            E::Review { id, reason } => {
                ServiceError::conflict("not_reviewable", format!("transaction {id} cannot be reviewed: {reason}"))
            }
            E::UnknownTx(id) => ServiceError::NotFound { what: "review transaction", name: id.to_string() },
            e @ (E::Database { .. } | E::Log { .. }) if e.retryable() => unavailable(e.to_string(), Some(1)),
            E::Privilege { .. } => unavailable(
                "the tenant's review database is not usable: least privilege could not be set up for it; the server's log has the details".into(),
                None,
            ),
            E::Database { op, message, .. } => {
                ServiceError::Refused { code: "database_refused", detail: format!("{op}: {message}") }
            }
            other => ServiceError::Internal(other.to_string()),
        },
    }
}

fn rv(tag: &str, n: u64) -> String {
    crate::ids::format(crate::ids::Kind::Review, tag, n)
}

fn snake<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn templates_view(m: &Manager, added: bool) -> TemplatesView {
    let o = m.options();
    TemplatesView {
        added,
        templates: m.templates().templates.iter().map(|t| t.name.clone()).collect(),
        strategy: snake(&o.strategy),
        granularity: snake(&o.granularity),
    }
}

fn tx_view(m: &Manager, tag: &str, v: tidegate_review::TxView) -> ReviewTxView {
    let sql = m
        .templates()
        .get(&v.template)
        .map(|t| t.steps.iter().flat_map(|s| s.statements.iter().map(|st| st.sql.clone())).collect())
        .unwrap_or_default();
    let reviewable = v.suspicious && v.review.is_none() && !v.status.is_final();
    let removal_cascade =
        if reviewable { m.cascade_preview(v.id).into_iter().map(|n| rv(tag, n)).collect() } else { Vec::new() };
    ReviewTxView {
        id: rv(tag, v.id),
        template: v.template,
        sql,
        params: v.params,
        sender: v.sender,
        suspicious: v.suspicious,
        status: v.status,
        reviewable,
        review: v.review.map(|d| snake(&d)),
        waits_for: v.waits_for.into_iter().map(|n| rv(tag, n)).collect(),
        waited_by: v.waited_by.into_iter().map(|n| rv(tag, n)).collect(),
        removal_cascade,
        cascaded_from: v.cascaded_from.map(|n| rv(tag, n)),
        error: v.error,
    }
}

impl crate::tenant::Tenant {
    /// Runs `f` on the tenant's review manager on a blocking thread. With `id` (the review
    /// transaction a request names, as given), an unknown transaction is `NotFound` naming
    /// `id` exactly as an id of another tenant, and a refused review names `id`, not the
    /// manager's internal number.
    async fn with_review<R: Send + 'static>(
        self: &std::sync::Arc<Self>,
        id: Option<&str>,
        f: impl FnOnce(&mut Manager) -> tidegate_review::Result<R> + Send + 'static,
    ) -> crate::error::Result<R> {
        use crate::error::ServiceError;
        let t = self.clone();
        let r = tokio::task::spawn_blocking(move || t.review.with(&t.engine, &t.review_place, f))
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))?;
        r.map_err(|e| match (e, id) {
            (ReviewFailure::Review(tidegate_review::Error::UnknownTx(_)), Some(id)) => {
                ServiceError::NotFound { what: "review transaction", name: id.to_owned() }
            }
            (ReviewFailure::Review(tidegate_review::Error::Review { reason, .. }), Some(id)) => {
                ServiceError::conflict("not_reviewable", format!("transaction {id} cannot be reviewed: {reason}"))
            }
            (e, _) => review_error(e),
        })
    }

    fn parse_review(&self, id: &str) -> crate::error::Result<u64> {
        crate::ids::parse(crate::ids::Kind::Review, &self.tag, id)
            .ok_or_else(|| crate::error::ServiceError::NotFound { what: "review transaction", name: id.to_owned() })
    }

    /// Registers a template set (JSON in the format of docs/review.md; its fields are named
    /// under `set`), after running `schema` (SQL) on the tenant's review database.
    pub async fn register_templates(
        self: &std::sync::Arc<Self>,
        set: serde_json::Value,
        schema: Option<String>,
    ) -> crate::error::Result<TemplatesView> {
        let set: TemplateSet = serde_path_to_error::deserialize(set).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "set".to_owned() } else { format!("set.{path}") };
            crate::error::ServiceError::invalid(
                field,
                e.inner().to_string(),
                "a template set (tables, invariants, templates; docs/review.md)",
            )
        })?;
        let schema = schema.filter(|s| !s.trim().is_empty());
        self.with_review(None, move |m| {
            let added = m.register(set, schema)?;
            Ok(templates_view(m, added))
        })
        .await
    }

    /// The registered templates.
    pub async fn review_templates(self: &std::sync::Arc<Self>) -> crate::error::Result<TemplatesView> {
        self.with_review(None, |m| Ok(templates_view(m, false))).await
    }

    /// Requests a review transaction (`caller` is the sender when the request names none):
    /// it runs at once, or is buffered until a reviewer decides.
    pub async fn request_review(
        self: &std::sync::Arc<Self>,
        req: ReviewRequest,
        caller: String,
    ) -> crate::error::Result<ReviewTxView> {
        if let Some(s) = &req.sender
            && (s.is_empty() || s.len() > MAX_SENDER_BYTES)
        {
            return Err(crate::error::ServiceError::invalid(
                "sender",
                s.as_str(),
                format!("1 to {MAX_SENDER_BYTES} bytes"),
            ));
        }
        let sender = req.sender.unwrap_or(caller);
        let request =
            tidegate_review::Request { template: req.template, params: req.params, sender, suspicious: req.suspicious };
        let tag = self.tag.clone();
        self.with_review(None, move |m| {
            let id = m.request(request)?;
            let v = m.status(id)?;
            Ok(tx_view(m, &tag, v))
        })
        .await
    }

    /// The review transaction `id`.
    pub async fn review_tx(self: &std::sync::Arc<Self>, id: &str) -> crate::error::Result<ReviewTxView> {
        let n = self.parse_review(id)?;
        let tag = self.tag.clone();
        self.with_review(Some(id), move |m| {
            let v = m.status(n)?;
            Ok(tx_view(m, &tag, v))
        })
        .await
    }

    /// A reviewer's (`reviewer`) decision about the review transaction `id`.
    pub async fn decide_review(
        self: &std::sync::Arc<Self>,
        id: &str,
        decision: tidegate_review::Decision,
        reviewer: String,
    ) -> crate::error::Result<Decided> {
        let n = self.parse_review(id)?;
        let tag = self.tag.clone();
        self.with_review(Some(id), move |m| {
            m.review(n, decision, &reviewer)?;
            let v = m.status(n)?;
            let cascaded = m.cascaded(n).into_iter().map(|c| rv(&tag, c)).collect();
            Ok(Decided { transaction: tx_view(m, &tag, v), cascaded })
        })
        .await
    }

    /// The buffer: the first `limit` transactions not yet final, oldest first.
    pub async fn review_queue(self: &std::sync::Arc<Self>, limit: usize) -> crate::error::Result<ReviewQueue> {
        let tag = self.tag.clone();
        self.with_review(None, move |m| {
            let all = m.queue();
            let total = all.len();
            let data: Vec<ReviewTxView> = all.into_iter().take(limit).map(|v| tx_view(m, &tag, v)).collect();
            let reviewable = m.reviewable().len();
            Ok(ReviewQueue { data, total, reviewable })
        })
        .await
    }
}
