//! Storage errors: what went wrong, where (path, LSN, value), and whether to retry.

use std::path::PathBuf;
use std::sync::Arc;

use crate::Lsn;

/// [`std::result::Result`] with [`StoreError`] as the default error.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Why a storage operation failed.
///
/// [`StoreError::retryable`] tells a transient failure (retrying the same operation may
/// succeed) from a terminal one (the store or the data directory needs attention first).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O failure not tied to one file; the operation may succeed if retried.
    #[error("ledger I/O failed during {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An I/O failure on a named file or directory.
    #[error("ledger I/O failed during {op} on {}: {source}", path.display())]
    File {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The ledger is corrupt at the given position.
    #[error("ledger is corrupt at LSN {lsn}: {detail}")]
    Corrupt {
        /// Where.
        lsn: Lsn,
        /// What is wrong.
        detail: String,
    },
    /// The ledger ends before the last position that was acknowledged: events a caller was
    /// told are durable are missing. Refused, never replayed as if whole.
    #[error(
        "ledger {} ends at LSN {last}, but LSN {acknowledged} was acknowledged (its high-water mark says so): \
         events {}..={acknowledged} are missing. This is what a lost, truncated or damaged write-ahead log, \
         or a copy of the database file without it, looks like. The ledger is refused rather than replayed \
         as if whole; restore the data directory from a backup (`tidegate ledger backup`)",
        path.display(),
        last.saturating_add(1)
    )]
    Shortened {
        /// The ledger.
        path: PathBuf,
        /// The last LSN acknowledged as durable.
        acknowledged: Lsn,
        /// The last LSN the ledger holds.
        last: Lsn,
    },
    /// The ledger's completeness cannot be proven: its high-water mark is missing, damaged, or
    /// belongs to another ledger. Refused, never replayed as if whole.
    #[error("cannot prove that ledger {} is whole: {detail}", path.display())]
    Unprovable {
        /// The ledger.
        path: PathBuf,
        /// What is missing or wrong, and what to do.
        detail: String,
    },
    /// The store was closed.
    #[error("ledger store is closed")]
    Closed,
    /// Another process (or another open store in this process) holds the data directory.
    #[error(
        "data directory {} is held by another process{} (lock file {}); stop it or choose another directory",
        dir.display(),
        holder.as_deref().map(|h| format!(" ({h})")).unwrap_or_default(),
        lock_file.display()
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The lock file.
        lock_file: PathBuf,
        /// What the holder wrote into the lock file (its process id), if readable.
        holder: Option<String>,
    },
    /// The ledger was written by a newer build in a format this build cannot read.
    #[error(
        "ledger {} has {key} {found}, newer than {supported}, the newest this build reads; \
         open it with a newer tidegate",
        path.display()
    )]
    NewerFormat {
        /// The ledger file.
        path: PathBuf,
        /// Which version: `format_version` (events) or `schema_version` (tables).
        key: &'static str,
        /// The version found in the ledger.
        found: u64,
        /// The newest version this build reads.
        supported: u64,
    },
    /// The file is not a Tidegate ledger (or its `meta` table is malformed).
    #[error("{} is not a tidegate ledger: {detail}", path.display())]
    NotALedger {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The embedded database reported an error.
    #[error("ledger database {} failed during {op}: {source}", path.display())]
    Database {
        /// What was being done.
        op: &'static str,
        /// The database file.
        path: PathBuf,
        /// Whether the database said the condition is transient (busy, locked).
        retryable: bool,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An event could not be encoded as JSON; nothing of its batch was written (a backend
    /// that encodes on its writer, as the SQLite store, stops with this as its cause).
    #[error("event {index} of the batch could not be encoded as JSON: {detail}")]
    Encode {
        /// The event's 0-based position in its batch.
        index: usize,
        /// Why.
        detail: String,
    },
    /// An argument is out of range.
    #[error("invalid `{field}` = {value}: expected {expected}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A durability wait named an LSN that was never assigned.
    #[error("LSN {lsn} was never assigned (the last LSN is {last})")]
    BeyondEnd {
        /// The LSN waited for.
        lsn: Lsn,
        /// The last LSN assigned when the wait started.
        last: Lsn,
    },
    /// A fault injected on purpose ([`crate::FaultyStore`], or a backend's test hooks): the
    /// store "crashed" here.
    #[error("injected crash at {what} #{n}")]
    InjectedCrash {
        /// `"append"`, `"sync"` or `"crash_now"`.
        what: &'static str,
        /// Which append or sync (1-based).
        n: u64,
    },
    /// The backend does not implement this operation (for example checkpoints).
    #[error("this ledger backend does not support {op}")]
    Unsupported {
        /// The operation.
        op: &'static str,
    },
    /// A newer owner holds the ledger stream: this handle was fenced out. Its writes are
    /// refused for good (not retryable); the process that holds it must stop using the
    /// stream, and requests go to the new owner.
    #[error(
        "ledger stream {stream} is owned by token {current} now; this handle (token {token}) was fenced out \
         and may not append"
    )]
    Fenced {
        /// The stream.
        stream: String,
        /// This handle's token.
        token: u64,
        /// The current owner's token.
        current: u64,
    },
    /// Another owner holds the ledger stream under a lease that has not run out: opening it
    /// for writing now would take it from a live owner. Retryable: the lease runs out unless
    /// its owner renews it (ask that owner instead, or wait).
    #[error(
        "ledger stream {stream} is held by {owner}{} under a lease for another {remaining_ms} ms; send its \
         requests there, or open it after the lease runs out",
        address.as_ref().map(|a| format!(" (at {a})")).unwrap_or_default()
    )]
    Leased {
        /// The stream.
        stream: String,
        /// The owner holding the lease (its node id).
        owner: String,
        /// Where the owner answers, as it registered itself (`None`: it did not say).
        address: Option<String>,
        /// How long the lease still runs, by the database's clock.
        remaining_ms: u64,
    },
    /// The store is open read-only (an operator's view); it never writes.
    #[error("ledger {} is open read-only; {op} needs it opened for writing", path.display())]
    ReadOnly {
        /// The ledger.
        path: PathBuf,
        /// The refused operation.
        op: &'static str,
    },
    /// The store stopped after an earlier failure (a failed write or an injected crash) and
    /// refuses every operation: events not yet durable were dropped, nothing durable was
    /// lost. Reopen the data directory to go on.
    #[error("ledger store stopped after an earlier failure; reopen it: {cause}")]
    Failed {
        /// The failure that stopped the store.
        #[source]
        cause: Arc<StoreError>,
    },
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            StoreError::Io { .. } | StoreError::File { .. } | StoreError::Leased { .. } => true,
            StoreError::Database { retryable, .. } => *retryable,
            StoreError::Corrupt { .. }
            | StoreError::Shortened { .. }
            | StoreError::Unprovable { .. }
            | StoreError::Closed
            | StoreError::Locked { .. }
            | StoreError::NewerFormat { .. }
            | StoreError::NotALedger { .. }
            | StoreError::Encode { .. }
            | StoreError::InvalidArgument { .. }
            | StoreError::BeyondEnd { .. }
            | StoreError::InjectedCrash { .. }
            | StoreError::Unsupported { .. }
            | StoreError::Fenced { .. }
            | StoreError::ReadOnly { .. }
            | StoreError::Failed { .. } => false,
        }
    }

    /// Whether this error is, or was caused by, this handle being fenced out by a newer owner.
    pub fn is_fenced(&self) -> bool {
        match self {
            StoreError::Fenced { .. } => true,
            StoreError::Failed { cause } => cause.is_fenced(),
            _ => false,
        }
    }

    /// Whether this error is, or was caused by, an injected crash.
    pub fn is_injected_crash(&self) -> bool {
        match self {
            StoreError::InjectedCrash { .. } => true,
            StoreError::Failed { cause } => cause.is_injected_crash(),
            _ => false,
        }
    }

    pub(crate) fn file(op: &'static str, path: &std::path::Path, source: std::io::Error) -> StoreError {
        StoreError::File { op, path: path.to_owned(), source }
    }
}
