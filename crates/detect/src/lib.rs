//! Offline detectors for the concurrency anomalies of multi-agent operation traces.
//!
//! `tidegate-detect` reads a JSON Lines trace of operation records (the model of the source
//! paper's §2.1; format in [`wire`] and `docs/trace-format.md`) from any system, and decides
//! from the trace alone which anomalies occurred, each with every witness:
//!
//! | anomaly | module | predicate |
//! | --- | --- | --- |
//! | A1 stale generation | [`detectors::a1`] | Definition 1 |
//! | A2 phantom tool | [`detectors::a2`] | Definition 2 (+ signature change, §4.16) |
//! | A3 causal cascade | [`detectors::a3`] | Definition 3, or the flat-trace residue |
//! | A4 split view | [`detectors::a4`] | §3.4/§4.12, with "same time" made precise |
//! | A6 tool-effect reordering | [`detectors::a6`] | Definition 4 |
//!
//! It classifies the trace into the highest [`Level`] L0–L4 it satisfies, and checks
//! conflict serialisability, reporting one witness cycle per non-trivial strongly connected
//! component ([`cycles`]). Everything runs in `O(n log n)` in the trace length (plus the
//! number of witnesses kept); see `docs/detectors.md`.
//!
//! # Use
//!
//! ```no_run
//! use tidegate_detect::{ReadOptions, read_path, check};
//! # fn main() -> Result<(), tidegate_detect::Error> {
//! // Lenient: malformed lines are skipped, counted and listed (strict: ReadOptions::strict()).
//! let trace = read_path("trace.jsonl", &ReadOptions::default())?;
//! let report = check(&trace);
//! println!("{}", report.to_json_pretty()); // machine-readable
//! print!("{report}");                      // human-readable
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod build;
mod check;
pub mod cycles;
pub mod detectors;
mod error;
mod generate;
mod intern;
mod level;
mod merge;
mod reader;
mod report;
mod report_text;
mod trace;
pub mod wire;

pub use build::TraceBuilder;
pub use check::{Findings, analyze, check, check_with};
pub use cycles::{Cycle, Edge, EdgeKind};
pub use detectors::a1::A1Witness;
pub use detectors::a2::{A2Witness, ToolChange};
pub use detectors::a3::A3Witness;
pub use detectors::a4::{A4Witness, ReplicaRead};
pub use detectors::a6::A6Witness;
pub use detectors::{A3Form, CheckOptions, Detection};
pub use error::{Error, Result};
pub use generate::{GenOptions, generate_trace, generate_trace_with};
pub use level::Level;
pub use reader::{ReadOptions, read_path, read_str, read_trace};
pub use report::{
    AnomalyCounts, EdgeRef, LineError, REPORT_VERSION, RecordRef, ReplicaReadRef, Report, SkipCounts, Witness,
};
pub use trace::{
    AgentId, CellId, EffectEntry, NULL_VALUE, ReadEntry, ReadStats, Record, RecordIdx, ReplicaId, ToolEntry, ToolId,
    Trace, TxId, ValueId,
};
