//! A generator of realistic random traces, for benchmarks and demos.
//!
//! It simulates agents running read–generate–write operations against a shared store with a
//! versioned tool registry, on the paper's clock (advanced by each commit). Up to
//! `concurrency` operations are in flight at once, so stale generations (A1) arise naturally
//! when another agent commits to a cell between an operation's read and its commit. The other
//! anomalies are injected at low rates: reads served by lagging replicas (A4), registry
//! changes under an operation (A2), effects committed out of issuance order (A6), and
//! committed operations retracted after others read their writes without the dependents being
//! aborted too (A3). Output is deterministic in `(n, seed, options)`.

use std::collections::VecDeque;
use std::fmt::Write as _;

/// Options of [`generate_trace_with`].
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Number of agents (default 8).
    pub agents: u32,
    /// Number of cells; `None` (default) picks `max(64, n / 50)`.
    pub cells: Option<u32>,
    /// Operations in flight at once (default 4).
    pub concurrency: u32,
    /// Emit `predecessors` (default `true`); without them A3 is checked in residue form.
    pub predecessors: bool,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions { agents: 8, cells: None, concurrency: 4, predecessors: true }
    }
}

/// `n` JSON lines of a random trace with some anomalies (see the module docs).
pub fn generate_trace(n: usize, seed: u64) -> impl Iterator<Item = String> {
    generate_trace_with(n, seed, GenOptions::default())
}

/// `n` JSON lines of a random trace, with explicit options.
pub fn generate_trace_with(n: usize, seed: u64, opts: GenOptions) -> impl Iterator<Item = String> {
    let cells = opts.cells.unwrap_or_else(|| (n / 50).max(64) as u32).max(1);
    Generator {
        rng: Rng(seed ^ 0x9e37_79b9_7f4a_7c15),
        opts,
        cells,
        n,
        made: 0,
        clock: 0,
        next_tx: 0,
        next_value: 0,
        history: vec![Vec::new(); cells as usize],
        tools: (0..8).map(|i| Tool { name: TOOL_NAMES[i], version: 1, present: true }).collect(),
        in_flight: Vec::new(),
        settling: VecDeque::new(),
        ready: VecDeque::new(),
    }
}

/// SplitMix64: tiny, fast, good enough for simulation, and dependency-free.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64 }
    }
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

const TOOL_NAMES: [&str; 8] = ["search", "book", "cancel", "mail", "pay", "refund", "quote", "notify"];

#[derive(Debug, Clone)]
struct Tool {
    name: &'static str,
    version: u32,
    present: bool,
}

#[derive(Debug, Clone, Copy)]
struct Version {
    value: u64,
    writer: u64,
}

#[derive(Debug, Clone)]
struct Op {
    tx: u64,
    agent: u64,
    read_time: u64,
    /// (cell, value, replica): value `None` is `null`; replica 0 is the primary.
    reads: Vec<(u32, Option<String>, u8)>,
    preds: Vec<u64>,
    registry_at_read: String,
    planned: Option<String>,
}

#[derive(Debug, Clone)]
struct Done {
    op: Op,
    writes: Vec<(u32, u64)>,
    write_time: u64,
    registry_at_commit: String,
    reorder: bool,
    aborted: bool,
}

#[derive(Debug)]
struct Generator {
    rng: Rng,
    opts: GenOptions,
    cells: u32,
    n: usize,
    made: usize,
    clock: u64,
    next_tx: u64,
    next_value: u64,
    history: Vec<Vec<Version>>,
    tools: Vec<Tool>,
    in_flight: Vec<Op>,
    settling: VecDeque<Done>,
    ready: VecDeque<String>,
}

impl Iterator for Generator {
    type Item = String;
    fn next(&mut self) -> Option<String> {
        while self.ready.is_empty() {
            if self.made < self.n {
                self.step();
            } else if let Some(done) = self.settling.pop_front() {
                let line = self.render(&done);
                self.ready.push_back(line);
            } else {
                return None;
            }
        }
        self.ready.pop_front()
    }
}

impl Generator {
    fn step(&mut self) {
        let room = self.in_flight.len() < self.opts.concurrency.max(1) as usize;
        if room && (self.in_flight.is_empty() || self.rng.chance(0.5)) {
            self.begin();
        } else {
            let i = self.rng.below(self.in_flight.len() as u64) as usize;
            let op = self.in_flight.swap_remove(i);
            self.commit(op);
        }
        if self.rng.chance(0.002) {
            let t = self.rng.below(self.tools.len() as u64) as usize;
            if self.rng.chance(0.5) { self.tools[t].present = false } else { self.tools[t].version += 1 }
        }
        if self.rng.chance(0.02) {
            let t = self.rng.below(self.tools.len() as u64) as usize;
            self.tools[t].present = true;
        }
    }

    fn cell(&mut self) -> u32 {
        let u = self.rng.unit();
        ((u * u * f64::from(self.cells)) as u32).min(self.cells - 1)
    }

    fn registry(&self) -> String {
        let mut s = String::from("[");
        for t in self.tools.iter().filter(|t| t.present) {
            if s.len() > 1 {
                s.push(',');
            }
            let _ = write!(s, "\"{}@{}\"", t.name, t.version);
        }
        s.push(']');
        s
    }

