//! Conversions of SQLite and file-system failures into the contract's [`StoreError`].

use std::path::Path;

use tidegate_storage::StoreError;

/// A failure reported by SQLite during `op` on the database at `path`; retryable when SQLite
/// says the condition is transient (busy, locked).
pub(crate) fn database(op: &'static str, path: &Path, e: rusqlite::Error) -> StoreError {
    let retryable =
        matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked));
    StoreError::Database { op, path: path.to_owned(), retryable, source: Box::new(e) }
}

/// A failure of the file system during `op` on `path`.
pub(crate) fn file(op: &'static str, path: &Path, source: std::io::Error) -> StoreError {
    StoreError::File { op, path: path.to_owned(), source }
}
