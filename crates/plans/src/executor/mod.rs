//! The executor: a projection folded from plan facts and engine observations, and the
//! deterministic step function `decide(now)` that turns it into new facts and dispatches
//! (docs/plans.md, "Invariants" and "Key operations").
//!
//! This file owns the projection's data: the [`Executor`] and the plans, registrations,
//! triggers, atoms and timers it holds, with its constructor and counters. Each way of reading
//! or changing it has a file of its own:
//!
//! - `command.rs`: the commands (`open`, `begin_step`, `arm`, `commit`, `signal`, `verdict`,
//!   `resolve`, `start`): validate against the projection, apply the fact, return it.
//! - `fold.rs`: `apply` / `apply_fact`, the one path by which a plan fact changes the
//!   projection, whether a command made it, `decide` did, or a rebuild read it from the log.
//! - `observe.rs`: engine facts (`Observation`): registrations, forward outcomes, settlements.
//! - `trigger.rs`: predicate triggers and their atoms: arming, setting, evaluating.
//! - `decide.rs`: `decide(now)`, the step function: fire due timers, then pick each plan's
//!   next move until it must wait.
//! - `action.rs`: the dispatches a decision asks for and the facts that record their results.
//! - `view.rs`: what the API reads (`PlanView`, `PlanDetail`, the stuck queue).
//! - `snapshot.rs`: the versioned binary snapshot and the checks on a decoded one.
//!
//! ```text
//!  command ─────────────► fact ──┐
//!  decide(now) ─────────► facts ─┤
//!  dispatch result ─────► fact ──┼─► fold ─────┐
//!  log entry (plan fact) ────────┘             ├─► projection ─► decide, views, snapshot
//!  engine fact, log entry (engine) ─► observe ─┘
//! ```

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fact::{Cause, EffectId, Outcome, PlanId, Seq, StuckReason, TxId, Verdict};
use crate::predicate::{Atom, Node, Predicate, Tri};
use crate::wheel::Wheel;

mod action;
mod command;
mod decide;
mod fold;
mod observe;
mod snapshot;
mod trigger;
mod view;

pub use action::{Action, CallOutcome, Decision, DispatchKey, DispatchRequest, Operation};
pub use decide::resolve_args;
pub use snapshot::PLAN_SNAPSHOT_VERSION;
pub use view::{PlanDetail, PlanView, RegistrationView, TriggerView};

/// The forward state of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Forward {
    /// Recorded, no result yet.
    Pending,
    /// Executed, or released at commit.
    Externalised,
    /// Known never to have left the process.
    NotApplied,
    /// Its outcome is unknown.
    InDoubt,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum RegState {
    Held,
    InFlight(u64),
    InDoubt { probe_unknown: bool },
    Failed(String),
    Done,
    Skipped,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reg {
    tx: TxId,
    effect: EffectId,
    tool: Box<str>,
    key: Box<str>,
    /// JSON text: a parsed tree costs ten times the memory, and is only needed when firing.
    args: Box<str>,
    output: Option<Box<str>>,
    descriptor: Option<Box<str>>,
    /// The forward effect's canonical scopes (what its compensation writes).
    scopes: Box<[Box<str>]>,
    /// `PROBE` and `FORWARD_PROBE` bits of the descriptor.
    probes: u8,
    held: bool,
    forward: Forward,
    fwd_probe: Option<Option<bool>>,
    verdict: Option<Verdict>,
    state: RegState,
    attempts: u32,
}

/// The state of a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Running steps.
    Open,
    /// Failed; unwinding at this cascade depth.
    Failing {
        /// Cascade depth.
        depth: u32,
    },
    /// Waiting for its owner.
    Stuck {
        /// Why.
        reason: StuckReason,
        /// Depth of the unwind it stopped (0 for an open plan).
        depth: u32,
        /// Whether it was open (a verdict's compensation stopped) rather than unwinding.
        was_open: bool,
    },
    /// Finished.
    Ended(Outcome),
}

