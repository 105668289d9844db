//! The runtime's error type.

use tidegate_core::{AbortReason, EngineError, Outcome, TxId};
use tidegate_storage::StoreError;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine refused the operation (bad input, wrong state, protocol).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The transaction aborted; the outcome holds every effect's tag.
    #[error("transaction {} aborted: {}", .0.tx, .0.reason.as_ref().map_or_else(|| "unknown reason".to_owned(), ToString::to_string))]
    Aborted(Box<Outcome>),
    /// The transaction has finished (or is finishing) and takes no more work: this says how
    /// it ended. Retryable (in a new transaction) when it aborted for a retryable reason,
    /// such as an expired lease or a stale read.
    #[error("transaction {tx} {}", finished_text(*.committed, .reason.as_ref(), *.settled))]
    Finished {
        /// The transaction.
        tx: TxId,
        /// Whether it committed.
        committed: bool,
        /// Why it aborted (`None` for a commit).
        reason: Option<AbortReason>,
        /// `false` while its settlement (releases, compensations) is still running.
        settled: bool,
    },
    /// The ledger store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A malformed argument.
    #[error("invalid `{field}` = {value}: expected {expected}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// The value given.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A tool named in the ledger or a plan is not registered with this engine.
    #[error("tool `{name}` is not registered with this engine{detail}")]
    UnknownTool {
        /// The name.
        name: String,
        /// Context.
        detail: String,
    },
    /// The trace file could not be created or written.
    #[error("trace file `{}`: {source}", path.display())]
    Trace {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Error {
    /// Whether running the same work again (at a fresh epoch, for aborts) may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Engine(e) => e.retryable(),
            Error::Aborted(o) => o.reason.as_ref().is_some_and(AbortReason::retryable),
            Error::Finished { committed, reason, .. } => {
                !committed && reason.as_ref().is_some_and(AbortReason::retryable)
            }
            Error::Store(e) => e.retryable(),
            Error::InvalidArgument { .. } | Error::UnknownTool { .. } | Error::Trace { .. } => false,
        }
    }

    /// The outcome, when the error is an abort.
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Error::Aborted(o) => Some(o),
            _ => None,
        }
    }

    /// The abort reason, when the error is an abort.
    pub fn abort_reason(&self) -> Option<&AbortReason> {
        self.outcome().and_then(|o| o.reason.as_ref())
    }
}

fn finished_text(committed: bool, reason: Option<&AbortReason>, settled: bool) -> String {
    let how = match (committed, settled) {
        (true, true) => "has already committed",
        (true, false) => "is committing",
        (false, true) => "has already aborted",
        (false, false) => "is aborting",
    };
    match reason {
        Some(r) if r.retryable() => format!("{how}: {r}; retry the work in a new transaction"),
        Some(r) => format!("{how}: {r}"),
        None => format!("{how}; it takes no more reads, calls or decisions"),
    }
}
