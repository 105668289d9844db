//! Settings of the service's tenants that a front door's configuration fills in: the
//! `[dispatch]` and `[review]` sections of `tidegate serve`'s TOML file are these types (the
//! server's `config` module re-exports them), so the service reads typed values and never the
//! file.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[dispatch]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchSection {
    /// Default webhook timeout in milliseconds. Default 10 000.
    pub webhook_timeout_ms: u64,
    /// Default webhook attempts. Default 4.
    pub webhook_attempts: u32,
    /// Default backoff before the second attempt, in milliseconds. Default 100.
    pub webhook_backoff_ms: u64,
    /// Default worker task lease in milliseconds. Default 30 000.
    pub task_lease_ms: u64,
    /// Effect keys whose dispatch attempts are kept per tenant. Default 10 000.
    pub attempts_retained: usize,
    /// If non-empty, webhook URLs must name one of these hosts. Default empty (any).
    pub allowed_webhook_hosts: Vec<String>,
}

impl Default for DispatchSection {
    fn default() -> Self {
        DispatchSection {
            webhook_timeout_ms: 10_000,
            webhook_attempts: 4,
            webhook_backoff_ms: 100,
            task_lease_ms: 30_000,
            attempts_retained: 10_000,
            allowed_webhook_hosts: Vec::new(),
        }
    }
}

/// `[review]`: each tenant's review manager (one per tenant, opened at its first review
/// request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReviewSection {
    /// The database transactions run on, for tenants not listed in `tenants`: `sqlite:PATH`,
    /// `postgres://...` (or `postgresql://...`), or empty for the default: the SQLite file
    /// `<data_dir>/tenants/<name>/review.db` (a private in-memory SQLite database with
    /// `server.memory`). Default empty.
    pub database: String,
    /// `buffer_suspicious` or `buffer_compensating` (a template may override it). Default
    /// `buffer_suspicious`.
    pub strategy: tidegate_review::Strategy,
    /// The finest granularity of dependency checks: `field`, `row`, `column` or `table`.
    /// Default `field`.
    pub granularity: tidegate_review::Granularity,
    /// The longest one call of a tenant's SQL (a statement of a template, a registration's
    /// schema) may run, in milliseconds, on either database; the tenant's SQL cannot lift it.
    /// Default 30000.
    pub statement_timeout_ms: u64,
    /// PostgreSQL: whether a `database` URL may connect as a superuser. The URL is the admin
    /// connection that creates each tenant's login role and schema (it needs CREATEROLE and
    /// should own the database); tenant SQL always runs as the tenant's own role. Default
    /// `false`: the server refuses to start on a superuser URL.
    pub allow_postgres_superuser: bool,
    /// Per tenant: `[review.tenants.<name>]` with `database`, and optionally `strategy` and
    /// `granularity`. Default empty.
    pub tenants: std::collections::BTreeMap<String, ReviewTenant>,
}

impl Default for ReviewSection {
    fn default() -> Self {
        ReviewSection {
            database: String::new(),
            strategy: tidegate_review::Strategy::BufferSuspicious,
            granularity: tidegate_review::Granularity::Field,
            statement_timeout_ms: 30_000,
            allow_postgres_superuser: false,
            tenants: std::collections::BTreeMap::new(),
        }
    }
}

/// `[review.tenants.<name>]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ReviewTenant {
    /// As `review.database`.
    pub database: String,
    /// As `review.strategy`; default: that.
    pub strategy: Option<tidegate_review::Strategy>,
    /// As `review.granularity`; default: that.
    pub granularity: Option<tidegate_review::Granularity>,
    /// PostgreSQL only: the schema the tenant's tables and marker table live in (created if
    /// missing; letters, digits and `_`, at most 63 bytes). Default: derived from the tenant's
    /// name ([`ReviewSection::pg_schema`]), so tenants sharing one database never share tables.
    pub schema: Option<String>,
}

/// Where a tenant's review database is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewDatabase {
    /// The default: `review.db` in the tenant's directory, or in memory.
    Default,
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL URL.
    Postgres(String),
}

impl ReviewSection {
    /// Parses a `database` value.
    pub fn parse_database(text: &str) -> Result<ReviewDatabase, String> {
        if text.is_empty() {
            Ok(ReviewDatabase::Default)
        } else if let Some(p) = text.strip_prefix("sqlite:") {
            if p.is_empty() {
                return Err(format!("`{text}`: expected a path after `sqlite:`"));
            }
            Ok(ReviewDatabase::Sqlite(PathBuf::from(p)))
        } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Ok(ReviewDatabase::Postgres(text.to_owned()))
        } else {
            Err(format!("`{text}`: expected empty, `sqlite:PATH` or a `postgres://` URL"))
        }
    }

    /// The PostgreSQL schema of `tenant`: its `schema` key, else `tidegate_review_` followed
    /// by the name (up to 30 bytes, `-` written `_`) and 8 hex digits of a hash of the whole
    /// name, so two tenants never get one schema and the name fits PostgreSQL's 63 bytes.
    pub fn pg_schema(&self, tenant: &str) -> Result<String, String> {
        if let Some(s) = self.tenants.get(tenant).and_then(|t| t.schema.clone()) {
            if s.is_empty() || s.len() > 63 || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("review.tenants.{tenant}.schema `{s}`: expected 1 to 63 letters, digits and `_`"));
            }
            return Ok(s);
        }
        let mut h: u32 = 0x811c_9dc5;
        for b in tenant.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        let short: String = tenant.chars().take(30).map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        Ok(format!("tidegate_review_{short}_{h:08x}"))
    }

    /// Every PostgreSQL URL the section names, each with the key naming it first.
    pub fn postgres_urls(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let keyed = std::iter::once(("review.database".to_owned(), &self.database))
            .chain(self.tenants.iter().map(|(n, t)| (format!("review.tenants.{n}.database"), &t.database)));
        for (key, url) in keyed {
            if matches!(Self::parse_database(url), Ok(ReviewDatabase::Postgres(_)))
                && !out.iter().any(|(_, u)| u == url)
            {
                out.push((key, url.clone()));
            }
        }
        out
    }

    /// The bounds on a tenant's SQL.
    pub fn bounds(&self) -> tidegate_review::SqlBounds {
        tidegate_review::SqlBounds { statement_timeout: std::time::Duration::from_millis(self.statement_timeout_ms) }
    }

    /// The database, strategy and granularity of `tenant`.
    pub fn for_tenant(
        &self,
        tenant: &str,
    ) -> Result<(ReviewDatabase, tidegate_review::Strategy, tidegate_review::Granularity), String> {
        match self.tenants.get(tenant) {
            Some(t) => Ok((
                Self::parse_database(&t.database)?,
                t.strategy.unwrap_or(self.strategy),
                t.granularity.unwrap_or(self.granularity),
            )),
            None => Ok((Self::parse_database(&self.database)?, self.strategy, self.granularity)),
        }
    }
}