impl Status {
    fn name(&self) -> String {
        match self {
            Status::Open => "open".into(),
            Status::Failing { .. } => "failing".into(),
            Status::Stuck { .. } => "stuck".into(),
            Status::Ended(o) => format!("ended ({o:?})").to_lowercase(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Trigger {
    #[serde(with = "crate::executor::snapshot::as_json")]
    predicate: Predicate,
    node: Node,
    atoms: Vec<usize>,
    fired: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct AtomSlot {
    plan: PlanId,
    trigger: u32,
    atom: Atom,
    value: Tri,
    witness: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    owner: Box<str>,
    deadline_ms: Option<u64>,
    cascade_limit: u32,
    opening: u32,
    #[serde(with = "crate::executor::snapshot::status")]
    status: Status,
    steps: Vec<TxId>,
    regs: Vec<Reg>,
    triggers: Vec<Trigger>,
    #[serde(with = "crate::executor::snapshot::as_json")]
    pending_fail: Option<(Cause, u32)>,
    /// The cause and depth of the last failure (for the API).
    #[serde(with = "crate::executor::snapshot::as_json")]
    failure: Option<(Cause, u32)>,
    force: bool,
    any_done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Timer {
    Deadline { plan: PlanId, opening: u32 },
    Atom(usize),
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct TxInfo {
    plan: PlanId,
    settled: Option<bool>,
}

/// One tenant's executor state and step function.
#[derive(Debug, Serialize, Deserialize)]
pub struct Executor {
    tenant: String,
    incarnation: u64,
    next_plan: PlanId,
    plans: PlanTable,
    txs: FxHashMap<TxId, TxInfo>,
    wheel: Wheel<Timer>,
    atoms: Vec<AtomSlot>,
    /// The registration of each effect of a step (its plan is the step's, in `txs`).
    by_effect: FxHashMap<(TxId, EffectId), Seq>,
    by_tagged: FxHashMap<(TxId, EffectId), Vec<usize>>,
    by_comp: FxHashMap<PlanId, Vec<usize>>,
    by_scope: FxHashMap<String, Vec<usize>>,
    /// Commits decided and not yet settled: their decision time (what their settlement is
    /// compared with) and the scopes they wrote.
    committing: FxHashMap<TxId, (u64, Vec<String>)>,
    /// `no_commit` atoms whose time passed while a commit decided before it was pending, by
    /// that commit: its settlement says whether they read false or true.
    blocked: FxHashMap<TxId, Vec<usize>>,
    agenda: BTreeSet<PlanId>,
    probing: FxHashSet<(PlanId, Seq)>,
    #[serde(with = "crate::executor::snapshot::as_json")]
    stuck: BTreeMap<PlanId, StuckReason>,
    held: usize,
}

/// Plans by id: ids are dense from 1 (`plan_opened` refuses any other), so a vector indexed
/// by `id - 1` replaces a hash map (no hashing, no rehash copies, replay touches memory in order).
#[derive(Debug, Default, Serialize, Deserialize)]
struct PlanTable(Vec<Plan>);

impl PlanTable {
    fn index(id: PlanId) -> Option<usize> {
        usize::try_from(id.checked_sub(1)?).ok()
    }
    fn get(&self, id: &PlanId) -> Option<&Plan> {
        self.0.get(Self::index(*id)?)
    }
    fn get_mut(&mut self, id: &PlanId) -> Option<&mut Plan> {
        let i = Self::index(*id)?;
        self.0.get_mut(i)
    }
    fn contains_key(&self, id: &PlanId) -> bool {
        self.get(id).is_some()
    }
    fn keys(&self) -> impl Iterator<Item = PlanId> + '_ {
        (1..=self.0.len() as PlanId).map(|i| i as PlanId)
    }
    fn iter_mut(&mut self) -> impl Iterator<Item = (PlanId, &mut Plan)> {
        self.0.iter_mut().enumerate().map(|(i, p)| (i as PlanId + 1, p))
    }
    /// `id` must be the next one (checked by the caller).
    fn insert(&mut self, id: PlanId, plan: Plan) {
        debug_assert_eq!(Self::index(id), Some(self.0.len()));
        self.0.push(plan);
    }
}

impl Executor {
    /// An empty executor of `tenant` (fold the log into it with [`Executor::apply`]).
    pub fn new(tenant: impl Into<String>) -> Executor {
        Executor {
            tenant: tenant.into(),
            incarnation: 0,
            next_plan: 1,
            plans: PlanTable::default(),
            txs: FxHashMap::default(),
            wheel: Wheel::new(),
            atoms: Vec::new(),
            by_effect: FxHashMap::default(),
            by_tagged: FxHashMap::default(),
            by_comp: FxHashMap::default(),
            by_scope: FxHashMap::default(),
            committing: FxHashMap::default(),
            blocked: FxHashMap::default(),
            agenda: BTreeSet::new(),
            probing: FxHashSet::default(),
            stuck: BTreeMap::new(),
            held: 0,
        }
    }

    /// Plans opened (ended ones included).
    pub fn plan_count(&self) -> usize {
        self.plans.0.len()
    }

    /// The tenant served.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The current incarnation (0 before the first `executor_started`).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Registrations held across all plans (not compensated, skipped or retired).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Timers in the deadline wheel.
    pub fn armed_timers(&self) -> usize {
        self.wheel.len()
    }

    /// The earliest time a timer may fire, for the driver's sleep.
    pub fn next_deadline(&self) -> Option<u64> {
        self.wheel.next_deadline()
    }
}

/// [`Reg::probes`] bit: the descriptor names a `probe` (did the compensation take effect?).
const PROBE: u8 = 1;
/// [`Reg::probes`] bit: the descriptor names a `forward_probe` (did the forward effect?).
const FORWARD_PROBE: u8 = 2;

/// A JSON value kept as its text (registrations hold arguments and outputs so).
fn text(v: &Value) -> Box<str> {
    v.to_string().into_boxed_str()
}

/// The value of JSON text [`text`] kept (`null` if it does not parse).
fn value(t: &str) -> Value {
    serde_json::from_str(t).unwrap_or(Value::Null)
}
