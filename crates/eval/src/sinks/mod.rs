//! Real sinks the tools write to, and the ground truth the harness audits.
//!
//! Every sink keeps its own record of what reached it; the harness decides leaks, duplicates
//! and residue from these records alone, never from what a mechanism says it did.
//!
//! - [`BufferSink`]: an in-memory buffer (the bufferable class).
//! - [`FsSink`]: files in a temporary directory (reversible: delete undoes a write).
//! - [`DbSink`]: rows in a SQLite file, plus the versioned `orders` table of the retail
//!   workloads (reversible: delete/restore undoes a write).
//! - [`MailSink`]: a local HTTP endpoint on 127.0.0.1 with an append-only delivery log
//!   (irreversible: nothing un-sends). See [`http`].
//!
//! Every sink honours an idempotency key when the caller sends one (a repeat of an applied
//! key is a no-op, as with Stripe-style providers) and supports try/confirm/cancel
//! reservations for the TCC baseline.

mod buffer;
mod db;
mod fs;
pub mod http;

pub use buffer::BufferSink;
pub use db::{DbSink, OrderRow};
pub use fs::FsSink;
pub use http::{MailServer, MailSink};

use serde::Serialize;
use serde_json::Value;

/// Which sink an effect lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SinkKind {
    /// In-memory buffer.
    Buffer,
    /// Filesystem.
    Fs,
    /// Database rows.
    Db,
    /// HTTP mailbox (irreversible).
    Mail,
}

impl SinkKind {
    /// The four sinks.
    pub const ALL: [SinkKind; 4] = [SinkKind::Buffer, SinkKind::Fs, SinkKind::Db, SinkKind::Mail];

    /// Column name.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Buffer => "Buffer",
            SinkKind::Fs => "Filesystem",
            SinkKind::Db => "DB rows",
            SinkKind::Mail => "Mailbox",
        }
    }
}

/// A sink failed (the provider itself, not an injected fault).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// Filesystem I/O.
    #[error("filesystem sink: {op} `{path}`: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// SQLite.
    #[error("database sink: {op}: {source}")]
    Db {
        /// What was being done.
        op: &'static str,
        /// The cause.
        source: rusqlite::Error,
    },
    /// The HTTP endpoint.
    #[error("mail sink: {op} {url}: {detail}")]
    Http {
        /// What was being done.
        op: &'static str,
        /// The URL.
        url: String,
        /// The cause.
        detail: String,
    },
    /// The effect cannot be undone at this provider.
    #[error("{sink} cannot undo `{res}`")]
    NotUndoable {
        /// The sink.
        sink: &'static str,
        /// The effect.
        res: String,
    },
    /// An unknown reservation.
    #[error("{sink}: no reservation `{id}`")]
    NoReservation {
        /// The sink.
        sink: &'static str,
        /// The reservation id.
        id: String,
    },
}

/// Result alias.
pub type SinkResult<T> = Result<T, SinkError>;

/// A provider. Calls are blocking and fast (local): the harness calls them from its
/// single-threaded paused runtime, so they cost no virtual time.
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Which sink.
    fn kind(&self) -> SinkKind;
    /// Applies the effect `res`. With `key`, MUST be a no-op if `key` was applied before.
    fn apply(&self, res: &str, body: &Value, key: Option<&str>) -> SinkResult<()>;
    /// Undoes one live application of `res` (no-op if none is live).
    fn undo(&self, res: &str) -> SinkResult<()>;
    /// Whether an application under `key` reached the sink (a probe).
    fn applied_key(&self, key: &str) -> SinkResult<bool>;
    /// Live applications of `res`: 0 = absent, 1 = present once, more = duplicates.
    fn live(&self, res: &str) -> SinkResult<u64>;
    /// TCC try: reserves `res` without making it visible; returns the reservation id.
    fn reserve(&self, res: &str, body: &Value) -> SinkResult<String>;
    /// TCC confirm: makes the reservation visible. Idempotent per reservation id.
    fn confirm(&self, id: &str) -> SinkResult<()>;
    /// TCC cancel: drops the reservation (no-op if already confirmed or cancelled).
    fn cancel(&self, id: &str) -> SinkResult<()>;
}
