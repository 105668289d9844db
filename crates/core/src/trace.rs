//! Operation records: one per finished transaction, so `tidegate check` and any other reader
//! of the trace format can decide from the engine's own runs which anomalies happened.
//!
//! These are plain engine types. The trace format (docs/trace-format.md) is owned by
//! `tidegate-detect` (`tidegate_detect::wire`); `tidegate-runtime` converts each record into
//! that format's types when it writes a trace.
//!
//! The engine's logical clock is its commit stamp: a read happens at the stamp of the last
//! decided commit (it sees that commit's writes), a commit advances the stamp by one. A
//! scope's value is its version, so a read observes the stamp of the commit it saw and a
//! write writes its own commit stamp. Registries are written restricted to the tools the
//! transaction used (the only entries the phantom-tool predicate looks at).

use std::sync::Arc;

use crate::engine::Level;

/// The trace schema version the engine's record shape corresponds to (the version written is
/// `tidegate_detect::wire::SchemaVersion::CURRENT`).
pub const TRACE_SCHEMA_VERSION: &str = "1.0";

/// One read of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRead {
    /// The canonical scope.
    pub cell: Arc<str>,
    /// The version observed.
    pub value: u64,
    /// Logical time of the read.
    pub time: u64,
}

/// One registry entry of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceTool {
    /// Tool name.
    pub name: Arc<str>,
    /// Its signature: the registry version that defined it.
    pub signature: u64,
}

/// One operation record (written as one line of the trace format by the runtime).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRecord {
    /// Always [`TRACE_SCHEMA_VERSION`].
    pub schema_version: &'static str,
    /// Transaction id (its number).
    pub tx: u64,
    /// The agent.
    pub agent: Arc<str>,
    /// The level the engine ran at (an extra field; readers ignore it).
    pub level: Level,
    /// Logical time of the first read (the begin stamp if it read nothing).
    pub read_time: u64,
    /// Reads in order.
    pub reads: Vec<TraceRead>,
    /// The tools used, as visible at the first read (absent ones omitted).
    pub registry_at_read: Vec<TraceTool>,
    /// The tools the transaction called, each once, in first-use order.
    pub planned_tools: Vec<Arc<str>>,
    /// `[scope, commit stamp]` for each scope written, if the transaction reached a commit
    /// decision.
    pub writes: Vec<(Arc<str>, u64)>,
    /// Commit stamp, if decided to commit.
    pub write_time: Option<u64>,
    /// The tools used, as in the registry at the decision (absent ones omitted).
    pub registry_at_commit: Vec<TraceTool>,
    /// Externalised effects in issuance order, `[first scope, "tx/effect:tool"]`.
    pub io: Vec<(Arc<str>, String)>,
    /// The same effects in the order they reached the world.
    pub co: Vec<(Arc<str>, String)>,
    /// Aborted, or retracted after its commit decision.
    pub aborted: bool,
    /// Transactions whose committed writes this one's reads observed.
    pub predecessors: Vec<u64>,
}
