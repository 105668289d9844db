//! Conflict-graph serialisability check.
//!
//! Nodes are the committed records (not flagged aborted). For each cell, every access is an
//! event: a first read of the cell at its read time, a first write at the record's commit
//! time. Events are ordered by time, writes before reads at equal times (a write committed at
//! `t` is visible to reads at `t`), then by record. Two events of different records conflict
//! when at least one is a write, and the earlier one's record gets an edge to the later one's:
//! `ww` (write then write), `wr` (write then read), `rw` (read then write). The history is
//! conflict-serialisable iff this graph is acyclic.
//!
//! The full graph can have quadratically many edges (every reader of a hot cell against every
//! later writer). We keep only edges to the *nearest* conflicting events: each write gets an
//! edge from the previous write and from every read since that write, each read an edge from
//! the previous write. Every full-graph edge is a path of kept edges through the writes in
//! between, and every kept edge is a full-graph edge, so reachability — hence the strongly
//! connected components — is the same, with at most one edge per event.
//!
//! Every strongly connected component with two or more records is reported once, with one
//! simple cycle through it found by a breadth-first search inside the component. Components
//! are found with Tarjan's algorithm on an explicit stack, so depth is never a problem.

use crate::detectors::{Buckets, CheckOptions, Detection, keep};
use crate::trace::{CellId, NONE, RecordIdx, Trace};
use serde::Serialize;

/// The kind of a conflict edge, named by the two accesses in time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum EdgeKind {
    /// Write, then a later write of the same cell.
    #[serde(rename = "ww")]
    WriteWrite,
    /// Write, then a later read of the same cell.
    #[serde(rename = "wr")]
    WriteRead,
    /// Read, then a later write of the same cell.
    #[serde(rename = "rw")]
    ReadWrite,
}

/// A conflict edge `from → to` on `cell`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Edge {
    /// The record with the earlier access.
    pub from: RecordIdx,
    /// The record with the later access.
    pub to: RecordIdx,
    /// Which accesses conflict.
    pub kind: EdgeKind,
    /// The cell.
    pub cell: CellId,
}

/// A witness cycle: `edges[k].to == edges[k + 1].from`, and the last edge returns to the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The edges of the cycle, in order.
    pub edges: Vec<Edge>,
    /// Number of records in the strongly connected component the cycle was taken from.
    pub component_size: u32,
}

