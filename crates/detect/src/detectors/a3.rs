//! A3, causal cascade: the paper's Definition 3 (precise form) and its flat-trace residue.
//!
//! **Precise form** (the trace carries `aborted` flags and `predecessors`): a witness is a pair
//! `(j, p)` with `j` not aborted, `tx(p)` in `predecessors(j)` and `p` aborted. A predecessor
//! id names every record with that `tx`, so with duplicate ids each aborted one is a witness.
//! Cost: one counting sort of the aborted records by tx id, then one lookup per predecessor.
//!
//! **Residue form** (for traces without predecessors): a witness is a read `(j, c, v)` with
//! `v` not `NULL` such that no record `k != j` writes `c = v` with
//! `write_time(k) <= read_time(j, c)`. Over the committed projection, a retracted writer is
//! gone, so every cascade with a surviving reader leaves a residue witness; the residue also
//! fires on reads of values no logged operation wrote (initial or external data): it is the
//! paper's sound over-approximation. Cost: writes bucketed per cell and sorted by
//! (value, time); one binary search per read.

use super::{A3Form, Buckets, CheckOptions, Detection, in_history, keep};
use crate::trace::{CellId, NONE, NULL_VALUE, RecordIdx, Trace, ValueId};

/// A causal-cascade witness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum A3Witness {
    /// Precise form: surviving `record` keeps the aborted `predecessor` in its closure.
    Cascade {
        /// The surviving record `j`.
        record: RecordIdx,
        /// The aborted predecessor `p`.
        predecessor: RecordIdx,
    },
    /// Residue form: `record` read `value` from `cell` at `read_time`, and no other record
    /// wrote that value to that cell at or before then.
    Residue {
        /// The reading record `j`.
        record: RecordIdx,
        /// The cell read.
        cell: CellId,
        /// The unsupported value.
        value: ValueId,
        /// Logical time of the read.
        read_time: u64,
    },
}

/// The form [`causal_cascade`] evaluates for these options: `Auto` becomes `Precise` when
/// the trace carries both `predecessors` and `aborted` flags (on some records), `Residue`
/// otherwise: without both, Definition 3 cannot fire and the residue is the informative form.
pub fn resolve_form(trace: &Trace, opts: &CheckOptions) -> A3Form {
    match opts.a3_form {
        A3Form::Auto if trace.has_predecessors() && trace.has_aborted_flags() => A3Form::Precise,
        A3Form::Auto => A3Form::Residue,
        form => form,
    }
}

/// Every A3 witness, in the form chosen by [`resolve_form`].
pub fn causal_cascade(trace: &Trace, opts: &CheckOptions) -> (A3Form, Detection<A3Witness>) {
    match resolve_form(trace, opts) {
        A3Form::Residue => (A3Form::Residue, residue(trace, opts)),
        _ => (A3Form::Precise, precise(trace, opts)),
    }
}

/// Every witness of the precise form (Definition 3).
pub fn precise(trace: &Trace, opts: &CheckOptions) -> Detection<A3Witness> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let aborted_by_tx: Buckets<u32> = Buckets::build(trace.tx_count(), |emit| {
        for (idx, r) in trace.records.iter().enumerate() {
            if r.is_aborted() && r.tx != NONE {
                emit(r.tx, idx as u32);
            }
        }
    });
    let mut witnesses = Vec::new();
    let (mut count, mut skipped) = (0u64, 0u64);
    let mut preds = Vec::new();
    for (idx, r) in trace.records.iter().enumerate() {
        if r.is_aborted() {
            continue;
        }
        let Some(list) = trace.predecessors(r) else {
            skipped += 1;
            continue;
        };
        preds.clear();
        preds.extend(list.iter().map(|t| t.0));
        preds.sort_unstable();
        preds.dedup();
        for &p in &preds {
            for &q in aborted_by_tx.get(p) {
                count += 1;
                let w = A3Witness::Cascade { record: idx as u32, predecessor: q };
                keep(&mut witnesses, limit, w);
            }
        }
    }
    Detection { witnesses, count, skipped }
}

#[derive(Debug, Clone, Copy, Default)]
struct Produced {
    value: u32,
    time: u64,
    record: u32,
}

/// Every witness of the residue form.
pub fn residue(trace: &Trace, opts: &CheckOptions) -> Detection<A3Witness> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let mut by_cell: Buckets<Produced> = Buckets::build(trace.cell_count(), |emit| {
        for (idx, r) in trace.records.iter().enumerate() {
            if !in_history(r, opts) {
                continue;
            }
            let (Some(time), Some(writes)) = (r.write_time, trace.writes(r)) else { continue };
            for w in writes.iter().filter(|w| w.first && w.value != NONE) {
                emit(w.cell.0, Produced { value: w.value, time, record: idx as u32 });
            }
        }
    });
    by_cell.sort_each_by_key(|p| (p.value, p.time, p.record));
    let mut witnesses = Vec::new();
    let (mut count, mut skipped) = (0u64, 0u64);
    for (idx, r) in trace.records.iter().enumerate() {
        if !in_history(r, opts) {
            continue;
        }
        let known_writes =
            r.write_time.is_some() && trace.writes(r).is_some_and(|ws| ws.iter().all(|w| !w.first || w.value != NONE));
        let Some(reads) = trace.reads(r) else {
            skipped += 1;
            continue;
        };
        if !known_writes || reads.iter().any(|e| e.first && (e.value == NONE || e.time.is_none())) {
            skipped += 1;
        }
        for rd in reads.iter().filter(|e| e.first && e.value != NONE && e.value != NULL_VALUE.0) {
            let Some(rt) = rd.time else { continue };
            let ps = by_cell.get(rd.cell.0);
            let start = ps.partition_point(|p| p.value < rd.value);
            let earliest_other =
                ps[start..].iter().take_while(|p| p.value == rd.value).find(|p| p.record != idx as u32);
            if earliest_other.is_some_and(|p| p.time <= rt) {
                continue;
            }
            count += 1;
            let w = A3Witness::Residue { record: idx as u32, cell: rd.cell, value: ValueId(rd.value), read_time: rt };
            keep(&mut witnesses, limit, w);
        }
    }
    Detection { witnesses, count, skipped }
}