    fn begin(&mut self) {
        let tx = self.next_tx;
        self.next_tx += 1;
        let agent = self.rng.below(u64::from(self.opts.agents.max(1)));
        let mut reads = Vec::new();
        let mut preds = Vec::new();
        for _ in 0..1 + self.rng.below(3) {
            let cell = self.cell();
            let versions = &self.history[cell as usize];
            let lagging = versions.len() >= 2 && self.rng.chance(0.05);
            let version = if lagging { versions.get(versions.len() - 2) } else { versions.last() };
            let mut value = version.map(|v| format!("v{}", v.value));
            if let Some(v) = version {
                preds.push(v.writer);
            }
            if self.rng.chance(0.0005) {
                value = Some(format!("x{}", self.rng.below(1 << 30)));
            }
            reads.push((cell, value, if lagging { 1 + self.rng.below(2) as u8 } else { 0 }));
        }
        preds.sort_unstable();
        preds.dedup();
        let present: Vec<&Tool> = self.tools.iter().filter(|t| t.present).collect();
        let planned = if !present.is_empty() && self.rng.chance(0.8) {
            let t = present[self.rng.below(present.len() as u64) as usize];
            Some(format!("{}@{}", t.name, t.version))
        } else {
            None
        };
        let registry_at_read = self.registry();
        self.in_flight.push(Op { tx, agent, read_time: self.clock, reads, preds, registry_at_read, planned });
    }

    fn commit(&mut self, op: Op) {
        self.clock += 1;
        self.made += 1;
        let aborted = self.rng.chance(0.01);
        let mut writes: Vec<(u32, u64)> = Vec::new();
        for k in 0..self.rng.below(3) {
            let cell = match op.reads.get(k as usize) {
                Some(r) if self.rng.chance(0.7) => r.0,
                _ => self.cell(),
            };
            if writes.iter().any(|w| w.0 == cell) {
                continue;
            }
            self.next_value += 1;
            writes.push((cell, self.next_value));
        }
        if !aborted {
            for &(cell, value) in &writes {
                let h = &mut self.history[cell as usize];
                if h.len() == 3 {
                    h.remove(0);
                }
                h.push(Version { value, writer: op.tx });
            }
        }
        let reorder = writes.len() >= 2 && self.rng.chance(0.02);
        let registry_at_commit = self.registry();
        let done = Done { op, writes, write_time: self.clock, registry_at_commit, reorder, aborted };
        self.settling.push_back(done);
        if self.rng.chance(0.002) {
            self.retract();
        }
        while self.settling.len() > 32 {
            if let Some(d) = self.settling.pop_front() {
                let line = self.render(&d);
                self.ready.push_back(line);
            }
        }
    }

    /// Retracts a settling operation after it committed; its dependents still settling are
    /// cascaded (aborted) half of the time, which is what L2 would do every time.
    fn retract(&mut self) {
        let i = self.rng.below(self.settling.len() as u64) as usize;
        let tx = self.settling[i].op.tx;
        self.settling[i].aborted = true;
        if self.rng.chance(0.5) {
            for d in self.settling.iter_mut() {
                if d.op.preds.contains(&tx) {
                    d.aborted = true;
                }
            }
        }
    }

    fn render(&self, d: &Done) -> String {
        let op = &d.op;
        let mut s = String::with_capacity(512);
        let _ = write!(
            s,
            "{{\"schema_version\":\"1.0\",\"tx\":\"t{}\",\"agent\":\"agent-{}\",\"read_time\":{},\"reads\":[",
            op.tx, op.agent, op.read_time
        );
        for (i, (cell, value, replica)) in op.reads.iter().enumerate() {
            let sep = if i > 0 { "," } else { "" };
            let value = value.as_ref().map_or_else(|| "null".to_owned(), |v| format!("\"{v}\""));
            let replica = if *replica == 0 { "primary".to_owned() } else { format!("r{replica}") };
            let _ = write!(s, "{sep}{{\"cell\":\"order:{cell}\",\"value\":{value},\"replica\":\"{replica}\"}}");
        }
        let _ = write!(s, "],\"registry_at_read\":{},\"planned_tools\":[", op.registry_at_read);
        if let Some(p) = &op.planned {
            let _ = write!(s, "\"{p}\"");
        }
        let effects = |order: &mut dyn Iterator<Item = &(u32, u64)>| {
            let items: Vec<String> = order.map(|(c, v)| format!("[\"order:{c}\",\"v{v}\"]")).collect();
            format!("[{}]", items.join(","))
        };
        let io = effects(&mut d.writes.iter());
        let co = if d.reorder { effects(&mut d.writes.iter().rev()) } else { io.clone() };
        let _ = write!(
            s,
            "],\"writes\":{io},\"write_time\":{},\"registry_at_commit\":{},\"io\":{io},\"co\":{co},\"aborted\":{}",
            d.write_time, d.registry_at_commit, d.aborted
        );
        if self.opts.predecessors {
            let preds: Vec<String> = op.preds.iter().map(|p| format!("\"t{p}\"")).collect();
            let _ = write!(s, ",\"predecessors\":[{}]", preds.join(","));
        }
        s.push('}');
        s
    }
}
