//! How the database's errors become [`StoreError`]s, and where the store's calls run.

use std::path::Path;

use tidegate_storage::StoreError;

/// SQLSTATE of `tidegate_append` / `tidegate_put_checkpoint` when the caller's token is not the
/// stream's current one (the detail carries the current token).
pub(crate) const FENCED: &str = "TG001";
/// SQLSTATE when the stream has no head row.
pub(crate) const NO_STREAM: &str = "TG002";
/// SQLSTATE when a batch's first LSN does not continue the stream (the detail carries the
/// stream's last LSN).
pub(crate) const NOT_NEXT: &str = "TG003";
/// SQLSTATE when a checkpoint names an LSN past the stream's end.
pub(crate) const PAST_END: &str = "TG004";

/// SQLSTATEs after which the same operation may succeed: serialization failures, deadlocks,
/// the server shutting down or starting, too many connections, connection failures.
const TRANSIENT: [&str; 9] = ["40001", "40P01", "57P01", "57P02", "57P03", "53300", "08000", "08003", "08006"];

/// Whether the same operation may succeed after `e`: a transient SQLSTATE, or no SQLSTATE at
/// all (the connection or the client failed: closed, timed out, I/O). Shared by every
/// PostgreSQL-backed part (the ledger, the service's catalog and tenant state).
pub fn is_transient(e: &postgres::Error) -> bool {
    match e.code() {
        Some(code) => TRANSIENT.contains(&code.code()) || code.code().starts_with("08"),
        None => true,
    }
}

/// A database error during `op` on the ledger at `location`, classified.
pub(crate) fn database(op: &'static str, location: &Path, e: postgres::Error) -> StoreError {
    StoreError::Database { op, path: location.to_owned(), retryable: is_transient(&e), source: Box::new(e) }
}

/// The SQLSTATE and detail of a database error raised by the server (not by the client).
pub(crate) fn state_of(e: &postgres::Error) -> Option<(&str, Option<&str>)> {
    e.as_db_error().map(|d| (d.code().code(), d.detail()))
}

/// Runs `f` where the blocking client may run: directly on a plain thread, on a scoped helper
/// thread when the caller is inside an async runtime (the client drives a runtime of its own,
/// which must not be started, nor dropped, inside another).
pub(crate) fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}
