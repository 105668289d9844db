//! The executor: a projection folded from plan facts and engine observations, and the
//! deterministic step function `decide(now)` that turns it into new facts and dispatches
//! (docs/plans.md, "Invariants" and "Key operations").

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::PlanError;
use crate::fact::{
    Cause, Choice, CompResult, DEFAULT_CASCADE_LIMIT, Descriptor, EffectId, Entry, MAX_CASCADE_LIMIT, Observation,
    Outcome, PlanFact, PlanId, Seq, SkipReason, StuckReason, Touch, TxId, Verdict,
};
use crate::predicate::{Atom, Node, Predicate, Tri};
use crate::wheel::Wheel;

/// The version of [`Executor::snapshot`]'s form this build writes and reads.
pub const PLAN_SNAPSHOT_VERSION: u32 = 3;

/// What a dispatch asks a capability to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Undo a forward effect.
    Compensate,
    /// Ask whether the operation with this key took effect.
    Probe,
}

/// One dispatch (the server's `DispatchRequest` carries the same fields).
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchRequest {
    /// The capability's name.
    pub capability: String,
    /// The operation.
    pub operation: Operation,
    /// The forward effect's tool.
    pub tool: String,
    /// The idempotency key of every attempt.
    pub key: String,
    /// The arguments (references resolved).
    pub args: Value,
    /// The forward effect's output, if known.
    pub output: Option<Value>,
}

/// How a dispatch ended (a probe: `Done` = happened, `NotApplied` = did not).
#[derive(Debug, Clone, PartialEq)]
pub enum CallResult {
    /// Confirmed.
    Done {
        /// The capability's output.
        output: Value,
        /// Residue a compensation reported.
        residue: Option<String>,
    },
    /// Certainly did not take effect.
    NotApplied(String),
    /// May or may not have taken effect.
    Unknown(String),
}

/// A dispatch the executor decided; run it after the decision's facts are durable, then
/// append [`Action::result_fact`].
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Fire a compensation.
    Compensate {
        /// Plan.
        plan: PlanId,
        /// Registration.
        seq: Seq,
        /// Cascade depth of its outcome.
        depth: u32,
        /// The dispatch.
        request: DispatchRequest,
        /// The scopes it writes: appended as [`Entry::Touch`] with the decision's facts and
        /// again with the result.
        touch: Touch,
    },
    /// Ask whether a forward effect took effect.
    ProbeForward {
        /// Plan.
        plan: PlanId,
        /// Registration.
        seq: Seq,
        /// The dispatch.
        request: DispatchRequest,
    },
    /// Ask whether a compensation took effect.
    ProbeCompensation {
        /// Plan.
        plan: PlanId,
        /// Registration.
        seq: Seq,
        /// The dispatch.
        request: DispatchRequest,
    },
}

impl Action {
    /// The scopes this action writes when it runs (a compensation's), if any.
    pub fn touch(&self) -> Option<&Touch> {
        match self {
            Action::Compensate { touch, .. } if !touch.scopes.is_empty() => Some(touch),
            _ => None,
        }
    }

    /// The dispatch to run.
    pub fn request(&self) -> &DispatchRequest {
        match self {
            Action::Compensate { request, .. }
            | Action::ProbeForward { request, .. }
            | Action::ProbeCompensation { request, .. } => request,
        }
    }

    /// The plan it belongs to.
    pub fn plan(&self) -> PlanId {
        match self {
            Action::Compensate { plan, .. }
            | Action::ProbeForward { plan, .. }
            | Action::ProbeCompensation { plan, .. } => *plan,
        }
    }

    /// The fact recording the dispatch's result.
    pub fn result_fact(&self, result: CallResult) -> PlanFact {
        let happened = |r: &CallResult| match r {
            CallResult::Done { .. } => Some(true),
            CallResult::NotApplied(_) => Some(false),
            CallResult::Unknown(_) => None,
        };
        match self {
            Action::Compensate { plan, seq, depth, .. } => {
                let (result, output, residue, error) = match result {
                    CallResult::Done { output, residue } => (CompResult::Done, Some(output), residue, None),
                    CallResult::NotApplied(e) => (CompResult::NotApplied, None, None, Some(e)),
                    CallResult::Unknown(e) => (CompResult::Unknown, None, None, Some(e)),
                };
                PlanFact::CompDone { plan: *plan, seq: *seq, result, output, residue, error, depth: *depth }
            }
            Action::ProbeForward { plan, seq, .. } => {
                let output = match &result {
                    CallResult::Done { output, .. } => Some(output.clone()),
                    _ => None,
                };
                PlanFact::ForwardProbed { plan: *plan, seq: *seq, happened: happened(&result), output }
            }
            Action::ProbeCompensation { plan, seq, .. } => {
                PlanFact::CompProbed { plan: *plan, seq: *seq, happened: happened(&result) }
            }
        }
    }
}

/// What one call of [`Executor::decide`] decided.
#[derive(Debug, Default)]
pub struct Decision {
    /// Facts to append (already applied to the projection): durable before any action runs.
    pub facts: Vec<PlanFact>,
    /// Dispatches to run once the facts are durable.
    pub actions: Vec<Action>,
}

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
    #[serde(with = "crate::snapshot::as_json")]
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
    #[serde(with = "crate::snapshot::status")]
    status: Status,
    steps: Vec<TxId>,
    regs: Vec<Reg>,
    triggers: Vec<Trigger>,
    #[serde(with = "crate::snapshot::as_json")]
    pending_fail: Option<(Cause, u32)>,
    /// The cause and depth of the last failure (for the API).
    #[serde(with = "crate::snapshot::as_json")]
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

/// What the API shows of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanView {
    /// Id.
    pub plan: PlanId,
    /// Owner.
    pub owner: String,
    /// State.
    pub status: Status,
    /// Its steps' transactions.
    pub steps: Vec<TxId>,
    /// Registrations still held (not compensated, skipped or retired).
    pub held: usize,
}

/// One held registration as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrationView {
    /// Position within the plan (unwind order is highest first).
    pub seq: Seq,
    /// The step's transaction.
    pub tx: TxId,
    /// The effect within it.
    pub effect: EffectId,
    /// The forward effect's tool.
    pub tool: String,
    /// The forward effect's idempotency key.
    pub key: String,
    /// The compensation descriptor (`None`: non-compensable).
    pub descriptor: Option<Value>,
    /// The forward effect's state.
    pub forward: Forward,
    /// `held`, `in_flight`, `in_doubt`, `failed`, `done`, `skipped` or `step_aborted` (its
    /// step aborted, so the engine's abort undid it; not counted as held, passed over by an
    /// unwind).
    pub state: &'static str,
    /// A verdict posted about the effect.
    pub verdict: Option<Verdict>,
    /// Compensation attempts so far.
    pub attempts: u32,
}

