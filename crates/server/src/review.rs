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

use crate::config::{ReviewDatabase, ReviewSection};

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
    manager: Mutex<Option<Manager>>,
}

impl std::fmt::Debug for TenantReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantReview").field("open", &self.manager.lock().is_some()).finish()
    }
}

/// Why the manager could not be used.
#[derive(Debug)]
pub enum ReviewFailure {
    /// The configuration names no usable database.
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
        let mut slot = self.manager.lock();
        if slot.is_none() {
            *slot = Some(open(engine, place)?);
        }
        let m = slot.as_mut().ok_or_else(|| ReviewFailure::Config("the manager did not open".into()))?;
        Ok(f(m)?)
    }

    /// Whether the manager is open.
    pub fn is_open(&self) -> bool {
        self.manager.lock().is_some()
    }
}

/// Opens `place`'s manager over `engine`'s ledger.
pub fn open(engine: &Tidegate, place: &ReviewPlace) -> Result<Manager, ReviewFailure> {
    let (db, strategy, granularity) = place.config.for_tenant(&place.tenant).map_err(ReviewFailure::Config)?;
    let db: Box<dyn tidegate_review::Database> = match db {
        ReviewDatabase::Default => match &place.dir {
            Some(dir) => Box::new(SqliteDatabase::open(&dir.join("review.db"))?),
            None => Box::new(SqliteDatabase::memory()?),
        },
        ReviewDatabase::Sqlite(path) => Box::new(SqliteDatabase::open(&path)?),
        ReviewDatabase::Postgres(url) => {
            // Each tenant in a schema of its own: tenants sharing one database never share
            // tables or the marker table (whose rows are keyed by the tenant's numbers).
            let schema = place.config.pg_schema(&place.tenant).map_err(ReviewFailure::Config)?;
            Box::new(tidegate_review::PgDatabase::connect(&url, Some(&schema))?)
        }
    };
    let log = LedgerLog::new(engine.clone(), STREAM);
    Ok(Manager::open(TemplateSet::default(), db, Box::new(log), Options { strategy, granularity })?)
}
