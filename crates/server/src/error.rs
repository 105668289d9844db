//! Errors of starting and running the server (the HTTP API's errors are
//! [`crate::api::problem::ApiError`]).

use std::path::PathBuf;

/// Result with [`ServerError`] as the default error.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;

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

/// What can go wrong opening or running the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
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
        source: rusqlite::Error,
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
        source: Box<tidegate_runtime::Error>,
    },
    /// A bad argument to a catalog operation (tenant name, role, key id).
    #[error("invalid {field} `{value}`: expected {expected}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// The value given.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The named tenant or key does not exist.
    #[error("no {what} `{name}`")]
    NotFound {
        /// `tenant` or `key`.
        what: &'static str,
        /// The name or id.
        name: String,
    },
    /// The tenant already exists.
    #[error("tenant `{name}` already exists")]
    TenantExists {
        /// The name.
        name: String,
    },
    /// I/O: data directory, listener, signals.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client for webhooks could not be built.
    #[error("building the webhook client: {0}")]
    HttpClient(#[source] reqwest::Error),
}

impl ServerError {
    /// Whether trying again later may succeed (a busy catalog, an I/O hiccup).
    pub fn retryable(&self) -> bool {
        match self {
            ServerError::Catalog { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            ServerError::Tenant { source, .. } => source.retryable(),
            ServerError::Io { .. } => true,
            _ => false,
        }
    }
}
