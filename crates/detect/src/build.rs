//! Conversion of wire records into the interned [`Trace`].

use crate::trace::{EffectEntry, NONE, ReadEntry, Record, Span, ToolEntry, Trace, TxId};
use crate::wire::{CellValues, Effect, RecordLine, Str, Tool, Value};
use std::io::Write as _;

/// Builds a [`Trace`] from wire records, one at a time, interning as it goes.
///
/// The streaming reader ([`crate::read_trace`]) uses this; use it directly to check records
/// produced in memory.
#[derive(Debug)]
pub struct TraceBuilder {
    trace: Trace,
    null_string: Option<String>,
    key: Vec<u8>,
    seen: crate::intern::IdMap<u32, ()>,
    /// Recently interned registry snapshots: consecutive records usually see the same
    /// registry, so they share one span of the tool arena.
    registries: Vec<(Vec<Tool<'static>>, Span)>,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceBuilder {
    /// A builder for a new, empty trace.
    pub fn new() -> Self {
        let mut trace = Trace::default();
        let null = trace.values.intern(b"n");
        debug_assert_eq!(null, crate::trace::NULL_VALUE.0);
        TraceBuilder {
            trace,
            null_string: None,
            key: Vec::with_capacity(64),
            seen: Default::default(),
            registries: Vec::new(),
        }
    }

    /// Also read string values equal to `s` as `null` (the reference runtime writes `"NULL"`).
    pub fn null_string(mut self, s: Option<String>) -> Self {
        self.null_string = s;
        self
    }

    /// Number of records pushed so far.
    pub fn len(&self) -> usize {
        self.trace.records.len()
    }

    /// Whether no record was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.trace.records.is_empty()
    }

    /// Mutable read statistics (the reader records lines and malformed lines here).
    pub(crate) fn stats_mut(&mut self) -> &mut crate::trace::ReadStats {
        &mut self.trace.stats
    }

    /// The finished trace.
    pub fn finish(mut self) -> Trace {
        self.trace.records.shrink_to_fit();
        self.trace
    }

    /// Adds the record found on 1-based line `line`.
    pub fn push(&mut self, line: u64, rec: &RecordLine<'_>) {
        let tx = match &rec.tx {
            Some(id) => self.trace.txs.intern_str(&id.0),
            None => NONE,
        };
        let agent = match rec.agent.as_ref().or(rec.agent_id.as_ref()) {
            Some(a) => self.trace.agents.intern_str(&a.0),
            None => NONE,
        };
        let replica = rec.replica.as_ref().map_or(NONE, |r| self.trace.replicas.intern_str(&r.0));
        let reads = self.push_reads(rec, replica);
        let writes = if let Some(w) = &rec.writes {
            self.push_effects(w.iter().map(|e| (&e.cell, e.value.as_ref())), true)
        } else if rec.write_set.is_some() || rec.write_values.is_some() {
            self.push_paired(rec.write_set.as_deref(), rec.write_values.as_ref())
        } else if let Some(co) = rec.co.as_ref().or(rec.co_seq.as_ref()) {
            self.push_effects(co.iter().map(|e| (&e.cell, e.value.as_ref())), true)
        } else {
            Span::UNKNOWN
        };
        let planned = match (&rec.planned_tools, &rec.planned_tool) {
            (Some(list), _) => self.push_tools(list.iter()),
            (None, Some(one)) => self.push_tools(one.iter()),
            (None, None) => Span::UNKNOWN,
        };
        let reg_read =
            rec.registry_at_read.as_ref().or(rec.tools_visible_at_read.as_ref()).or(rec.read_registry.as_ref());
        let registry_at_read = reg_read.map_or(Span::UNKNOWN, |l| self.registry(l));
        let reg_commit = rec.registry_at_commit.as_ref().or(rec.tools_used.as_ref()).or(rec.write_registry.as_ref());
        let registry_at_commit = reg_commit.map_or(Span::UNKNOWN, |l| self.registry(l));
        // `io`, `co` and `writes` are usually the same list: share spans, or reuse entries.
        let wire_writes = rec.writes.as_deref().map(|w| (w, writes));
        let io_list = rec.io.as_deref().or(rec.io_seq.as_deref());
        let io = io_list.map_or(Span::UNKNOWN, |l| self.effect_list(l, wire_writes));
        let co_list = rec.co.as_deref().or(rec.co_seq.as_deref());
        let co = match (co_list, io_list) {
            (None, _) => Span::UNKNOWN,
            (Some(c), Some(i)) => self.effect_list(c, Some((i, io))),
            (Some(c), None) => self.effect_list(c, wire_writes),
        };
        let predecessors = match &rec.predecessors {
            Some(list) => {
                self.trace.any_predecessors = true;
                let start = self.trace.preds.len();
                for id in list {
                    let t = self.trace.txs.intern_str(&id.0);
                    self.trace.preds.push(TxId(t));
                }
                span(start, self.trace.preds.len())
            }
            None => Span::UNKNOWN,
        };
        self.trace.any_aborted_flag |= rec.aborted.is_some();
        self.trace.records.push(Record {
            line,
            tx,
            agent,
            read_time: rec.read_time,
            write_time: rec.write_time,
            aborted: rec.aborted,
            reads,
            writes,
            planned,
            registry_at_read,
            registry_at_commit,
            io,
            co,
            predecessors,
        });
    }

