//! The trace format: JSON Lines of operation records, schema version 1.
//!
//! These are the *serialisation* types. They mirror the text exactly (borrowing strings from
//! the line) and know nothing of the analysis; [`crate::Trace`] is the interned in-memory
//! form the detectors run on. `docs/trace-format.md` is the user-facing copy of this page.
//!
//! # Lines
//!
//! A trace is UTF-8 text with one JSON object per line, one *operation record* per object
//! (the model of the source paper's §2.1: an operation reads some cells and the tool registry,
//! generates, then commits its writes atomically). Blank lines are ignored. A line that is not
//! a JSON object of the shape below is *malformed*: the reader reports it with its line and
//! byte column and, unless asked to be strict, skips it and counts it.
//!
//! # Versioning
//!
//! Each record may carry `"schema_version": "MAJOR.MINOR"`; absent means `"1.0"`.
//!
//! * Within a major version, new **optional** fields may be added (bumping the minor version);
//!   the meaning of existing fields never changes.
//! * Readers **ignore fields they do not know**, so a 1.0 reader reads a 1.7 trace.
//! * A record whose major version the reader does not know is malformed
//!   ([`crate::Error::UnsupportedVersion`]).
//!
//! # Absent means unknown
//!
//! Every field is optional. An **absent** field (or one set to `null`, except where `null` is a
//! value, see below) means *unknown*, which differs from empty: `"planned_tools": []` says the
//! operation planned no tool, while no `planned_tools` says nothing. A detector that needs an
//! unknown field of a record skips that record (or that one read or write) and counts it in the
//! report's `skipped` section. The one exception is `aborted`: the paper's flat model logs only
//! operations that committed, so a record without `aborted` is read as not aborted.
//!
//! # Fields
//!
//! | field | type | meaning |
//! | --- | --- | --- |
//! | `schema_version` | string | see above |
//! | `tx` | string or integer | transaction id; ids compare by text (`7` = `"7"`) |
//! | `agent` | string | the agent that ran the operation |
//! | `reads` | list of [`Read`] | read set: `{"cell", "value", "time", "replica"}` each |
//! | `read_time` | integer | logical time of the read phase (default `time` of each read) |
//! | `replica` | string | default replica of the reads that name none |
//! | `registry_at_read` | list of [`Tool`] | tools visible when the operation read |
//! | `planned_tools` | list of [`Tool`] | tools the operation planned to call |
//! | `writes` | list of [`Effect`] | write set with values: `[cell, value]` or `{"cell", "value"}` |
//! | `write_time` | integer | logical time at which the writes committed |
//! | `registry_at_commit` | list of [`Tool`] | tools in the registry when the operation committed |
//! | `io` | list of [`Effect`] | effects in issuance order |
//! | `co` | list of [`Effect`] | the same effects in the order they were committed/externalised |
//! | `aborted` | bool | the operation was aborted (or retracted after committing) |
//! | `predecessors` | list of tx ids | committed transactions whose writes this one observed |
//! | `level` | string | (1.1) the consistency level the producer ran at; informational |
//!
//! Logical times are non-negative integers on one clock per trace (the paper uses the length
//! of the operation log). A write committed at time `t` is visible to reads at time `t` and
//! later. Values are any JSON value; `null` is the paper's `NULL` sentinel (the value of a
//! cell never written), so `"value": null` is a known value, not an unknown one. Values are
//! compared as JSON values ([`Value`]). A tool is a name (`"search"`, or a full signature string
//! such as `"search(q:str)@2"`) or `{"name": .., "signature": ..}`.
//!
//! When a record lists the same cell twice in its reads (or writes), the first entry gives
//! the record's read (or written) value for that cell, as in the paper's `first_value` helper;
//! the split-view detector, which is about individual reads, sees every entry.
//!
//! # Names used by the paper's reference runtime
//!
//! Records written by the paper's reference runtime and pilot harness use other names and
//! shapes; the reader accepts them. When both spellings are present the first one listed wins.
//!
//! | field | also accepted |
//! | --- | --- |
//! | `agent` | `agent_id` |
//! | `reads` | `read_set` (list of cells) with `read_values` (object cell→value, or list of pairs); a cell of `read_set` missing from `read_values` has an unknown value; `read_values` alone |
//! | `writes` | `write_set` with `write_values`, as for reads; `write_values` alone; else derived from `co` (the paper derives the write set from `co`) |
//! | `registry_at_read` | `tools_visible_at_read`, `read_registry` |
//! | `planned_tools` | `planned_tool` (one tool, or `null` for none) |
//! | `registry_at_commit` | `tools_used`, `write_registry` |
//! | `io`, `co` | `io_seq`, `co_seq` |
//!
//! The reference runtime writes the sentinel as the string `"NULL"`; set
//! [`crate::ReadOptions::null_string`] to `Some("NULL")` to read it as `null`.
//!
//! # Example
//!
//! ```json
//! {"schema_version":"1.0","tx":"t2","agent":"flight","read_time":0,"reads":[{"cell":"trip:date","value":"06-14","replica":"primary"}],"registry_at_read":["book@1"],"planned_tools":["book@1"],"writes":[["booking:7","06-14"]],"write_time":2,"registry_at_commit":["book@1"],"io":[["booking:7","06-14"]],"co":[["booking:7","06-14"]],"aborted":false,"predecessors":["t0"]}
//! ```

