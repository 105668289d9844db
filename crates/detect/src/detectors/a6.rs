//! A6, tool-effect reordering (the paper's Definition 4).
//!
//! A witness is a record `i` with `|io(i)| >= 2`, `co(i) != io(i)` as sequences, and `co(i)`
//! a permutation of `io(i)` (equal as multisets of `(cell, value)` pairs). An effect whose
//! value is unknown makes the record unevaluable (skipped). Cost: `O(k log k)` per record
//! with `k` effects.

use super::{CheckOptions, Detection, in_history, keep};
use crate::trace::{EffectEntry, NONE, RecordIdx, Trace};

/// A tool-effect reordering witness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct A6Witness {
    /// The record.
    pub record: RecordIdx,
    /// The first position at which `co` differs from `io`.
    pub first_difference: u32,
}

fn same_effect(a: &EffectEntry, b: &EffectEntry) -> bool {
    a.cell == b.cell && a.value == b.value
}

/// Every A6 witness of `trace` (see the module docs for the predicate).
pub fn reordering(trace: &Trace, opts: &CheckOptions) -> Detection<A6Witness> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let mut witnesses = Vec::new();
    let (mut count, mut skipped) = (0u64, 0u64);
    let (mut sorted_io, mut sorted_co) = (Vec::new(), Vec::new());
    for (idx, r) in trace.records.iter().enumerate() {
        if !in_history(r, opts) {
            continue;
        }
        let (Some(io), Some(co)) = (trace.io(r), trace.co(r)) else {
            skipped += 1;
            continue;
        };
        if io.iter().chain(co).any(|e| e.value == NONE) {
            skipped += 1;
            continue;
        }
        if io.len() < 2 || io.len() != co.len() {
            continue;
        }
        let Some(diff) = io.iter().zip(co).position(|(a, b)| !same_effect(a, b)) else {
            continue;
        };
        sorted_io.clear();
        sorted_io.extend(io.iter().map(|e| (e.cell, e.value)));
        sorted_io.sort_unstable();
        sorted_co.clear();
        sorted_co.extend(co.iter().map(|e| (e.cell, e.value)));
        sorted_co.sort_unstable();
        if sorted_io != sorted_co {
            continue;
        }
        count += 1;
        keep(&mut witnesses, limit, A6Witness { record: idx as u32, first_difference: diff as u32 });
    }
    Detection { witnesses, count, skipped }
}