    fn push_reads(&mut self, rec: &RecordLine<'_>, default_replica: u32) -> Span {
        let start = self.trace.reads.len();
        if let Some(reads) = &rec.reads {
            for r in reads {
                let cell = self.trace.cells.intern_str(&r.cell.0);
                let value = r.value.as_ref().map_or(NONE, |v| self.intern_value(v));
                let replica = r.replica.as_ref().map_or(default_replica, |s| self.trace.replicas.intern_str(&s.0));
                let time = r.time.or(rec.read_time);
                self.trace.reads.push(ReadEntry { cell: crate::CellId(cell), first: true, value, replica, time });
            }
        } else if rec.read_set.is_some() || rec.read_values.is_some() {
            let span = self.push_paired(rec.read_set.as_deref(), rec.read_values.as_ref());
            // Re-home the paired entries (pushed as effects) into the read arena.
            let start_e = span.start as usize;
            let pairs: Vec<EffectEntry> = self.trace.effects.drain(start_e..).collect();
            for e in pairs {
                self.trace.reads.push(ReadEntry {
                    cell: e.cell,
                    first: true,
                    value: e.value,
                    replica: default_replica,
                    time: rec.read_time,
                });
            }
        } else {
            return Span::UNKNOWN;
        }
        let end = self.trace.reads.len();
        self.mark_first_reads(start, end);
        span(start, end)
    }

    fn mark_first_reads(&mut self, start: usize, end: usize) {
        let reads = &mut self.trace.reads[start..end];
        if reads.len() <= 16 {
            for i in 1..reads.len() {
                let c = reads[i].cell;
                reads[i].first = !reads[..i].iter().any(|r| r.cell == c);
            }
        } else {
            self.seen.clear();
            for r in reads.iter_mut() {
                r.first = self.seen.insert(r.cell.0, ()).is_none();
            }
        }
    }

