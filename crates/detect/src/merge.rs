//! Appending one interned trace to another, for reading a file's halves in parallel.

use crate::error::Error;
use crate::intern::Interner;
use crate::trace::{NONE, Span, Trace, TxId};

/// Maps every id of `from` to the id of the same key in `into`, interning what is new.
fn remap(into: &mut Interner, from: &Interner) -> Vec<u32> {
    (0..from.len() as u32).map(|id| into.intern(from.get(id))).collect()
}

#[inline]
fn map(ids: &[u32], raw: u32) -> u32 {
    if raw == NONE { NONE } else { ids[raw as usize] }
}

fn shift(span: Span, by: usize) -> Span {
    if span == Span::UNKNOWN { span } else { Span { start: span.start + by as u32, len: span.len } }
}

impl Error {
    /// The same error with its line number moved by `by` (for a trace read in parts).
    pub(crate) fn shift_line(mut self, by: u64) -> Error {
        match &mut self {
            Error::Syntax { line, .. }
            | Error::Field { line, .. }
            | Error::UnsupportedVersion { line, .. }
            | Error::LineTooLong { line, .. }
            | Error::Io { line, .. } => *line += by,
            Error::NothingReadable { lines, .. } => *lines += by,
        }
        self
    }
}

impl Trace {
    /// Appends `other`, read from the lines that follow this trace's lines in the same file:
    /// its ids are re-interned, its spans shifted and its line numbers moved past ours.
    pub(crate) fn append(&mut self, other: Trace, max_errors_kept: usize) {
        let cells = remap(&mut self.cells, &other.cells);
        let values = remap(&mut self.values, &other.values);
        let agents = remap(&mut self.agents, &other.agents);
        let txs = remap(&mut self.txs, &other.txs);
        let tools = remap(&mut self.tool_names, &other.tool_names);
        let replicas = remap(&mut self.replicas, &other.replicas);
        let (reads_at, effects_at, tools_at, preds_at) =
            (self.reads.len(), self.effects.len(), self.tools.len(), self.preds.len());
        self.reads.extend(other.reads.iter().map(|r| crate::ReadEntry {
            cell: crate::CellId(cells[r.cell.0 as usize]),
            value: map(&values, r.value),
            replica: map(&replicas, r.replica),
            ..*r
        }));
        self.effects.extend(other.effects.iter().map(|e| crate::EffectEntry {
            cell: crate::CellId(cells[e.cell.0 as usize]),
            value: map(&values, e.value),
            ..*e
        }));
        self.tools.extend(other.tools.iter().map(|t| crate::ToolEntry {
            name: crate::ToolId(tools[t.name.0 as usize]),
            signature: map(&values, t.signature),
        }));
        self.preds.extend(other.preds.iter().map(|t| TxId(txs[t.0 as usize])));
        let lines_before = self.stats.lines;
        self.records.extend(other.records.into_iter().map(|r| crate::Record {
            line: r.line + lines_before,
            tx: map(&txs, r.tx),
            agent: map(&agents, r.agent),
            reads: shift(r.reads, reads_at),
            writes: shift(r.writes, effects_at),
            io: shift(r.io, effects_at),
            co: shift(r.co, effects_at),
            planned: shift(r.planned, tools_at),
            registry_at_read: shift(r.registry_at_read, tools_at),
            registry_at_commit: shift(r.registry_at_commit, tools_at),
            predecessors: shift(r.predecessors, preds_at),
            ..r
        }));
        let stats = other.stats;
        self.stats.lines += stats.lines;
        self.stats.blank += stats.blank;
        self.stats.malformed += stats.malformed;
        let room = max_errors_kept.saturating_sub(self.stats.errors.len());
        self.stats.errors.extend(stats.errors.into_iter().take(room).map(|e| e.shift_line(lines_before)));
        self.any_predecessors |= other.any_predecessors;
        self.any_aborted_flag |= other.any_aborted_flag;
    }
}