/// One trigger of a plan and its current value.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerView {
    /// `deadline`, `signal` or `predicate`.
    pub kind: &'static str,
    /// The predicate (for `predicate`), the deadline in engine milliseconds (for `deadline`).
    pub detail: Value,
    /// The trigger's value now.
    pub value: Tri,
}

/// Everything the API shows of one plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanDetail {
    /// The summary.
    pub view: PlanView,
    /// The deadline, engine clock milliseconds.
    pub deadline_ms: Option<u64>,
    /// The plan's cascade limit.
    pub cascade_limit: u32,
    /// Why it failed, once a trigger fired (cause and cascade depth).
    pub failure: Option<(Cause, u32)>,
    /// Every registration, in unwind order (highest `seq` first).
    pub registrations: Vec<RegistrationView>,
    /// The deadline, signal and predicate triggers with their values.
    pub triggers: Vec<TriggerView>,
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
    #[serde(with = "crate::snapshot::as_json")]
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

enum Next {
    Fact(PlanFact, Option<Action>),
    Action(Action),
    Wait,
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

    /// The executor's state as bytes ([`Executor::restore`] reads them back): what a
    /// checkpoint stores so that a reopen folds only the log after it. Versioned
    /// ([`PLAN_SNAPSHOT_VERSION`]); the encoding is compact and not meant to be read by anything
    /// but this crate.
    pub fn snapshot(&self) -> Result<Vec<u8>, PlanError> {
        let mut out = postcard::to_stdvec(&PLAN_SNAPSHOT_VERSION)
            .map_err(|e| PlanError::Snapshot { detail: format!("encoding the version: {e}") })?;
        postcard::to_io(self, &mut out)
            .map_err(|e| PlanError::Snapshot { detail: format!("encoding the executor: {e}") })?;
        Ok(out)
    }

    /// An executor of `tenant` from [`Executor::snapshot`]'s bytes: the same state, indexes
    /// included. Refused ([`PlanError::Snapshot`]) when the bytes do not decode, are of a newer
    /// version, belong to another tenant or are inconsistent; the caller then folds the log.
    pub fn restore(tenant: &str, bytes: &[u8]) -> Result<Executor, PlanError> {
        let bad = |detail: String| PlanError::Snapshot { detail };
        let (version, rest) =
            postcard::take_from_bytes::<u32>(bytes).map_err(|e| bad(format!("reading the version: {e}")))?;
        if version != PLAN_SNAPSHOT_VERSION {
            return Err(bad(format!("snapshot version {version}; this build reads {PLAN_SNAPSHOT_VERSION}")));
        }
        let (exec, rest) =
            postcard::take_from_bytes::<Executor>(rest).map_err(|e| bad(format!("decoding the executor: {e}")))?;
        if !rest.is_empty() {
            return Err(bad(format!("{} bytes after the executor", rest.len())));
        }
        if exec.tenant != tenant {
            return Err(bad(format!("it is tenant `{}`'s, this executor serves `{tenant}`", exec.tenant)));
        }
        exec.check().map_err(bad)?;
        Ok(exec)
    }