impl Cycle {
    /// The records of the cycle, in order.
    pub fn records(&self) -> impl Iterator<Item = RecordIdx> + '_ {
        self.edges.iter().map(|e| e.from)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Event {
    time: u64,
    is_read: bool,
    record: u32,
}

/// The reduced conflict graph's edges (see the module docs), and the skipped-record count.
pub fn conflict_edges(trace: &Trace) -> (Vec<Edge>, u64) {
    let mut skipped = 0;
    for r in trace.records.iter().filter(|r| !r.is_aborted()) {
        let reads_ok = trace.reads(r).is_some_and(|rs| rs.iter().all(|e| e.time.is_some()));
        let writes_ok = trace.writes(r).is_some_and(|ws| ws.is_empty() || r.write_time.is_some());
        skipped += u64::from(!(reads_ok && writes_ok));
    }
    let mut by_cell: Buckets<Event> = Buckets::build(trace.cell_count(), |emit| {
        for (idx, r) in trace.records.iter().enumerate() {
            if r.is_aborted() {
                continue;
            }
            for e in trace.reads(r).unwrap_or(&[]).iter().filter(|e| e.first) {
                if let Some(time) = e.time {
                    emit(e.cell.0, Event { time, is_read: true, record: idx as u32 });
                }
            }
            if let (Some(time), Some(ws)) = (r.write_time, trace.writes(r)) {
                for w in ws.iter().filter(|w| w.first) {
                    emit(w.cell.0, Event { time, is_read: false, record: idx as u32 });
                }
            }
        }
    });
    by_cell.sort_each_by_key(|e| (e.time, e.is_read, e.record));
    let mut edges = Vec::new();
    let mut pending = Vec::new();
    for cell in 0..by_cell.keys() as u32 {
        let mut last_write = NONE;
        pending.clear();
        let mut add = |from: u32, to: u32, kind: EdgeKind| {
            if from != to && from != NONE {
                edges.push(Edge { from, to, kind, cell: CellId(cell) });
            }
        };
        for e in by_cell.get(cell) {
            if e.is_read {
                add(last_write, e.record, EdgeKind::WriteRead);
                pending.push(e.record);
            } else {
                add(last_write, e.record, EdgeKind::WriteWrite);
                for &r in &pending {
                    add(r, e.record, EdgeKind::ReadWrite);
                }
                pending.clear();
                last_write = e.record;
            }
        }
    }
    (edges, skipped)
}

/// Every non-trivial strongly connected component of the conflict graph, each with a cycle.
pub fn conflict_cycles(trace: &Trace, opts: &CheckOptions) -> Detection<Cycle> {
    let limit = opts.witness_limit.unwrap_or(usize::MAX);
    let (edges, skipped) = conflict_edges(trace);
    let n = trace.len();
    let adj: Buckets<u32> = Buckets::build(n, |emit| {
        for (i, e) in edges.iter().enumerate() {
            emit(e.from, i as u32);
        }
    });
    let mut index = vec![NONE; n];
    let mut low = vec![0u32; n];
    let mut comp = vec![NONE; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut call: Vec<(u32, usize)> = Vec::new();
    let mut counter = 0u32;
    let mut components = 0u32;
    let mut bfs = Bfs { parent: vec![NONE; n], queue: Vec::new() };
    let mut witnesses = Vec::new();
    let mut count = 0u64;
    for s in 0..n as u32 {
        if index[s as usize] != NONE || adj.get(s).is_empty() {
            continue;
        }
        index[s as usize] = counter;
        low[s as usize] = counter;
        counter += 1;
        stack.push(s);
        on_stack[s as usize] = true;
        call.push((s, 0));
        while let Some(&mut (v, ref mut pos)) = call.last_mut() {
            let out = adj.get(v);
            if *pos < out.len() {
                let w = edges[out[*pos] as usize].to;
                *pos += 1;
                if index[w as usize] == NONE {
                    index[w as usize] = counter;
                    low[w as usize] = counter;
                    counter += 1;
                    stack.push(w);
                    on_stack[w as usize] = true;
                    call.push((w, 0));
                } else if on_stack[w as usize] {
                    low[v as usize] = low[v as usize].min(index[w as usize]);
                }
                continue;
            }
            call.pop();
            if let Some(&(u, _)) = call.last() {
                low[u as usize] = low[u as usize].min(low[v as usize]);
            }
            if low[v as usize] != index[v as usize] {
                continue;
            }
            let mut size = 0u32;
            while let Some(x) = stack.pop() {
                on_stack[x as usize] = false;
                comp[x as usize] = components;
                size += 1;
                if x == v {
                    break;
                }
            }
            if size >= 2 {
                count += 1;
                if witnesses.len() < limit {
                    let cycle = bfs.cycle_through(v, components, &comp, &adj, &edges);
                    keep(&mut witnesses, limit, Cycle { edges: cycle, component_size: size });
                }
            }
            components += 1;
        }
    }
    // Present each cycle from its earliest record, and the cycles in that order.
    for c in &mut witnesses {
        if let Some(first) = c.edges.iter().enumerate().min_by_key(|(_, e)| e.from).map(|(i, _)| i) {
            c.edges.rotate_left(first);
        }
    }
    witnesses.sort_by_key(|c| c.edges.first().map(|e| e.from));
    Detection { witnesses, count, skipped }
}

struct Bfs {
    parent: Vec<u32>,
    queue: Vec<u32>,
}

impl Bfs {
    /// A shortest cycle through `root` inside component `c` (which contains one, being
    /// strongly connected with two or more nodes). Resets what it touched.
    fn cycle_through(&mut self, root: u32, c: u32, comp: &[u32], adj: &Buckets<u32>, edges: &[Edge]) -> Vec<Edge> {
        self.queue.clear();
        self.queue.push(root);
        let mut head = 0;
        let mut closing = NONE;
        'search: while head < self.queue.len() {
            let v = self.queue[head];
            head += 1;
            for &ei in adj.get(v) {
                let to = edges[ei as usize].to;
                if comp[to as usize] != c {
                    continue;
                }
                if to == root {
                    closing = ei;
                    break 'search;
                }
                if self.parent[to as usize] == NONE {
                    self.parent[to as usize] = ei;
                    self.queue.push(to);
                }
            }
        }
        let mut path = Vec::new();
        let mut ei = closing;
        while ei != NONE {
            let e = edges[ei as usize];
            path.push(e);
            ei = if e.from == root { NONE } else { self.parent[e.from as usize] };
        }
        path.reverse();
        for &v in &self.queue {
            self.parent[v as usize] = NONE;
        }
        debug_assert!(path.first().is_some_and(|e| e.from == root), "an SCC of size >= 2 has a cycle through its root");
        path
    }
}
