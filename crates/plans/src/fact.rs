//! The plan facts (records of the ledger stream `plans`) and the engine observations the
//! executor folds, with their JSON forms (docs/plans.md, "Ledger records and version rule").

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::PlanError;
use crate::predicate::Predicate;

/// A plan's id: dense per tenant, allocated by the executor.
pub type PlanId = u64;
/// An engine transaction id.
pub type TxId = u64;
/// An effect's issuance position within its transaction.
pub type EffectId = u32;
/// A held registration's position within its plan (ledger order across steps).
pub type Seq = u32;

/// The version of the plan records this crate writes and reads.
pub const PLAN_FORMAT_VERSION: u32 = 1;
/// The ledger stream the plan records belong to.
pub const STREAM: &str = "plans";
/// Cascade limit of a plan that does not set one.
pub const DEFAULT_CASCADE_LIMIT: u32 = 3;
/// The largest cascade limit a plan may set.
pub const MAX_CASCADE_LIMIT: u32 = 64;
/// The largest descriptor (its JSON, bytes).
pub const MAX_DESCRIPTOR_BYTES: usize = 64 * 1024;

/// How to undo one forward effect, as data that outlives the process that formulated it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// The capability that runs the compensation.
    pub capability: String,
    /// Arguments; `{"$output": ptr}`, `{"$args": ptr}` and `{"$literal": v}` are resolved when fired.
    #[serde(default)]
    pub args: Value,
    /// The compensation's idempotency key (default `<forward key>#compensate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Capability asked whether the compensation took effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Capability asked whether the forward effect took effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_probe: Option<String>,
}

impl Descriptor {
    /// A descriptor with `capability` and `args`, default key, no probes.
    pub fn new(capability: impl Into<String>, args: Value) -> Descriptor {
        Descriptor { capability: capability.into(), args, key: None, probe: None, forward_probe: None }
    }

    /// Checks the descriptor's form (not its references, which need the forward output).
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.capability.is_empty() || self.capability.len() > 128 {
            return Err(PlanError::invalid("descriptor.capability", &self.capability, "1 to 128 characters"));
        }
        let bytes = serde_json::to_vec(&self.args).map(|v| v.len()).unwrap_or(usize::MAX);
        if bytes > MAX_DESCRIPTOR_BYTES {
            return Err(PlanError::invalid(
                "descriptor.args",
                format!("{bytes} bytes"),
                format!("at most {MAX_DESCRIPTOR_BYTES} bytes of JSON"),
            ));
        }
        Ok(())
    }

    /// The compensation's key for a forward effect keyed `forward_key`: the descriptor's own
    /// `key`, else the forward key's compensation (`<key>#compensate` once rendered).
    pub fn key_for(&self, forward_key: &str) -> tidegate_core::DispatchKey {
        match &self.key {
            Some(k) => tidegate_core::DispatchKey::given(forward_key, k.as_str()),
            None => tidegate_core::DispatchKey::compensation(forward_key),
        }
    }
}

/// A compliance verdict about one effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The effect must not stand: compensate it.
    Block,
    /// The effect may stand.
    Allow,
}

/// An owner's choice for a stuck plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// Reopen the plan, or try the registration the unwind stopped at again.
    Retry,
    /// Keep the partial outcome; retire every remaining registration.
    Accept,
    /// Unwind the compensable part (skipping what cannot be compensated).
    Unwind,
}

/// Why a plan failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// Its deadline passed before it committed.
    Deadline,
    /// An explicit failure signal.
    Signal {
        /// The signal's reason.
        reason: String,
    },
    /// A predicate trigger became true.
    Predicate {
        /// The trigger's number within the plan.
        trigger: u32,
    },
}

/// Why a plan is stuck.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StuckReason {
    /// Non-compensable effects that left the process.
    Irreversible {
        /// Their registrations.
        seqs: Vec<Seq>,
    },
    /// A compensation certainly failed (or could not be built).
    CompensationFailed {
        /// The registration.
        seq: Seq,
        /// The error.
        error: String,
    },
    /// A compensation's outcome is unknown and no probe could tell.
    CompensationInDoubt {
        /// The registration.
        seq: Seq,
    },
    /// A forward effect's outcome is unknown and no probe could tell.
    ForwardInDoubt {
        /// The registration.
        seq: Seq,
    },
    /// The cascade went deeper than the plan's limit.
    CascadeLimit {
        /// The depth it would have unwound at.
        depth: u32,
        /// The plan's limit.
        limit: u32,
    },
}

/// How a compensation's dispatch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompResult {
    /// Confirmed done.
    Done,
    /// Certainly did not take effect.
    NotApplied,
    /// May or may not have taken effect.
    Unknown,
}

/// Why a registration was passed over by an unwind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The forward effect never left the process.
    NeverExternalised,
    /// Its step aborted (the engine's abort compensated it).
    StepAborted,
    /// It has no compensation (an owner's `unwind`).
    NonCompensable,
    /// The owner's `unwind` passed over the registration the unwind was stuck at.
    Owner,
}

/// How a plan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Committed: every registration retired.
    Committed,
    /// Failed and unwound.
    Unwound,
    /// Stuck and accepted by its owner.
    Accepted,
}

