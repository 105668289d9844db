//! The result of [`crate::check`]: counts, level, and witnesses resolved to names and values.

use crate::check::Findings;
use crate::cycles::EdgeKind;
use crate::detectors::A3Form;
use crate::detectors::a2::ToolChange;
use crate::detectors::a3::A3Witness;
use crate::level::Level;
use crate::trace::{CellId, EffectEntry, RecordIdx, Trace};
use serde::Serialize;
use serde_json::Value as Json;

/// Version of the report's JSON shape (same rule as the trace format: fields may be added
/// within a major version).
pub const REPORT_VERSION: &str = "1.0";

/// Witness counts per anomaly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AnomalyCounts {
    /// A1 stale generation.
    #[serde(rename = "A1")]
    pub a1: u64,
    /// A2 phantom tool.
    #[serde(rename = "A2")]
    pub a2: u64,
    /// A3 causal cascade (in the form of [`Report::a3_form`]).
    #[serde(rename = "A3")]
    pub a3: u64,
    /// A4 split view.
    #[serde(rename = "A4")]
    pub a4: u64,
    /// A6 tool-effect reordering.
    #[serde(rename = "A6")]
    pub a6: u64,
}

/// Records each detector could not fully evaluate because a field it needs is unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SkipCounts {
    /// Skipped by A1.
    #[serde(rename = "A1")]
    pub a1: u64,
    /// Skipped by A2.
    #[serde(rename = "A2")]
    pub a2: u64,
    /// Skipped by A3.
    #[serde(rename = "A3")]
    pub a3: u64,
    /// Skipped by A4.
    #[serde(rename = "A4")]
    pub a4: u64,
    /// Skipped by A6.
    #[serde(rename = "A6")]
    pub a6: u64,
    /// Skipped by the conflict graph.
    pub cycles: u64,
}

/// A record as named in a report: its line, and its transaction and agent when known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordRef {
    /// 1-based line in the trace.
    pub line: u64,
    /// Transaction id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx: Option<String>,
    /// Agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// One side of a split view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaReadRef {
    /// The reading record.
    pub record: RecordRef,
    /// The replica.
    pub replica: String,
    /// The value it returned.
    pub value: Json,
}

/// A conflict edge of a cycle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeRef {
    /// Line of the earlier access's record.
    pub from: u64,
    /// Line of the later access's record.
    pub to: u64,
    /// `ww`, `wr` or `rw`.
    pub kind: EdgeKind,
    /// The cell.
    pub cell: String,
}

/// A witness, resolved to lines, names and JSON values. Serialised with an `anomaly` tag.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "anomaly")]
pub enum Witness {
    /// A1, see [`crate::detectors::a1`].
    #[serde(rename = "A1")]
    StaleGeneration {
        /// The stale reader `i`.
        reader: RecordRef,
        /// The interleaved writer `j`.
        writer: RecordRef,
        /// The cell.
        cell: String,
        /// What the reader saw.
        read_value: Json,
        /// What the writer wrote.
        written_value: Json,
        /// When the reader read the cell.
        read_time: Option<u64>,
        /// When the writer committed.
        write_time: Option<u64>,
        /// When the reader committed.
        reader_write_time: Option<u64>,
    },
    /// A2, see [`crate::detectors::a2`].
    #[serde(rename = "A2")]
    PhantomTool {
        /// The record.
        record: RecordRef,
        /// The planned tool.
        tool: String,
        /// `removed` or `signature_changed`.
        change: &'static str,
        /// Signature visible at read time (for `signature_changed`).
        #[serde(skip_serializing_if = "Option::is_none")]
        signature_at_read: Option<Json>,
        /// Signature at commit time (for `signature_changed`).
        #[serde(skip_serializing_if = "Option::is_none")]
        signature_at_commit: Option<Json>,
    },
    /// A3 precise form, see [`crate::detectors::a3`].
    #[serde(rename = "A3")]
    CausalCascade {
        /// Always `precise`.
        form: A3Form,
        /// The surviving record `j`.
        record: RecordRef,
        /// Its aborted predecessor `p`.
        predecessor: RecordRef,
    },
    /// A3 residue form, see [`crate::detectors::a3`].
    #[serde(rename = "A3")]
    CascadeResidue {
        /// Always `residue`.
        form: A3Form,
        /// The reading record `j`.
        record: RecordRef,
        /// The cell read.
        cell: String,
        /// The value no committed write produced in time.
        value: Json,
        /// When it was read.
        read_time: u64,
    },
    /// A4, see [`crate::detectors::a4`].
    #[serde(rename = "A4")]
    SplitView {
        /// The cell.
        cell: String,
        /// The common logical read time.
        time: u64,
        /// The earlier read in trace order.
        first: ReplicaReadRef,
        /// The later read in trace order.
        second: ReplicaReadRef,
    },
    /// A6, see [`crate::detectors::a6`].
    #[serde(rename = "A6")]
    Reordering {
        /// The record.
        record: RecordRef,
        /// First position where `co` differs from `io`.
        first_difference: u32,
        /// Effects in issuance order.
        io: Vec<(String, Json)>,
        /// Effects in commit order.
        co: Vec<(String, Json)>,
    },
    /// A serialisability cycle, see [`crate::cycles`].
    #[serde(rename = "cycle")]
    Cycle {
        /// Records in the strongly connected component.
        component_size: u32,
        /// The records of the cycle, in order.
        records: Vec<RecordRef>,
        /// Its edges, in order; the last returns to the first record.
        edges: Vec<EdgeRef>,
    },
}

