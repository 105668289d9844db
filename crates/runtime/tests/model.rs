//! A reference model of settlement, and seeded random schedules of concurrent agents checked
//! against it.
//!
//! Each schedule builds a fresh engine on a current-thread tokio runtime with paused time and
//! spawns 3-5 agents. They begin transactions (declared, undeclared, speculation groups) over
//! a small pool of overlapping `retail:`, `mail:` scopes, read, call tools of every effect
//! class with injected call, release and compensation failures (transient, refused, unknown
//! before the effect, a plain error or a panic after it; some tools have a probe), think
//! (virtual time, past their leases sometimes), seal, commit (some with a wait timeout or a
//! pre-commit hook), abort, drop their commit or abort future at a random point, break the
//! protocol, or abandon the transaction. Afterwards the schedule is checked
//! against [`reference`], an obviously-correct serial implementation of the rules, using the
//! engine's ledger (what it decided), the agents' records (what they were told) and the
//! outside world's log (every call, release and compensation the tools saw):
//!
//! * every read version, every commit decision (reads current; in epoch order, no earlier
//!   unfinished transaction that may touch the footprint) and every stale-read abort;
//! * the committed transactions replayed serially in commit order, and their conflict graph
//!   (no cycle);
//! * every effect's settlement against the world: held effects externalise only on commit,
//!   once, in issuance order; executed effects of aborted transactions are compensated (in
//!   reverse order) or tagged non-clean; failures happen exactly where they were injected;
//! * speculation groups (at most one branch, the chosen one, commits), idempotency keys (never
//!   executed twice, never replaying an undone effect), the legitimacy of every abort reason,
//!   and the engine's final state (`check_integrity`, nothing unfinished).
//!
//! `TIDEGATE_SCHEDULES` (default 10 000) sets how many schedules run, `TIDEGATE_SEED` the first
//! seed. A failure names the seed and how to replay it:
//!
//! ```text
//! TIDEGATE_SEED=<seed> TIDEGATE_SCHEDULES=1 cargo test -p tidegate-runtime --test model -- --nocapture
//! TIDEGATE_SCHEDULES=1000000 cargo test --release -p tidegate-runtime --test model   # soak
//! ```

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tidegate_core::{Event, Timestamp};
use tidegate_runtime::{
    AbortReason, Ack, CommitOptions, Compensation, Disposition, EffectClass, EngineError, Error, FnHook, Ordering,
    Outcome, Probe, RetryPolicy, Tag, Tidegate, Tool, ToolError, TxId, TxOptions, TxState, Verdict,
};
use tidegate_storage::MemoryStore;
use tokio::time::Instant;

/// Marks the failures and panics the schedules inject (the panic hook keeps them quiet).
const INJECTED: &str = "model: injected failure";

/// The seed of the first schedule unless `TIDEGATE_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x7469_6465_6761_7465;
/// Schedules in a default run unless `TIDEGATE_SCHEDULES` says otherwise.
const DEFAULT_SCHEDULES: u64 = 10_000;
/// Attempts of the retry policy every schedule's engine uses (calls, releases, compensations).
const ATTEMPTS: u32 = 3;
/// Virtual time after which a schedule whose agents have not finished is a liveness failure.
const LIVENESS_LIMIT: Duration = Duration::from_secs(3600);

// ---------------------------------------------------------------------------------------------
// The reference model.
// ---------------------------------------------------------------------------------------------

/// The rules, written as plainly as possible and independently of the engine's code: scope
/// overlap, per-scope versions, serial replay in commit order, the conflict graph, and what an
/// injected failure must do to a call, a release or a compensation.
mod reference {
    use super::ATTEMPTS;

    /// `type` and path segments of a colon-style canonical scope.
    fn split(scope: &str) -> (&str, Vec<&str>) {
        let mut parts = scope.split(':');
        let kind = parts.next().unwrap_or_default();
        (kind, parts.collect())
    }

    /// Two scopes overlap iff they have the same type and, segment by segment over the shorter
    /// path, every pair is equal or one of them is `*`.
    pub fn overlaps(a: &str, b: &str) -> bool {
        let ((ka, sa), (kb, sb)) = (split(a), split(b));
        ka == kb && sa.iter().zip(&sb).all(|(x, y)| x == y || *x == "*" || *y == "*")
    }

    /// `outer` covers `inner` iff it is a segment prefix of it, `*` in `outer` matching any one
    /// segment (a `*` in `inner` only by a `*`).
    pub fn covers(outer: &str, inner: &str) -> bool {
        let ((ko, so), (ki, si)) = (split(outer), split(inner));
        ko == ki && so.len() <= si.len() && so.iter().zip(&si).all(|(o, i)| *o == "*" || o == i)
    }

    /// Committed writes; a scope's version is the largest commit stamp of a write overlapping
    /// it (0 if none).
    #[derive(Debug, Default, Clone)]
    pub struct Versions {
        writes: Vec<(String, u64)>,
    }

    impl Versions {
        pub fn version(&self, scope: &str) -> u64 {
            self.writes.iter().filter(|(w, _)| overlaps(w, scope)).map(|(_, s)| *s).max().unwrap_or(0)
        }

        pub fn write(&mut self, scope: &str, stamp: u64) {
            self.writes.push((scope.to_owned(), stamp));
        }
    }

    /// A transaction that reached a commit decision.
    #[derive(Debug, Clone)]
    pub struct Decided {
        pub label: String,
        pub stamp: u64,
        pub reads: Vec<(String, u64)>,
        pub writes: Vec<String>,
        /// Its commit was decided but it ended aborted (its first release failed). Its write
        /// stamp stays in the versions (the engine records writes at the decision), but it is
        /// not a committed transaction.
        pub phantom: bool,
    }

    /// Replays the decided transactions one at a time in commit order: every committed one
    /// must have read exactly the versions the serial execution gives at its turn.
    pub fn serial_replay(decided: &[Decided]) -> Result<(), String> {
        let mut order: Vec<&Decided> = decided.iter().collect();
        order.sort_by_key(|t| t.stamp);
        let mut versions = Versions::default();
        for t in order {
            if !t.phantom {
                for (scope, seen) in &t.reads {
                    let serial = versions.version(scope);
                    if *seen != serial {
                        return Err(format!(
                            "serial replay in commit order: {} (stamp {}) read `{scope}` at v{seen}, but executed \
                             serially it would read v{serial}",
                            t.label, t.stamp
                        ));
                    }
                }
            }
            for w in &t.writes {
                versions.write(w, t.stamp);
            }
        }
        Ok(())
    }

    /// The conflict (precedence) graph of the committed transactions, with edges ww (by commit
    /// stamp), wr (the read saw the write) and rw (the read missed a later write); returns a
    /// cycle if there is one.
    pub fn conflict_cycle(decided: &[Decided]) -> Option<Vec<String>> {
        let txs: Vec<&Decided> = decided.iter().filter(|t| !t.phantom).collect();
        let n = txs.len();
        let mut adj = vec![Vec::new(); n];
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let (ta, tb) = (txs[a], txs[b]);
                let ww = ta.stamp < tb.stamp && ta.writes.iter().any(|x| tb.writes.iter().any(|y| overlaps(x, y)));
                let wr = tb.reads.iter().any(|(s, v)| ta.stamp <= *v && ta.writes.iter().any(|w| overlaps(w, s)));
                let rw = ta.reads.iter().any(|(s, v)| tb.stamp > *v && tb.writes.iter().any(|w| overlaps(w, s)));
                if ww || wr || rw {
                    adj[a].push(b);
                }
            }
        }
        // Iterative DFS with colours; a grey successor closes a cycle.
        let mut colour = vec![0u8; n];
        for start in 0..n {
            if colour[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            colour[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(&succ) = adj[node].get(*next) {
                    *next += 1;
                    match colour[succ] {
                        0 => {
                            colour[succ] = 1;
                            stack.push((succ, 0));
                        }
                        1 => {
                            let from = stack.iter().position(|&(x, _)| x == succ).unwrap_or(0);
                            return Some(stack[from..].iter().map(|&(x, _)| txs[x].label.clone()).collect());
                        }
                        _ => {}
                    }
                } else {
                    colour[node] = 2;
                    stack.pop();
                }
            }
        }
        None
    }

    /// How an injected failure behaves.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FailKind {
        /// Known not to have happened; the runtime retries it.
        Transient,
        /// Known not to have happened; not worth retrying.
        Hard,
        /// May have happened (a timeout); never retried without a probe.
        Unknown,
        /// Happened, then the handler returned a plain error (a lost reply): an unknown
        /// outcome.
        After,
        /// Happened, then the handler panicked: an unknown outcome. (A compensation planned to
        /// fail panics instead of refusing.)
        Panic,
    }

    impl FailKind {
        pub fn as_str(self) -> &'static str {
            match self {
                FailKind::Transient => "transient",
                FailKind::Hard => "hard",
                FailKind::Unknown => "unknown",
                FailKind::After => "after",
                FailKind::Panic => "panic",
            }
        }

        /// Whether a failed attempt of this kind took effect.
        pub fn acts(self) -> bool {
            matches!(self, FailKind::After | FailKind::Panic)
        }

        pub fn parse(s: &str) -> FailKind {
            match s {
                "hard" => FailKind::Hard,
                "unknown" => FailKind::Unknown,
                "after" => FailKind::After,
                "panic" => FailKind::Panic,
                _ => FailKind::Transient,
            }
        }
    }

    /// An eager call whose first `fails` attempts fail succeeds iff the policy gets past
    /// them: a transient failure is retried, up to `ATTEMPTS` in all; a hard one is final; an
    /// unknown outcome is never retried blind: the tool's probe (if `probe`) says whether it
    /// happened: if it did (the failure came after the effect) the call succeeded, if it did
    /// not the call is retried in place like a transient one.
    pub fn call_succeeds(fails: u32, kind: FailKind, probe: bool) -> bool {
        match kind {
            FailKind::Transient => fails < ATTEMPTS,
            FailKind::Hard => fails == 0,
            FailKind::Unknown if probe => fails < ATTEMPTS,
            FailKind::After | FailKind::Panic if probe => true,
            FailKind::Unknown | FailKind::After | FailKind::Panic => fails == 0,
        }
    }

    /// Whether a call that failed is reported with an unknown outcome: every failure but an
    /// explicit "did not happen" (transient, hard, or a probe's answer) is.
    pub fn failure_unknown(kind: FailKind, probe: bool) -> bool {
        match kind {
            FailKind::Transient | FailKind::Hard => false,
            FailKind::Unknown => !probe,
            FailKind::After | FailKind::Panic => true,
        }
    }

    /// A release follows the same policy as an eager call (one rule for every path).
    pub fn release_succeeds(fails: u32, kind: FailKind, probe: bool) -> bool {
        call_succeeds(fails, kind, probe)
    }

    /// A compensation is retried on every failure.
    pub fn compensation_succeeds(fails: u32) -> bool {
        fails < ATTEMPTS
    }
}

use reference::FailKind;

// ---------------------------------------------------------------------------------------------
// The outside world: tools that record what reached it, with failure injection.
// ---------------------------------------------------------------------------------------------

/// What reached the outside world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HitKind {
    /// An eager call executed.
    Exec,
    /// A staged (bufferable) effect was applied at commit.
    Apply,
    /// A queued (gated) effect fired at commit.
    Fire,
    /// An executed effect was compensated.
    Compensate,
}

/// One externalised call. Only successful calls are logged: a failed attempt left nothing.
#[derive(Debug, Clone)]
struct Hit {
    kind: HitKind,
    tool: &'static str,
    uid: u64,
    key: Option<String>,
    scopes: Vec<String>,
}

#[derive(Debug, Default)]
struct WorldState {
    log: Vec<Hit>,
    call_attempts: HashMap<u64, u32>,
    comp_attempts: HashMap<u64, u32>,
}

/// The ground truth of what left: every tool handler writes here.
#[derive(Debug, Clone, Default)]
struct World(Arc<Mutex<WorldState>>);

struct ToolSpec {
    name: &'static str,
    class: EffectClass,
    compensable: bool,
    residue: bool,
    keyed: bool,
    /// The tool can be asked whether a call took effect.
    probe: bool,
}

/// The tools of every schedule: each effect class, with and without compensation handlers,
/// residue and an adapter-supplied idempotency key.
const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "modify",
        class: EffectClass::Reversible,
        compensable: true,
        residue: false,
        keyed: false,
        probe: true,
    },
    ToolSpec {
        name: "refund",
        class: EffectClass::ReversibleWithCost,
        compensable: true,
        residue: true,
        keyed: false,
        probe: false,
    },
    ToolSpec {
        name: "note",
        class: EffectClass::Bufferable,
        compensable: false,
        residue: false,
        keyed: false,
        probe: false,
    },
    ToolSpec {
        name: "email",
        class: EffectClass::Gated,
        compensable: false,
        residue: false,
        keyed: false,
        probe: true,
    },
    ToolSpec {
        name: "charge",
        class: EffectClass::Idempotent,
        compensable: true,
        residue: false,
        keyed: true,
        probe: false,
    },
    ToolSpec {
        name: "ping",
        class: EffectClass::Idempotent,
        compensable: false,
        residue: false,
        keyed: false,
        probe: true,
    },
    // A reversible "set" of the cells named by its scopes to its call id; its compensation
    // restores the values before it (`check_cells` replays the world's log with exactly these
    // semantics). Issue 10 item 1: sets of concurrent transactions lost updates.
    ToolSpec {
        name: "set",
        class: EffectClass::Reversible,
        compensable: true,
        residue: false,
        keyed: false,
        probe: false,
    },
];

