//! Running every detector, the classification and the cycle check over one trace.

use crate::cycles::{Cycle, conflict_cycles};
use crate::detectors::a1::{A1Witness, stale_generation};
use crate::detectors::a2::{A2Witness, phantom_tool};
use crate::detectors::a3::{A3Witness, causal_cascade};
use crate::detectors::a4::{A4Witness, split_view};
use crate::detectors::a6::{A6Witness, reordering};
use crate::detectors::{A3Form, CheckOptions, Detection};
use crate::level::Level;
use crate::report::Report;
use crate::trace::Trace;

/// The raw results of all detectors on one trace, with interned ids.
/// [`Report`] is the resolved, serialisable form.
#[derive(Debug, Clone)]
pub struct Findings {
    /// A1 stale generation.
    pub a1: Detection<A1Witness>,
    /// A2 phantom tool.
    pub a2: Detection<A2Witness>,
    /// The A3 form evaluated (`Precise` or `Residue`).
    pub a3_form: A3Form,
    /// A3 causal cascade.
    pub a3: Detection<A3Witness>,
    /// A4 split view.
    pub a4: Detection<A4Witness>,
    /// A6 tool-effect reordering.
    pub a6: Detection<A6Witness>,
    /// Serialisability cycles (one per non-trivial strongly connected component).
    pub cycles: Detection<Cycle>,
}

impl Findings {
    /// The highest level of the chain the trace satisfies (A4 does not enter; see [`Level`]).
    pub fn level(&self) -> Level {
        Level::classify(self.a1.found(), self.a2.found(), self.a3.found(), self.a6.found())
    }
}

/// Runs every detector and the cycle check. The work is split over two threads.
pub fn analyze(trace: &Trace, opts: &CheckOptions) -> Findings {
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            let cycles = conflict_cycles(trace, opts);
            let a2 = phantom_tool(trace, opts);
            let a6 = reordering(trace, opts);
            (cycles, a2, a6)
        });
        let a1 = stale_generation(trace, opts);
        let (a3_form, a3) = causal_cascade(trace, opts);
        let a4 = split_view(trace, opts);
        let (cycles, a2, a6) = match other.join() {
            Ok(results) => results,
            // A panic in a detector is a bug; surface it on this thread rather than hide it.
            Err(panic) => std::panic::resume_unwind(panic),
        };
        Findings { a1, a2, a3_form, a3, a4, a6, cycles }
    })
}

/// Checks a trace with the default options: every detector, the level and the cycles.
///
/// ```
/// let trace = tidegate_detect::read_str(
///     r#"{"tx":"a","agent":"x","reads":[{"cell":"c","value":null}],"read_time":0,"writes":[["c",1]],"write_time":2}
/// {"tx":"b","agent":"y","reads":[],"read_time":0,"writes":[["c",2]],"write_time":1}"#,
///     &tidegate_detect::ReadOptions::default(),
/// ).unwrap();
/// let report = tidegate_detect::check(&trace);
/// assert_eq!(report.level, tidegate_detect::Level::L0);
/// assert_eq!(report.anomalies.a1, 1);
/// ```
pub fn check(trace: &Trace) -> Report {
    check_with(trace, &CheckOptions::default())
}

/// Checks a trace with explicit options.
pub fn check_with(trace: &Trace, opts: &CheckOptions) -> Report {
    let findings = analyze(trace, opts);
    Report::new(trace, &findings)
}