/// A malformed line, as listed in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineError {
    /// 1-based line.
    pub line: u64,
    /// 1-based byte column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    /// The full message (names the field and value).
    pub message: String,
}

/// Everything `tidegate check` prints: serialises to JSON, and [`std::fmt::Display`]s as a
/// human report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// [`REPORT_VERSION`].
    pub report_version: &'static str,
    /// Records read.
    pub records: u64,
    /// Highest level of the L0–L4 chain the trace satisfies.
    pub level: Level,
    /// Witness counts per anomaly.
    pub anomalies: AnomalyCounts,
    /// Which A3 form was evaluated.
    pub a3_form: A3Form,
    /// Non-trivial strongly connected components of the conflict graph.
    pub cycles: u64,
    /// Malformed lines skipped while reading.
    pub malformed: u64,
    /// Records each detector could not fully evaluate.
    pub skipped: SkipCounts,
    /// Whether the witness list was cut by a witness limit.
    pub truncated: bool,
    /// The witnesses (A1, A2, A3, A4, A6, then cycles).
    pub witnesses: Vec<Witness>,
    /// The first malformed lines.
    pub errors: Vec<LineError>,
}

impl Report {
    /// Resolves `findings` against `trace`.
    pub fn new(trace: &Trace, f: &Findings) -> Report {
        let r = Resolver { trace };
        let mut witnesses = Vec::new();
        witnesses.extend(f.a1.witnesses.iter().map(|w| r.a1(w)));
        witnesses.extend(f.a2.witnesses.iter().map(|w| r.a2(w)));
        witnesses.extend(f.a3.witnesses.iter().map(|w| r.a3(w, f.a3_form)));
        witnesses.extend(f.a4.witnesses.iter().map(|w| r.a4(w)));
        witnesses.extend(f.a6.witnesses.iter().map(|w| r.a6(w)));
        witnesses.extend(f.cycles.witnesses.iter().map(|c| r.cycle(c)));
        let stats = trace.stats();
        Report {
            report_version: REPORT_VERSION,
            records: trace.len() as u64,
            level: f.level(),
            anomalies: AnomalyCounts { a1: f.a1.count, a2: f.a2.count, a3: f.a3.count, a4: f.a4.count, a6: f.a6.count },
            a3_form: f.a3_form,
            cycles: f.cycles.count,
            malformed: stats.malformed,
            skipped: SkipCounts {
                a1: f.a1.skipped,
                a2: f.a2.skipped,
                a3: f.a3.skipped,
                a4: f.a4.skipped,
                a6: f.a6.skipped,
                cycles: f.cycles.skipped,
            },
            truncated: f.a1.truncated()
                || f.a2.truncated()
                || f.a3.truncated()
                || f.a4.truncated()
                || f.a6.truncated()
                || f.cycles.truncated(),
            witnesses,
            errors: stats
                .errors
                .iter()
                .map(|e| LineError { line: e.line(), column: e.column(), message: e.to_string() })
                .collect(),
        }
    }