    /// The structural facts code elsewhere indexes by, so a decoded snapshot cannot panic.
    fn check(&self) -> Result<(), String> {
        self.wheel.check()?;
        let n = self.atoms.len();
        let atom_ok = |i: &usize| *i < n;
        for (id, p) in self.plans.0.iter().enumerate() {
            for t in &p.triggers {
                if !t.atoms.iter().all(atom_ok) || !t.node.atoms_below(t.atoms.len()) {
                    return Err(format!("plan {} has a trigger naming an atom that does not exist", id + 1));
                }
            }
        }
        for a in &self.atoms {
            let Some(p) = self.plans.get(&a.plan) else {
                return Err(format!("an atom names plan {}, which does not exist", a.plan));
            };
            if p.triggers.get(a.trigger as usize).is_none() {
                return Err(format!("an atom names trigger {} of plan {}, which does not exist", a.trigger, a.plan));
            }
        }
        let indexed = self
            .by_tagged
            .values()
            .chain(self.by_comp.values())
            .chain(self.by_scope.values())
            .chain(self.blocked.values());
        let timed = self.wheel.items().filter_map(|t| match t {
            Timer::Atom(i) => Some(i),
            Timer::Deadline { .. } => None,
        });
        if !indexed.flatten().chain(timed).all(atom_ok) {
            return Err("an index names an atom that does not exist".into());
        }
        for (tx, info) in &self.txs {
            if !self.plans.contains_key(&info.plan) {
                return Err(format!("transaction {tx} is a step of plan {}, which does not exist", info.plan));
            }
        }
        for (&(tx, effect), &seq) in &self.by_effect {
            let reg = self.txs.get(&tx).and_then(|i| self.plans.get(&i.plan)).and_then(|p| p.regs.get(seq as usize));
            if reg.is_none_or(|r| r.tx != tx || r.effect != effect) {
                return Err(format!("effect {effect} of transaction {tx} names registration {seq}, which is not it"));
            }
        }
        if self.next_plan != self.plans.0.len() as PlanId + 1 {
            return Err(format!("next plan id {} after {} plans", self.next_plan, self.plans.0.len()));
        }
        Ok(())
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

    /// The fact a new executor appends once it has folded the log.
    pub fn start(&mut self) -> Result<PlanFact, PlanError> {
        let fact = PlanFact::ExecutorStarted { incarnation: self.incarnation + 1 };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// The owner-intervention queue, by plan id.
    pub fn stuck(&self) -> Vec<(PlanId, StuckReason)> {
        self.stuck.iter().map(|(p, r)| (*p, r.clone())).collect()
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

    /// Every plan, by id.
    pub fn plans(&self) -> Vec<PlanView> {
        let mut ids: Vec<_> = self.plans.keys().collect();
        ids.sort_unstable();
        ids.into_iter().filter_map(|p| self.plan(p)).collect()
    }

    /// One plan.
    pub fn plan(&self, plan: PlanId) -> Option<PlanView> {
        let p = self.plans.get(&plan)?;
        Some(PlanView {
            plan,
            owner: p.owner.to_string(),
            status: p.status.clone(),
            steps: p.steps.clone(),
            held: p
                .regs
                .iter()
                .filter(|r| !matches!(r.state, RegState::Done | RegState::Skipped) && !self.step_aborted(r.tx))
                .count(),
        })
    }

    /// Whether `tx` is a step that settled aborted (its effects were undone by the engine's
    /// abort; an unwind passes over its registrations).
    fn step_aborted(&self, tx: TxId) -> bool {
        self.txs.get(&tx).and_then(|i| i.settled) == Some(false)
    }

    /// One plan in full: registrations in unwind order, triggers with their values at `now`.
    pub fn detail(&self, plan: PlanId, now: u64) -> Option<PlanDetail> {
        let view = self.plan(plan)?;
        let p = self.plans.get(&plan)?;
        let registrations = p
            .regs
            .iter()
            .enumerate()
            .rev()
            .map(|(seq, r)| RegistrationView {
                seq: seq as Seq,
                tx: r.tx,
                effect: r.effect,
                tool: r.tool.to_string(),
                key: r.key.to_string(),
                descriptor: r.descriptor.as_deref().and_then(|d| serde_json::from_str(d).ok()),
                forward: r.forward,
                state: match r.state {
                    RegState::Held if self.step_aborted(r.tx) => "step_aborted",
                    RegState::Held => "held",
                    RegState::InFlight(_) => "in_flight",
                    RegState::InDoubt { .. } => "in_doubt",
                    RegState::Failed(_) => "failed",
                    RegState::Done => "done",
                    RegState::Skipped => "skipped",
                },
                verdict: r.verdict,
                attempts: r.attempts,
            })
            .collect();
        let committed = matches!(p.status, Status::Ended(Outcome::Committed));
        let failure = p.pending_fail.clone().or_else(|| p.failure.clone());
        let mut triggers = Vec::new();
        if let Some(d) = p.deadline_ms {
            let value = match &failure {
                Some((Cause::Deadline, _)) => Tri::True,
                _ if committed => Tri::False,
                _ if now >= d && matches!(p.status, Status::Open) => Tri::True,
                _ if !matches!(p.status, Status::Open) => Tri::False,
                _ => Tri::Unknown,
            };
            triggers.push(TriggerView { kind: "deadline", detail: Value::from(d), value });
        }
        if let Some((Cause::Signal { reason }, _)) = &failure {
            triggers.push(TriggerView { kind: "signal", detail: Value::from(reason.clone()), value: Tri::True });
        }
        for t in &p.triggers {
            let values: Vec<Tri> =
                t.atoms.iter().map(|id| self.atoms.get(*id).map_or(Tri::Unknown, |a| a.value)).collect();
            let value = if t.fired { Tri::True } else { t.node.eval(&values) };
            let detail = serde_json::to_value(&t.predicate).unwrap_or(Value::Null);
            triggers.push(TriggerView { kind: "predicate", detail, value });
        }
        Some(PlanDetail {
            view,
            deadline_ms: p.deadline_ms,
            cascade_limit: p.cascade_limit,
            failure,
            registrations,
            triggers,
        })
    }

    /// The forward state of registration `seq` of `plan`.
    pub fn forward(&self, plan: PlanId, seq: Seq) -> Option<Forward> {
        self.plans.get(&plan)?.regs.get(seq as usize).map(|r| r.forward)
    }

    /// The registration of effect `(tx, effect)`, if it belongs to a plan.
    pub fn registration(&self, tx: TxId, effect: EffectId) -> Option<(PlanId, Seq)> {
        let info = self.txs.get(&tx)?;
        let seq = *self.by_effect.get(&(tx, effect))?;
        Some((info.plan, seq))
    }

    // ----- commands: validate, apply, return the fact to append -----

    /// Opens a plan.
    pub fn open(
        &mut self,
        tenant: &str,
        owner: &str,
        deadline_ms: Option<u64>,
        cascade_limit: Option<u32>,
        now: u64,
    ) -> Result<PlanFact, PlanError> {
        if tenant != self.tenant {
            return Err(PlanError::CrossTenant {
                field: "tenant".into(),
                found: tenant.into(),
                tenant: self.tenant.clone(),
            });
        }
        if owner.is_empty() || owner.len() > 256 {
            return Err(PlanError::invalid("owner", format!("{owner:?}"), "1 to 256 characters"));
        }
        let limit = cascade_limit.unwrap_or(DEFAULT_CASCADE_LIMIT);
        if limit > MAX_CASCADE_LIMIT {
            return Err(PlanError::invalid("cascade_limit", limit, format!("0 to {MAX_CASCADE_LIMIT}")));
        }
        let fact = PlanFact::PlanOpened {
            plan: self.next_plan,
            tenant: tenant.into(),
            owner: owner.into(),
            deadline_ms,
            cascade_limit: limit,
            at_ms: now,
        };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    fn plan_in(
        &self,
        plan: PlanId,
        op: &'static str,
        ok: fn(&Status) -> bool,
        expected: &'static str,
    ) -> Result<&Plan, PlanError> {
        let p = self.plans.get(&plan).ok_or(PlanError::UnknownPlan { plan })?;
        if !ok(&p.status) {
            return Err(PlanError::WrongState { plan, operation: op, state: p.status.name(), expected });
        }
        Ok(p)
    }

    /// Binds transaction `tx` to `plan` as its next step.
    pub fn begin_step(&mut self, plan: PlanId, tx: TxId) -> Result<PlanFact, PlanError> {
        let p = self.plan_in(plan, "begin_step", |s| matches!(s, Status::Open), "open")?;
        if self.txs.contains_key(&tx) {
            return Err(PlanError::invalid("tx", tx, "a transaction not already a step of a plan"));
        }
        let fact = PlanFact::StepBegun { plan, step: p.steps.len() as u32, tx };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// Arms a predicate trigger on an open plan.
    pub fn arm(&mut self, plan: PlanId, predicate: Predicate) -> Result<PlanFact, PlanError> {
        let p = self.plan_in(plan, "arm", |s| matches!(s, Status::Open), "open")?;
        let (atoms, _) = predicate.compile(&self.tenant)?;
        for a in &atoms {
            if let Atom::Compensated { plan: other, .. } = a
                && !self.plans.contains_key(other)
            {
                return Err(PlanError::UnknownPlan { plan: *other });
            }
        }
        let fact = PlanFact::TriggerArmed { plan, trigger: p.triggers.len() as u32, predicate };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// Commits a plan: retires every held registration.
    pub fn commit(&mut self, plan: PlanId, now: u64) -> Result<PlanFact, PlanError> {
        let p = self.plan_in(plan, "commit", |s| matches!(s, Status::Open), "open")?;
        if let Some(tx) = p.steps.iter().find(|tx| self.txs.get(tx).is_some_and(|i| i.settled.is_none())) {
            return Err(PlanError::StepUnsettled { plan, tx: *tx });
        }
        if p.pending_fail.is_some() {
            return Err(PlanError::WrongState {
                plan,
                operation: "commit",
                state: "failed (a trigger fired)".into(),
                expected: "open",
            });
        }
        if p.regs.iter().any(|r| matches!(r.state, RegState::InFlight(_) | RegState::InDoubt { .. })) {
            return Err(PlanError::WrongState {
                plan,
                operation: "commit",
                state: "compensating a blocked effect".into(),
                expected: "open with no compensation running",
            });
        }
        let fact = PlanFact::PlanCommitted { plan, at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// An explicit failure signal.
    pub fn signal(&mut self, plan: PlanId, reason: &str, now: u64) -> Result<PlanFact, PlanError> {
        self.plan_in(plan, "signal", |s| matches!(s, Status::Open), "open")?;
        let fact = PlanFact::PlanSignalled { plan, reason: reason.into(), at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// A compliance verdict about effect `(tx, effect)` of `plan`.
    pub fn verdict(
        &mut self,
        plan: PlanId,
        tx: TxId,
        effect: EffectId,
        verdict: Verdict,
        now: u64,
    ) -> Result<PlanFact, PlanError> {
        let p =
            self.plan_in(plan, "verdict", |s| matches!(s, Status::Open | Status::Failing { .. }), "open or failing")?;
        let mine = self.txs.get(&tx).is_some_and(|i| i.plan == plan);
        let Some(seq) = self.by_effect.get(&(tx, effect)).filter(|_| mine) else {
            return Err(PlanError::invalid(
                "effect",
                format!("{tx}/{effect}"),
                format!("an effect registered in plan {plan}"),
            ));
        };
        if let Some(v) = p.regs[*seq as usize].verdict {
            return Err(PlanError::invalid(
                "verdict",
                format!("{verdict:?}"),
                format!("one verdict per effect (already {v:?})"),
            ));
        }
        let fact = PlanFact::Verdict { plan, tx, effect, verdict, at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    /// An owner's choice for a stuck plan.
    pub fn resolve(&mut self, plan: PlanId, choice: Choice, now: u64) -> Result<PlanFact, PlanError> {
        self.plan_in(plan, "resolve", |s| matches!(s, Status::Stuck { .. }), "stuck")?;
        let fact = PlanFact::PlanResolved { plan, choice, at_ms: now };
        self.apply_fact(&fact)?;
        Ok(fact)
    }

    // ----- the fold -----

    /// Folds one log entry.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), PlanError> {
        match entry {
            Entry::Plan(f) => self.apply_fact(f),
            Entry::Engine(o) => {
                self.observe(o);
                Ok(())
            }
            Entry::Touch(_) => Ok(()),
        }
    }

    fn plan_mut(&mut self, plan: PlanId) -> Result<&mut Plan, PlanError> {
        self.agenda.insert(plan);
        self.plans.get_mut(&plan).ok_or(PlanError::UnknownPlan { plan })
    }

    fn reg_mut(&mut self, plan: PlanId, seq: Seq) -> Result<&mut Reg, PlanError> {
        self.plan_mut(plan)?
            .regs
            .get_mut(seq as usize)
            .ok_or_else(|| PlanError::invalid("seq", seq, format!("a registration of plan {plan}")))
    }

    fn set_reg_state(&mut self, plan: PlanId, seq: Seq, state: RegState) -> Result<(), PlanError> {
        let r = self.reg_mut(plan, seq)?;
        let was_held = !matches!(r.state, RegState::Done | RegState::Skipped);
        let now_held = !matches!(state, RegState::Done | RegState::Skipped);
        r.state = state;
        match (was_held, now_held) {
            (true, false) => self.held = self.held.saturating_sub(1),
            (false, true) => self.held += 1,
            _ => {}
        }
        Ok(())
    }

    /// Folds one plan fact.
    pub fn apply_fact(&mut self, fact: &PlanFact) -> Result<(), PlanError> {
        match fact {
            PlanFact::ExecutorStarted { incarnation } => {
                self.incarnation = *incarnation;
                self.probing.clear();
                let inc = *incarnation;
                let mut touched = Vec::new();
                for (id, p) in self.plans.iter_mut() {
                    let id = &id;
                    for r in p.regs.iter_mut() {
                        if matches!(r.state, RegState::InFlight(i) if i < inc) {
                            r.state = RegState::InDoubt { probe_unknown: false };
                            touched.push(*id);
                        }
                    }
                }
                self.agenda.extend(touched);
            }
            PlanFact::PlanOpened { plan, tenant, owner, deadline_ms, cascade_limit, .. } => {
                if *tenant != self.tenant {
                    return Err(PlanError::CrossTenant {
                        field: "plan_opened.tenant".into(),
                        found: tenant.clone(),
                        tenant: self.tenant.clone(),
                    });
                }
                if *plan != self.next_plan {
                    return Err(PlanError::invalid(
                        "plan_opened.plan",
                        plan,
                        format!("the next plan id {}", self.next_plan),
                    ));
                }
                self.next_plan += 1;
                self.plans.insert(
                    *plan,
                    Plan {
                        owner: owner.as_str().into(),
                        deadline_ms: *deadline_ms,
                        cascade_limit: *cascade_limit,
                        opening: 0,
                        status: Status::Open,
                        steps: Vec::new(),
                        regs: Vec::new(),
                        triggers: Vec::new(),
                        pending_fail: None,
                        failure: None,
                        force: false,
                        any_done: false,
                    },
                );
                if let Some(d) = deadline_ms {
                    self.wheel.insert(*d, Timer::Deadline { plan: *plan, opening: 0 });
                }
            }
            PlanFact::StepBegun { plan, tx, .. } => {
                self.plan_mut(*plan)?.steps.push(*tx);
                self.txs.insert(*tx, TxInfo { plan: *plan, settled: None });
            }
            PlanFact::TriggerArmed { plan, predicate, .. } => {
                let (atoms, node) = predicate.compile(&self.tenant)?;
                let trigger = self.plan_mut(*plan)?.triggers.len() as u32;
                let mut ids = Vec::with_capacity(atoms.len());
                for atom in atoms {
                    let id = self.atoms.len();
                    ids.push(id);
                    let mut value = Tri::Unknown;
                    let mut witness = 0;
                    match &atom {
                        Atom::Tagged { tx, effect, .. } => self.by_tagged.entry((*tx, *effect)).or_default().push(id),
                        Atom::Compensated { plan: other, seq } => {
                            self.by_comp.entry(*other).or_default().push(id);
                            if let Some(o) = self.plans.get(other) {
                                let done = match seq {
                                    Some(s) => o.regs.get(*s as usize).is_some_and(|r| r.state == RegState::Done),
                                    None => o.any_done,
                                };
                                if done {
                                    value = Tri::True;
                                    witness = 1;
                                } else if matches!(o.status, Status::Ended(_)) {
                                    value = Tri::False;
                                }
                            }
                        }
                        Atom::NoCommit { scope, before_ms } => {
                            self.by_scope.entry(scope.clone()).or_default().push(id);
                            self.wheel.insert(*before_ms, Timer::Atom(id));
                        }
                    }
                    self.atoms.push(AtomSlot { plan: *plan, trigger, atom, value, witness });
                }
                self.plan_mut(*plan)?.triggers.push(Trigger {
                    predicate: predicate.clone(),
                    node,
                    atoms: ids,
                    fired: false,
                });
                self.eval_trigger(*plan, trigger);
            }
            PlanFact::PlanCommitted { plan, .. } => self.end_plan(*plan, Outcome::Committed)?,
            PlanFact::PlanSignalled { plan, reason, .. } => {
                let p = self.plan_mut(*plan)?;
                if p.status == Status::Open && p.pending_fail.is_none() {
                    p.pending_fail = Some((Cause::Signal { reason: reason.clone() }, 0));
                }
            }
            PlanFact::Verdict { plan, tx, effect, verdict, .. } => {
                let mine = self.txs.get(tx).is_some_and(|i| i.plan == *plan);
                let seq = *self.by_effect.get(&(*tx, *effect)).filter(|_| mine).ok_or_else(|| {
                    PlanError::invalid("verdict.effect", format!("{tx}/{effect}"), "a registered effect")
                })?;
                let p = self.plan_mut(*plan)?;
                let r = &mut p.regs[seq as usize];
                r.verdict = Some(*verdict);
                if *verdict == Verdict::Block
                    && r.descriptor.is_none()
                    && p.status == Status::Open
                    && p.pending_fail.is_none()
                {
                    p.pending_fail = Some((
                        Cause::Signal { reason: format!("verdict blocks `{}`, which has no compensation", r.tool) },
                        0,
                    ));
                }
            }
            PlanFact::PlanResolved { plan, choice, at_ms } => {
                let p = self.plan_mut(*plan)?;
                let Status::Stuck { reason, depth, was_open } = p.status.clone() else {
                    return Err(PlanError::invalid("plan_resolved.plan", plan, "a stuck plan"));
                };
                self.stuck.remove(plan);
                match choice {
                    Choice::Accept => self.end_plan(*plan, Outcome::Accepted)?,
                    Choice::Retry => match reason {
                        StuckReason::Irreversible { .. } | StuckReason::CascadeLimit { .. } => {
                            let p = self.plan_mut(*plan)?;
                            p.status = Status::Open;
                            p.opening += 1;
                            p.pending_fail = None;
                            let opening = p.opening;
                            if p.deadline_ms.is_some_and(|d| d <= *at_ms) {
                                p.deadline_ms = None;
                            }
                            if let Some(d) = p.deadline_ms {
                                self.wheel.insert(d, Timer::Deadline { plan: *plan, opening });
                            }
                        }
                        StuckReason::CompensationFailed { seq, .. } => {
                            self.set_reg_state(*plan, seq, RegState::Held)?;
                            self.plan_mut(*plan)?.status = restore(depth, was_open);
                        }
                        StuckReason::CompensationInDoubt { seq } => {
                            let r = self.reg_mut(*plan, seq)?;
                            let has_probe = r.probes & PROBE != 0;
                            r.state =
                                if has_probe { RegState::InDoubt { probe_unknown: false } } else { RegState::Held };
                            self.plan_mut(*plan)?.status = restore(depth, was_open);
                        }
                        StuckReason::ForwardInDoubt { seq } => {
                            let r = self.reg_mut(*plan, seq)?;
                            if r.probes & FORWARD_PROBE != 0 {
                                r.fwd_probe = None;
                            } else {
                                r.forward = Forward::Externalised;
                            }
                            self.plan_mut(*plan)?.status = restore(depth, was_open);
                        }
                    },
                    Choice::Unwind => {
                        match reason {
                            StuckReason::CompensationFailed { seq, .. }
                            | StuckReason::CompensationInDoubt { seq }
                            | StuckReason::ForwardInDoubt { seq } => {
                                self.set_reg_state(*plan, seq, RegState::Skipped)?
                            }
                            _ => {}
                        }
                        let p = self.plan_mut(*plan)?;
                        p.force = true;
                        p.status = Status::Failing { depth };
                    }
                }
            }
            PlanFact::PlanFailed { plan, cause, depth, .. } => {
                let p = self.plan_mut(*plan)?;
                p.failure = Some((cause.clone(), *depth));
                p.status = Status::Failing { depth: *depth };
                p.pending_fail = None;
            }
            PlanFact::PlanStuck { plan, reason, .. } => {
                let p = self.plan_mut(*plan)?;
                let (depth, was_open) = match p.status {
                    Status::Failing { depth } => (depth, false),
                    _ => (0, true),
                };
                p.status = Status::Stuck { reason: reason.clone(), depth, was_open };
                self.stuck.insert(*plan, reason.clone());
            }
            PlanFact::CompStarted { plan, seq, incarnation, attempt } => {
                self.set_reg_state(*plan, *seq, RegState::InFlight(*incarnation))?;
                self.reg_mut(*plan, *seq)?.attempts = *attempt;
            }
            PlanFact::CompDone { plan, seq, result, error, depth, .. } => match result {
                CompResult::Done => self.comp_done(*plan, *seq, *depth)?,
                CompResult::NotApplied => {
                    self.set_reg_state(*plan, *seq, RegState::Failed(error.clone().unwrap_or_default()))?
                }
                CompResult::Unknown => self.set_reg_state(*plan, *seq, RegState::InDoubt { probe_unknown: false })?,
            },
            PlanFact::CompSkipped { plan, seq, .. } => self.set_reg_state(*plan, *seq, RegState::Skipped)?,
            PlanFact::ForwardProbed { plan, seq, happened, output } => {
                self.probing.remove(&(*plan, *seq));
                let r = self.reg_mut(*plan, *seq)?;
                r.fwd_probe = Some(*happened);
                if let Some(o) = output
                    && r.output.is_none()
                {
                    r.output = Some(text(o));
                }
                match happened {
                    Some(true) => r.forward = Forward::Externalised,
                    Some(false) => r.forward = Forward::NotApplied,
                    None => {}
                }
            }
            PlanFact::CompProbed { plan, seq, happened } => {
                self.probing.remove(&(*plan, *seq));
                match happened {
                    Some(true) => {
                        let depth = match self.plans.get(plan).map(|p| &p.status) {
                            Some(Status::Failing { depth } | Status::Stuck { depth, .. }) => depth + 1,
                            _ => 1,
                        };
                        self.comp_done(*plan, *seq, depth)?
                    }
                    Some(false) => self.set_reg_state(*plan, *seq, RegState::Held)?,
                    None => self.set_reg_state(*plan, *seq, RegState::InDoubt { probe_unknown: true })?,
                }
            }
            PlanFact::PlanEnded { plan, outcome, .. } => self.end_plan(*plan, *outcome)?,
        }
        Ok(())
    }

    fn comp_done(&mut self, plan: PlanId, seq: Seq, depth: u32) -> Result<(), PlanError> {
        self.set_reg_state(plan, seq, RegState::Done)?;
        self.plan_mut(plan)?.any_done = true;
        let ids = self.by_comp.get(&plan).cloned().unwrap_or_default();
        for id in ids {
            if let Atom::Compensated { seq: want, .. } = self.atoms[id].atom
                && want.is_none_or(|w| w == seq)
            {
                self.set_atom(id, Tri::True, depth);
            }
        }
        Ok(())
    }

    fn end_plan(&mut self, plan: PlanId, outcome: Outcome) -> Result<(), PlanError> {
        let p = self.plan_mut(plan)?;
        p.status = Status::Ended(outcome);
        p.pending_fail = None;
        let regs = std::mem::take(&mut p.regs);
        let steps = p.steps.clone();
        for r in &regs {
            self.by_effect.remove(&(r.tx, r.effect));
        }
        let left = regs.iter().filter(|r| !matches!(r.state, RegState::Done | RegState::Skipped)).count();
        self.held = self.held.saturating_sub(left);
        for tx in steps {
            self.txs.remove(&tx);
        }
        self.stuck.remove(&plan);
        let ids = self.by_comp.get(&plan).cloned().unwrap_or_default();
        for id in ids {
            self.set_atom(id, Tri::False, 0);
        }
        Ok(())
    }

    /// For a `no_commit` atom still unknown: the lowest pending commit (decided, not yet
    /// settled) that wrote its scope before its time, which keeps it unknown until it settles.
    fn pending_commit_before(&self, id: usize) -> Option<TxId> {
        let a = &self.atoms[id];
        let Atom::NoCommit { scope, before_ms } = &a.atom else { return None };
        if a.value != Tri::Unknown {
            return None;
        }
        self.committing
            .iter()
            .filter(|(_, (at, scopes))| at < before_ms && scopes.iter().any(|s| s == scope))
            .map(|(tx, _)| *tx)
            .min()
    }

    fn set_atom(&mut self, id: usize, value: Tri, witness: u32) {
        let a = &mut self.atoms[id];
        if a.value != Tri::Unknown {
            return;
        }
        a.value = value;
        a.witness = witness;
        let (plan, trigger) = (a.plan, a.trigger);
        self.eval_trigger(plan, trigger);
    }

    fn eval_trigger(&mut self, plan: PlanId, trigger: u32) {
        let Some(p) = self.plans.get(&plan) else { return };
        let Some(t) = p.triggers.get(trigger as usize) else { return };
        if t.fired || p.status != Status::Open {
            return;
        }
        let values: Vec<Tri> = t.atoms.iter().map(|&i| self.atoms[i].value).collect();
        if t.node.eval(&values) != Tri::True {
            return;
        }
        let witness =
            t.atoms.iter().filter(|&&i| self.atoms[i].value == Tri::True).map(|&i| self.atoms[i].witness).max();
        let p = self.plans.get_mut(&plan).expect("checked above");
        p.triggers[trigger as usize].fired = true;
        if p.pending_fail.is_none() {
            p.pending_fail = Some((Cause::Predicate { trigger }, witness.unwrap_or(0)));
            self.agenda.insert(plan);
        }
    }

    /// Folds one engine fact.
    pub fn observe(&mut self, o: &Observation) {
        match o {
            Observation::EffectRecorded { tx, effect, tool, held, key, args, descriptor, scopes } => {
                let Some(info) = self.txs.get(tx).copied() else { return };
                let Some(p) = self.plans.get_mut(&info.plan) else { return };
                if matches!(p.status, Status::Ended(_)) {
                    return;
                }
                let seq = p.regs.len() as Seq;
                p.regs.push(Reg {
                    tx: *tx,
                    effect: *effect,
                    tool: tool.as_str().into(),
                    key: key.as_str().into(),
                    args: text(args),
                    output: None,
                    descriptor: descriptor
                        .as_ref()
                        .and_then(|d| serde_json::to_string(d).ok())
                        .map(String::into_boxed_str),
                    scopes: scopes.iter().map(|s| s.as_str().into()).collect(),
                    probes: descriptor.as_ref().map_or(0, |d| {
                        u8::from(d.probe.is_some()) * PROBE + u8::from(d.forward_probe.is_some()) * FORWARD_PROBE
                    }),
                    held: *held,
                    forward: Forward::Pending,
                    fwd_probe: None,
                    verdict: None,
                    state: RegState::Held,
                    attempts: 0,
                });
                self.by_effect.insert((*tx, *effect), seq);
                self.held += 1;
                self.agenda.insert(info.plan);
            }
            Observation::EffectExecuted { tx, effect, output } => {
                if let Some(r) = self.reg_of(*tx, *effect) {
                    r.forward = Forward::Externalised;
                    r.output = Some(text(output));
                }
            }
            Observation::EffectFailed { tx, effect, unknown } => {
                if let Some(r) = self.reg_of(*tx, *effect) {
                    r.forward = if *unknown { Forward::InDoubt } else { Forward::NotApplied };
                }
            }
            Observation::Released { tx, effect, ok, unknown, output } => {
                if let Some(r) = self.reg_of(*tx, *effect) {
                    if output.is_some() {
                        r.output = output.as_ref().map(text);
                    }
                    r.forward = match (ok, unknown) {
                        (true, _) => Forward::Externalised,
                        (false, true) => Forward::InDoubt,
                        (false, false) => Forward::NotApplied,
                    };
                }
            }
            Observation::Committing { tx, scopes, at_ms } => {
                self.committing.insert(*tx, (*at_ms, scopes.clone()));
            }
            Observation::Settled { tx, committed, tags, scopes, at_ms } => {
                // A commit is compared by its decision time when it was seen decided.
                let at_ms = &self.committing.remove(tx).map_or(*at_ms, |(at, _)| at);
                if let Some(info) = self.txs.get_mut(tx) {
                    info.settled = Some(*committed);
                    let plan = info.plan;
                    if let Some(p) = self.plans.get_mut(&plan) {
                        // Still pending at the settlement: an eager call whose outcome never
                        // came back may have happened; a held effect of a commit was never
                        // released, unless the commit tagged it unresolved (its release started
                        // and its outcome was lost: it may have fired).
                        for r in p.regs.iter_mut().filter(|r| r.tx == *tx && r.forward == Forward::Pending) {
                            let unresolved = tags.iter().any(|(e, t)| *e == r.effect && t == "unresolved");
                            r.forward = if !*committed || (r.held && !unresolved) {
                                Forward::NotApplied
                            } else {
                                Forward::InDoubt
                            };
                        }
                    }
                    self.agenda.insert(plan);
                }
                for (effect, tag) in tags {
                    for id in self.by_tagged.get(&(*tx, *effect)).cloned().unwrap_or_default() {
                        if let Atom::Tagged { tag: want, .. } = &self.atoms[id].atom {
                            let v = if want == tag { Tri::True } else { Tri::False };
                            self.set_atom(id, v, 0);
                        }
                    }
                }
                if *committed {
                    for s in scopes {
                        for id in self.by_scope.get(s).cloned().unwrap_or_default() {
                            if let Atom::NoCommit { before_ms, .. } = self.atoms[id].atom
                                && *at_ms < before_ms
                            {
                                self.set_atom(id, Tri::False, 0);
                            }
                        }
                    }
                }
                // Atoms whose time passed while this commit was pending: still unknown (it was
                // retracted, or did not write their scope), they read true unless another
                // pending commit holds them.
                for id in self.blocked.remove(tx).unwrap_or_default() {
                    match self.pending_commit_before(id) {
                        Some(other) => self.blocked.entry(other).or_default().push(id),
                        None => self.set_atom(id, Tri::True, 0),
                    }
                }
            }
        }
    }

    fn reg_of(&mut self, tx: TxId, effect: EffectId) -> Option<&mut Reg> {
        let info = self.txs.get(&tx)?;
        let plan = info.plan;
        self.agenda.insert(plan);
        let seq = *self.by_effect.get(&(tx, effect))?;
        self.plans.get_mut(&plan)?.regs.get_mut(seq as usize)
    }

    // ----- the step function -----

    /// Advances the clock to `now` and decides what to do next. The returned facts are
    /// already applied; append them (durably) before running the actions.
    pub fn decide(&mut self, now: u64) -> Decision {
        let mut fired = Vec::new();
        self.wheel.advance(now, |_, t| fired.push(t));
        for t in fired {
            match t {
                Timer::Deadline { plan, opening } => {
                    if let Some(p) = self.plans.get_mut(&plan)
                        && p.status == Status::Open
                        && p.opening == opening
                        && p.deadline_ms.is_some()
                        && p.pending_fail.is_none()
                    {
                        p.pending_fail = Some((Cause::Deadline, 0));
                        self.agenda.insert(plan);
                    }
                }
                Timer::Atom(id) => match self.pending_commit_before(id) {
                    Some(tx) => self.blocked.entry(tx).or_default().push(id),
                    None => self.set_atom(id, Tri::True, 0),
                },
            }
        }
        let mut out = Decision::default();
        while let Some(plan) = self.agenda.pop_first() {
            loop {
                match self.next(plan, now) {
                    Next::Wait => break,
                    Next::Action(a) => {
                        out.actions.push(a);
                        break;
                    }
                    Next::Fact(f, a) => {
                        if let Err(e) = self.apply_fact(&f) {
                            debug_assert!(false, "a decided fact must apply: {e}");
                            break;
                        }
                        out.facts.push(f);
                        if let Some(a) = a {
                            out.actions.push(a);
                            break;
                        }
                    }
                }
            }
            self.agenda.remove(&plan);
        }
        out
    }

    fn next(&mut self, plan: PlanId, now: u64) -> Next {
        let Some(p) = self.plans.get(&plan) else { return Next::Wait };
        match &p.status {
            Status::Open => {
                if let Some((cause, depth)) = p.pending_fail.clone() {
                    return Next::Fact(PlanFact::PlanFailed { plan, cause, depth, at_ms: now }, None);
                }
                if p.regs.iter().any(|r| matches!(r.state, RegState::InFlight(i) if i == self.incarnation)) {
                    return Next::Wait;
                }
                let due = p.regs.iter().position(|r| {
                    r.verdict == Some(Verdict::Block)
                        && r.descriptor.is_some()
                        && !matches!(r.state, RegState::Done | RegState::Skipped)
                        && self.txs.get(&r.tx).is_some_and(|i| i.settled.is_some())
                });
                match due {
                    Some(seq) => self.handle(plan, seq as Seq, 0, now),
                    None => Next::Wait,
                }
            }
            Status::Failing { depth } => {
                let depth = *depth;
                if !p.force && depth > p.cascade_limit {
                    let reason = StuckReason::CascadeLimit { depth, limit: p.cascade_limit };
                    return Next::Fact(PlanFact::PlanStuck { plan, reason, at_ms: now }, None);
                }
                if !p.force {
                    let seqs: Vec<Seq> = p
                        .regs
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| {
                            r.descriptor.is_none()
                                && r.state == RegState::Held
                                && matches!(r.forward, Forward::Externalised | Forward::InDoubt)
                                && self.txs.get(&r.tx).is_some_and(|i| i.settled == Some(true))
                        })
                        .map(|(i, _)| i as Seq)
                        .collect();
                    if !seqs.is_empty() {
                        let reason = StuckReason::Irreversible { seqs };
                        return Next::Fact(PlanFact::PlanStuck { plan, reason, at_ms: now }, None);
                    }
                }
                // A step still running may register more effects above the current top: the
                // unwind starts once every step has settled (an orphaned step's lease ends it).
                if p.steps.iter().any(|tx| self.txs.get(tx).is_some_and(|i| i.settled.is_none())) {
                    return Next::Wait;
                }
                match p.regs.iter().rposition(|r| !matches!(r.state, RegState::Done | RegState::Skipped)) {
                    Some(seq) => self.handle(plan, seq as Seq, depth, now),
                    None => Next::Fact(PlanFact::PlanEnded { plan, outcome: Outcome::Unwound, at_ms: now }, None),
                }
            }
            Status::Stuck { .. } | Status::Ended(_) => Next::Wait,
        }
    }

    /// The next move for registration `seq` (its plan's current one).
    fn handle(&mut self, plan: PlanId, seq: Seq, depth: u32, now: u64) -> Next {
        let incarnation = self.incarnation;
        let Some(p) = self.plans.get(&plan) else { return Next::Wait };
        let force = p.force;
        let r = &p.regs[seq as usize];
        // The descriptor and the forward effect's arguments and output are kept as JSON text.
        let parsed: Option<Result<Descriptor, String>> = r
            .descriptor
            .as_deref()
            .map(|t| serde_json::from_str(t).map_err(|e| format!("the held descriptor does not parse: {e}")));
        let output = r.output.as_deref().map(value);
        let stuck = |reason| Next::Fact(PlanFact::PlanStuck { plan, reason, at_ms: now }, None);
        let skip = |reason| Next::Fact(PlanFact::CompSkipped { plan, seq, reason }, None);
        let probe = |capability: &str, key: &str| DispatchRequest {
            capability: capability.into(),
            operation: Operation::Probe,
            tool: r.tool.to_string(),
            key: key.into(),
            args: value(&r.args),
            output: output.clone(),
        };
        match &r.state {
            RegState::Done | RegState::Skipped => Next::Wait,
            RegState::InFlight(i) if *i == incarnation => Next::Wait,
            RegState::Failed(error) => stuck(StuckReason::CompensationFailed { seq, error: error.clone() }),
            RegState::InFlight(_) | RegState::InDoubt { .. } => {
                let unknown = matches!(r.state, RegState::InDoubt { probe_unknown: true });
                let d = parsed.as_ref().and_then(|d| d.as_ref().ok());
                match d.and_then(|d| d.probe.as_deref()) {
                    Some(cap) if !unknown => {
                        if !self.probing.insert((plan, seq)) {
                            return Next::Wait;
                        }
                        let key = d.map(|d| d.key_for(&r.key)).unwrap_or_default();
                        Next::Action(Action::ProbeCompensation { plan, seq, request: probe(cap, &key) })
                    }
                    _ => stuck(StuckReason::CompensationInDoubt { seq }),
                }
            }
            RegState::Held => {
                match self.txs.get(&r.tx).and_then(|i| i.settled) {
                    None => return Next::Wait,
                    Some(false) => return skip(SkipReason::StepAborted),
                    Some(true) => {}
                }
                let d = match parsed {
                    Some(Ok(d)) => d,
                    Some(Err(error)) => return stuck(StuckReason::CompensationFailed { seq, error }),
                    None => {
                        return match r.forward {
                            Forward::NotApplied => skip(SkipReason::NeverExternalised),
                            _ if force => skip(SkipReason::NonCompensable),
                            _ => stuck(StuckReason::Irreversible { seqs: vec![seq] }),
                        };
                    }
                };
                match r.forward {
                    Forward::NotApplied => skip(SkipReason::NeverExternalised),
                    Forward::Externalised => match resolve_args(&d.args, &value(&r.args), output.as_ref()) {
                        Err(error) => stuck(StuckReason::CompensationFailed { seq, error }),
                        Ok(args) => {
                            let request = DispatchRequest {
                                capability: d.capability.clone(),
                                operation: Operation::Compensate,
                                tool: r.tool.to_string(),
                                key: d.key_for(&r.key),
                                args,
                                output: output.clone(),
                            };
                            let fact = PlanFact::CompStarted { plan, seq, incarnation, attempt: r.attempts + 1 };
                            let touch = Touch {
                                tx: r.tx,
                                effect: r.effect,
                                scopes: r.scopes.iter().map(|s| s.to_string()).collect(),
                                done: false,
                            };
                            Next::Fact(fact, Some(Action::Compensate { plan, seq, depth: depth + 1, request, touch }))
                        }
                    },
                    Forward::InDoubt | Forward::Pending => match (r.fwd_probe, d.forward_probe.as_deref()) {
                        (None, Some(cap)) => {
                            if !self.probing.insert((plan, seq)) {
                                return Next::Wait;
                            }
                            Next::Action(Action::ProbeForward { plan, seq, request: probe(cap, &r.key) })
                        }
                        _ => stuck(StuckReason::ForwardInDoubt { seq }),
                    },
                }
            }
        }
    }
}

const PROBE: u8 = 1;
const FORWARD_PROBE: u8 = 2;

fn text(v: &Value) -> Box<str> {
    v.to_string().into_boxed_str()
}

fn value(t: &str) -> Value {
    serde_json::from_str(t).unwrap_or(Value::Null)
}

fn restore(depth: u32, was_open: bool) -> Status {
    if was_open { Status::Open } else { Status::Failing { depth } }
}

/// Resolves a descriptor's `$output`, `$args` and `$literal` references.
pub fn resolve_args(template: &Value, args: &Value, output: Option<&Value>) -> Result<Value, String> {
    match template {
        Value::Object(m) if m.len() == 1 => {
            let (k, v) = m.iter().next().expect("one member");
            let source = match k.as_str() {
                "$literal" => return Ok(v.clone()),
                "$output" => output.unwrap_or(&Value::Null),
                "$args" => args,
                _ => return Ok(Value::Object(std::iter::once((k.clone(), resolve_args(v, args, output)?)).collect())),
            };
            let ptr = v.as_str().ok_or_else(|| format!("`{k}` must be a JSON pointer string, got {v}"))?;
            source
                .pointer(ptr)
                .cloned()
                .ok_or_else(|| format!("`{k}` pointer {ptr:?} names nothing in the forward effect's {}", &k[1..]))
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| Ok((k.clone(), resolve_args(v, args, output)?)))
            .collect::<Result<_, String>>()
            .map(Value::Object),
        Value::Array(a) => a.iter().map(|v| resolve_args(v, args, output)).collect::<Result<_, _>>().map(Value::Array),
        v => Ok(v.clone()),
    }
}
