//! A1, stale generation (the paper's Definition 1).
//!
//! A witness is a triple `(i, j, c)` of two records and a cell such that
//!
//! * `agent(i) != agent(j)` (both known), and `c` is in `read_set(i) ∩ write_set(j)`;
//! * `read_time(i, c) < write_time(j) < write_time(i)`, where `read_time(i, c)` is the time
//!   of `i`'s first read of `c` (its own `time`, defaulting to the record's `read_time`);
//! * `read_value(i, c) != written_value(j, c)` (first entries for `c`; `null` is a value).
//!
//! `i != j` follows from the strict inequalities. Evaluation: writers are bucketed per cell
//! and sorted by commit time; each read then selects its window `(read_time, write_time(i))`
//! by binary search and scans it. The scan touches only writes inside some reader's window,
//! so the cost is `O(n log n + W + S)` with `W` witnesses and `S` writes in a window by the
//! reader's own agent or with the value it read. When a limit stops the scan, the exact count
//! comes from inclusion–exclusion over binary-searched ranges in `O(n log n)`.

use super::{Buckets, CheckOptions, Detection, in_history, keep};
use crate::trace::{CellId, NONE, RecordIdx, Trace, ValueId};

/// A stale-generation witness: `reader` read `cell` (seeing `read_value`) before `writer`
/// committed `written_value` to it, and committed itself after that write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct A1Witness {
    /// Record `i`, the stale reader.
    pub reader: RecordIdx,
    /// Record `j`, the interleaved writer.
    pub writer: RecordIdx,
    /// The cell.
    pub cell: CellId,
    /// What `i` read.
    pub read_value: ValueId,
    /// What `j` wrote.
    pub written_value: ValueId,
}

#[derive(Debug, Clone, Copy, Default)]
struct Write {
    time: u64,
    record: u32,
    agent: u32,
    value: u32,
}

fn writers(trace: &Trace, opts: &CheckOptions) -> Buckets<Write> {
    let mut b = Buckets::build(trace.cell_count(), |emit| {
        for (idx, r) in trace.records.iter().enumerate() {
            if !in_history(r, opts) || r.agent == NONE {
                continue;
            }
            let (Some(time), Some(writes)) = (r.write_time, trace.writes(r)) else {
                continue;
            };
            for w in writes.iter().filter(|w| w.first && w.value != NONE) {
                emit(w.cell.0, Write { time, record: idx as u32, agent: r.agent, value: w.value });
            }
        }
    });
    b.sort_each_by_key(|w| (w.time, w.record));
    b
}

/// Whether A1 can evaluate every part of `r`.
fn fully_known(trace: &Trace, r: &crate::Record) -> bool {
    r.agent != NONE
        && r.write_time.is_some()
        && trace.reads(r).is_some_and(|rs| rs.iter().filter(|e| e.first).all(|e| e.value != NONE && e.time.is_some()))
        && trace.writes(r).is_some_and(|ws| ws.iter().filter(|w| w.first).all(|w| w.value != NONE))
}

/// Every A1 witness of `trace` (see the module docs for the predicate).
pub fn stale_generation(trace: &Trace, opts: &CheckOptions) -> Detection<A1Witness> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let by_cell = writers(trace, opts);
    let mut witnesses = Vec::new();
    let mut count: u64 = 0;
    let mut skipped = 0;
    let mut complete = true;
    'records: for (idx, r) in trace.records.iter().enumerate() {
        if !in_history(r, opts) {
            continue;
        }
        if !fully_known(trace, r) {
            skipped += 1;
        }
        let (Some(wt), Some(reads)) = (r.write_time, trace.reads(r)) else {
            continue;
        };
        if r.agent == NONE {
            continue;
        }
        for rd in reads.iter().filter(|e| e.first && e.value != NONE) {
            let Some(rt) = rd.time else { continue };
            let ws = by_cell.get(rd.cell.0);
            let lo = ws.partition_point(|w| w.time <= rt);
            let hi = ws.partition_point(|w| w.time < wt);
            for w in ws.get(lo..hi).unwrap_or(&[]) {
                if w.agent != r.agent && w.value != rd.value {
                    let witness = A1Witness {
                        reader: idx as u32,
                        writer: w.record,
                        cell: rd.cell,
                        read_value: ValueId(rd.value),
                        written_value: ValueId(w.value),
                    };
                    if !keep(&mut witnesses, limit, witness) {
                        complete = false;
                        break 'records;
                    }
                    count += 1;
                }
            }
        }
    }
    if !complete {
        count = count_by_ranges(trace, opts, by_cell);
    }
    Detection { witnesses, count, skipped }
}

/// Exact witness count without enumeration: for each read, (writes in the window) minus
/// (same agent) minus (same value) plus (same agent and value), each a range count in a
/// bucket sorted by (key, time).
fn count_by_ranges(trace: &Trace, opts: &CheckOptions, mut by_cell: Buckets<Write>) -> u64 {
    fn range(ws: &[Write], key: impl Fn(&Write) -> (u32, u32), k: (u32, u32), lo: u64, hi: u64) -> u64 {
        let a = ws.partition_point(|w| (key(w), w.time) <= (k, lo));
        let b = ws.partition_point(|w| (key(w), w.time) < (k, hi));
        b.saturating_sub(a) as u64
    }
    let mut total: i128 = 0;
    // Pass 0 sorts by time only; passes 1..=3 by agent, value, and both.
    type Key = fn(&Write) -> (u32, u32);
    let keys: [Key; 4] = [|_| (0, 0), |w| (w.agent, 0), |w| (0, w.value), |w| (w.agent, w.value)];
    for (pass, key) in keys.into_iter().enumerate() {
        by_cell.sort_each_by_key(|w| (key(w), w.time));
        let sign: i128 = if pass == 0 || pass == 3 { 1 } else { -1 };
        for r in trace.records.iter().filter(|r| in_history(r, opts) && r.agent != NONE) {
            let (Some(wt), Some(reads)) = (r.write_time, trace.reads(r)) else { continue };
            for rd in reads.iter().filter(|e| e.first && e.value != NONE) {
                let Some(rt) = rd.time else { continue };
                if rt >= wt {
                    continue;
                }
                let probe = Write { time: 0, record: 0, agent: r.agent, value: rd.value };
                let n = range(by_cell.get(rd.cell.0), key, key(&probe), rt, wt);
                total += sign * n as i128;
            }
        }
    }
    total.max(0) as u64
}
