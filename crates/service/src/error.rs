//! The service's errors: one `#[non_exhaustive]` enum for opening and running the service and
//! for every operation's refusals, with the field at fault named and a `retryable()`
//! classification. Front doors render it (the HTTP layer as `application/problem+json`, in
//! one place: `api/problem.rs` of crates/server); nothing here knows a transport.

use std::path::PathBuf;
use std::sync::Arc;

/// Result with [`ServiceError`] as the default error.
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// A configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file is not TOML.
    #[error("the configuration is not valid TOML: {detail}")]
    Parse {
        /// The parser's message.
        detail: String,
    },
    /// A key is unknown or its value has the wrong type or range.
    #[error("configuration key `{key}`: {detail}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// What is wrong and what was expected.
        detail: String,
    },
}

/// What can go wrong opening or running the service, or refuses one of its operations.
/// Cloneable (sources are shared), so one answer can be kept and given again (a repeated
/// result of a ticket, a settlement that many requests wait for).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The catalog database failed.
    #[error("catalog {path}: {op}: {source}")]
    Catalog {
        /// The database file (`:memory:` in memory).
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// SQLite's error.
        #[source]
        source: Arc<rusqlite::Error>,
    },
    /// The catalog's PostgreSQL database failed.
    #[error("catalog {path}: {op}: {source}")]
    CatalogPostgres {
        /// The database (without its password).
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Whether the database said the condition is transient (a lost connection, a
        /// serialization failure, the server shutting down).
        retryable: bool,
        /// The client's error.
        #[source]
        source: Arc<postgres::Error>,
    },
    /// The catalog was written by a newer version.
    #[error("catalog {path} has schema version {found}; this build reads up to {supported}")]
    CatalogVersion {
        /// The database file.
        path: PathBuf,
        /// The version found.
        found: i64,
        /// The newest this build reads.
        supported: i64,
    },
    /// A tenant's ledger or engine could not be opened or recovered.
    #[error("tenant `{tenant}`: {what}: {source}")]
    Tenant {
        /// The tenant.
        tenant: String,
        /// What was being done.
        what: &'static str,
        /// The runtime's error.
        #[source]
        source: Arc<tidegate_runtime::Error>,
    },
    /// A tenant's state (idempotency records, worker tasks, attempts: `crate::state`) failed,
    /// or could not be opened (a damaged state file names itself and what to do).
    #[error("tenant state: {0}")]
    State(Arc<crate::state::StateError>),
    /// Bad input: `field` had `value`, `expected` was wanted. Not retryable.
    #[error("invalid `{field}` = {value}: expected {expected}")]
    Invalid {
        /// The field at fault (a JSON path, a parameter, a catalog argument).
        field: String,
        /// The value given (truncated by whoever shows it).
        value: String,
        /// What was expected.
        expected: String,
    },
    /// The named thing does not exist for this tenant. An id of another tenant is reported
    /// exactly as one never issued.
    #[error("no {what} `{name}`")]
    NotFound {
        /// `tenant`, `key`, `transaction`, `effect`, `group`, `plan`, ...
        what: &'static str,
        /// The name or id as given.
        name: String,
    },
    /// The tenant already exists.
    #[error("tenant `{name}` already exists")]
    TenantExists {
        /// The name.
        name: String,
    },
    /// The operation conflicts with the state of what it names (`wrong_state`,
    /// `result_conflict`, `capability_in_use`, ...); `retry_after` says when asking again may
    /// help.
    #[error("{detail}")]
    Conflict {
        /// The machine-readable kind.
        code: &'static str,
        /// What is in the way.
        detail: String,
        /// Seconds after which the same request may succeed, if it may.
        retry_after: Option<u64>,
    },
    /// The engine refused or ended the operation (bad input, wrong state, an abort).
    #[error(transparent)]
    Engine(Arc<tidegate_runtime::Error>),
    /// A part the operation needs cannot serve now (a tenant's store stopped, a review
    /// database that does not answer).
    #[error("{detail}")]
    Unavailable {
        /// The machine-readable kind.
        code: &'static str,
        /// What cannot serve.
        detail: String,
        /// Seconds after which it may serve again, if known.
        retry_after: Option<u64>,
    },
    /// This node does not serve the tenant (any more): its ledger store fenced the node's
    /// engine out because another node took the tenant over, so the node dropped it.
    /// Retryable: another node may serve the tenant (a router sends the request there).
    #[error("tenant `{tenant}` is not served by this node: {reason}")]
    TenantUnavailable {
        /// The tenant.
        tenant: String,
        /// Why (the fence: the ledger stream and both owners' tokens).
        reason: String,
    },
    /// The service is shutting down; the operation was not started.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// A bug or an impossible state: the operation failed, nothing of it is acknowledged.
    #[error("internal error: {0}")]
    Internal(String),
    /// I/O: data directory, listener, signals.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The HTTP client for webhooks could not be built.
    #[error("building the webhook client: {0}")]
    HttpClient(#[source] Arc<reqwest::Error>),
    /// Too much is in progress to take this operation on now (e.g. every waiter slot of the
    /// front door is taken); `retry_after` says when asking again may help.
    #[error("{detail}")]
    Busy {
        /// The machine-readable kind (`too_many_waiters`, ...).
        code: &'static str,
        /// What is exhausted.
        detail: String,
        /// Seconds after which the same request may succeed.
        retry_after: Option<u64>,
    },
    /// `field` names another tenant (`found`) where only the caller's own may be named. Not
    /// retryable.
    #[error("{detail}")]
    CrossTenant {
        /// The field at fault.
        field: String,
        /// The tenant it named.
        found: String,
        /// The refusal in words.
        detail: String,
    },
    /// A well-formed request that the system behind the operation refused (a review
    /// database's constraint, ...), with its code and words. Not retryable.
    #[error("{detail}")]
    Refused {
        /// The machine-readable kind (`database_refused`, ...).
        code: &'static str,
        /// What refused it and why.
        detail: String,
    },
}

impl ServiceError {
    /// Bad input (see [`ServiceError::Invalid`]).
    pub fn invalid(field: impl Into<String>, value: impl Into<String>, expected: impl Into<String>) -> ServiceError {
        ServiceError::Invalid { field: field.into(), value: value.into(), expected: expected.into() }
    }

    /// A conflict with the state of what the operation names.
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> ServiceError {
        ServiceError::Conflict { code, detail: detail.into(), retry_after: None }
    }

    /// The engine's refusal; an engine fenced out of its ledger stream is
    /// [`ServiceError::TenantUnavailable`] (the node drops such a tenant).
    pub fn engine(e: tidegate_runtime::Error) -> ServiceError {
        match e.fence() {
            Some(f) => ServiceError::fenced(f),
            None => ServiceError::Engine(Arc::new(e)),
        }
    }

    /// The refusal for a tenant this node dropped because `fence` fenced its engine out.
    pub fn fenced(fence: &tidegate_runtime::Fence) -> ServiceError {
        let reason = format!(
            "its ledger stream {} is owned by token {} now and this node's engine (token {}) was fenced out; \
             another node serves the tenant",
            fence.stream, fence.current, fence.token
        );
        ServiceError::TenantUnavailable { tenant: fence.tenant.clone(), reason }
    }

    /// An I/O failure while doing `op`.
    pub fn io(op: impl Into<String>, source: std::io::Error) -> ServiceError {
        ServiceError::Io { op: op.into(), source: Arc::new(source) }
    }

    /// A catalog failure while doing `op` on `path`.
    pub fn catalog(path: impl Into<PathBuf>, op: &'static str, source: rusqlite::Error) -> ServiceError {
        ServiceError::Catalog { path: path.into(), op, source: Arc::new(source) }
    }

    /// The field at fault, for bad input.
    pub fn field(&self) -> Option<&str> {
        match self {
            ServiceError::Invalid { field, .. } => Some(field),
            ServiceError::CrossTenant { field, .. } => Some(field),
            ServiceError::Engine(e) => match &**e {
                tidegate_runtime::Error::InvalidArgument { field, .. } => Some(field),
                _ => None,
            },
            _ => None,
        }
    }

    /// The same refusal with its field named under `prefix` (`effects[2]` + `tool` is
    /// `effects[2].tool`): a request that carries several calls names the one at fault.
    /// Refusals without a field are returned as they are.
    pub fn under(self, prefix: &str) -> ServiceError {
        let join = |f: &str| if f.is_empty() { prefix.to_owned() } else { format!("{prefix}.{f}") };
        match self {
            ServiceError::Invalid { field, value, expected } => {
                ServiceError::Invalid { field: join(&field), value, expected }
            }
            ServiceError::CrossTenant { field, found, detail } => {
                ServiceError::CrossTenant { field: join(&field), found, detail }
            }
            ServiceError::Engine(e) => match &*e {
                tidegate_runtime::Error::InvalidArgument { field, value, expected } => {
                    ServiceError::Invalid { field: join(field), value: value.clone(), expected: (*expected).to_owned() }
                }
                _ => ServiceError::Engine(e),
            },
            other => other,
        }
    }

    /// Whether the refusal says that the transaction it concerns aborted (the engine's abort,
    /// or a call that failed after it ran and took its transaction down).
    pub fn is_abort(&self) -> bool {
        match self {
            ServiceError::Engine(e) => matches!(**e, tidegate_runtime::Error::Aborted(_)),
            ServiceError::Conflict { code, .. } => *code == "transaction_aborted",
            _ => false,
        }
    }

    /// Whether the tenant could not be opened because another node holds its ledger stream
    /// under a live lease (a PostgreSQL store): that node serves it.
    pub fn is_served_elsewhere(&self) -> bool {
        self.served_elsewhere().is_some()
    }

    /// The node that serves the tenant instead of this one, where it answers (if it said) and
    /// how long its lease still runs, when the tenant could not be opened because of it.
    pub fn served_elsewhere(&self) -> Option<(&str, Option<&str>, u64)> {
        match self {
            ServiceError::Tenant { source, .. } | ServiceError::Engine(source) => match &**source {
                tidegate_runtime::Error::Store(tidegate_storage::StoreError::Leased {
                    owner,
                    address,
                    remaining_ms,
                    ..
                }) => Some((owner, address.as_deref(), *remaining_ms)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether trying the same thing again later may succeed (a busy catalog, an I/O hiccup,
    /// a retryable abort, a conflict that says when to come back).
    pub fn retryable(&self) -> bool {
        match self {
            ServiceError::Catalog { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            ServiceError::CatalogPostgres { retryable, .. } => *retryable,
            ServiceError::Tenant { source, .. } | ServiceError::Engine(source) => source.retryable(),
            ServiceError::State(source) => source.retryable(),
            ServiceError::Conflict { retry_after, .. } => retry_after.is_some(),
            ServiceError::Busy { .. } => true,
            ServiceError::Unavailable { .. }
            | ServiceError::TenantUnavailable { .. }
            | ServiceError::Io { .. }
            | ServiceError::ShuttingDown => true,
            _ => false,
        }
    }
}

impl From<tidegate_runtime::Error> for ServiceError {
    fn from(e: tidegate_runtime::Error) -> ServiceError {
        ServiceError::engine(e)
    }
}

impl From<crate::state::StateError> for ServiceError {
    fn from(e: crate::state::StateError) -> ServiceError {
        ServiceError::State(Arc::new(e))
    }
}