/// One plan fact (docs/plans.md has each one's meaning).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fact", rename_all = "snake_case")]
#[allow(missing_docs)] // the fields are documented in docs/plans.md
pub enum PlanFact {
    ExecutorStarted {
        incarnation: u64,
    },
    PlanOpened {
        plan: PlanId,
        tenant: String,
        owner: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
        cascade_limit: u32,
        at_ms: u64,
    },
    StepBegun {
        plan: PlanId,
        step: u32,
        tx: TxId,
    },
    TriggerArmed {
        plan: PlanId,
        trigger: u32,
        predicate: Predicate,
    },
    PlanCommitted {
        plan: PlanId,
        at_ms: u64,
    },
    PlanSignalled {
        plan: PlanId,
        reason: String,
        at_ms: u64,
    },
    Verdict {
        plan: PlanId,
        tx: TxId,
        effect: EffectId,
        verdict: Verdict,
        at_ms: u64,
    },
    PlanResolved {
        plan: PlanId,
        choice: Choice,
        at_ms: u64,
    },
    PlanFailed {
        plan: PlanId,
        cause: Cause,
        depth: u32,
        at_ms: u64,
    },
    PlanStuck {
        plan: PlanId,
        reason: StuckReason,
        at_ms: u64,
    },
    CompStarted {
        plan: PlanId,
        seq: Seq,
        incarnation: u64,
        attempt: u32,
    },
    CompDone {
        plan: PlanId,
        seq: Seq,
        result: CompResult,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        residue: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        depth: u32,
    },
    CompSkipped {
        plan: PlanId,
        seq: Seq,
        reason: SkipReason,
    },
    ForwardProbed {
        plan: PlanId,
        seq: Seq,
        happened: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
    },
    CompProbed {
        plan: PlanId,
        seq: Seq,
        happened: Option<bool>,
    },
    PlanEnded {
        plan: PlanId,
        outcome: Outcome,
        at_ms: u64,
    },
}

impl PlanFact {
    /// The record's JSON: `{"v": 1, "fact": …, …}`.
    pub fn encode(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("v".into(), Value::from(PLAN_FORMAT_VERSION));
        }
        v
    }

    /// Reads a record; a newer `v` or an unknown kind is refused.
    pub fn decode(record: &Value) -> Result<PlanFact, PlanError> {
        let version = record.get("v").and_then(Value::as_u64);
        match version {
            Some(v) if v == u64::from(PLAN_FORMAT_VERSION) => {}
            Some(v) if v > u64::from(PLAN_FORMAT_VERSION) => {
                return Err(PlanError::NewerFormat { found: v, supported: PLAN_FORMAT_VERSION });
            }
            _ => return Err(PlanError::invalid("v", short(record.get("v")), "the plan record version 1")),
        }
        let mut body = record.clone();
        if let Value::Object(m) = &mut body {
            m.remove("v");
        }
        serde_json::from_value(body)
            .map_err(|e| PlanError::invalid("record", short(Some(record)), format!("a plan record ({e})")))
    }
}

fn short(v: Option<&Value>) -> String {
    let s = v.map(Value::to_string).unwrap_or_else(|| "(missing)".into());
    s.chars().take(120).collect()
}

/// An engine fact the executor folds (the binding maps the engine's ledger events to these).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Observation {
    /// An effect was recorded (with its descriptor, in the same append).
    EffectRecorded {
        tx: TxId,
        effect: EffectId,
        tool: String,
        /// Held until commit (bufferable, gated) rather than executed at once.
        held: bool,
        key: String,
        args: Value,
        descriptor: Option<Descriptor>,
        /// The canonical scopes the effect touches: its compensation writes them, so the
        /// binding advances their versions when it fires ([`Entry::Touch`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        scopes: Vec<String>,
    },
    EffectExecuted {
        tx: TxId,
        effect: EffectId,
        output: Value,
    },
    EffectFailed {
        tx: TxId,
        effect: EffectId,
        unknown: bool,
    },
    Released {
        tx: TxId,
        effect: EffectId,
        ok: bool,
        unknown: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
    },
    /// A commit was decided at `at_ms` (engine clock) for a transaction that wrote `scopes`;
    /// it settles later, committed or retracted into an abort. Until then a `no_commit` atom
    /// on one of those scopes whose time passes stays unknown.
    Committing {
        tx: TxId,
        scopes: Vec<String>,
        at_ms: u64,
    },
    /// A transaction finished: its tags, and for a commit the scopes it wrote.
    Settled {
        tx: TxId,
        committed: bool,
        tags: Vec<(EffectId, String)>,
        scopes: Vec<String>,
        at_ms: u64,
    },
}

/// One entry of the log the executor folds: a plan record or an engine fact, in ledger order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// A record of the `plans` stream.
    Plan(PlanFact),
    /// An engine fact.
    Engine(Observation),
    /// A compensation is about to write, or has written, the scopes of a forward effect:
    /// appended with its `comp_started` and with its `comp_done`, in the same append. The
    /// ledger-backed binding turns it into the engine's own record that advances the scopes'
    /// versions (so a read made before the compensation cannot commit after it); the executor
    /// keeps nothing of it.
    Touch(Touch),
}

/// The scopes a compensation of one forward effect writes (see [`Entry::Touch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Touch {
    /// The forward effect's transaction.
    pub tx: TxId,
    /// The forward effect.
    pub effect: EffectId,
    /// Its canonical scopes (empty when the binding did not give them: nothing to touch).
    pub scopes: Vec<String>,
    /// `false` with `comp_started` (about to run), `true` with `comp_done` (ended).
    pub done: bool,
}