mod de;
mod version;

use de::present;
pub use de::{CellValues, Effect, Id, Str, Tool, Value};
use serde::{Deserialize, Serialize};
pub use version::SchemaVersion;

/// One read of the read set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Read<'a> {
    /// The cell read.
    #[serde(borrow)]
    pub cell: Str<'a>,
    /// The value observed; `None` if unknown (absent), `Some(Value::Null)` for `null`.
    #[serde(borrow, default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub value: Option<Value<'a>>,
    /// Logical time of this read; defaults to the record's `read_time`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<u64>,
    /// The replica that served the read; defaults to the record's `replica`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<Str<'a>>,
}

/// One operation record, as written on one line. See the [module docs](self) for the format.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordLine<'a> {
    /// Format version of this record; absent means 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<SchemaVersion>,
    /// Transaction id.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub tx: Option<Id<'a>>,
    /// The agent that ran the operation.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Str<'a>>,
    /// Reference-runtime spelling of `agent` (used when `agent` is absent).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<Str<'a>>,
    /// Read set with observed values.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<Vec<Read<'a>>>,
    /// Reference-runtime read set (cells only); values come from `read_values`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub read_set: Option<Vec<Str<'a>>>,
    /// Reference-runtime observed values of `read_set`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub read_values: Option<CellValues<'a>>,
    /// Logical time of the read phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_time: Option<u64>,
    /// Default replica of reads that name none.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<Str<'a>>,
    /// Tools visible at read time.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub registry_at_read: Option<Vec<Tool<'a>>>,
    /// Reference-runtime spelling of `registry_at_read`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub tools_visible_at_read: Option<Vec<Tool<'a>>>,
    /// The paper's spelling of `registry_at_read`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub read_registry: Option<Vec<Tool<'a>>>,
    /// Tools the operation planned to call.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub planned_tools: Option<Vec<Tool<'a>>>,
    /// Reference-runtime single planned tool: `Some(None)` is an explicit `null` (none
    /// planned), `None` is absent (unknown).
    #[serde(borrow, default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub planned_tool: Option<Option<Tool<'a>>>,
    /// Write set with values.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub writes: Option<Vec<Effect<'a>>>,
    /// Reference-runtime write set (cells only); values come from `write_values`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub write_set: Option<Vec<Str<'a>>>,
    /// Reference-runtime written values.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub write_values: Option<CellValues<'a>>,
    /// Logical commit time of the writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_time: Option<u64>,
    /// Tools in the registry at commit time.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub registry_at_commit: Option<Vec<Tool<'a>>>,
    /// Reference-runtime spelling of `registry_at_commit`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub tools_used: Option<Vec<Tool<'a>>>,
    /// The paper's spelling of `registry_at_commit`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub write_registry: Option<Vec<Tool<'a>>>,
    /// Effects in issuance order.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub io: Option<Vec<Effect<'a>>>,
    /// Alternative spelling of `io`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub io_seq: Option<Vec<Effect<'a>>>,
    /// Effects in commit (externalisation) order.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub co: Option<Vec<Effect<'a>>>,
    /// Alternative spelling of `co`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub co_seq: Option<Vec<Effect<'a>>>,
    /// Whether the operation was aborted or later retracted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<bool>,
    /// Transactions whose committed writes this one observed.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub predecessors: Option<Vec<Id<'a>>>,
    /// The consistency level the producing system ran at, e.g. `"L4"` (1.1; informational:
    /// the detectors decide the level from the records, never from this).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub level: Option<Str<'a>>,
}

impl<'a> RecordLine<'a> {
    /// Parses one line. Errors carry serde_json's line/column (line is always 1 here).
    pub fn parse(line: &'a [u8]) -> serde_json::Result<Self> {
        serde_json::from_slice(line)
    }

    /// The record as one line of the trace format (no newline). Writers of traces use this,
    /// so the format has one owner.
    pub fn to_line(&self) -> String {
        // Every type here serialises without failing (no map with non-string keys).
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"unserialisable record: {e}\"}}"))
    }
}
