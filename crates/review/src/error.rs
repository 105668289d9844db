//! Errors of the review middleware: one enum, each variant naming what was wrong, and a
//! retryable classification (a lost database connection is worth retrying; a constraint
//! violation or a bad template is not).

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the review middleware.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A template (or template file) is invalid.
    #[error("template {template:?}: field `{field}` is {value:?}, expected {expected}")]
    Template {
        /// The template's name (or the file for whole-file errors).
        template: String,
        /// The field that is wrong, as a path (`steps[1].sql`).
        field: String,
        /// The offending value.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A request names no registered template.
    #[error("request: field `template` is {0:?}, expected the name of a registered template")]
    UnknownTemplate(String),
    /// A request's parameters do not match its template.
    #[error("request for {template:?}: parameter `{field}` is {value}, expected {expected}")]
    Param {
        /// The template requested.
        template: String,
        /// The parameter.
        field: String,
        /// The value given (JSON), or `missing`.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// The database refused or failed a statement.
    #[error("database: {op}: {message}")]
    Database {
        /// What was being done (`execute`, `connect`, the SQL...).
        op: String,
        /// The database's message.
        message: String,
        /// Whether trying again may succeed (connection trouble, serialisation failure).
        retryable: bool,
    },
    /// A review names no transaction, or one that cannot be reviewed now.
    #[error("review of transaction {id}: {reason}")]
    Review {
        /// The transaction id.
        id: u64,
        /// Why the review is refused.
        reason: String,
    },
    /// A status query names no transaction.
    #[error("field `id` is {0}, expected the id of a transaction this manager knows")]
    UnknownTx(u64),
    /// Least privilege could not be set up or verified for a tenant's database (a superuser
    /// admin connection not explicitly allowed, an admin role that cannot create roles, a
    /// tenant role that reaches more than its own schema). Not retryable: the deployment must
    /// change.
    #[error("least privilege: {message}")]
    Privilege {
        /// What was refused, naming the roles involved.
        message: String,
    },
    /// The decision log failed.
    #[error("decision log: {message}")]
    Log {
        /// What failed.
        message: String,
        /// Whether trying again may succeed.
        retryable: bool,
    },
}

impl Error {
    /// Whether the same call may succeed if repeated.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Database { retryable, .. } | Error::Log { retryable, .. } => *retryable,
            _ => false,
        }
    }

    pub(crate) fn template(
        template: &str,
        field: impl Into<String>,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> Self {
        Error::Template {
            template: template.to_owned(),
            field: field.into(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    pub(crate) fn db(op: impl Into<String>, message: impl ToString, retryable: bool) -> Self {
        Error::Database { op: op.into(), message: message.to_string(), retryable }
    }
}
