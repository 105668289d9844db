//! A4, split view (the paper's §3.4/§4.12 predicate, with "same time" made precise).
//!
//! A witness is an unordered pair of read entries `r1 != r2` (possibly of the same record)
//! such that both read the same cell at the same logical time — equal effective read times
//! (each read's own `time`, else its record's `read_time`) — from different replicas, and
//! observed different values (`null` included). On the paper's clock (the log length, advanced
//! only by commits) equal read times mean no commit happened between the two reads, so both
//! should have seen the same committed state; seeing different values is the split.
//!
//! Evaluation: read entries are bucketed per cell and sorted by (time, value, replica); the
//! count per (cell, time) group is exact by inclusion–exclusion
//! (`pairs - same replica - same value + same both`), and witnesses are enumerated by pairing
//! each read with the later value blocks of its group, skipping its own replica. The scan is
//! `O(n log n + W + S)`, `S` being pairs of one replica returning two values at one time (which
//! a monotone replica never does).

use super::{Buckets, CheckOptions, Detection, in_history, keep, pairs};
use crate::trace::{CellId, NONE, RecordIdx, ReplicaId, Trace, ValueId};

/// One side of a split view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaRead {
    /// The record that read.
    pub record: RecordIdx,
    /// Position of the read in the record's read set.
    pub entry: u32,
    /// The replica that served it.
    pub replica: ReplicaId,
    /// What it returned.
    pub value: ValueId,
}

/// A split-view witness: two reads of `cell` at `time` that disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct A4Witness {
    /// The cell.
    pub cell: CellId,
    /// The common logical read time.
    pub time: u64,
    /// The earlier read in trace order.
    pub first: ReplicaRead,
    /// The later read in trace order.
    pub second: ReplicaRead,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Item {
    time: u64,
    value: u32,
    replica: u32,
    record: u32,
    entry: u32,
}

/// Every A4 witness of `trace` (see the module docs for the predicate).
pub fn split_view(trace: &Trace, opts: &CheckOptions) -> Detection<A4Witness> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let mut skipped = 0;
    for r in trace.records.iter().filter(|r| in_history(r, opts)) {
        let known = trace
            .reads(r)
            .is_some_and(|rs| rs.iter().all(|e| e.value != NONE && e.replica != NONE && e.time.is_some()));
        skipped += u64::from(!known);
    }
    let mut by_cell: Buckets<Item> = Buckets::build(trace.cell_count(), |emit| {
        for (idx, r) in trace.records.iter().enumerate() {
            if !in_history(r, opts) {
                continue;
            }
            for (pos, e) in trace.reads(r).unwrap_or(&[]).iter().enumerate() {
                let Some(time) = e.time else { continue };
                if e.value == NONE || e.replica == NONE {
                    continue;
                }
                let item = Item { time, value: e.value, replica: e.replica, record: idx as u32, entry: pos as u32 };
                emit(e.cell.0, item);
            }
        }
    });
    by_cell.sort_each_by_key(|i| *i);
    let mut witnesses = Vec::new();
    let mut count = 0u64;
    let mut by_replica = Vec::new();
    for cell in 0..by_cell.keys() as u32 {
        let items = by_cell.get(cell);
        let mut g = 0;
        while g < items.len() {
            let end = g + items[g..].partition_point(|i| i.time == items[g].time);
            let group = &items[g..end];
            count += count_group(group, &mut by_replica);
            if witnesses.len() < limit {
                enumerate_group(CellId(cell), group, limit, &mut witnesses);
            }
            g = end;
        }
    }
    Detection { witnesses, count, skipped }
}

/// Pairs with different replica and different value, by inclusion–exclusion.
fn count_group(group: &[Item], scratch: &mut Vec<(u32, u32)>) -> u64 {
    let runs = |keys: &mut dyn Iterator<Item = (u32, u32)>| {
        let mut total = 0u64;
        let mut prev = None;
        let mut run = 0u64;
        for k in keys {
            if Some(k) == prev {
                run += 1;
            } else {
                total += pairs(run);
                run = 1;
                prev = Some(k);
            }
        }
        total + pairs(run)
    };
    // `group` is sorted by (value, replica): value runs and (value, replica) runs are contiguous.
    let same_value = runs(&mut group.iter().map(|i| (i.value, 0)));
    let same_both = runs(&mut group.iter().map(|i| (i.value, i.replica)));
    scratch.clear();
    scratch.extend(group.iter().map(|i| (i.replica, 0)));
    scratch.sort_unstable();
    let same_replica = runs(&mut scratch.iter().copied());
    pairs(group.len() as u64) + same_both - same_value - same_replica
}

fn enumerate_group(cell: CellId, group: &[Item], limit: usize, out: &mut Vec<A4Witness>) {
    let mut block_end = 0;
    for (a, x) in group.iter().enumerate() {
        if a == block_end {
            block_end = a + group[a..].partition_point(|i| i.value == x.value);
        }
        for y in &group[block_end..] {
            if y.replica == x.replica {
                continue;
            }
            let side = |i: &Item| ReplicaRead {
                record: i.record,
                entry: i.entry,
                replica: ReplicaId(i.replica),
                value: ValueId(i.value),
            };
            let (first, second) = if (x.record, x.entry) < (y.record, y.entry) { (x, y) } else { (y, x) };
            let w = A4Witness { cell, time: x.time, first: side(first), second: side(second) };
            if !keep(out, limit, w) {
                return;
            }
        }
    }
}
