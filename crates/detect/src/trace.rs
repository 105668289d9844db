//! The in-memory, interned form of a trace that the detectors run on.
//!
//! Cells, values, agents, transaction ids, tool names and replicas are interned to dense
//! `u32` ids; the variable-length parts of all records (reads, writes, effects, tools,
//! predecessors) live in a few shared arenas, and a [`Record`] holds spans into them. This is
//! kept apart from the serialisation types of [`crate::wire`]: the format can grow without
//! touching the detectors, and the detectors never see text.

use crate::error::Error;
use crate::intern::Interner;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);
    };
}

id_type!(
    /// An interned cell name.
    CellId
);
id_type!(
    /// An interned JSON value. [`NULL_VALUE`] is `null`, the paper's `NULL` sentinel.
    ValueId
);
id_type!(
    /// An interned agent name.
    AgentId
);
id_type!(
    /// An interned transaction id.
    TxId
);
id_type!(
    /// An interned tool name.
    ToolId
);
id_type!(
    /// An interned replica id.
    ReplicaId
);

/// Index of a record in its [`Trace`] (0-based, in file order).
pub type RecordIdx = u32;

/// The id of `null`, the paper's `NULL` sentinel. Interned first in every trace.
pub const NULL_VALUE: ValueId = ValueId(0);

pub(crate) const NONE: u32 = u32::MAX;

#[inline]
pub(crate) fn opt(raw: u32) -> Option<u32> {
    (raw != NONE).then_some(raw)
}

/// A range in one of the trace's arenas; [`Span::UNKNOWN`] marks an absent field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) len: u32,
}

impl Span {
    pub(crate) const UNKNOWN: Span = Span { start: NONE, len: 0 };

    #[inline]
    pub(crate) fn get<T>(self, arena: &[T]) -> Option<&[T]> {
        if self.start == NONE {
            None
        } else {
            let s = self.start as usize;
            Some(&arena[s..s + self.len as usize])
        }
    }
}

/// One read of a record's read set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadEntry {
    /// The cell read.
    pub cell: CellId,
    /// Whether this is the record's first read of `cell` (the one that defines the record's
    /// read value and read time for the cell).
    pub first: bool,
    pub(crate) value: u32,
    pub(crate) replica: u32,
    pub(crate) time: Option<u64>,
}

impl ReadEntry {
    /// The value observed, if known.
    pub fn value(&self) -> Option<ValueId> {
        opt(self.value).map(ValueId)
    }
    /// The replica that served the read, if known.
    pub fn replica(&self) -> Option<ReplicaId> {
        opt(self.replica).map(ReplicaId)
    }
    /// Logical time of the read: its own `time`, else the record's `read_time`.
    pub fn time(&self) -> Option<u64> {
        self.time
    }
}

/// One write, or one effect of `io`/`co`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EffectEntry {
    /// The cell written.
    pub cell: CellId,
    pub(crate) value: u32,
    /// For writes: whether this is the record's first write of `cell` (the one that defines
    /// the record's written value for the cell). Always `true` in `io`/`co`.
    pub first: bool,
}

impl EffectEntry {
    /// The value written, if known.
    pub fn value(&self) -> Option<ValueId> {
        opt(self.value).map(ValueId)
    }
}

/// One tool of a registry snapshot or of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolEntry {
    /// The tool's name (for plain-string tools, the whole string).
    pub name: ToolId,
    pub(crate) signature: u32,
}

impl ToolEntry {
    /// The separately recorded signature, if any.
    pub fn signature(&self) -> Option<ValueId> {
        opt(self.signature).map(ValueId)
    }
}

/// One operation record. Fields that were absent in the trace read as `None`.
#[derive(Debug, Clone)]
pub struct Record {
    /// 1-based line number in the trace file.
    pub line: u64,
    pub(crate) tx: u32,
    pub(crate) agent: u32,
    /// Logical time of the read phase.
    pub read_time: Option<u64>,
    /// Logical commit time.
    pub write_time: Option<u64>,
    /// Whether the record is flagged aborted (`None`: no flag, read as not aborted).
    pub aborted: Option<bool>,
    pub(crate) reads: Span,
    pub(crate) writes: Span,
    pub(crate) planned: Span,
    pub(crate) registry_at_read: Span,
    pub(crate) registry_at_commit: Span,
    pub(crate) io: Span,
    pub(crate) co: Span,
    pub(crate) predecessors: Span,
}

impl Record {
    /// Transaction id, if known.
    pub fn tx(&self) -> Option<TxId> {
        opt(self.tx).map(TxId)
    }
    /// Agent, if known.
    pub fn agent(&self) -> Option<AgentId> {
        opt(self.agent).map(AgentId)
    }
    /// Whether the record is flagged `"aborted": true`.
    pub fn is_aborted(&self) -> bool {
        self.aborted == Some(true)
    }
}

/// Counts and errors from reading a trace.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Lines read, including blank and malformed ones.
    pub lines: u64,
    /// Blank lines (ignored).
    pub blank: u64,
    /// Malformed lines skipped (lenient mode).
    pub malformed: u64,
    /// The first malformed-line errors, up to [`crate::ReadOptions::max_errors_kept`].
    pub errors: Vec<Error>,
}