    /// Pushes `(cell, value)` effects; with `mark_first`, flags the first entry of each cell.
    fn push_effects<'e, 'a: 'e>(
        &mut self,
        items: impl Iterator<Item = (&'e Str<'a>, Option<&'e Value<'a>>)>,
        mark_first: bool,
    ) -> Span {
        let start = self.trace.effects.len();
        for (cell, value) in items {
            let cell = self.trace.cells.intern_str(&cell.0);
            let value = value.map_or(NONE, |v| self.intern_value(v));
            self.trace.effects.push(EffectEntry { cell: crate::CellId(cell), value, first: true });
        }
        let end = self.trace.effects.len();
        if mark_first {
            let effects = &mut self.trace.effects[start..end];
            if effects.len() <= 16 {
                for i in 1..effects.len() {
                    let c = effects[i].cell;
                    effects[i].first = !effects[..i].iter().any(|e| e.cell == c);
                }
            } else {
                self.seen.clear();
                for e in effects.iter_mut() {
                    e.first = self.seen.insert(e.cell.0, ()).is_none();
                }
            }
        }
        span(start, end)
    }

    /// The reference runtime's `*_set` + `*_values` pair. With a set, its cells in order, each
    /// valued from the first matching pair (unknown if none); without, the pairs themselves.
    fn push_paired(&mut self, set: Option<&[Str<'_>]>, values: Option<&CellValues<'_>>) -> Span {
        let pairs: &[Effect<'_>] = values.map_or(&[], |v| &v.0);
        match set {
            None => self.push_effects(pairs.iter().map(|e| (&e.cell, e.value.as_ref())), true),
            Some(cells) if pairs.len() <= 16 => self.push_effects(
                cells.iter().map(|c| {
                    let v = pairs.iter().find(|p| p.cell == *c).and_then(|p| p.value.as_ref());
                    (c, v)
                }),
                true,
            ),
            Some(cells) => {
                let mut by_cell: std::collections::HashMap<&str, Option<&Value<'_>>> =
                    std::collections::HashMap::with_capacity(pairs.len());
                for p in pairs {
                    by_cell.entry(&p.cell.0).or_insert(p.value.as_ref());
                }
                self.push_effects(cells.iter().map(|c| (c, by_cell.get(&*c.0).copied().flatten())), true)
            }
        }
    }

    /// An `io`/`co` list. If it equals `like` (a list already pushed at `span`) and every
    /// entry there is a first entry, shares `span`; otherwise reuses ids entry by entry.
    fn effect_list(&mut self, list: &[Effect<'_>], like: Option<(&[Effect<'_>], Span)>) -> Span {
        if let Some((other, span)) = like {
            let shared = span.get(&self.trace.effects).is_some_and(|es| es.iter().all(|e| e.first));
            if shared && other == list {
                return span;
            }
        }
        let start = self.trace.effects.len();
        for (k, e) in list.iter().enumerate() {
            let same = like.filter(|(other, span)| other.get(k) == Some(e) && span.len as usize > k);
            let entry = match same {
                Some((_, span)) => EffectEntry { first: true, ..self.trace.effects[span.start as usize + k] },
                None => {
                    let cell = crate::CellId(self.trace.cells.intern_str(&e.cell.0));
                    let value = e.value.as_ref().map_or(NONE, |v| self.intern_value(v));
                    EffectEntry { cell, value, first: true }
                }
            };
            self.trace.effects.push(entry);
        }
        span(start, self.trace.effects.len())
    }

    /// A registry snapshot, shared with a recent identical one when possible.
    fn registry(&mut self, list: &[Tool<'_>]) -> Span {
        if let Some(i) = self.registries.iter().position(|(cached, _)| cached.as_slice() == list) {
            return self.registries[i].1;
        }
        let span = self.push_tools(list.iter());
        if self.registries.len() == 4 {
            self.registries.pop();
        }
        self.registries.insert(0, (list.iter().map(Tool::to_static).collect(), span));
        span
    }

    fn push_tools<'e, 'a: 'e>(&mut self, tools: impl Iterator<Item = &'e Tool<'a>>) -> Span {
        let start = self.trace.tools.len();
        for t in tools {
            let name = self.trace.tool_names.intern_str(&t.name.0);
            let signature = t.signature.as_ref().map_or(NONE, |v| self.intern_value(v));
            self.trace.tools.push(ToolEntry { name: crate::ToolId(name), signature });
        }
        span(start, self.trace.tools.len())
    }

    fn intern_value(&mut self, v: &Value<'_>) -> u32 {
        encode_value(v, self.null_string.as_deref(), &mut self.key);
        self.trace.values.intern(&self.key)
    }
}

fn span(start: usize, end: usize) -> Span {
    debug_assert!(end <= u32::MAX as usize, "arena exceeds 2^32 entries");
    Span { start: start as u32, len: (end - start) as u32 }
}

/// The canonical interning key of a value: a one-byte tag, then the content. Equal JSON values
/// get equal keys (object keys are sorted), so value equality is id equality.
pub(crate) fn encode_value(v: &Value<'_>, null_string: Option<&str>, out: &mut Vec<u8>) {
    out.clear();
    match v {
        Value::Null => out.push(b'n'),
        Value::Bool(true) => out.push(b't'),
        Value::Bool(false) => out.push(b'f'),
        Value::Int(i) => {
            out.push(b'#');
            let _ = write!(out, "{i}");
        }
        Value::UInt(u) => {
            out.push(b'#');
            let _ = write!(out, "{u}");
        }
        Value::Float(f) => {
            out.push(b'.');
            let _ = write!(out, "{f}");
        }
        Value::Str(s) if null_string == Some(&**s) => out.push(b'n'),
        Value::Str(s) => {
            out.push(b's');
            out.extend_from_slice(s.as_bytes());
        }
        Value::Compound(j) => {
            out.push(b'j');
            canonical_json(j, out);
        }
    }
}

fn canonical_json(v: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value as J;
    match v {
        J::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        J::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = serde_json::to_writer(&mut *out, k);
                out.push(b':');
                canonical_json(item, out);
            }
            out.push(b'}');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

/// Inverse of [`encode_value`], for reports.
pub(crate) fn decode_value(key: &[u8]) -> serde_json::Value {
    use serde_json::Value as J;
    let (tag, body) = match key.split_first() {
        Some((t, b)) => (*t, b),
        None => return J::Null,
    };
    let text = || String::from_utf8_lossy(body);
    match tag {
        b't' => J::Bool(true),
        b'f' => J::Bool(false),
        b'#' => {
            let t = text();
            t.parse::<u64>().map(J::from).or_else(|_| t.parse::<i64>().map(J::from)).unwrap_or(J::Null)
        }
        b'.' => text().parse::<f64>().ok().and_then(serde_json::Number::from_f64).map_or(J::Null, J::Number),
        b's' => J::String(text().into_owned()),
        b'j' => serde_json::from_slice(body).unwrap_or(J::Null),
        _ => J::Null,
    }
}