fn tool_spec(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

/// The failure plan of one call, carried in its arguments so that the world and the checker
/// both read it from there.
#[derive(Debug, Clone)]
struct CallPlan {
    uid: u64,
    tool: usize,
    scopes: Vec<&'static str>,
    key: Option<&'static str>,
    /// The first `fails` attempts of the call (or release) fail ...
    fails: u32,
    /// ... this way.
    kind: FailKind,
    /// The first `comp_fails` compensation attempts fail.
    comp_fails: u32,
    /// Virtual time every invocation takes.
    delay_ms: u64,
}

impl CallPlan {
    /// Names the call by its uid, so that a retry of it (same uid, same arguments) replays
    /// while two distinct calls with equal arguments would both run.
    fn opts(&self) -> tidegate_runtime::CallOptions {
        tidegate_runtime::CallOptions::call_id(self.uid.to_string())
    }

    fn args(&self) -> Value {
        json!({
            "u": self.uid,
            "s": self.scopes,
            "k": self.key,
            "f": self.fails,
            "fk": self.kind.as_str(),
            "cf": self.comp_fails,
            "d": self.delay_ms,
        })
    }
}

/// The parts of a call's arguments the world and the checker need.
#[derive(Debug, Clone)]
struct ArgsView {
    uid: u64,
    scopes: Vec<String>,
    key: Option<String>,
    fails: u32,
    kind: FailKind,
    comp_fails: u32,
    delay_ms: u64,
}

impl ArgsView {
    fn of(a: &Value) -> ArgsView {
        let num = |k: &str| a[k].as_u64().unwrap_or(0);
        ArgsView {
            uid: num("u"),
            scopes: scopes_of(a),
            key: a["k"].as_str().map(str::to_owned),
            fails: u32::try_from(num("f")).unwrap_or(u32::MAX),
            kind: FailKind::parse(a["fk"].as_str().unwrap_or_default()),
            comp_fails: u32::try_from(num("cf")).unwrap_or(u32::MAX),
            delay_ms: num("d"),
        }
    }
}

fn scopes_of(a: &Value) -> Vec<String> {
    a["s"].as_array().map(|v| v.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

impl World {
    fn log(&self) -> Vec<Hit> {
        self.0.lock().log.clone()
    }

    async fn call(self, spec: &'static ToolSpec, kind: HitKind, args: Arc<Value>) -> Result<Value, ToolError> {
        let a = ArgsView::of(&args);
        if a.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(a.delay_ms)).await;
        }
        let mut w = self.0.lock();
        let attempt = w.call_attempts.entry(a.uid).or_insert(0);
        *attempt += 1;
        let attempt = *attempt;
        let failing = attempt <= a.fails;
        if failing && !a.kind.acts() {
            let msg = format!("{} #{} attempt {attempt} refused", spec.name, a.uid);
            return Err(match a.kind {
                FailKind::Transient => ToolError::transient(msg),
                FailKind::Hard => ToolError::failed(msg),
                _ => ToolError::unknown(msg),
            });
        }
        w.log.push(Hit { kind, tool: spec.name, uid: a.uid, key: a.key.clone(), scopes: a.scopes.clone() });
        if failing {
            let msg = format!("{INJECTED}: {} #{} attempt {attempt} after acting", spec.name, a.uid);
            drop(w);
            if a.kind == FailKind::Panic {
                panic!("{msg}");
            }
            return Err(msg.into());
        }
        Ok(World::output(spec, &a))
    }

    fn output(spec: &ToolSpec, a: &ArgsView) -> Value {
        json!({"tool": spec.name, "u": a.uid, "k": a.key})
    }

    /// The provider's answer to "did call `uid` take effect?".
    fn probe(&self, spec: &'static ToolSpec, kind: HitKind, args: &Value) -> Probe {
        let a = ArgsView::of(args);
        if self.0.lock().log.iter().any(|h| h.uid == a.uid && h.kind == kind) {
            Probe::Happened(World::output(spec, &a))
        } else {
            Probe::DidNotHappen
        }
    }

    async fn compensate(self, spec: &'static ToolSpec, args: Arc<Value>) -> Result<Compensation, ToolError> {
        let a = ArgsView::of(&args);
        if a.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(a.delay_ms)).await;
        }
        let mut w = self.0.lock();
        let attempt = w.comp_attempts.entry(a.uid).or_insert(0);
        *attempt += 1;
        if *attempt <= a.comp_fails {
            let msg = format!("undo of {} #{} refused", spec.name, a.uid);
            drop(w);
            if a.kind == FailKind::Panic {
                panic!("{INJECTED}: {msg}");
            }
            return Err(ToolError::failed(msg));
        }
        w.log.push(Hit {
            kind: HitKind::Compensate,
            tool: spec.name,
            uid: a.uid,
            key: a.key.clone(),
            scopes: a.scopes,
        });
        Ok(if spec.residue { Compensation::with_residue("cancellation fee") } else { Compensation::clean() })
    }

    fn tools(&self) -> Result<Vec<Tool>, String> {
        TOOLS.iter().map(|spec| self.tool(spec)).collect()
    }

    fn tool(&self, spec: &'static ToolSpec) -> Result<Tool, String> {
        let kind = match spec.class {
            EffectClass::Bufferable => HitKind::Apply,
            EffectClass::Gated => HitKind::Fire,
            _ => HitKind::Exec,
        };
        let w = self.clone();
        let mut b = Tool::builder(spec.name, spec.class)
            .scope(|a: &Value| scopes_of(a))
            .call(move |a: Arc<Value>| w.clone().call(spec, kind, a));
        if spec.keyed {
            b = b.key(|a: &Value| a["k"].as_str().unwrap_or_default().to_owned());
        }
        if spec.compensable {
            let w = self.clone();
            b = b.compensate(move |a: Arc<Value>, _out: Arc<Value>| w.clone().compensate(spec, a));
        }
        if spec.probe {
            let w = self.clone();
            b = b.probe(move |a: Arc<Value>| {
                let answer = w.probe(spec, kind, &a);
                async move { answer }
            });
        }
        b.build().map_err(|e| e.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// Schedules: what every agent will do, drawn from the seed before anything runs.
// ---------------------------------------------------------------------------------------------

/// Scopes reads and effects use. They overlap as prefixes (`retail:order` covers everything
/// under it), as extensions (`...:W1:lines`) and through the wildcard.
const POOL: &[&str] = &[
    "retail:order:W1",
    "retail:order:W1:lines",
    "retail:order:W2",
    "retail:order:W2:lines",
    "retail:order",
    "retail:payment:P1",
    "mail:ops@example.com",
    "retail:order:*:lines",
];

/// Scopes may-touch declarations draw from.
const DECLS: &[&str] = &[
    "retail:order:W1",
    "retail:order:W2",
    "retail:order:W1:lines",
    "retail:order",
    "retail:order:*",
    "retail:order:*:lines",
    "retail:payment:P1",
    "mail:ops@example.com",
];

const KEYS: &[&str] = &["pay-1", "pay-2", "pay-3"];

#[derive(Debug, Clone)]
enum Op {
    Read(&'static str),
    Call(CallPlan),
    /// Two calls in flight at once.
    Concurrent(CallPlan, CallPlan),
    /// Repeats the transaction's previous call with identical arguments (a retry).
    Repeat,
    Think(u64),
    Yield(u32),
    /// Reads a scope outside the declared may-touch set: a protocol violation.
    ReadOutside(&'static str),
}

#[derive(Debug, Clone)]
struct HookPlan {
    delay_ms: u64,
    veto: bool,
}

#[derive(Debug, Clone)]
enum End {
    Commit {
        think_after_seal: u64,
        wait_timeout_ms: Option<u64>,
        hook: Option<HookPlan>,
        /// Calls a tool after sealing: a protocol violation.
        effect_after_seal: Option<CallPlan>,
        /// The agent stops waiting for the commit after this long (a timeout around
        /// `commit()`): the future is dropped and the transaction must settle on its own.
        drop_after_ms: Option<u64>,
    },
    Abort {
        /// As for `Commit`: the `abort()` future is dropped after this long.
        drop_after_ms: Option<u64>,
    },
    /// The agent walks away (crashes): only the lease ends the transaction.
    Abandon,
}

#[derive(Debug, Clone)]
enum GroupEnd {
    Choose { winner: usize, wait_timeout_ms: Option<u64> },
    AbortGroup,
    Abandon,
}

#[derive(Debug, Clone)]
enum TxPlan {
    Single { decl: Option<Vec<&'static str>>, lease: Option<Duration>, ops: Vec<Op>, end: End },
    Group { decl: Option<Vec<&'static str>>, branches: Vec<Vec<Op>>, seal_branches: bool, end: GroupEnd },
}

#[derive(Debug, Clone)]
struct AgentPlan {
    start_delay_ms: u64,
    txs: Vec<(u64, TxPlan)>,
}

#[derive(Debug, Clone)]
struct SchedulePlan {
    ordering: Ordering,
    lease: Duration,
    reaper: bool,
    agents: Vec<AgentPlan>,
}

struct Gen<'a> {
    rng: &'a mut SmallRng,
    next_uid: u64,
    lease: Duration,
}

impl Gen<'_> {
    fn schedule(rng: &mut SmallRng) -> SchedulePlan {
        let ordering = if rng.gen_bool(0.25) { Ordering::FirstCommitterWins } else { Ordering::EpochOrder };
        let lease = match rng.gen_range(0..10) {
            0..=3 => Duration::from_secs(30),
            4..=7 => Duration::from_millis(250),
            _ => Duration::from_secs(1),
        };
        let reaper = rng.gen_bool(0.5);
        let mut g = Gen { rng, next_uid: 1, lease };
        let n = g.rng.gen_range(3..=5);
        let agents = (0..n).map(|_| g.agent()).collect();
        SchedulePlan { ordering, lease, reaper, agents }
    }

    fn agent(&mut self) -> AgentPlan {
        let start_delay_ms = if self.rng.gen_bool(0.5) { 0 } else { self.rng.gen_range(0..4) };
        let n = self.rng.gen_range(1..=4);
        let txs = (0..n)
            .map(|_| {
                let gap = if self.rng.gen_bool(0.6) { 0 } else { self.rng.gen_range(1..10) };
                let plan = if self.rng.gen_bool(0.15) { self.group() } else { self.single() };
                (gap, plan)
            })
            .collect();
        AgentPlan { start_delay_ms, txs }
    }

    fn decl(&mut self) -> Option<Vec<&'static str>> {
        if self.rng.gen_bool(0.2) {
            return None;
        }
        let n = self.rng.gen_range(1..=2);
        let mut d: Vec<&'static str> = Vec::new();
        for _ in 0..n {
            let s = DECLS[self.rng.gen_range(0..DECLS.len())];
            if !d.contains(&s) {
                d.push(s);
            }
        }
        Some(d)
    }

    fn inside(&mut self, decl: Option<&[&'static str]>) -> &'static str {
        let candidates: Vec<&'static str> = POOL
            .iter()
            .copied()
            .filter(|s| decl.is_none_or(|d| d.iter().any(|m| reference::covers(m, s))))
            // The wildcard scope is a rare bulk operation.
            .filter(|s| !s.contains('*') || self.rng.gen_bool(0.3))
            .collect();
        if candidates.is_empty() {
            // Every declaration covers at least one non-wildcard scope of the pool, but be safe.
            return decl.and_then(|d| d.first().copied()).unwrap_or(POOL[0]);
        }
        candidates[self.rng.gen_range(0..candidates.len())]
    }

    fn outside(&mut self, decl: &[&'static str]) -> Option<&'static str> {
        let candidates: Vec<&'static str> =
            POOL.iter().copied().filter(|s| !decl.iter().any(|m| reference::covers(m, s))).collect();
        (!candidates.is_empty()).then(|| candidates[self.rng.gen_range(0..candidates.len())])
    }

    fn call(&mut self, decl: Option<&[&'static str]>) -> CallPlan {
        let tool = self.rng.gen_range(0..TOOLS.len());
        let mut scopes = vec![self.inside(decl)];
        if self.rng.gen_bool(0.15) {
            let s = self.inside(decl);
            if !scopes.contains(&s) {
                scopes.push(s);
            }
        }
        let key = TOOLS[tool].keyed.then(|| KEYS[self.rng.gen_range(0..KEYS.len())]);
        let (fails, kind) = if self.rng.gen_bool(0.85) {
            (0, FailKind::Transient)
        } else {
            let fails = [1, 2, 5][self.rng.gen_range(0..3)];
            let kind = match self.rng.gen_range(0..26) {
                0..=11 => FailKind::Transient,
                12..=16 => FailKind::Hard,
                17..=19 => FailKind::Unknown,
                20..=23 => FailKind::After,
                _ => FailKind::Panic,
            };
            (fails, kind)
        };
        let comp_fails = if self.rng.gen_bool(0.85) { 0 } else { [1, 5][self.rng.gen_range(0..2)] };
        let delay_ms = if self.rng.gen_bool(0.7) { 0 } else { self.rng.gen_range(1..=30) };
        let uid = self.next_uid;
        self.next_uid += 1;
        CallPlan { uid, tool, scopes, key, fails, kind, comp_fails, delay_ms }
    }

    fn think(&mut self) -> u64 {
        if self.rng.gen_bool(0.85) { self.rng.gen_range(1..=20) } else { self.rng.gen_range(100..=500) }
    }

    fn ops(&mut self, decl: Option<&[&'static str]>, n: usize) -> Vec<Op> {
        let mut ops = Vec::with_capacity(n);
        let mut has_call = false;
        for _ in 0..n {
            let op = match self.rng.gen_range(0..100) {
                0..=29 => Op::Read(self.inside(decl)),
                30..=74 => Op::Call(self.call(decl)),
                75..=79 if has_call => Op::Repeat,
                75..=79 => Op::Concurrent(self.call(decl), self.call(decl)),
                80..=89 => Op::Think(self.think()),
                90..=97 => Op::Yield(self.rng.gen_range(1..=3)),
                98..=99 => match decl.and_then(|d| self.outside(d)) {
                    Some(s) => Op::ReadOutside(s),
                    None => Op::Yield(1),
                },
                _ => Op::Read(self.inside(decl)),
            };
            has_call |= matches!(op, Op::Call(_));
            ops.push(op);
        }
        ops
    }

    /// Sometimes the agent drops its commit or abort future at a random point.
    fn drop_after(&mut self) -> Option<u64> {
        self.rng.gen_bool(0.1).then(|| self.rng.gen_range(0..=40))
    }

    fn wait_timeout(&mut self) -> Option<u64> {
        self.rng.gen_bool(0.15).then(|| self.rng.gen_range(5..=100))
    }

    fn single(&mut self) -> TxPlan {
        let decl = self.decl();
        // Some transactions override the engine's lease, shorter or longer.
        let lease = self.rng.gen_bool(0.1).then(|| {
            [Duration::from_millis(50), Duration::from_millis(100), self.lease * 2, Duration::from_secs(5)]
                [self.rng.gen_range(0..4)]
        });
        let n = self.rng.gen_range(1..=6);
        let ops = self.ops(decl.as_deref(), n);
        let end = match self.rng.gen_range(0..100) {
            0..=79 => {
                let think_after_seal = if self.rng.gen_bool(0.7) { 0 } else { self.think() };
                let hook = self
                    .rng
                    .gen_bool(0.08)
                    .then(|| HookPlan { delay_ms: self.rng.gen_range(0..=50), veto: self.rng.gen_bool(0.5) });
                let effect_after_seal = self.rng.gen_bool(0.02).then(|| self.call(decl.as_deref()));
                let drop_after_ms = self.drop_after();
                End::Commit {
                    think_after_seal,
                    wait_timeout_ms: self.wait_timeout(),
                    hook,
                    effect_after_seal,
                    drop_after_ms,
                }
            }
            80..=91 => End::Abort { drop_after_ms: self.drop_after() },
            _ => End::Abandon,
        };
        TxPlan::Single { decl, lease, ops, end }
    }

    fn group(&mut self) -> TxPlan {
        let decl = self.decl();
        let n = self.rng.gen_range(2..=3);
        let branches = (0..n)
            .map(|_| {
                let k = self.rng.gen_range(1..=3);
                // Sets (undo restores the previous value) run inside groups too: a sibling's
                // second eager write on a scope is refused (`SiblingConflict`), and the winner
                // commits only after the losers' compensations settled, so `check_cells` must
                // find every cell at the winner's value (issue 26 item 1).
                self.ops(decl.as_deref(), k)
            })
            .collect();
        let end = match self.rng.gen_range(0..10) {
            0..=6 => GroupEnd::Choose { winner: self.rng.gen_range(0..n), wait_timeout_ms: self.wait_timeout() },
            7..=8 => GroupEnd::AbortGroup,
            _ => GroupEnd::Abandon,
        };
        TxPlan::Group { decl, branches, seal_branches: self.rng.gen_bool(0.5), end }
    }
}

// ---------------------------------------------------------------------------------------------
// Agents: run a plan against the engine and record what they were told.
// ---------------------------------------------------------------------------------------------

/// What an agent was told about one call.
#[derive(Debug, Clone, PartialEq)]
enum CallResult {
    /// Ran now as effect `effect`; its output names call `out`.
    Executed { effect: u32, out: u64 },
    /// Staged as effect `effect`.
    Staged { effect: u32 },
    /// Queued as effect `effect`.
    Queued { effect: u32 },
    /// Not run: the recorded output of call `out` was returned.
    Replayed { effect: u32, out: u64 },
    /// Refused without effect (the key is held by an unfinished transaction, unresolved, or
    /// was first used for another call).
    Refused,
    /// The call failed and aborted the transaction, or the transaction was gone.
    Failed,
}

#[derive(Debug, Clone)]
struct CallRec {
    uid: u64,
    result: CallResult,
}

/// One transaction, as its agent saw it.
#[derive(Debug, Clone)]
struct TxRec {
    tx: TxId,
    agent: usize,
    group: Option<u64>,
    lease: Duration,
    /// Begin, and every read and recorded effect: the moments the lease was (re)started.
    touches: Vec<Instant>,
    /// When the transaction stopped needing its lease (commit requested, aborted, noticed
    /// gone); `None` if the agent walked away.
    idle_from: Option<Instant>,
    reads: Vec<(String, u64)>,
    calls: Vec<CallRec>,
    staged: Vec<(Vec<&'static str>, u64, u32)>,
    aborted_by_agent: bool,
    violated: bool,
    veto: bool,
    wait_timeout: bool,
    /// The agent dropped its commit or abort future before it finished.
    dropped: bool,
    outcome: Option<Outcome>,
    /// Keyed calls that executed in this transaction.
    keyed_executed: Vec<CallPlan>,
}

impl TxRec {
    fn new(tx: TxId, agent: usize, group: Option<u64>, lease: Duration) -> TxRec {
        TxRec {
            tx,
            agent,
            group,
            lease,
            touches: vec![Instant::now()],
            idle_from: None,
            reads: Vec::new(),
            calls: Vec::new(),
            keyed_executed: Vec::new(),
            staged: Vec::new(),
            aborted_by_agent: false,
            violated: false,
            veto: false,
            wait_timeout: false,
            dropped: false,
            outcome: None,
        }
    }

    fn idle_now(&mut self) {
        if self.idle_from.is_none() {
            self.idle_from = Some(Instant::now());
        }
    }

    /// The longest stretch without a lease renewal while the lease mattered.
    fn longest_idle(&self) -> Option<Duration> {
        let gaps = self.touches.windows(2).map(|w| w[1].saturating_duration_since(w[0]));
        let last = self.touches.last().copied();
        match (self.idle_from, last) {
            (None, _) => None,
            (Some(end), Some(last)) => {
                Some(gaps.chain([end.saturating_duration_since(last)]).max().unwrap_or_default())
            }
            (Some(_), None) => Some(gaps.max().unwrap_or_default()),
        }
    }
}

#[derive(Debug, Clone)]
struct GroupRec {
    group: u64,
    branches: Vec<TxId>,
    chosen: Option<TxId>,
    aborted_by_agent: bool,
}

#[derive(Debug, Default)]
struct AgentReport {
    txs: Vec<TxRec>,
    groups: Vec<GroupRec>,
    problems: Vec<String>,
    /// Eager calls of a branch refused because a sibling wrote the scope eagerly first.
    sibling_refusals: u64,
}

struct Agent {
    idx: usize,
    tg: Tidegate,
    tools: Arc<Vec<Tool>>,
    lease: Duration,
    report: AgentReport,
    /// Keyed calls that executed in this agent's committed transactions: a later call may
    /// repeat one (same arguments, same key) and must be replayed, never run again.
    committed_keyed: Vec<CallPlan>,
    /// The declaration of the single (non-group) transaction running, if one is.
    single_decl: Option<Option<Vec<&'static str>>>,
}

/// Whether the transaction can still be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Alive,
    Gone,
}

impl Agent {
    async fn run(mut self, plan: AgentPlan) -> AgentReport {
        sleep_ms(plan.start_delay_ms).await;
        for (gap, tx) in plan.txs {
            sleep_ms(gap).await;
            match tx {
                TxPlan::Single { decl, lease, ops, end } => self.single(decl, lease, ops, end).await,
                TxPlan::Group { decl, branches, seal_branches, end } => {
                    self.group(decl, branches, seal_branches, end).await
                }
            }
        }
        self.report
    }

    /// For some keyed calls of a single transaction: a keyed call this agent committed
    /// earlier whose scopes the declaration allows, repeated as is (it must replay).
    fn repeat_committed(&self, plan: &CallPlan) -> CallPlan {
        let Some(decl) = &self.single_decl else { return plan.clone() };
        if !TOOLS[plan.tool].keyed || self.committed_keyed.is_empty() || plan.uid.is_multiple_of(2) {
            return plan.clone();
        }
        let old = &self.committed_keyed[plan.uid as usize % self.committed_keyed.len()];
        let allowed = |s: &&str| decl.as_ref().is_none_or(|d| d.iter().any(|m| reference::covers(m, s)));
        if old.scopes.iter().all(allowed) { old.clone() } else { plan.clone() }
    }

    fn problem(&mut self, what: String) {
        self.report.problems.push(format!("agent {}: {what}", self.idx));
    }

    fn options(&self, decl: &Option<Vec<&'static str>>) -> TxOptions {
        let opts = TxOptions::agent(format!("agent-{}", self.idx));
        match decl {
            Some(d) => opts.may_touch(d.iter().copied()),
            None => opts,
        }
    }

    /// Classifies an error of an operation on a transaction that may legitimately have been
    /// aborted behind the agent's back (lease expiry, a violation's background abort).
    fn gone(&mut self, rec: &mut TxRec, op: &str, e: Error) -> Flow {
        rec.idle_now();
        match e {
            Error::Aborted(o) => rec.outcome = Some(*o),
            Error::Engine(EngineError::Settled { .. })
            | Error::Finished { committed: false, .. }
            | Error::Engine(EngineError::WrongState { state: TxState::Aborting, .. })
            | Error::Engine(EngineError::ProtocolViolation { .. })
            // The isolation of eager effects aborted it (legitimacy: `check_decisions`).
            | Error::Engine(EngineError::LockConflict { .. })
            | Error::CallInterrupted { .. } => {}
            other => self.problem(format!("{op} on {}: unexpected error: {other}", rec.tx)),
        }
        Flow::Gone
    }

    async fn single(&mut self, decl: Option<Vec<&'static str>>, lease: Option<Duration>, ops: Vec<Op>, end: End) {
        let mut opts = self.options(&decl);
        if let Some(l) = lease {
            opts = opts.lease(l);
        }
        let tx = match self.tg.begin_with(opts) {
            Ok(tx) => tx,
            Err(e) => return self.problem(format!("begin: {e}")),
        };
        let mut rec = TxRec::new(tx.id(), self.idx, None, lease.unwrap_or(self.lease));
        self.single_decl = Some(decl.clone());
        let mut last = None;
        let mut flow = Flow::Alive;
        for op in &ops {
            flow = self.op(&tx, &mut rec, op, &mut last).await;
            if flow == Flow::Gone {
                break;
            }
        }
        if flow == Flow::Alive {
            self.end(&tx, &mut rec, end).await;
        }
        self.single_decl = None;
        if rec.outcome.as_ref().is_some_and(|o| o.committed) {
            self.committed_keyed.append(&mut rec.keyed_executed);
        }
        self.report.txs.push(rec);
    }

    async fn op(
        &mut self,
        tx: &tidegate_runtime::Transaction,
        rec: &mut TxRec,
        op: &Op,
        last: &mut Option<(CallPlan, CallResult)>,
    ) -> Flow {
        match op {
            Op::Read(s) => self.read(tx, rec, s),
            Op::Call(plan) => {
                let plan = &self.repeat_committed(plan);
                let (flow, result) = self.call(tx, rec, plan, None).await;
                *last = Some((plan.clone(), result));
                flow
            }
            Op::Concurrent(a, b) => {
                let flow = self.concurrent(tx, rec, a, b).await;
                *last = None;
                flow
            }
            Op::Repeat => match last.clone() {
                Some((plan, previous)) => {
                    let (flow, result) = self.call(tx, rec, &plan, Some(previous)).await;
                    *last = Some((plan, result));
                    flow
                }
                None => Flow::Alive,
            },
            Op::Think(ms) => {
                sleep_ms(*ms).await;
                Flow::Alive
            }
            Op::Yield(n) => {
                for _ in 0..*n {
                    tokio::task::yield_now().await;
                }
                Flow::Alive
            }
            Op::ReadOutside(s) => match tx.read(s) {
                Ok(_) => {
                    self.problem(format!("{} read `{s}` outside its may-touch set and was not stopped", rec.tx));
                    Flow::Alive
                }
                Err(Error::Engine(EngineError::ProtocolViolation { .. })) => {
                    rec.violated = true;
                    rec.idle_now();
                    Flow::Gone
                }
                Err(e) => self.gone(rec, "read outside", e),
            },
        }
    }

    fn read(&mut self, tx: &tidegate_runtime::Transaction, rec: &mut TxRec, scope: &str) -> Flow {
        let at = Instant::now();
        match tx.read(scope) {
            Ok(r) => {
                rec.touches.push(at);
                rec.reads.push((scope.to_owned(), r.version.0));
                // Read-your-writes: the latest staged effect on an overlapping scope.
                let expected = rec
                    .staged
                    .iter()
                    .rev()
                    .find(|(scopes, _, _)| scopes.iter().any(|s| reference::overlaps(s, scope)))
                    .map(|&(_, uid, _)| uid);
                let got = r.staged.as_ref().and_then(|v| v["u"].as_u64());
                if got != expected {
                    self.problem(format!(
                        "{} read `{scope}` and saw staged effect {got:?}, but its latest overlapping staged \
                         effect is {expected:?}",
                        rec.tx
                    ));
                }
                Flow::Alive
            }
            Err(e) => self.gone(rec, "read", e),
        }
    }

    async fn call(
        &mut self,
        tx: &tidegate_runtime::Transaction,
        rec: &mut TxRec,
        plan: &CallPlan,
        previous: Option<CallResult>,
    ) -> (Flow, CallResult) {
        let at = Instant::now();
        let result = tx.call_with(&self.tools[plan.tool], plan.args(), plan.opts()).await;
        self.note_call(rec, plan, previous, at, result)
    }

    /// Two calls of one transaction in flight at once.
    async fn concurrent(
        &mut self,
        tx: &tidegate_runtime::Transaction,
        rec: &mut TxRec,
        a: &CallPlan,
        b: &CallPlan,
    ) -> Flow {
        let at = Instant::now();
        let (ra, rb) = futures::join!(
            tx.call_with(&self.tools[a.tool], a.args(), a.opts()),
            tx.call_with(&self.tools[b.tool], b.args(), b.opts())
        );
        let (fa, _) = self.note_call(rec, a, None, at, ra);
        let (fb, _) = self.note_call(rec, b, None, at, rb);
        if fa == Flow::Gone || fb == Flow::Gone { Flow::Gone } else { Flow::Alive }
    }

    /// Records and checks what the agent was told about one call started at `at`.
    fn note_call(
        &mut self,
        rec: &mut TxRec,
        plan: &CallPlan,
        previous: Option<CallResult>,
        at: Instant,
        result: tidegate_runtime::Result<Ack>,
    ) -> (Flow, CallResult) {
        let spec = &TOOLS[plan.tool];
        let (flow, result) = match result {
            Ok(ack) => {
                rec.touches.push(at);
                let out = |v: &Value| v["u"].as_u64().unwrap_or(0);
                let r = match ack {
                    Ack::Executed { effect, output } => CallResult::Executed { effect: effect.0, out: out(&output) },
                    Ack::Staged { effect } => CallResult::Staged { effect: effect.0 },
                    Ack::Queued { effect } => CallResult::Queued { effect: effect.0 },
                    Ack::Replayed { effect, output } => CallResult::Replayed { effect: effect.0, out: out(&output) },
                };
                let class_ok = match (&r, spec.class) {
                    (CallResult::Staged { .. }, c) => c == EffectClass::Bufferable,
                    (CallResult::Queued { .. }, c) => c == EffectClass::Gated,
                    (CallResult::Executed { out, .. }, c) => c.executes_eagerly() && *out == plan.uid,
                    (CallResult::Replayed { .. }, c) => c.executes_eagerly(),
                    _ => false,
                };
                if !class_ok {
                    self.problem(format!("{} call #{} of `{}` was acknowledged as {r:?}", rec.tx, plan.uid, spec.name));
                }
                if spec.keyed && matches!(r, CallResult::Executed { .. }) {
                    rec.keyed_executed.push(plan.clone());
                }
                if let CallResult::Staged { effect } = r
                    && !rec.staged.iter().any(|&(_, _, e)| e == effect)
                {
                    rec.staged.push((plan.scopes.clone(), plan.uid, effect));
                }
                (Flow::Alive, r)
            }
            Err(Error::Engine(EngineError::KeyInUse { .. } | EngineError::KeyUnresolved { .. })) => {
                rec.touches.push(at);
                (Flow::Alive, CallResult::Refused)
            }
            // A speculation branch's eager call on a scope a sibling already wrote eagerly
            // (docs/engine.md, "Speculation and eager effects"): refused before it ran; the
            // branch goes on.
            Err(Error::Engine(EngineError::SiblingConflict { tx, .. })) => {
                if tx != rec.tx || rec.group.is_none() || !spec.class.executes_eagerly() {
                    self.problem(format!(
                        "{} call #{} of `{}` refused as a sibling conflict, but it is not an eager call of a branch",
                        rec.tx, plan.uid, spec.name
                    ));
                }
                self.report.sibling_refusals += 1;
                (Flow::Alive, CallResult::Refused)
            }
            // Every new call has a new uid in its arguments, so an adapter key the engine still
            // remembers is refused for it; only the same call (a retry) may reuse a key.
            Err(Error::Engine(EngineError::KeyReused { ref differs, ref this, .. })) => {
                if !spec.keyed || !differs.starts_with("arguments") {
                    self.problem(format!(
                        "{} call #{} of `{}` refused as a key reuse: {this}, {differs}",
                        rec.tx, plan.uid, spec.name
                    ));
                }
                rec.touches.push(at);
                (Flow::Alive, CallResult::Refused)
            }
            Err(e) => {
                if matches!(e, Error::Aborted(_)) {
                    rec.touches.push(at);
                }
                (self.gone(rec, "call", e), CallResult::Failed)
            }
        };
        // A retry with identical arguments returns what the first call returned, without
        // running again.
        if let Some(prev) = previous {
            let expected = match prev {
                CallResult::Executed { effect, out } | CallResult::Replayed { effect, out } => {
                    Some(CallResult::Replayed { effect, out })
                }
                staged @ CallResult::Staged { .. } => Some(staged),
                queued @ CallResult::Queued { .. } => Some(queued),
                CallResult::Refused | CallResult::Failed => None,
            };
            let keyed_replay = spec.keyed && matches!(result, CallResult::Replayed { .. });
            if let Some(expected) = expected {
                let same = match (&expected, &result) {
                    // A key that committed elsewhere replays as a new effect of this transaction.
                    (CallResult::Replayed { out: a, .. }, CallResult::Replayed { out: b, .. }) if keyed_replay => {
                        a == b
                    }
                    (a, b) => a == b,
                };
                if !same && result != CallResult::Failed {
                    self.problem(format!(
                        "{} retried call #{} of `{}`: expected {expected:?}, got {result:?}",
                        rec.tx, plan.uid, spec.name
                    ));
                }
            }
        }
        rec.calls.push(CallRec { uid: plan.uid, result: result.clone() });
        (flow, result)
    }

    async fn end(&mut self, tx: &tidegate_runtime::Transaction, rec: &mut TxRec, end: End) {
        match end {
            End::Abandon => {}
            End::Abort { drop_after_ms } => {
                rec.aborted_by_agent = true;
                rec.idle_now();
                let Some(r) = within(drop_after_ms, tx.abort("the agent changed its mind")).await else {
                    // Dropped: the abort finishes on its own; the ledger says how it settled.
                    rec.dropped = true;
                    return;
                };
                match r {
                    Ok(o) => rec.outcome = Some(o),
                    Err(e) => {
                        self.gone(rec, "abort", e);
                    }
                }
            }
            End::Commit { think_after_seal, wait_timeout_ms, hook, effect_after_seal, drop_after_ms } => {
                if let Err(e) = tx.seal() {
                    self.gone(rec, "seal", e);
                    return;
                }
                sleep_ms(think_after_seal).await;
                if let Some(plan) = effect_after_seal {
                    match tx.call_with(&self.tools[plan.tool], plan.args(), plan.opts()).await {
                        Err(Error::Engine(EngineError::ProtocolViolation { .. })) => {
                            rec.violated = true;
                            rec.idle_now();
                        }
                        Ok(ack) => self.problem(format!("{} called a tool after sealing and got {ack:?}", rec.tx)),
                        Err(e) => {
                            self.gone(rec, "call after seal", e);
                        }
                    }
                    return;
                }
                self.commit(tx, rec, wait_timeout_ms, hook, drop_after_ms).await;
            }
        }
    }

    async fn commit(
        &mut self,
        tx: &tidegate_runtime::Transaction,
        rec: &mut TxRec,
        wait_timeout_ms: Option<u64>,
        hook: Option<HookPlan>,
        drop_after_ms: Option<u64>,
    ) {
        if let Some(h) = hook {
            rec.veto |= h.veto;
            let verdict = if h.veto { Verdict::Veto("policy says no".into()) } else { Verdict::Approve };
            let delay = h.delay_ms;
            tx.add_hook(Arc::new(FnHook::new("policy", move |_view| {
                let verdict = verdict.clone();
                async move {
                    sleep_ms(delay).await;
                    verdict
                }
            })));
        }
        rec.wait_timeout = wait_timeout_ms.is_some();
        rec.idle_now();
        let opts = CommitOptions { wait_timeout: wait_timeout_ms.map(Duration::from_millis) };
        let Some(r) = within(drop_after_ms, tx.commit_with(opts)).await else {
            // Dropped: the commit settles on its own; the ledger says how.
            rec.dropped = true;
            return;
        };
        match r {
            Ok(o) => rec.outcome = Some(o),
            Err(e) => {
                self.gone(rec, "commit", e);
            }
        }
    }

    async fn group(
        &mut self,
        decl: Option<Vec<&'static str>>,
        branches: Vec<Vec<Op>>,
        seal_branches: bool,
        end: GroupEnd,
    ) {
        let spec = match self.tg.speculate(self.options(&decl), branches.len()) {
            Ok(s) => s,
            Err(e) => return self.problem(format!("speculate: {e}")),
        };
        let txs: Vec<tidegate_runtime::Transaction> = spec.branches().to_vec();
        let group = spec.id().0;
        let mut recs: Vec<TxRec> = txs.iter().map(|t| TxRec::new(t.id(), self.idx, Some(group), self.lease)).collect();
        let mut grec =
            GroupRec { group, branches: txs.iter().map(|t| t.id()).collect(), chosen: None, aborted_by_agent: false };
        let mut alive = vec![Flow::Alive; txs.len()];
        let mut lasts = vec![None; txs.len()];
        let rounds = branches.iter().map(Vec::len).max().unwrap_or(0);
        // The controller interleaves its branches round by round.
        for round in 0..rounds {
            for (b, ops) in branches.iter().enumerate() {
                if alive[b] == Flow::Alive
                    && let Some(op) = ops.get(round)
                {
                    alive[b] = self.op(&txs[b], &mut recs[b], op, &mut lasts[b]).await;
                }
            }
        }
        if seal_branches {
            for b in 0..txs.len() {
                if alive[b] == Flow::Alive
                    && let Err(e) = txs[b].seal()
                {
                    alive[b] = self.gone(&mut recs[b], "seal branch", e);
                }
            }
        }
        let mut abort_group = matches!(end, GroupEnd::AbortGroup);
        if let GroupEnd::Choose { winner, wait_timeout_ms } = end {
            let w = &txs[winner];
            match spec.choose(w.id()).await {
                Ok(losers) => {
                    grec.chosen = Some(w.id());
                    for o in losers {
                        if let Some(r) = recs.iter_mut().find(|r| r.tx == o.tx) {
                            r.idle_now();
                            r.outcome = Some(o);
                        }
                    }
                    for (b, r) in recs.iter_mut().enumerate() {
                        if b != winner {
                            r.idle_now();
                        }
                    }
                    let rw = &mut recs[winner];
                    let sealed = match w.state() {
                        Ok(TxState::Open) => match w.seal() {
                            Ok(()) => true,
                            Err(e) => {
                                self.gone(rw, "seal winner", e);
                                false
                            }
                        },
                        Ok(_) => true,
                        Err(e) => {
                            self.gone(rw, "winner state", e);
                            false
                        }
                    };
                    if sealed {
                        self.commit(w, rw, wait_timeout_ms, None, None).await;
                    }
                }
                // The chosen branch could not win (it aborted already): give up on the group.
                Err(
                    Error::Engine(
                        EngineError::WrongState { .. } | EngineError::Settled { .. } | EngineError::UnknownGroup { .. },
                    )
                    | Error::Finished { .. },
                ) => abort_group = true,
                Err(e) => {
                    self.problem(format!("choose {} in group {group}: {e}", w.id()));
                    abort_group = true;
                }
            }
        }
        if abort_group {
            grec.aborted_by_agent = true;
            for r in &mut recs {
                r.aborted_by_agent = true;
                r.idle_now();
            }
            match spec.abort("no branch is good enough").await {
                Ok(outcomes) => {
                    for o in outcomes {
                        if let Some(r) = recs.iter_mut().find(|r| r.tx == o.tx) {
                            r.outcome = Some(o);
                        }
                    }
                }
                Err(Error::Engine(EngineError::UnknownGroup { .. })) => {}
                Err(e) => self.problem(format!("abort group {group}: {e}")),
            }
        }
        self.report.txs.extend(recs);
        self.report.groups.push(grec);
    }
}

async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Running one schedule.
// ---------------------------------------------------------------------------------------------

/// Everything a schedule produced, for the checker.
#[derive(Debug, Default)]
struct History {
    ordering: Ordering,
    events: Vec<Event>,
    world: Vec<Hit>,
    txs: Vec<TxRec>,
    groups: Vec<GroupRec>,
    problems: Vec<String>,
    sibling_refusals: u64,
    /// `(unfinished, committed, aborted)` from the engine's counters.
    stats: (usize, u64, u64),
}

fn run_schedule(seed: u64) -> Result<Coverage, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let plan = Gen::schedule(&mut rng);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot build a runtime: {e}"))?;
    // Replaying one schedule: say everything about it.
    let replay = std::env::var("TIDEGATE_SCHEDULES").is_ok_and(|n| n.trim() == "1");
    rt.block_on(drive(&plan))
        .and_then(|h| {
            check(&h).map_err(|e| {
                if replay { format!("{e}\n\nledger:\n{}\nworld:\n{:#?}", ledger_text(&h.events), h.world) } else { e }
            })
        })
        .map_err(|e| if replay { format!("{e}\n\nplan: {plan:#?}") } else { e })
}

/// `fut`'s output, or `None` if it was dropped after `ms` (virtual) milliseconds.
async fn within<T>(ms: Option<u64>, fut: impl std::future::Future<Output = T>) -> Option<T> {
    match ms {
        None => Some(fut.await),
        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), fut).await.ok(),
    }
}

fn ledger_text(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| format!("  {}\n", tidegate_storage::wire::encode(0, e).unwrap_or_else(|err| err.to_string())))
        .collect()
}

async fn drive(plan: &SchedulePlan) -> Result<History, String> {
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder()
        .lease(plan.lease)
        .ordering(plan.ordering)
        .retry(RetryPolicy {
            attempts: ATTEMPTS,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(4),
        })
        .store(store.clone())
        .build()
        .map_err(|e| format!("cannot build the engine: {e}"))?;
    let world = World::default();
    let tools = Arc::new(world.tools()?);
    let reaper = plan.reaper.then(|| tg.spawn_reaper());
    let handles: Vec<_> = plan
        .agents
        .iter()
        .enumerate()
        .map(|(idx, a)| {
            let agent = Agent {
                idx,
                tg: tg.clone(),
                tools: tools.clone(),
                lease: plan.lease,
                report: AgentReport::default(),
                committed_keyed: Vec::new(),
                single_decl: None,
            };
            tokio::spawn(agent.run(a.clone()))
        })
        .collect();
    let joined = tokio::time::timeout(LIVENESS_LIMIT, async {
        let mut reports = Vec::new();
        for h in handles {
            reports.push(h.await.map_err(|e| format!("an agent task failed: {e}"))?);
        }
        Ok::<_, String>(reports)
    })
    .await
    .map_err(|_| {
        format!(
            "liveness: the agents had not finished after {LIVENESS_LIMIT:?} of virtual time (stats {:?}); a commit \
             waits forever",
            tg.stats()
        )
    })??;
    // Once every lease is over, reap whatever the agents abandoned and let the aborts finish.
    let longest = plan
        .agents
        .iter()
        .flat_map(|a| &a.txs)
        .filter_map(|(_, t)| match t {
            TxPlan::Single { lease, .. } => *lease,
            TxPlan::Group { .. } => None,
        })
        .fold(plan.lease, Duration::max);
    tokio::time::sleep(longest + Duration::from_secs(1)).await;
    tg.reap().await.map_err(|e| format!("reap: {e}"))?;
    for _ in 0..10_000 {
        if tg.stats().unfinished == 0 {
            break;
        }
        sleep_ms(5).await;
    }
    if let Some(r) = reaper {
        r.abort();
    }
    tg.check_integrity().map_err(|e| format!("check_integrity: {e}"))?;
    let stats = tg.stats();
    let mut h = History {
        ordering: plan.ordering,
        events: store.events(),
        world: world.log(),
        stats: (stats.unfinished, stats.committed, stats.aborted),
        ..History::default()
    };
    for r in joined {
        h.txs.extend(r.txs);
        h.groups.extend(r.groups);
        h.problems.extend(r.problems);
        h.sibling_refusals += r.sibling_refusals;
    }
    Ok(h)
}

// ---------------------------------------------------------------------------------------------
// The checker.
// ---------------------------------------------------------------------------------------------

/// Counts of what the schedules exercised, so that a drift of the generator that stops
/// covering something is noticed.
#[derive(Debug, Default, Clone)]
struct Coverage(BTreeMap<String, u64>);

impl Coverage {
    fn add(&mut self, what: impl Into<String>, n: u64) {
        *self.0.entry(what.into()).or_insert(0) += n;
    }

    fn get(&self, what: &str) -> u64 {
        self.0.get(what).copied().unwrap_or(0)
    }

    fn merge(&mut self, other: &Coverage) {
        for (k, v) in &other.0 {
            self.add(k.clone(), *v);
        }
    }
}

/// One effect, as the ledger recorded it.
#[derive(Debug, Clone)]
struct LEff {
    tool: String,
    class: EffectClass,
    /// A compensation handler exists.
    compensable: bool,
    scopes: Vec<String>,
    args: ArgsView,
    executed: Option<Value>,
    /// The call returned after its transaction's abort was decided (compensated late, out of
    /// the abort's reverse order).
    returned_after_abort: bool,
    failed: Option<bool>,
    release_started: bool,
    released: Option<bool>,
    /// The failed release may nevertheless have taken effect.
    release_unknown: bool,
    compensations: Vec<(bool, Option<String>)>,
}

/// One transaction, as the ledger recorded it.
#[derive(Debug, Clone, Default)]
struct LTx {
    epoch: u64,
    group: Option<u64>,
    may_touch: Option<Vec<String>>,
    reads: Vec<(String, u64)>,
    effects: Vec<LEff>,
    sealed: bool,
    decisions: Vec<(bool, Option<u64>, Option<AbortReason>)>,
    settled: Option<(bool, Vec<(Disposition, Tag)>)>,
    /// The fresh version a retraction gave the scopes this transaction wrote (L2 and above).
    retract_stamp: Option<u64>,
    /// The fresh version its settlement gave the scopes of its eager compensable effects, if it
    /// aborted before any commit decision (L1 and above; docs/engine.md).
    abort_stamp: Option<u64>,
    /// `touched` records of compensations of its effects after it settled (a late call's
    /// compensation): (the fresh version each gave, the effect's scopes, done).
    touches: Vec<(u64, Vec<String>, bool)>,
}

impl LTx {
    fn footprint(&self) -> impl Iterator<Item = &str> {
        self.reads
            .iter()
            .map(|(s, _)| s.as_str())
            .chain(self.effects.iter().flat_map(|e| e.scopes.iter().map(String::as_str)))
    }

    fn committed(&self) -> bool {
        self.settled.as_ref().is_some_and(|(c, _)| *c)
    }

    fn stamp(&self) -> Option<u64> {
        self.decisions.iter().find_map(|(c, s, _)| if *c { *s } else { None })
    }

    fn reason(&self) -> Option<&AbortReason> {
        self.decisions.last().and_then(|(_, _, r)| r.as_ref())
    }

    /// The scopes of its dirty marks: eager effects with a compensation that did not replay
    /// a key (`disp`: the settlement's dispositions, if settled).
    fn dirty_scopes(&self, upto: usize) -> Vec<String> {
        let disp = self.settled.as_ref().map(|(_, d)| d.as_slice()).unwrap_or_default();
        self.effects
            .iter()
            .take(upto)
            .enumerate()
            .filter(|(i, e)| {
                e.class.executes_eagerly() && e.compensable && !matches!(disp.get(*i), Some((Disposition::Replayed, _)))
            })
            .flat_map(|(_, e)| e.scopes.iter().cloned())
            .collect()
    }

    /// The scopes it wrote at its commit decision (replayed effects did not run, so they
    /// wrote nothing).
    fn writes(&self) -> Vec<String> {
        let disp = self.settled.as_ref().map(|(_, d)| d.as_slice()).unwrap_or_default();
        self.effects
            .iter()
            .enumerate()
            .filter(|(i, _)| !matches!(disp.get(*i), Some((Disposition::Replayed, _))))
            .flat_map(|(_, e)| e.scopes.iter().cloned())
            .collect()
    }
}

fn parse_ledger(events: &[Event]) -> Result<BTreeMap<TxId, LTx>, String> {
    let mut txs: BTreeMap<TxId, LTx> = BTreeMap::new();
    let mut last_stamp = 0;
    for e in events {
        if matches!(e, Event::ToolChanged { .. }) {
            continue; // engine-wide registry change, no transaction
        }
        if let Event::Touched { scopes, undoes, effect, done } = e {
            // A compensation of a settled transaction's effect: one fresh version.
            let t = txs.get_mut(undoes).filter(|t| t.settled.is_some()).ok_or_else(|| {
                format!("ledger: touched by the compensation of {undoes}#{}, which has not settled", effect.0)
            })?;
            last_stamp += 1;
            t.touches.push((last_stamp, scopes.iter().map(|s| s.to_string()).collect(), *done));
            continue;
        }
        let id = e.tx();
        if !matches!(e, Event::Begin { .. }) && !txs.contains_key(&id) {
            return Err(format!("ledger: event for {id} before its begin: {e:?}"));
        }
        match e {
            Event::Begin { epoch, group, may_touch, .. } => {
                let t =
                    LTx { epoch: epoch.0, group: group.map(|g| g.0), may_touch: may_touch.clone(), ..LTx::default() };
                if txs.insert(id, t).is_some() {
                    return Err(format!("ledger: {id} began twice"));
                }
            }
            Event::Read { scope, version, .. } => {
                if let Some(t) = txs.get_mut(&id) {
                    t.reads.push((scope.to_string(), version.0));
                }
            }
            Event::EffectRecorded { effect, tool, class, scopes, args, compensable, .. } => {
                if let Some(t) = txs.get_mut(&id) {
                    if effect.0 as usize != t.effects.len() {
                        return Err(format!("ledger: {id} recorded effect {effect} out of order"));
                    }
                    t.effects.push(LEff {
                        tool: tool.to_string(),
                        class: *class,
                        compensable: *compensable,
                        scopes: scopes.iter().map(|s| s.to_string()).collect(),
                        args: ArgsView::of(args),
                        executed: None,
                        returned_after_abort: false,
                        failed: None,
                        release_started: false,
                        released: None,
                        release_unknown: false,
                        compensations: Vec::new(),
                    });
                }
            }
            Event::EffectExecuted { effect, output, .. } => {
                let aborted = txs.get(&id).is_some_and(|t| t.decisions.iter().any(|d| !d.0));
                let e = effect_mut(&mut txs, id, effect.0)?;
                e.executed = Some((**output).clone());
                e.returned_after_abort = aborted;
            }
            Event::EffectFailed { effect, unknown, .. } => {
                effect_mut(&mut txs, id, effect.0)?.failed = Some(*unknown);
            }
            Event::Sealed { .. } => {
                if let Some(t) = txs.get_mut(&id) {
                    t.sealed = true;
                }
            }
            Event::Decided { commit, stamp, reason, .. } => {
                if let Some(t) = txs.get_mut(&id) {
                    if let Some(s) = stamp {
                        last_stamp = last_stamp.max(*s);
                    }
                    if !*commit && t.stamp().is_some() {
                        last_stamp += 1;
                        t.retract_stamp = Some(last_stamp);
                    }
                    t.decisions.push((*commit, *stamp, reason.clone()));
                }
            }
            Event::ReleaseStarted { effect, .. } => {
                let e = effect_mut(&mut txs, id, effect.0)?;
                if e.release_started {
                    return Err(format!("ledger: {id}#{} release started twice", effect.0));
                }
                e.release_started = true;
            }
            Event::Released { effect, error, unknown, .. } => {
                let e = effect_mut(&mut txs, id, effect.0)?;
                if e.released.is_some() || !e.release_started {
                    return Err(format!("ledger: {id}#{} released twice or without starting", effect.0));
                }
                e.released = Some(error.is_none());
                e.release_unknown = *unknown;
            }
            Event::Compensated { effect, residue, error, .. } => {
                effect_mut(&mut txs, id, effect.0)?.compensations.push((error.is_none(), residue.clone()));
            }
            Event::Settled { committed, effects, .. } => {
                if let Some(t) = txs.get_mut(&id) {
                    if t.settled.is_some() {
                        return Err(format!("ledger: {id} settled twice"));
                    }
                    t.settled = Some((*committed, effects.iter().map(|(_, d, tag)| (d.clone(), *tag)).collect()));
                    if !*committed && t.stamp().is_none() && !t.dirty_scopes(usize::MAX).is_empty() {
                        last_stamp += 1;
                        t.abort_stamp = Some(last_stamp);
                    }
                }
            }
            other => return Err(format!("ledger: an event this model does not know: {other:?}")),
        }
    }
    Ok(txs)
}

fn effect_mut(txs: &mut BTreeMap<TxId, LTx>, tx: TxId, effect: u32) -> Result<&mut LEff, String> {
    txs.get_mut(&tx)
        .and_then(|t| t.effects.get_mut(effect as usize))
        .ok_or_else(|| format!("ledger: {tx}#{effect} was never recorded"))
}

/// Per-transaction state while the ledger is replayed in order.
#[derive(Debug, Clone, Copy, Default)]
struct Phase {
    begun: bool,
    sealed: bool,
    /// Decided to abort: it will never write, so it no longer blocks anything.
    aborting: bool,
    committing: bool,
    finished: bool,
}

/// Replays the ledger in order through the reference: every read version, every commit
/// decision (reads current; in epoch order, nothing earlier unfinished that may touch the
/// footprint) and every stale-read abort.
fn check_decisions(h: &History, txs: &BTreeMap<TxId, LTx>) -> Result<(), String> {
    let mut versions = reference::Versions::default();
    let mut phase: HashMap<TxId, Phase> = HashMap::new();
    let mut last_stamp = 0;
    // Decided commits' held effects not yet released: (effect, scope).
    let mut unreleased: HashMap<TxId, Vec<(u32, String)>> = HashMap::new();
    // Isolation of eager effects: effects recorded so far per transaction, and held effects
    // of transactions not aborting, not yet released: (effect, scope).
    let mut recorded: HashMap<TxId, usize> = HashMap::new();
    let mut held: HashMap<TxId, Vec<(u32, String)>> = HashMap::new();
    // Compensations of settled transactions' effects running now (between their two
    // `touched`): (transaction, effect, scopes).
    let mut undoing: Vec<(TxId, u32, Vec<String>)> = Vec::new();
    for (i, e) in h.events.iter().enumerate() {
        if let Event::Touched { scopes, undoes, effect, done } = e {
            last_stamp += 1;
            for s in scopes {
                versions.write(s, last_stamp);
            }
            if *done {
                undoing.retain(|(t, e, _)| !(t == undoes && *e == effect.0));
            } else {
                undoing.push((*undoes, effect.0, scopes.iter().map(|s| s.to_string()).collect()));
            }
            continue;
        }
        let id = e.tx();
        let Some(t) = txs.get(&id) else { continue };
        match e {
            Event::EffectRecorded { effect, class, scopes, .. } => {
                *recorded.entry(id).or_default() += 1;
                if !class.executes_eagerly() {
                    held.entry(id).or_default().extend(scopes.iter().map(|s| (effect.0, s.to_string())));
                }
            }
            Event::Decided { commit: false, reason: Some(AbortReason::LockConflict { scope }), .. } => {
                // Legitimate iff another transaction (not a branch of the same group: another
                // epoch) has a dirty mark overlapping the scope, or holds an unreleased effect
                // there.
                let dirty = txs.iter().any(|(uid, u)| {
                    *uid != id
                        && u.epoch != t.epoch
                        && !phase.get(uid).is_some_and(|p| p.finished)
                        && u.dirty_scopes(recorded.get(uid).copied().unwrap_or(0))
                            .iter()
                            .any(|d| reference::overlaps(d, scope))
                });
                let holds = held.iter().any(|(uid, list)| {
                    *uid != id
                        && txs.get(uid).is_some_and(|u| u.epoch != t.epoch)
                        && list.iter().any(|(_, s)| reference::overlaps(s, scope))
                });
                // Or a compensation of a settled transaction's effect is writing there.
                let undone = undoing.iter().any(|(_, _, list)| list.iter().any(|s| reference::overlaps(s, scope)));
                if !dirty && !holds && !undone {
                    return Err(format!(
                        "event {i}: {id} aborted as a lock conflict on `{scope}`, but no other unfinished transaction \
                         has an uncommitted eager write or an unreleased held write there"
                    ));
                }
                held.remove(&id);
                phase.entry(id).or_default().aborting = true;
            }
            Event::Begin { .. } => phase.entry(id).or_default().begun = true,
            Event::Read { scope, version, .. } => {
                // A decided commit whose held effects on the scope have not all been released
                // is not visible yet: the read records a version just below its stamp.
                let mut want = versions.version(scope);
                let hidden = unreleased
                    .iter()
                    .filter(|(uid, list)| **uid != id && list.iter().any(|(_, s)| reference::overlaps(s, scope)))
                    .filter_map(|(uid, _)| txs.get(uid).and_then(LTx::stamp))
                    .min();
                if let Some(s) = hidden
                    && s <= want
                {
                    want = s - 1;
                }
                if version.0 != want {
                    return Err(format!(
                        "event {i}: {id} read `{scope}` at v{}, but the committed version is v{want}",
                        version.0
                    ));
                }
            }
            Event::Sealed { .. } => phase.entry(id).or_default().sealed = true,
            Event::ReleaseStarted { effect, .. } => {
                let p = phase.get(&id).copied().unwrap_or_default();
                if !p.committing || p.aborting {
                    return Err(format!("event {i}: {id}{effect} released before its commit was decided"));
                }
            }
            Event::Decided { commit: true, stamp, .. } => {
                let Some(stamp) = *stamp else { return Err(format!("event {i}: commit of {id} without a stamp")) };
                if stamp <= last_stamp {
                    return Err(format!("event {i}: commit stamp {stamp} of {id} is not above {last_stamp}"));
                }
                last_stamp = stamp;
                if !phase.get(&id).is_some_and(|p| p.sealed) {
                    return Err(format!("event {i}: {id} committed without sealing"));
                }
                for (scope, seen) in &t.reads {
                    let now = versions.version(scope);
                    if *seen != now {
                        return Err(format!(
                            "event {i}: {id} committed with a stale read: `{scope}` read at v{seen}, committed version \
                             v{now}"
                        ));
                    }
                }
                if h.ordering == Ordering::EpochOrder {
                    for (uid, u) in txs {
                        let p = phase.get(uid).copied().unwrap_or_default();
                        if *uid == id || !p.begun || p.finished || p.aborting || u.epoch >= t.epoch {
                            continue;
                        }
                        for s in t.footprint() {
                            let blocks = if p.sealed {
                                u.footprint().any(|f| reference::overlaps(f, s))
                            } else {
                                u.may_touch.as_ref().is_none_or(|m| m.iter().any(|d| reference::overlaps(d, s)))
                            };
                            if blocks {
                                return Err(format!(
                                    "event {i}: commit predicate broken: {id} (epoch {}) committed while the earlier \
                                     unfinished {uid} (epoch {}) may still touch `{s}`",
                                    t.epoch, u.epoch
                                ));
                            }
                        }
                    }
                }
                for w in t.writes() {
                    versions.write(&w, stamp);
                }
                let held: Vec<(u32, String)> = t
                    .effects
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| {
                        matches!(e.class, EffectClass::Bufferable | EffectClass::Gated) && e.executed.is_none()
                    })
                    .flat_map(|(k, e)| e.scopes.iter().map(move |s| (k as u32, s.clone())))
                    .collect();
                unreleased.insert(id, held);
                phase.entry(id).or_default().committing = true;
            }
            Event::Released { effect, .. } => {
                if let Some(list) = unreleased.get_mut(&id) {
                    list.retain(|(k, _)| *k != effect.0);
                }
                if let Some(list) = held.get_mut(&id) {
                    list.retain(|(k, _)| *k != effect.0);
                }
            }
            Event::Decided { commit: false, reason, .. } => {
                unreleased.remove(&id);
                held.remove(&id);
                // A retraction (a decided commit whose first release failed) gives the scopes
                // it wrote a fresh version at L2 and above (the engine's default level), so
                // no later read observes the retracted writes (docs/levels.md).
                if phase.get(&id).is_some_and(|p| p.committing) {
                    last_stamp += 1;
                    for w in t.writes() {
                        versions.write(&w, last_stamp);
                    }
                }
                phase.entry(id).or_default().aborting = true;
                if let Some(AbortReason::StaleRead { scope, read, current }) = reason {
                    let now = versions.version(scope);
                    if !t.reads.contains(&(scope.clone(), *read)) || now != *current || current <= read {
                        return Err(format!(
                            "event {i}: {id} aborted as a stale read of `{scope}` (read v{read}, now v{current}), but \
                             the reference has v{now} and its reads are {:?}",
                            t.reads
                        ));
                    }
                }
            }
            Event::Settled { .. } => {
                unreleased.remove(&id);
                held.remove(&id);
                phase.entry(id).or_default().finished = true;
                // An abort before any commit decision gives the scopes of its eager
                // compensable effects a fresh version: its compensations wrote there.
                if let Some(stamp) = t.abort_stamp {
                    last_stamp += 1;
                    if stamp != last_stamp {
                        return Err(format!("event {i}: the abort of {id} took stamp {stamp}, expected {last_stamp}"));
                    }
                    for s in t.dirty_scopes(usize::MAX) {
                        versions.write(&s, stamp);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The cells of the "set" tool, replayed from the world's log (a set writes its call id; its
/// compensation restores the values before it), end at the values the committed sets give in
/// commit order, then issuance order: no lost update (issue 10 item 1). Cells a set touched
/// whose abort left residue (a failed compensation) or whose call returned after its abort
/// (a late call can land after a later writer) are not predictable and are skipped.
fn check_cells(h: &History, txs: &BTreeMap<TxId, LTx>, cov: &mut Coverage) -> Result<(), String> {
    let mut cells: HashMap<String, u64> = HashMap::new();
    let mut prev: HashMap<u64, Vec<(String, u64)>> = HashMap::new();
    for hit in h.world.iter().filter(|x| x.tool == "set") {
        match hit.kind {
            HitKind::Exec => {
                prev.insert(
                    hit.uid,
                    hit.scopes.iter().map(|s| (s.clone(), cells.get(s).copied().unwrap_or(0))).collect(),
                );
                for s in &hit.scopes {
                    cells.insert(s.clone(), hit.uid);
                }
            }
            HitKind::Compensate => {
                for (s, v) in prev.get(&hit.uid).into_iter().flatten() {
                    cells.insert(s.clone(), *v);
                }
            }
            _ => {}
        }
    }
    let mut want: HashMap<String, u64> = HashMap::new();
    let mut skip: Vec<String> = Vec::new();
    let mut order: Vec<&LTx> = txs.values().filter(|t| t.committed()).collect();
    order.sort_by_key(|t| t.stamp());
    let sets = |t: &LTx| -> Vec<(usize, LEff)> {
        let disp = t.settled.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
        t.effects
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                e.tool == "set" && e.executed.is_some() && !matches!(disp.get(*i), Some((Disposition::Replayed, _)))
            })
            .map(|(i, e)| (i, e.clone()))
            .collect()
    };
    for t in txs.values().filter(|t| !t.committed()) {
        let tags = t.settled.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
        // Every set, executed or not: one that failed with an unknown outcome may have acted,
        // and its tag says whether its blind compensation undid it.
        for (i, e) in t.effects.iter().enumerate().filter(|(_, e)| e.tool == "set") {
            if e.returned_after_abort || !matches!(tags.get(i), Some((_, Tag::Clean))) {
                skip.extend(e.scopes.iter().cloned());
            }
        }
    }
    for t in order {
        for (_, e) in sets(t) {
            for s in &e.scopes {
                want.insert(s.clone(), e.args.uid);
            }
        }
    }
    for cell in cells.keys().chain(want.keys()) {
        if skip.contains(cell) {
            continue;
        }
        let (got, expected) = (cells.get(cell).copied().unwrap_or(0), want.get(cell).copied().unwrap_or(0));
        if got != expected {
            return Err(format!(
                "lost update: cell `{cell}` ends at set #{got}, but the committed sets in commit order leave #{expected}"
            ));
        }
        cov.add("set cells checked", 1);
    }
    Ok(())
}

/// Checks one settled effect against the world and its injected failures.
fn check_effect(
    id: TxId,
    i: usize,
    e: &LEff,
    committed: bool,
    (disp, tag): &(Disposition, Tag),
    hits: &HashMap<(u64, &'static str), usize>,
) -> Result<(), String> {
    let what = format!("{id}#{i} (`{}` #{} {})", e.tool, e.args.uid, e.class);
    let count = |k: &'static str| hits.get(&(e.args.uid, k)).copied().unwrap_or(0);
    let (exec, release, comp) = (count("exec"), count("release"), count("comp"));
    let spec = tool_spec(&e.tool).ok_or_else(|| format!("{what}: unknown tool"))?;
    if *disp == Disposition::Replayed {
        // The key had executed before: nothing ran for this call.
        return if *tag == Tag::Clean && e.class.executes_eagerly() {
            Ok(())
        } else {
            Err(format!("{what}: replayed but tagged {tag} / class {}", e.class))
        };
    }
    // Injected failures happen exactly where they were planned.
    if e.class.executes_eagerly() {
        let ok = reference::call_succeeds(e.args.fails, e.args.kind, spec.probe);
        match (e.executed.is_some(), e.failed) {
            (true, _) if !ok => return Err(format!("{what}: executed although every attempt was planned to fail")),
            (_, Some(_)) if ok => return Err(format!("{what}: failed although planned to succeed")),
            (_, Some(unknown)) if unknown != reference::failure_unknown(e.args.kind, spec.probe) => {
                return Err(format!("{what}: failure reported with unknown={unknown}, planned {:?}", e.args.kind));
            }
            _ => {}
        }
        // A failure after the effect left the effect in the world, reported unknown.
        let acted_unknown = e.failed == Some(true) && e.args.kind.acts();
        if exec != usize::from(e.executed.is_some()) + usize::from(acted_unknown) {
            return Err(format!(
                "{what}: executed {exec} times in the world, ledger says executed={}",
                e.executed.is_some()
            ));
        }
        if release != 0 {
            return Err(format!("{what}: an eager effect was released"));
        }
        let comp_ok = e.compensations.iter().filter(|(ok, _)| *ok).count();
        // A call whose outcome stayed unknown is compensated blind (it may have executed).
        let may_have_executed = exec + usize::from(e.failed == Some(true));
        if comp != comp_ok || comp > may_have_executed {
            return Err(format!(
                "{what}: compensated {comp} times in the world, {comp_ok} in the ledger, executed {exec}"
            ));
        }
        for (ok, residue) in &e.compensations {
            // A late call of a tool without a handler is "compensated" with a recorded failure.
            if !spec.compensable {
                if *ok {
                    return Err(format!("{what}: compensated although its tool has no compensation handler"));
                }
                continue;
            }
            if *ok != reference::compensation_succeeds(e.args.comp_fails) {
                return Err(format!("{what}: compensation ok={ok} but planned to fail {} times", e.args.comp_fails));
            }
            let blind = e.failed == Some(true);
            if blind && *ok && !residue.as_deref().is_some_and(|r| r.contains("outcome was unknown")) {
                return Err(format!("{what}: a blind compensation without its note: {residue:?}"));
            }
            if *ok && !blind && residue.is_some() != spec.residue {
                return Err(format!(
                    "{what}: compensation residue {residue:?} from a tool with residue={}",
                    spec.residue
                ));
            }
        }
    } else {
        if exec != 0 || comp != 0 {
            return Err(format!("{what}: a held effect executed eagerly or was compensated"));
        }
        if !committed && release != 0 {
            return Err(format!("{what}: externalised although its transaction aborted"));
        }
        if let Some(ok) = e.released {
            if ok != reference::release_succeeds(e.args.fails, e.args.kind, spec.probe) {
                return Err(format!("{what}: release ok={ok} but planned {} {:?} failures", e.args.fails, e.args.kind));
            }
            if e.release_unknown != (!ok && reference::failure_unknown(e.args.kind, spec.probe)) {
                return Err(format!(
                    "{what}: release reported unknown={} for planned {:?}",
                    e.release_unknown, e.args.kind
                ));
            }
        }
        let acted_unknown = e.release_unknown && e.args.kind.acts();
        if release != usize::from(e.released == Some(true)) + usize::from(acted_unknown) {
            return Err(format!("{what}: externalised {release} times, ledger says released={:?}", e.released));
        }
    }
    if committed {
        let expected_ok = match e.class {
            EffectClass::Bufferable => matches!((disp, tag), (Disposition::Applied, Tag::Clean)),
            EffectClass::Gated => matches!((disp, tag), (Disposition::Fired, Tag::Clean)),
            _ => matches!((disp, tag), (Disposition::Accepted, Tag::Clean)),
        };
        // A release that failed, or was never attempted after one that failed; a release whose
        // outcome is unknown may have left, so it keeps the commit and needs an operator.
        let partial = !e.class.executes_eagerly()
            && match (disp, tag) {
                (Disposition::ReleaseFailed, Tag::PartialCommit) => e.released == Some(false) && !e.release_unknown,
                (Disposition::NotReleased, Tag::PartialCommit) => e.released.is_none(),
                (Disposition::Unknown, Tag::Unresolved) => e.released == Some(false) && e.release_unknown,
                _ => false,
            };
        if !(expected_ok || partial) {
            return Err(format!("{what}: settled {disp:?}/{tag} in a committed transaction"));
        }
        if e.class.executes_eagerly() && (comp != 0 || exec != 1) {
            return Err(format!("{what}: executed {exec} and compensated {comp} times, yet its transaction committed"));
        }
        if expected_ok && !e.class.executes_eagerly() && release != 1 {
            return Err(format!("{what}: settled {disp:?} but reached the world {release} times"));
        }
        return Ok(());
    }
    // Aborted.
    if !e.class.executes_eagerly() {
        if release != 0 {
            return Err(format!("{what}: externalised although its transaction aborted"));
        }
        return match (disp, tag) {
            (Disposition::Discarded | Disposition::ReleaseFailed, Tag::Clean) => Ok(()),
            _ => Err(format!("{what}: a held effect of an aborted transaction settled {disp:?}/{tag}")),
        };
    }
    if exec == 1 && comp == 0 && *tag == Tag::Clean {
        return Err(format!("{what}: executed, never compensated, yet tagged clean ({disp:?})"));
    }
    // Whenever it executed, even after the abort was decided (and even if its outcome came back
    // unknown: compensated blind), an undoable effect is undone.
    if exec == 1 && comp == 0 && spec.compensable && reference::compensation_succeeds(e.args.comp_fails) {
        return Err(format!("{what}: executed for an aborted transaction and never compensated ({disp:?}/{tag})"));
    }
    match (disp, tag) {
        (Disposition::Compensated, t) => {
            // A blind compensation (the call's outcome stayed unknown) is never clean.
            let blind = e.failed == Some(true);
            let want = if spec.residue || blind { Tag::Unresolved } else { Tag::Clean };
            if comp != 1 || *t != want {
                return Err(format!(
                    "{what}: settled Compensated/{t} but compensated {comp} times (residue tool: {})",
                    spec.residue
                ));
            }
        }
        (Disposition::Discarded, Tag::Clean) => {
            if exec != 0 {
                return Err(format!("{what}: discarded but it executed"));
            }
        }
        (Disposition::CompensationFailed, Tag::Unresolved) => {
            if reference::compensation_succeeds(e.args.comp_fails) {
                return Err(format!("{what}: compensation failed although planned to succeed"));
            }
        }
        (Disposition::NotCompensable | Disposition::Unknown, Tag::Unresolved) => {}
        _ => return Err(format!("{what}: an executed effect of an aborted transaction settled {disp:?}/{tag}")),
    }
    Ok(())
}

/// Whether an abort reason is one the schedule can justify.
fn check_reason(id: TxId, t: &LTx, rec: &TxRec, groups: &[GroupRec], txs: &BTreeMap<TxId, LTx>) -> Result<(), String> {
    let Some(reason) = t.reason() else { return Err(format!("{id} aborted without a reason")) };
    let ok = match reason {
        AbortReason::ToolFailed { tool, .. } | AbortReason::ToolUnavailable { tool, .. } => {
            t.effects.iter().any(|e| e.failed.is_some() && e.tool == *tool)
        }
        AbortReason::ReleaseFailed { tool, .. } => {
            t.decisions.first().is_some_and(|(c, _, _)| *c)
                && t.effects
                    .iter()
                    .find(|e| e.released.is_some())
                    .is_some_and(|e| e.released == Some(false) && !e.release_unknown && e.tool == *tool)
        }
        AbortReason::Vetoed { hook, .. } => rec.veto && hook == "policy",
        AbortReason::LostBranch { winner } => {
            groups.iter().any(|g| g.chosen == Some(*winner) && g.branches.contains(&id) && *winner != id)
        }
        // Checked against the reference versions in `check_decisions`.
        AbortReason::StaleRead { .. } => true,
        // Checked against the dirty marks and held writes in `check_decisions`.
        AbortReason::LockConflict { .. } => true,
        // Every read and effect renews the transaction's own lease.
        AbortReason::LeaseExpired => rec.longest_idle().is_none_or(|idle| idle >= rec.lease),
        AbortReason::WaitTimeout => rec.wait_timeout,
        AbortReason::ProtocolViolation { .. } => rec.violated,
        AbortReason::Explicit { .. } => rec.aborted_by_agent,
        // L2: the predecessor's commit was retracted, and this transaction read a scope that
        // commit wrote before the retraction's fresh version (the version each read recorded,
        // including the one just below an unreleased commit's stamp, is checked exactly in
        // `check_decisions`).
        // Or a compensation of one of its effects after it settled (`touched`) wrote a scope
        // this transaction had read.
        AbortReason::CascadingAbort { predecessor } => txs.get(predecessor).is_some_and(|p| {
            let retracted = match (p.stamp(), p.retract_stamp) {
                (Some(_), Some(retracted)) => {
                    t.reads.iter().any(|(s, v)| *v < retracted && p.writes().iter().any(|w| reference::overlaps(w, s)))
                }
                _ => false,
            };
            let touched = p.touches.iter().any(|(stamp, scopes, _)| {
                t.reads.iter().any(|(s, v)| v < stamp && scopes.iter().any(|w| reference::overlaps(w, s)))
            });
            retracted || touched
        }),
        other => return Err(format!("{id} aborted for a reason this model does not know: {other}")),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{id} aborted as `{reason}` without cause (agent record: idle {:?} of lease {:?}, aborted_by_agent {}, \
             violated {}, veto {}, wait_timeout {})",
            rec.longest_idle(),
            rec.lease,
            rec.aborted_by_agent,
            rec.violated,
            rec.veto,
            rec.wait_timeout
        ))
    }
}

fn check(h: &History) -> Result<Coverage, String> {
    if let Some(p) = h.problems.first() {
        return Err(format!("{p} ({} problems in all)", h.problems.len()));
    }
    let txs = parse_ledger(&h.events)?;
    let mut cov = Coverage::default();
    cov.add("schedules", 1);
    cov.add("sibling eager writes refused", h.sibling_refusals);
    if h.ordering == Ordering::FirstCommitterWins {
        cov.add("schedules:first_committer_wins", 1);
    }

    // The engine's counters agree with the ledger, and nothing is left unfinished.
    if let Some((id, t)) = txs.iter().find(|(_, t)| t.settled.is_none()) {
        return Err(format!("{id} never settled: {t:?}"));
    }
    let committed = txs.values().filter(|t| t.committed()).count() as u64;
    let settled = txs.values().filter(|t| t.settled.is_some()).count() as u64;
    if h.stats != (0, committed, settled - committed) {
        return Err(format!(
            "engine stats (unfinished, committed, aborted) = {:?}, ledger says (0, {committed}, {})",
            h.stats,
            settled - committed
        ));
    }

    check_decisions(h, &txs)?;
    check_cells(h, &txs, &mut cov)?;

    // The world, by effect.
    let mut hits: HashMap<(u64, &'static str), usize> = HashMap::new();
    for hit in &h.world {
        let k = match hit.kind {
            HitKind::Exec => "exec",
            HitKind::Apply | HitKind::Fire => "release",
            HitKind::Compensate => "comp",
        };
        *hits.entry((hit.uid, k)).or_insert(0) += 1;
    }
    let mut owner: HashMap<u64, Vec<(TxId, usize, bool)>> = HashMap::new();
    for (id, t) in &txs {
        let disp = t.settled.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
        for (i, e) in t.effects.iter().enumerate() {
            owner.entry(e.args.uid).or_default().push((
                *id,
                i,
                matches!(disp.get(i), Some((Disposition::Replayed, _))),
            ));
        }
    }
    for hit in &h.world {
        if !owner.contains_key(&hit.uid) {
            return Err(format!(
                "the world saw {:?} of `{}` #{} which the engine never recorded",
                hit.kind, hit.tool, hit.uid
            ));
        }
    }
    for (uid, v) in &owner {
        if v.iter().filter(|(_, _, replayed)| !replayed).count() > 1 {
            return Err(format!("call #{uid} was recorded as a new effect more than once: {v:?}"));
        }
    }
    for ((uid, k), n) in &hits {
        if *n > 1 {
            return Err(format!("call #{uid} reached the world {n} times as `{k}`: an effect externalised twice"));
        }
    }

    // Every transaction.
    let recs: HashMap<TxId, &TxRec> = h.txs.iter().map(|r| (r.tx, r)).collect();
    let position = |uid: u64, kinds: &[HitKind]| h.world.iter().position(|x| x.uid == uid && kinds.contains(&x.kind));
    let mut decided = Vec::new();
    for (id, t) in &txs {
        let Some((committed, disp)) = &t.settled else { continue };
        let rec = recs.get(id).ok_or_else(|| format!("{id} is in the ledger but no agent began it"))?;
        if disp.len() != t.effects.len() {
            return Err(format!("{id} settled {} effects but recorded {}", disp.len(), t.effects.len()));
        }
        match t.decisions.as_slice() {
            [(c, _, _)] if c == committed => {}
            [(true, _, _), (false, _, Some(AbortReason::ReleaseFailed { .. }))] if !committed => {}
            other => return Err(format!("{id} settled committed={committed} after decisions {other:?}")),
        }
        if let Some(o) = &rec.outcome {
            let told: Vec<(Disposition, Tag)> = o.effects.iter().map(|e| (e.disposition.clone(), e.tag)).collect();
            if o.committed != *committed || told != *disp || o.tx != *id || o.reason.as_ref() != t.reason() {
                return Err(format!(
                    "{id}: the agent was told {o:?}, the ledger settled committed={committed} {disp:?} ({:?})",
                    t.reason()
                ));
            }
            // A partial commit names what left, what failed and what was never attempted.
            let released: Vec<u32> = (0..t.effects.len() as u32)
                .filter(|&i| {
                    disp[i as usize].0 != Disposition::ReleaseFailed && t.effects[i as usize].released == Some(true)
                })
                .collect();
            let failed = t.effects.iter().position(|e| e.released == Some(false));
            let partial =
                o.partial.as_ref().map(|p| (p.released.iter().map(|e| e.0).collect::<Vec<_>>(), p.failed.0 as usize));
            let expected = (*committed && failed.is_some()).then(|| (released, failed.unwrap_or_default()));
            if partial != expected {
                return Err(format!("{id}: partial-commit record {:?}, the ledger says {expected:?}", o.partial));
            }
        }
        if rec.group != t.group {
            return Err(format!(
                "{id}: agent {} ran it in group {:?}, the ledger says {:?}",
                rec.agent, rec.group, t.group
            ));
        }
        for read in &rec.reads {
            if !t.reads.contains(read) {
                return Err(format!("{id}: the agent read {read:?} but the ledger has {:?}", t.reads));
            }
        }
        // What the agent was told about each call matches what happened.
        for c in &rec.calls {
            let recorded = t.effects.iter().find(|e| e.args.uid == c.uid);
            let told_ok = match &c.result {
                CallResult::Executed { out, .. } => {
                    *out == c.uid
                        && hits.get(&(c.uid, "exec")) == Some(&1)
                        && recorded.is_some_and(|e| e.executed.is_some())
                }
                CallResult::Replayed { out, .. } => hits.get(&(*out, "exec")) == Some(&1),
                CallResult::Staged { .. } => recorded.is_some_and(|e| e.class == EffectClass::Bufferable),
                CallResult::Queued { .. } => recorded.is_some_and(|e| e.class == EffectClass::Gated),
                CallResult::Refused | CallResult::Failed => true,
            };
            if !told_ok {
                return Err(format!(
                    "{id}: agent {} was told {:?} for call #{}, which the ledger and world contradict",
                    rec.agent, c.result, c.uid
                ));
            }
        }
        for (i, e) in t.effects.iter().enumerate() {
            check_effect(*id, i, e, *committed, &disp[i], &hits)?;
        }
        if *committed {
            cov.add("committed", 1);
            // Held effects reach the world in issuance order.
            let order: Vec<usize> =
                t.effects.iter().filter_map(|e| position(e.args.uid, &[HitKind::Apply, HitKind::Fire])).collect();
            if order.windows(2).any(|w| w[0] > w[1]) {
                return Err(format!("{id}: held effects were released out of issuance order"));
            }
            // Releases stop at the first that fails for good.
            if let Some(f) = t.effects.iter().position(|e| e.released == Some(false))
                && let Some(later) = t.effects[f + 1..].iter().find(|e| e.release_started)
            {
                return Err(format!(
                    "{id}: release of #{} was attempted after #{} failed for good",
                    later.args.uid, t.effects[f].args.uid
                ));
            }
            if disp.iter().any(|(_, tag)| *tag == Tag::PartialCommit) {
                cov.add("partial_commits", 1);
            }
            cov.add("unknown_release_outcomes", t.effects.iter().filter(|e| e.release_unknown).count() as u64);
            // A replay stands for an effect that still stands.
            for (i, e) in t.effects.iter().enumerate() {
                if disp[i].0 != Disposition::Replayed {
                    continue;
                }
                let out = e.executed.as_ref().and_then(|v| v["u"].as_u64()).unwrap_or(0);
                // (A call repeated with its key carries the first call's arguments and uid.)
                let executed_elsewhere =
                    owner.get(&e.args.uid).is_some_and(|v| v.iter().any(|(t, _, replayed)| t != id && !replayed));
                if out != e.args.uid || executed_elsewhere {
                    cov.add("cross_tx_replays", 1);
                }
                let (x, c) = (hits.get(&(out, "exec")).copied(), hits.get(&(out, "comp")).copied());
                if x != Some(1) || c.is_some() {
                    return Err(format!(
                        "{id}#{i} committed a replay of call #{out} (key {:?}), which executed {x:?} times and was \
                         compensated {c:?} times: the replayed outcome does not stand",
                        e.args.key
                    ));
                }
            }
        } else {
            check_reason(*id, t, rec, &h.groups, &txs)?;
            cov.add(format!("aborted:{}", t.reason().map_or("none", AbortReason::kind)), 1);
            // Compensations run last-issued first (calls that returned after the abort was
            // decided are compensated when they return, outside that order).
            let order: Vec<usize> = t
                .effects
                .iter()
                .enumerate()
                .filter(|(i, e)| disp[*i].0 == Disposition::Compensated && !e.returned_after_abort)
                .filter_map(|(_, e)| position(e.args.uid, &[HitKind::Compensate]))
                .collect();
            if order.windows(2).any(|w| w[0] < w[1]) {
                return Err(format!("{id}: compensations did not run in reverse issuance order"));
            }
            for (i, e) in t.effects.iter().enumerate() {
                if let (Some(c), Some(x)) =
                    (position(e.args.uid, &[HitKind::Compensate]), position(e.args.uid, &[HitKind::Exec]))
                    && c < x
                {
                    return Err(format!("{id}#{i}: compensated before it executed"));
                }
            }
        }
        for (e, (d, _)) in t.effects.iter().zip(disp) {
            if *d == Disposition::Compensated && e.failed == Some(true) {
                cov.add("blind_compensations", 1);
            }
            if e.args.kind.acts() && e.args.fails > 0 && (e.failed.is_some() || e.executed.is_some()) {
                cov.add("failures_after_the_effect", 1);
            }
        }
        if rec.dropped {
            cov.add("dropped_futures", 1);
        }
        for (d, _) in disp {
            match d {
                Disposition::CompensationFailed => cov.add("compensation_failed", 1),
                Disposition::Unknown => cov.add("unknown_outcomes", 1),
                Disposition::NotCompensable => cov.add("not_compensable", 1),
                _ => {}
            }
        }
        if let Some(stamp) = t.stamp() {
            decided.push(reference::Decided {
                label: id.to_string(),
                stamp,
                reads: t.reads.clone(),
                writes: t.writes(),
                phantom: !committed,
            });
        }
        if let Some(stamp) = t.retract_stamp {
            decided.push(reference::Decided {
                label: format!("retraction of {id}"),
                stamp,
                reads: Vec::new(),
                writes: t.writes(),
                phantom: true,
            });
        }
        if let Some(stamp) = t.abort_stamp {
            decided.push(reference::Decided {
                label: format!("compensations of {id}"),
                stamp,
                reads: Vec::new(),
                writes: t.dirty_scopes(usize::MAX),
                phantom: true,
            });
        }
        for (stamp, scopes, done) in &t.touches {
            cov.add("late compensations touched", 1);
            decided.push(reference::Decided {
                label: format!("late compensation of {id} ({})", if *done { "done" } else { "started" }),
                stamp: *stamp,
                reads: Vec::new(),
                writes: scopes.clone(),
                phantom: true,
            });
        }
    }
    for r in &h.txs {
        if !txs.contains_key(&r.tx) {
            return Err(format!("the agent began {} but the ledger never heard of it", r.tx));
        }
    }

    // Serialisability of what committed.
    reference::serial_replay(&decided)?;
    if let Some(cycle) = reference::conflict_cycle(&decided) {
        return Err(format!("conflict cycle among committed transactions: {}", cycle.join(" -> ")));
    }

    // Speculation: at most one branch commits, and only the chosen one.
    let mut by_group: HashMap<u64, Vec<TxId>> = HashMap::new();
    for (id, t) in &txs {
        if let Some(g) = t.group {
            by_group.entry(g).or_default().push(*id);
        }
    }
    for (g, branches) in &by_group {
        let winners: Vec<&TxId> = branches.iter().filter(|b| txs.get(b).is_some_and(LTx::committed)).collect();
        let rec = h.groups.iter().find(|r| r.group == *g);
        if winners.len() > 1 {
            return Err(format!("group {g}: branches {winners:?} all committed"));
        }
        if let Some(w) = winners.first() {
            cov.add("group_commits", 1);
            if rec.is_none_or(|r| r.chosen != Some(**w)) {
                return Err(format!("group {g}: {w} committed but the controller chose {:?}", rec.map(|r| r.chosen)));
            }
        }
        if rec.is_some_and(|r| r.aborted_by_agent && r.chosen.is_none()) {
            cov.add("group_aborts", 1);
            if !winners.is_empty() {
                return Err(format!("group {g}: aborted by its controller, yet {winners:?} committed"));
            }
        }
    }

    // Idempotency keys: never executed twice without a compensation in between.
    let mut outstanding: HashMap<&str, u64> = HashMap::new();
    for hit in &h.world {
        let Some(k) = hit.key.as_deref() else { continue };
        match hit.kind {
            HitKind::Exec => {
                if let Some(prev) = outstanding.insert(k, hit.uid) {
                    return Err(format!(
                        "key `{k}` executed by #{prev} and again by #{} with no compensation between",
                        hit.uid
                    ));
                }
            }
            HitKind::Compensate => {
                outstanding.remove(k);
            }
            HitKind::Apply | HitKind::Fire => {}
        }
    }

    // In epoch order, held effects of overlapping commits reach the world in commit order.
    let stamp_of: HashMap<u64, (u64, TxId)> = txs
        .iter()
        .filter(|(_, t)| t.committed())
        .flat_map(|(id, t)| t.effects.iter().map(move |e| (e.args.uid, (t.stamp().unwrap_or(0), *id))))
        .collect();
    let releases: Vec<(&Hit, u64, TxId)> = h
        .world
        .iter()
        .filter(|x| matches!(x.kind, HitKind::Apply | HitKind::Fire))
        .filter_map(|x| stamp_of.get(&x.uid).map(|&(s, id)| (x, s, id)))
        .collect();
    for (a, &(ha, sa, ida)) in releases.iter().enumerate() {
        for &(hb, sb, idb) in &releases[a + 1..] {
            if sb < sa && ha.scopes.iter().any(|x| hb.scopes.iter().any(|y| reference::overlaps(x, y))) {
                return Err(format!(
                    "#{} of {ida} (stamp {sa}) reached the world before #{} of {idb} (stamp {sb}) on overlapping \
                     scopes: releases out of commit order ({:?})",
                    ha.uid, hb.uid, h.ordering
                ));
            }
        }
    }
    Ok(cov)
}

// ---------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        }
        Err(_) => default,
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Keeps the panics the schedules inject out of the test output (every other panic prints).
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            if !text.is_some_and(|t| t.starts_with(INJECTED)) {
                previous(info);
            }
        }));
    });
}

/// Runs `n` schedules from `base` on a few threads (each schedule on its own current-thread
/// runtime); returns the merged coverage or the first failing seed with its message.
fn run_schedules(base: u64, n: u64) -> Result<Coverage, (u64, String)> {
    let threads = std::thread::available_parallelism().map_or(2, |p| p.get()).clamp(1, 4) as u64;
    let next = AtomicU64::new(0);
    let failure: Mutex<Option<(u64, String)>> = Mutex::new(None);
    let total = Mutex::new(Coverage::default());
    std::thread::scope(|s| {
        for _ in 0..threads.min(n.max(1)) {
            s.spawn(|| {
                let mut cov = Coverage::default();
                loop {
                    let i = next.fetch_add(1, AtomicOrdering::Relaxed);
                    if i >= n || failure.lock().is_some() {
                        break;
                    }
                    let seed = base.wrapping_add(i);
                    let result = std::panic::catch_unwind(AssertUnwindSafe(|| run_schedule(seed)))
                        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
                    match result {
                        Ok(c) => cov.merge(&c),
                        Err(msg) => {
                            let mut f = failure.lock();
                            if f.as_ref().is_none_or(|(s, _)| seed < *s) {
                                *f = Some((seed, msg));
                            }
                            break;
                        }
                    }
                }
                total.lock().merge(&cov);
            });
        }
    });
    match failure.into_inner() {
        Some(f) => Err(f),
        None => Ok(total.into_inner()),
    }
}

#[test]
fn random_schedules_match_the_serial_reference_model() {
    quiet_injected_panics();
    let n = env_u64("TIDEGATE_SCHEDULES", DEFAULT_SCHEDULES);
    let base = env_u64("TIDEGATE_SEED", DEFAULT_SEED);
    let started = std::time::Instant::now();
    let cov = match run_schedules(base, n) {
        Ok(cov) => cov,
        Err((seed, msg)) => panic!(
            "schedule with seed {seed} broke the reference model:\n{msg}\n\nreplay it with:\n  \
             TIDEGATE_SEED={seed} TIDEGATE_SCHEDULES=1 cargo test -p tidegate-runtime --test model \
             random_schedules -- --nocapture"
        ),
    };
    println!("{n} schedules from seed {base} in {:.1?}; coverage:", started.elapsed());
    for (k, v) in &cov.0 {
        println!("  {k:<45} {v}");
    }
    assert_eq!(cov.get("schedules"), n);
    if n >= 2_000 {
        // The generator must keep exercising every rule; a drift that stops covering one of
        // them would make the checks above vacuous.
        for what in [
            "committed",
            "partial_commits",
            "unknown_release_outcomes",
            "cross_tx_replays",
            "compensation_failed",
            "unknown_outcomes",
            "not_compensable",
            "group_commits",
            "group_aborts",
            "schedules:first_committer_wins",
            "blind_compensations",
            "failures_after_the_effect",
            "dropped_futures",
            "aborted:tool_failed",
            "aborted:tool_unavailable",
            "aborted:release_failed",
            "aborted:vetoed",
            "aborted:lost_branch",
            "aborted:stale_read",
            "aborted:lease_expired",
            "aborted:wait_timeout",
            "aborted:protocol_violation",
            "aborted:explicit",
            "sibling eager writes refused",
        ] {
            assert!(cov.get(what) > 0, "{n} schedules never exercised `{what}`: {cov:#?}");
        }
    }
}

/// Regression: under first-committer-wins a commit never waited, so a later commit's held
/// effect could reach the world while an earlier overlapping commit was still releasing its
/// own, and the world applied the two writes against their commit order. A decided commit now
/// waits for overlapping commits that are still releasing.
#[tokio::test(start_paused = true)]
async fn first_committer_wins_releases_overlapping_commits_in_commit_order() {
    let tg = Tidegate::builder().ordering(Ordering::FirstCommitterWins).build().unwrap();
    let world = World::default();
    let tools = world.tools().unwrap();
    let write = |uid, delay_ms| CallPlan {
        uid,
        tool: NOTE,
        scopes: vec![W1],
        key: None,
        fails: 0,
        kind: FailKind::Transient,
        comp_fails: 0,
        delay_ms,
    };
    let first = tg.begin("first").unwrap();
    first.call(&tools[NOTE], write(1, 10).args()).await.unwrap();
    first.seal().unwrap();
    let second = tg.begin("second").unwrap();
    second.call(&tools[NOTE], write(2, 0).args()).await.unwrap();
    second.seal().unwrap();
    let earlier = tokio::spawn(async move { first.commit().await });
    // The first commit is decided and its (slow) release is under way.
    tokio::task::yield_now().await;
    second.commit().await.unwrap();
    earlier.await.unwrap().unwrap();
    let order: Vec<u64> = world.log().iter().map(|h| h.uid).collect();
    assert_eq!(order, [1, 2], "the world applied the later commit's write first");
}

/// A call that returns while its transaction's abort is still running (here: a concurrent call
/// failed, and a slow compensation keeps the abort busy) is compensated late, but the abort
/// settles it as `NotCompensable` ("the effect stands") and remembers its adapter key as
/// executed: a later call with the key replays a charge that was refunded. The random schedules
/// find this about once in 600 000 schedules (e.g. `TIDEGATE_SEED=5579079 TIDEGATE_SCHEDULES=1`).
#[tokio::test(start_paused = true)]
async fn a_key_whose_call_returned_during_the_abort_is_not_replayed_after_its_compensation() {
    const CHARGE: usize = 4;
    const PING: usize = 5;
    // Below L3 concurrent calls run concurrently (at L3 the ping would wait for the charge).
    let tg = Tidegate::builder().level(tidegate_runtime::Level::L2).build().unwrap();
    let world = World::default();
    let tools = world.tools().unwrap();
    let call = |uid, tool: usize, fails, delay_ms| CallPlan {
        uid,
        tool,
        scopes: vec![W1],
        key: TOOLS[tool].keyed.then_some("pay-1"),
        fails,
        kind: FailKind::Hard,
        comp_fails: 0,
        delay_ms,
    };
    let tx = tg.begin("a").unwrap();
    // Its compensation takes 20 ms, which keeps the abort running ...
    tx.call(&tools[MODIFY], call(1, MODIFY, 0, 20).args()).await.unwrap();
    // ... while the charge, still in flight when the ping failed and aborted, returns.
    let (charge, ping) = futures::join!(
        tx.call(&tools[CHARGE], call(2, CHARGE, 0, 10).args()),
        tx.call(&tools[PING], call(3, PING, 1, 0).args())
    );
    assert!(charge.is_err() && ping.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refunded = world.log().iter().any(|h| h.uid == 2 && h.kind == HitKind::Compensate);
    assert!(refunded, "the late charge was compensated: {:?}", world.log());
    let again = tg.begin("b").unwrap().call(&tools[CHARGE], call(4, CHARGE, 0, 0).args()).await.unwrap();
    assert!(!matches!(again, Ack::Replayed { .. }), "the key replayed the refunded charge: {again:?}");
}

// ---------------------------------------------------------------------------------------------
// The checker must be able to fail: hand-made histories that break one rule each.
// ---------------------------------------------------------------------------------------------

/// Builds a history event by event, with matching agent records.
struct Synth {
    h: History,
    now: Instant,
}

impl Synth {
    fn new(ordering: Ordering) -> Synth {
        Synth { h: History { ordering, ..History::default() }, now: Instant::now() }
    }

    fn begin(&mut self, tx: u64, epoch: u64, may_touch: Option<&[&str]>, group: Option<u64>) {
        self.h.events.push(Event::Begin {
            tx: TxId(tx),
            epoch: tidegate_core::Epoch(epoch),
            agent: "synth".into(),
            group: group.map(tidegate_core::GroupId),
            may_touch: may_touch.map(|m| m.iter().map(|s| (*s).to_owned()).collect()),
            lease_until: Timestamp(0),
        });
        let mut rec = TxRec::new(TxId(tx), 0, group, Duration::from_secs(30));
        rec.touches = vec![self.now];
        rec.idle_from = Some(self.now);
        self.h.txs.push(rec);
    }

    fn read(&mut self, tx: u64, scope: &str, version: u64) {
        self.h.events.push(Event::Read { tx: TxId(tx), scope: scope.into(), version: tidegate_core::Version(version) });
    }

    /// Records effect `id` of tool `tool` (index into [`TOOLS`]) on `scope`; eager effects
    /// execute (and reach the world) at once.
    fn effect(&mut self, tx: u64, id: u32, tool: usize, scope: &'static str, uid: u64) {
        let spec = &TOOLS[tool];
        let plan = CallPlan {
            uid,
            tool,
            scopes: vec![scope],
            key: None,
            fails: 0,
            kind: FailKind::Transient,
            comp_fails: 0,
            delay_ms: 0,
        };
        self.h.events.push(Event::EffectRecorded {
            tx: TxId(tx),
            effect: tidegate_core::EffectId(id),
            tool: spec.name.into(),
            class: spec.class,
            scopes: vec![scope.into()],
            key: format!("{}:{uid}", spec.name).into(),
            args: Arc::new(plan.args()),
            compensable: spec.compensable,
            adapter_key: false,
            compensation: None,
        });
        if spec.class.executes_eagerly() {
            self.h.events.push(Event::EffectExecuted {
                tx: TxId(tx),
                effect: tidegate_core::EffectId(id),
                output: Arc::new(json!({"u": uid})),
            });
            self.hit(HitKind::Exec, tool, uid, scope);
        }
    }

    /// Releases held effect `id` at commit: it reaches the world.
    fn release(&mut self, tx: u64, id: u32, tool: usize, uid: u64, scope: &str) {
        let effect = tidegate_core::EffectId(id);
        self.h.events.push(Event::ReleaseStarted { tx: TxId(tx), effect });
        self.h.events.push(Event::Released {
            tx: TxId(tx),
            effect,
            output: Some(Arc::new(json!({"u": uid}))),
            error: None,
            unknown: false,
        });
        let kind = if TOOLS[tool].class == EffectClass::Gated { HitKind::Fire } else { HitKind::Apply };
        self.hit(kind, tool, uid, scope);
    }

    fn hit(&mut self, kind: HitKind, tool: usize, uid: u64, scope: &str) {
        self.h.world.push(Hit { kind, tool: TOOLS[tool].name, uid, key: None, scopes: vec![scope.to_owned()] });
    }

    fn seal(&mut self, tx: u64) {
        self.h.events.push(Event::Sealed { tx: TxId(tx) });
    }

    fn decide(&mut self, tx: u64, stamp: Option<u64>, reason: Option<AbortReason>) {
        if matches!(reason, Some(AbortReason::Explicit { .. }))
            && let Some(r) = self.h.txs.iter_mut().find(|r| r.tx == TxId(tx))
        {
            r.aborted_by_agent = true;
        }
        self.h.events.push(Event::Decided { tx: TxId(tx), commit: stamp.is_some(), stamp, reason, at: None });
    }

    fn settle(&mut self, tx: u64, committed: bool, effects: &[(Disposition, Tag)]) {
        self.h.events.push(Event::Settled {
            tx: TxId(tx),
            committed,
            effects: effects
                .iter()
                .enumerate()
                .map(|(i, (d, t))| (tidegate_core::EffectId(i as u32), d.clone(), *t))
                .collect(),
        });
        let (c, a) = (&mut self.h.stats.1, &mut self.h.stats.2);
        if committed {
            *c += 1;
        } else {
            *a += 1;
        }
    }

    fn explicit() -> Option<AbortReason> {
        Some(AbortReason::Explicit { reason: "synth".into() })
    }

    fn check(&self) -> Result<Coverage, String> {
        check(&self.h)
    }
}

const MODIFY: usize = 0;
const NOTE: usize = 2;
const EMAIL: usize = 3;
const W1: &str = "retail:order:W1";

/// T1 writes W1 and commits; T2 read W1 before that and commits too.
fn stale_read_history(commit_reader: bool) -> Synth {
    let mut s = Synth::new(Ordering::EpochOrder);
    s.begin(1, 1, Some(&[W1]), None);
    s.begin(2, 2, Some(&[W1]), None);
    s.read(2, W1, 0);
    s.effect(1, 0, MODIFY, W1, 1);
    s.seal(1);
    s.decide(1, Some(1), None);
    s.settle(1, true, &[(Disposition::Accepted, Tag::Clean)]);
    s.seal(2);
    if commit_reader {
        s.decide(2, Some(2), None);
        s.settle(2, true, &[]);
    } else {
        s.decide(2, None, Some(AbortReason::StaleRead { scope: W1.into(), read: 0, current: 1 }));
        s.settle(2, false, &[]);
    }
    s
}

#[test]
fn the_checker_accepts_a_history_that_keeps_every_rule() {
    let s = stale_read_history(false);
    assert!(s.check().is_ok(), "{:?}", s.check());
}

#[test]
fn the_checker_rejects_a_committed_stale_read() {
    let err = stale_read_history(true).check().unwrap_err();
    assert!(err.contains("stale read"), "{err}");
}

#[test]
fn the_checker_rejects_a_commit_that_overtakes_an_earlier_overlapping_transaction() {
    let mut s = Synth::new(Ordering::EpochOrder);
    s.begin(1, 1, Some(&["retail:order"]), None);
    s.begin(2, 2, Some(&[W1]), None);
    s.effect(2, 0, EMAIL, W1, 1);
    s.seal(2);
    s.decide(2, Some(1), None);
    s.release(2, 0, EMAIL, 1, W1);
    s.settle(2, true, &[(Disposition::Fired, Tag::Clean)]);
    s.decide(1, None, Synth::explicit());
    s.settle(1, false, &[]);
    let err = s.check().unwrap_err();
    assert!(err.contains("commit predicate"), "{err}");
    // Under first-committer-wins the same history is fine.
    s.h.ordering = Ordering::FirstCommitterWins;
    assert!(s.check().is_ok(), "{:?}", s.check());
}

#[test]
fn the_checker_rejects_a_gated_effect_fired_for_an_aborted_transaction() {
    let mut s = Synth::new(Ordering::EpochOrder);
    s.begin(1, 1, None, None);
    s.effect(1, 0, EMAIL, W1, 1);
    s.effect(1, 1, NOTE, W1, 2);
    s.decide(1, None, Synth::explicit());
    s.hit(HitKind::Fire, EMAIL, 1, W1);
    s.settle(1, false, &[(Disposition::Discarded, Tag::Clean), (Disposition::Discarded, Tag::Clean)]);
    let err = s.check().unwrap_err();
    assert!(err.contains("externalised although its transaction aborted"), "{err}");
}

#[test]
fn the_checker_rejects_an_executed_effect_left_uncompensated_but_tagged_clean() {
    let mut s = Synth::new(Ordering::EpochOrder);
    s.begin(1, 1, None, None);
    s.effect(1, 0, MODIFY, W1, 1);
    s.decide(1, None, Synth::explicit());
    s.settle(1, false, &[(Disposition::Compensated, Tag::Clean)]);
    let err = s.check().unwrap_err();
    assert!(err.contains("never compensated, yet tagged clean"), "{err}");
}

#[test]
fn the_checker_rejects_an_effect_externalised_twice() {
    let mut s = Synth::new(Ordering::EpochOrder);
    s.begin(1, 1, None, None);
    s.effect(1, 0, MODIFY, W1, 1);
    s.hit(HitKind::Exec, MODIFY, 1, W1);
    s.seal(1);
    s.decide(1, Some(1), None);
    s.settle(1, true, &[(Disposition::Accepted, Tag::Clean)]);
    let err = s.check().unwrap_err();
    assert!(err.contains("externalised twice"), "{err}");
}

#[test]
fn the_checker_rejects_two_committed_branches_of_one_group() {
    let mut s = Synth::new(Ordering::EpochOrder);
    s.begin(1, 1, None, Some(1));
    s.begin(2, 1, None, Some(1));
    s.h.groups.push(GroupRec {
        group: 1,
        branches: vec![TxId(1), TxId(2)],
        chosen: Some(TxId(1)),
        aborted_by_agent: false,
    });
    for tx in [1, 2] {
        s.seal(tx);
        s.decide(tx, Some(tx), None);
        s.settle(tx, true, &[]);
    }
    let err = s.check().unwrap_err();
    assert!(err.contains("all committed"), "{err}");
}

#[test]
fn the_checker_rejects_a_conflict_cycle_among_commits() {
    // Write skew: each reads what the other writes, both commit; neither read is stale at
    // its own commit only because the versions were forged.
    let decided = vec![
        reference::Decided {
            label: "A".into(),
            stamp: 1,
            reads: vec![("retail:order:W2".into(), 0)],
            writes: vec![W1.into()],
            phantom: false,
        },
        reference::Decided {
            label: "B".into(),
            stamp: 2,
            reads: vec![(W1.into(), 0)],
            writes: vec!["retail:order:W2".into()],
            phantom: false,
        },
    ];
    assert!(reference::conflict_cycle(&decided).is_some());
    assert!(reference::serial_replay(&decided).is_err());
    assert!(reference::conflict_cycle(&decided[..1]).is_none());
}

#[test]
fn reference_scopes_overlap_by_segment_prefix_and_wildcard() {
    use reference::{covers, overlaps};
    assert!(overlaps("retail:order", "retail:order:W1:lines"));
    assert!(overlaps("retail:order:*:lines", "retail:order:W2"));
    assert!(!overlaps("retail:order:*:lines", "retail:order:W2:status"));
    assert!(!overlaps("retail:order:W1", "retail:order:W10"));
    assert!(!overlaps("retail:order:W1", "mail:order:W1"));
    assert!(covers("retail:order:*", "retail:order:*:lines"));
    assert!(!covers("retail:order:W1", "retail:order:*:lines"));
    assert!(!covers("retail:order:W1:lines", "retail:order:W1"));
    let mut v = reference::Versions::default();
    v.write("retail:order:W1:lines", 3);
    v.write("retail:order:W2", 4);
    assert_eq!((v.version("retail:order:W1"), v.version("retail:order"), v.version("retail:payment:P1")), (3, 4, 0));
}