/// An interned trace: records plus the arenas and name tables they point into.
#[derive(Debug, Default)]
pub struct Trace {
    pub(crate) records: Vec<Record>,
    pub(crate) reads: Vec<ReadEntry>,
    pub(crate) effects: Vec<EffectEntry>,
    pub(crate) tools: Vec<ToolEntry>,
    pub(crate) preds: Vec<TxId>,
    pub(crate) cells: Interner,
    pub(crate) values: Interner,
    pub(crate) agents: Interner,
    pub(crate) txs: Interner,
    pub(crate) tool_names: Interner,
    pub(crate) replicas: Interner,
    pub(crate) stats: ReadStats,
    pub(crate) any_predecessors: bool,
    pub(crate) any_aborted_flag: bool,
}

impl Trace {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }
    /// Whether the trace has no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    /// All records in file order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }
    /// The record at `idx`.
    pub fn record(&self, idx: RecordIdx) -> &Record {
        &self.records[idx as usize]
    }
    /// Counts and errors from reading.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }
    /// Whether any record carries `predecessors`.
    pub fn has_predecessors(&self) -> bool {
        self.any_predecessors
    }
    /// Whether any record carries an `aborted` flag.
    pub fn has_aborted_flags(&self) -> bool {
        self.any_aborted_flag
    }

    /// The read set, if known.
    pub fn reads(&self, r: &Record) -> Option<&[ReadEntry]> {
        r.reads.get(&self.reads)
    }
    /// The write set with values, if known.
    pub fn writes(&self, r: &Record) -> Option<&[EffectEntry]> {
        r.writes.get(&self.effects)
    }
    /// Effects in issuance order, if known.
    pub fn io(&self, r: &Record) -> Option<&[EffectEntry]> {
        r.io.get(&self.effects)
    }
    /// Effects in commit order, if known.
    pub fn co(&self, r: &Record) -> Option<&[EffectEntry]> {
        r.co.get(&self.effects)
    }
    /// Planned tools, if known.
    pub fn planned_tools(&self, r: &Record) -> Option<&[ToolEntry]> {
        r.planned.get(&self.tools)
    }
    /// Registry snapshot at read time, if known.
    pub fn registry_at_read(&self, r: &Record) -> Option<&[ToolEntry]> {
        r.registry_at_read.get(&self.tools)
    }
    /// Registry snapshot at commit time, if known.
    pub fn registry_at_commit(&self, r: &Record) -> Option<&[ToolEntry]> {
        r.registry_at_commit.get(&self.tools)
    }
    /// Causal predecessors, if known.
    pub fn predecessors(&self, r: &Record) -> Option<&[TxId]> {
        r.predecessors.get(&self.preds)
    }

    /// Number of distinct cells (cell ids are `0..cell_count()`).
    pub fn cell_count(&self) -> usize {
        self.cells.len()
    }
    /// Number of distinct transaction ids.
    pub fn tx_count(&self) -> usize {
        self.txs.len()
    }
    /// Number of distinct values.
    pub fn value_count(&self) -> usize {
        self.values.len()
    }
    /// The name of a cell.
    pub fn cell_name(&self, id: CellId) -> &str {
        self.cells.get_str(id.0)
    }
    /// The name of an agent.
    pub fn agent_name(&self, id: AgentId) -> &str {
        self.agents.get_str(id.0)
    }
    /// The text of a transaction id.
    pub fn tx_name(&self, id: TxId) -> &str {
        self.txs.get_str(id.0)
    }
    /// The name of a tool.
    pub fn tool_name(&self, id: ToolId) -> &str {
        self.tool_names.get_str(id.0)
    }
    /// The name of a replica.
    pub fn replica_name(&self, id: ReplicaId) -> &str {
        self.replicas.get_str(id.0)
    }
    /// The id of a transaction by its text, if it occurs in the trace.
    pub fn tx_by_name(&self, name: &str) -> Option<TxId> {
        self.txs.lookup(name.as_bytes()).map(TxId)
    }
    /// The id of a cell by its name, if it occurs in the trace.
    pub fn cell_by_name(&self, name: &str) -> Option<CellId> {
        self.cells.lookup(name.as_bytes()).map(CellId)
    }
    /// A value as JSON.
    pub fn value_json(&self, id: ValueId) -> serde_json::Value {
        crate::build::decode_value(self.values.get(id.0))
    }

    /// Approximate heap bytes held by the trace (for the memory budget of the benchmark).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.records.capacity() * size_of::<Record>()
            + self.reads.capacity() * size_of::<ReadEntry>()
            + self.effects.capacity() * size_of::<EffectEntry>()
            + self.tools.capacity() * size_of::<ToolEntry>()
            + self.preds.capacity() * size_of::<TxId>()
            + self.cells.heap_bytes()
            + self.values.heap_bytes()
            + self.agents.heap_bytes()
            + self.txs.heap_bytes()
            + self.tool_names.heap_bytes()
            + self.replicas.heap_bytes()
    }
}