    /// Compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Indented JSON.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A human-readable report listing at most `per_kind` witnesses of each kind.
    pub fn human(&self, per_kind: usize) -> String {
        crate::report_text::render(self, per_kind)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.human(10))
    }
}

struct Resolver<'t> {
    trace: &'t Trace,
}

impl Resolver<'_> {
    fn rec(&self, idx: RecordIdx) -> RecordRef {
        let r = self.trace.record(idx);
        RecordRef {
            line: r.line,
            tx: r.tx().map(|t| self.trace.tx_name(t).to_owned()),
            agent: r.agent().map(|a| self.trace.agent_name(a).to_owned()),
        }
    }
    fn cell(&self, c: CellId) -> String {
        self.trace.cell_name(c).to_owned()
    }
    fn effects(&self, list: Option<&[EffectEntry]>) -> Vec<(String, Json)> {
        let value = |e: &EffectEntry| e.value().map_or(Json::Null, |v| self.trace.value_json(v));
        list.unwrap_or(&[]).iter().map(|e| (self.cell(e.cell), value(e))).collect()
    }
    fn a1(&self, w: &crate::A1Witness) -> Witness {
        let reader = self.trace.record(w.reader);
        let read_time = self
            .trace
            .reads(reader)
            .and_then(|rs| rs.iter().find(|e| e.first && e.cell == w.cell))
            .and_then(|e| e.time());
        Witness::StaleGeneration {
            reader: self.rec(w.reader),
            writer: self.rec(w.writer),
            cell: self.cell(w.cell),
            read_value: self.trace.value_json(w.read_value),
            written_value: self.trace.value_json(w.written_value),
            read_time,
            write_time: self.trace.record(w.writer).write_time,
            reader_write_time: reader.write_time,
        }
    }
    fn a2(&self, w: &crate::A2Witness) -> Witness {
        let (change, at_read, at_commit) = match w.change {
            ToolChange::Removed => ("removed", None, None),
            ToolChange::SignatureChanged { at_read, at_commit } => {
                ("signature_changed", Some(self.trace.value_json(at_read)), Some(self.trace.value_json(at_commit)))
            }
        };
        Witness::PhantomTool {
            record: self.rec(w.record),
            tool: self.trace.tool_name(w.tool).to_owned(),
            change,
            signature_at_read: at_read,
            signature_at_commit: at_commit,
        }
    }
    fn a3(&self, w: &A3Witness, form: A3Form) -> Witness {
        match *w {
            A3Witness::Cascade { record, predecessor } => {
                Witness::CausalCascade { form, record: self.rec(record), predecessor: self.rec(predecessor) }
            }
            A3Witness::Residue { record, cell, value, read_time } => Witness::CascadeResidue {
                form,
                record: self.rec(record),
                cell: self.cell(cell),
                value: self.trace.value_json(value),
                read_time,
            },
        }
    }
    fn a4(&self, w: &crate::A4Witness) -> Witness {
        let side = |s: &crate::detectors::a4::ReplicaRead| ReplicaReadRef {
            record: self.rec(s.record),
            replica: self.trace.replica_name(s.replica).to_owned(),
            value: self.trace.value_json(s.value),
        };
        Witness::SplitView { cell: self.cell(w.cell), time: w.time, first: side(&w.first), second: side(&w.second) }
    }
    fn a6(&self, w: &crate::A6Witness) -> Witness {
        let r = self.trace.record(w.record);
        Witness::Reordering {
            record: self.rec(w.record),
            first_difference: w.first_difference,
            io: self.effects(self.trace.io(r)),
            co: self.effects(self.trace.co(r)),
        }
    }
    fn cycle(&self, c: &crate::Cycle) -> Witness {
        let line = |i: RecordIdx| self.trace.record(i).line;
        Witness::Cycle {
            component_size: c.component_size,
            records: c.records().map(|i| self.rec(i)).collect(),
            edges: c
                .edges
                .iter()
                .map(|e| EdgeRef { from: line(e.from), to: line(e.to), kind: e.kind, cell: self.cell(e.cell) })
                .collect(),
        }
    }
}
