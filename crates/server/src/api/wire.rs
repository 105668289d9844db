//! The API's wire types (kept apart from engine types; docs/server.md owns the format).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_runtime::{AbortReason, Tag};
use utoipa::{IntoParams, ToSchema};

use tidegate_service::auth::Role;
use tidegate_service::dispatch::Attempt;
use tidegate_service::dispatch::queue::TaskView;
use tidegate_service::ids;
use tidegate_service::index::{EffectRecord, EffectStatus, TxView};
use tidegate_service::registry::{CapabilitySpec, ToolDef, WireClass};
use tidegate_service::tenant::Tenant;

/// A transaction's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TxStateOut {
    /// Accepting reads and effects.
    Open,
    /// Footprint frozen.
    Sealed,
    /// Commit requested, not yet decided.
    Waiting,
    /// Commit decided; held effects being released.
    Committing,
    /// Abort decided; compensations running.
    Aborting,
    /// Settled: committed.
    Committed,
    /// Settled: aborted.
    Aborted,
}

impl TxStateOut {
    fn from_name(s: &str) -> TxStateOut {
        match s {
            "open" => TxStateOut::Open,
            "sealed" => TxStateOut::Sealed,
            "waiting" => TxStateOut::Waiting,
            "committing" => TxStateOut::Committing,
            "aborting" => TxStateOut::Aborting,
            "committed" => TxStateOut::Committed,
            _ => TxStateOut::Aborted,
        }
    }
}

/// A read.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReadOut {
    /// Canonical scope.
    pub scope: String,
    /// Version read.
    pub version: u64,
}

/// An effect of a transaction.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EffectOut {
    /// Issuance position (0-based).
    pub effect: u32,
    /// Tool.
    pub tool: String,
    /// Class.
    pub class: Option<WireClass>,
    /// Idempotency key.
    pub key: String,
    /// Canonical scopes.
    pub scopes: Vec<String>,
    /// Arguments.
    #[schema(value_type = Object)]
    pub args: Value,
    /// `in_flight`, `executed`, `failed`, `held`, `releasing`, `released`, `release_failed`,
    /// `compensated`, `compensation_failed`.
    pub status: String,
    /// Output of the call or release.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// Error text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether a failure's outcome is unknown.
    pub outcome_unknown: bool,
    /// Residue a compensation reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residue: Option<String>,
    /// Final disposition (`accepted`, `fired`, `compensated`, ...), once settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disposition: Option<String>,
    /// Settlement tag (`clean`, `leaked`, `unresolved`, `partial-commit`), once settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Why a transaction aborted.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AbortReasonOut {
    /// `stale_read`, `lease_expired`, `tool_failed`, `explicit`, ...
    pub kind: String,
    /// A sentence for people.
    pub message: String,
    /// The reason's fields (scope and versions of a stale read, the failing tool, ...).
    #[schema(value_type = Object)]
    pub details: Value,
    /// Whether running the work again at a fresh epoch may succeed.
    pub retryable: bool,
}

/// A settled transaction's outcome.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutcomeOut {
    /// Committed or aborted.
    pub committed: bool,
    /// Why it aborted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<AbortReasonOut>,
    /// Whether every effect settled clean.
    pub clean: bool,
}

/// One earlier transaction a commit waits for, from the engine's commit-order rule
/// (`Tidegate::waits_for`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WaitOut {
    /// The transaction waited for.
    pub transaction: String,
    /// Its agent (empty if no longer in the index).
    pub agent: String,
    /// Its epoch.
    pub epoch: u64,
    /// Its state (`open`, `sealed`, `waiting`, `committing`, `aborting`).
    pub state: String,
    /// Why: `overlap` (earlier epoch, overlapping scope), `undeclared` (earlier, open, no
    /// may-touch set: may touch anything), `predecessor` (this one read its write, whose commit
    /// is still releasing), `releasing` (first-committer-wins: an overlapping commit still
    /// releasing), `frontier` (global-frontier ablation).
    pub cause: String,
    /// This transaction's scope that overlaps (none: every scope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The other transaction's scope it overlaps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub theirs: Option<String>,
}

/// A transaction.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TransactionOut {
    /// `tx_<tag>_<n>`.
    pub id: String,
    /// Epoch.
    pub epoch: u64,
    /// Agent.
    pub agent: String,
    /// State.
    pub state: TxStateOut,
    /// Speculation group, if a branch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Declared may-touch scopes (`null`: undeclared).
    pub may_touch: Option<Vec<String>>,
    /// The lease deadline set at begin, Unix milliseconds (reads and effects renew it; the
    /// renewal is not in the ledger).
    pub lease_expires_at_ms: u64,
    /// Whether this server can act on it (a transaction kept open across a restart is
    /// resumed by id; false once settled).
    pub resumable: bool,
    /// Reads.
    pub reads: Vec<ReadOut>,
    /// Effects.
    pub effects: Vec<EffectOut>,
    /// For a sealed or waiting transaction: what its commit waits (or would wait) for now,
    /// oldest first (omitted when nothing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<WaitOut>,
    /// The outcome, once settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeOut>,
}

/// The wire name of an effect's status.
pub fn status_name(s: EffectStatus) -> &'static str {
    s.name()
}

fn name_of<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// An effect record on the wire.
pub fn effect_out(r: &EffectRecord) -> EffectOut {
    let args = (*r.args).clone();
    EffectOut {
        effect: r.id.0,
        tool: r.tool.to_string(),
        class: WireClass::from_engine(r.class),
        key: r.key.to_string(),
        scopes: r.scopes.iter().map(ToString::to_string).collect(),
        args,
        status: status_name(r.status).to_owned(),
        output: r.output.as_ref().map(|o| (**o).clone()),
        error: r.error.clone(),
        outcome_unknown: r.unknown,
        residue: r.residue.clone(),
        disposition: r.settled.as_ref().map(|(d, _)| name_of(d)),
        tag: r.settled.as_ref().map(|(_, t)| t.to_string()),
    }
}

/// An abort reason on the wire.
pub fn reason_out(r: &AbortReason) -> AbortReasonOut {
    let mut details = serde_json::to_value(r).unwrap_or(Value::Null);
    if let Some(o) = details.as_object_mut() {
        o.remove("kind");
    }
    AbortReasonOut { kind: r.kind().to_owned(), message: r.to_string(), details, retryable: r.retryable() }
}

/// A transaction view on the wire.
pub fn tx_out(tenant: &Tenant, v: &TxView) -> TransactionOut {
    let settled = v.phase.settled();
    TransactionOut {
        id: ids::tx(&tenant.tag, v.tx),
        epoch: v.epoch.0,
        agent: v.agent.to_string(),
        state: TxStateOut::from_name(v.state()),
        group: v.group.map(|g| ids::format(ids::Kind::Group, &tenant.tag, g.0)),
        may_touch: v.may_touch.clone(),
        lease_expires_at_ms: v.lease_until.0 / 1_000_000,
        resumable: !settled && (tenant.live(v.tx).is_some() || tenant.engine.transaction(v.tx).is_ok()),
        reads: v.reads.iter().map(|(s, ver)| ReadOut { scope: s.to_string(), version: *ver }).collect(),
        effects: v.effects.iter().map(effect_out).collect(),
        waits_for: if v.phase == tidegate_service::index::Phase::Sealed { waits_out(tenant, v) } else { Vec::new() },
        outcome: settled.then(|| OutcomeOut {
            committed: v.phase == tidegate_service::index::Phase::Committed,
            reason: v.reason.as_ref().map(reason_out),
            clean: v.effects.iter().all(|e| e.settled.as_ref().is_none_or(|(_, t)| *t == Tag::Clean)),
        }),
    }
}

/// What a sealed or waiting transaction's commit waits for, from the engine.
pub fn waits_out(tenant: &Tenant, v: &TxView) -> Vec<WaitOut> {
    let Ok(waits) = tenant.engine.waits_for(v.tx) else { return Vec::new() };
    waits
        .into_iter()
        .map(|w| WaitOut {
            transaction: ids::tx(&tenant.tag, w.tx),
            agent: tenant.index.agent(w.tx).map(|a| a.to_string()).unwrap_or_default(),
            epoch: w.epoch.0,
            state: w.state.to_string(),
            cause: w.cause.as_str().to_owned(),
            scope: w.scope.map(|s| s.to_string()),
            theirs: w.theirs.map(|s| s.to_string()),
        })
        .collect()
}

macro_rules! list_type {
    ($name:ident, $item:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Serialize, ToSchema)]
        pub struct $name {
            /// The page.
            pub data: Vec<$item>,
            /// Whether more follow.
            pub has_more: bool,
            /// Pass as `cursor` for the next page.
            pub next_cursor: Option<String>,
        }
    };
}

list_type!(TransactionList, TransactionOut, "A page of transactions.");
list_type!(ToolList, ToolOut, "Every tool.");
list_type!(CapabilityList, CapabilityOut, "Every capability.");
list_type!(TaskList, TaskView, "Unsettled worker tasks.");
list_type!(KeyList, KeyOut, "The tenant's keys.");
list_type!(LedgerEventList, LedgerEventOut, "A page of ledger events.");
list_type!(AttentionList, AttentionOut, "A page of effects needing attention.");

/// One minute of the console's picture.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MinuteOut {
    /// The minute's start, Unix milliseconds.
    pub start_ms: u64,
    /// Commit decisions.
    pub commits: u64,
    /// Abort decisions by reason kind (`stale_read`, `lease_expired`, ...).
    pub aborts: std::collections::BTreeMap<String, u64>,
    /// Commits that had to wait for earlier transactions.
    pub waits: u64,
    /// The most transactions waiting to commit at one sample in the minute.
    pub waiting_max: u64,
}

/// The tenant's figures of the last hour, one entry per minute, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SeriesOut {
    /// 60 minutes, the current one last.
    pub minutes: Vec<MinuteOut>,
}

/// One server-sent event of a `text/event-stream` response, as a client parses it: its name
/// and its data (a JSON text; what it holds is said per endpoint).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SseEventOut {
    /// The event's name (`state`, `snapshot`, `changes`, `resync`).
    pub event: String,
    /// The event's data: a JSON text.
    pub data: String,
}

/// Retry an attention entry.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"note": "the billing receiver is back up"})
))]
pub struct RetryIn {
    /// Why, for the next person (at most 2000 bytes).
    #[serde(default)]
    pub note: Option<String>,
}

/// A retry's result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RetryOut {
    /// `call`, `release` or `compensate`.
    pub operation: String,
    /// `done` (the entry is resolved), `failed` or `unknown`.
    pub outcome: String,
    /// The capability's error, if any.
    pub detail: Option<String>,
    /// The attention entry after the retry.
    pub entry: AttentionOut,
}

/// Resolve an attention entry.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"action": "resolved", "note": "refunded by hand in the billing console"})
))]
pub struct AttentionResolveIn {
    /// `resolved` (set right outside Tidegate) or `accepted` (may stand as it is).
    pub action: tidegate_service::console::OperatorAction,
    /// What was done, for the next person (1 to 2000 bytes).
    pub note: String,
}

/// Begin a transaction.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"agent": "billing-agent", "may_touch": ["retail:order:o-1042"], "lease_ms": 30000})
))]
pub struct BeginIn {
    /// The agent's name (default `agent`), at most 256 bytes.
    #[serde(default)]
    pub agent: Option<String>,
    /// Scopes the transaction may touch (at most 1024). Declaring them lets transactions on
    /// other scopes commit without waiting for this one.
    #[serde(default)]
    pub may_touch: Option<Vec<String>>,
    /// Lease in milliseconds (default `engine.lease_ms`; 1 to 604800000).
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// Begin the transaction as the next step of this plan (`plan_<tag>_<n>`): its reversible
    /// effects then need `compensate`, held until the plan ends (docs/plans.md).
    #[serde(default)]
    pub plan: Option<String>,
}

/// Record a read.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"scope": "retail:order:o-1042"})
))]
pub struct ReadIn {
    /// The scope read.
    pub scope: String,
}

/// The result of a read.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReadResultOut {
    /// Canonical scope.
    pub scope: String,
    /// Its committed version.
    pub version: u64,
    /// What this transaction staged on an overlapping scope (read-your-writes).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub staged: Option<Value>,
}

/// Call a server tool in a transaction.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"tool": "send_invoice", "args": {"order_id": "o-1042", "amount_cents": 1999}}),
    json!({"tool": "reserve_seat", "args": {"flight": "LX318", "seat": "12A"}, "execute": "client",
        "compensate": {"capability": "release_seat", "args": {"flight": "LX318", "seat": "12A"}}})
))]
pub struct EffectIn {
    /// The tool's name.
    pub tool: String,
    /// The arguments (default `{}`).
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub args: Value,
    /// The idempotency key (default: the tool's key template, else `<tx>:<tool>:<n>`), at
    /// most 512 bytes.
    #[serde(default)]
    pub key: Option<String>,
    /// Scopes overriding the tool's scope templates.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
    /// Who runs an eager effect (default `server`: through the tool's `call` capability).
    /// `client`: the answer is a ticket (`ack: execute`); the client runs the call under
    /// the effect's key and reports how it ended to `result_url`. Held classes are
    /// released at commit through the `call` capability either way.
    #[serde(default)]
    pub execute: Option<ExecuteMode>,
    /// In a plan step: how to undo this effect if the plan fails (needed for reversible
    /// tools there; refused for gated ones). Recorded with the effect, held until the plan
    /// commits, fired by the tenant's plan executor.
    #[serde(default)]
    pub compensate: Option<CompensateIn>,
}

/// A compensation descriptor (docs/plans.md): the capability that undoes the effect and its
/// arguments, in which `{"$output": "/ptr"}` is replaced by that part of the effect's output,
/// `{"$args": "/ptr"}` by that part of its recorded arguments, `{"$literal": v}` by `v`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompensateIn {
    /// The capability (1 to 128 characters) run with operation `compensate`.
    pub capability: String,
    /// Its arguments (default `{}`), at most 64 KiB of JSON.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub args: Value,
    /// The compensation's idempotency key (default `<effect key>#compensate`).
    #[serde(default)]
    pub key: Option<String>,
    /// A capability asked (operation `probe`) whether the compensation took effect.
    #[serde(default)]
    pub probe: Option<String>,
    /// A capability asked whether the forward effect took effect.
    #[serde(default)]
    pub forward_probe: Option<String>,
}

impl CompensateIn {
    /// The runtime's descriptor.
    pub fn into_descriptor(self) -> tidegate_runtime::Descriptor {
        tidegate_runtime::Descriptor {
            capability: self.capability,
            args: self.args,
            key: self.key,
            probe: self.probe,
            forward_probe: self.forward_probe,
        }
    }
}

/// Who runs an eager effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecuteMode {
    /// The server, through the tool's `call` capability.
    #[default]
    Server,
    /// The client: the server answers a ticket and waits for the result.
    Client,
}

/// How a client-executed call ended.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
#[schema(examples(
    json!({"status": "done", "output": {"reservation": "r-5521"}}),
    json!({"status": "not_applied", "error": "the seat is taken", "retry": false}),
    json!({"status": "unknown", "error": "timed out after 10 s"})
))]
pub enum EffectResultIn {
    /// The call took effect.
    Done {
        /// Its output (default `null`), kept for the compensation.
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        output: Option<Value>,
    },
    /// The call certainly did not take effect.
    NotApplied {
        /// Why (at most 4096 bytes).
        error: String,
        /// Whether trying again may succeed (the transaction then aborts retryably,
        /// `tool_unavailable`; retry the call yourself, under the same key, before reporting).
        #[serde(default)]
        retry: bool,
    },
    /// The call may or may not have taken effect: the tool's probe capability decides,
    /// else the transaction aborts and compensates it blind (`unresolved`).
    Unknown {
        /// Why (at most 4096 bytes).
        error: String,
    },
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// How the engine took an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AckKind {
    /// Executed now (server-executed eager effect); `output` holds the result.
    Executed,
    /// Bufferable: staged, applied at commit.
    Staged,
    /// Gated: queued, fired at commit.
    Queued,
    /// The key had executed before: the recorded output.
    Replayed,
    /// Client-executed eager effect (a ticket): run the call now under `effect.key`, then
    /// POST how it ended to `result_url`.
    Execute,
}

/// The acknowledgement of an effect.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EffectAckOut {
    /// The transaction.
    pub transaction: String,
    /// How the engine took it.
    pub ack: AckKind,
    /// The output (executed and replayed effects).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// The effect as recorded.
    pub effect: EffectOut,
    /// Where to report the result of a ticket (`ack: execute`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_url: Option<String>,
}

/// Commit a transaction.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"seal": true, "wait_ms": 5000})
))]
pub struct CommitIn {
    /// Seal first if still open (default false).
    #[serde(default)]
    pub seal: Option<bool>,
    /// How long to wait for the settlement before answering 202 (default 30000, at most
    /// `limits.max_wait_ms`).
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// Abort with `wait_timeout` if the commit cannot be decided within this many
    /// milliseconds (default: wait as long as earlier transactions' leases allow).
    #[serde(default)]
    pub commit_timeout_ms: Option<u64>,
}

/// Abort a transaction.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"reason": "the user cancelled the order", "wait_ms": 5000})
))]
pub struct AbortIn {
    /// Why (recorded in the ledger), at most 1024 bytes.
    #[serde(default)]
    pub reason: Option<String>,
    /// How long to wait for the compensations before answering 202 (default 30000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// A one-call transaction.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"tool": "send_invoice", "args": {"order_id": "o-1042", "amount_cents": 1999}, "agent": "billing-agent", "wait_ms": 1000})
))]
pub struct CallIn {
    /// The tool's name.
    pub tool: String,
    /// The arguments (default `{}`).
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub args: Value,
    /// The idempotency key.
    #[serde(default)]
    pub key: Option<String>,
    /// Scopes overriding the tool's templates.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
    /// The agent.
    #[serde(default)]
    pub agent: Option<String>,
    /// May-touch scopes (default: the call's scopes).
    #[serde(default)]
    pub may_touch: Option<Vec<String>>,
    /// Lease in milliseconds.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// How long to wait for the settlement before answering 202 (default 30000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// The result of a one-call transaction.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallOut {
    /// The transaction (settled unless the answer is 202).
    pub transaction: TransactionOut,
    /// How the engine took the call.
    pub ack: AckKind,
    /// The call's output (eager effects).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

/// Query of the transaction list.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListTxQuery {
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size (default 50).
    pub limit: Option<usize>,
    /// `unfinished`, `settled`, or a state (`open`, `sealed`, `waiting`, `committing`,
    /// `aborting`, `committed`, `aborted`).
    pub state: Option<String>,
}

/// Query of a long-poll.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// How long to wait for the settlement (default 30000, at most `limits.max_wait_ms`).
    pub timeout_ms: Option<u64>,
}

/// Query of a ledger page.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LedgerQuery {
    /// Events after this LSN (default 0).
    pub after_lsn: Option<u64>,
    /// Page size (default 50).
    pub limit: Option<usize>,
}

impl LedgerQuery {
    /// The first LSN to return. LSNs are below 2^63 (the ledger stores them as SQLite
    /// integers), which is also what the document's `int64` promises; a larger `after_lsn` is
    /// refused rather than silently answered with nothing (found by scripts/fuzz-api.sh).
    pub fn from_lsn(&self) -> Result<u64, crate::api::problem::ApiError> {
        match self.after_lsn {
            None => Ok(1),
            Some(n) if n < i64::MAX as u64 => Ok(n + 1),
            Some(n) => Err(crate::api::problem::ApiError::invalid("after_lsn", n.to_string(), "an LSN below 2^63 - 1")),
        }
    }
}

/// Query of the attention list.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AttentionQuery {
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size (default 50).
    pub limit: Option<usize>,
    /// `unresolved`, `leaked` or `partial-commit` (default: all three).
    pub tag: Option<String>,
    /// `true`: only entries an operator resolved; `false`: only the others (default: both).
    pub resolved: Option<bool>,
}

/// Query of the ledger's events (and of its JSON Lines export). The transaction filters
/// select transactions; their events are returned, and engine-wide events (registry changes,
/// extension records) only when no transaction filter is given.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LedgerEventsQuery {
    /// Events after this LSN (default 0).
    pub after_lsn: Option<u64>,
    /// Page size (default 50; the export: every matching event, at most 100000).
    pub limit: Option<usize>,
    /// Only events of this transaction (`tx_<tag>_<n>`); an id never issued to this tenant
    /// (another tenant's included) matches nothing.
    pub transaction: Option<String>,
    /// Only events of transactions begun by this agent.
    pub agent: Option<String>,
    /// Only events of transactions whose may-touch set, reads or effects overlap this scope.
    pub scope: Option<String>,
    /// Only events of transactions that `committed`, `aborted` or are `unfinished`.
    pub outcome: Option<String>,
    /// Only events of transactions whose begin-time lease deadline (`lease_expires_at_ms`,
    /// the one clock reading the ledger keeps) is at or after this Unix millisecond.
    pub from_ms: Option<u64>,
    /// ... and at or before this one.
    pub to_ms: Option<u64>,
    /// Only events of this kind (`begin`, `read`, `effect_recorded`, `decided`, `settled`, ...).
    pub event: Option<String>,
}

impl LedgerEventsQuery {
    /// The first LSN to return (as [`LedgerQuery::from_lsn`]).
    pub fn from_lsn(&self) -> Result<u64, crate::api::problem::ApiError> {
        LedgerQuery { after_lsn: self.after_lsn, limit: None }.from_lsn()
    }
}

/// One ledger event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LedgerEventOut {
    /// Its position.
    pub lsn: u64,
    /// The event kind (`begin`, `read`, `effect_recorded`, `decided`, `settled`, ...).
    pub event: String,
    /// The transaction it belongs to (none for registry changes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction: Option<String>,
    /// The event's fields as the ledger holds them (docs/ledger.md); transaction numbers
    /// inside are the `<n>` of `tx_<tag>_<n>`.
    #[schema(value_type = Object)]
    pub data: Value,
}

/// A transaction's timeline.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TimelineOut {
    /// The transaction.
    pub transaction: String,
    /// Its ledger events, in order.
    pub events: Vec<LedgerEventOut>,
    /// Every retained dispatch attempt of its effects.
    pub attempts: Vec<Attempt>,
    /// Whether more events follow.
    pub has_more: bool,
    /// Pass as `after_lsn` for the next page.
    pub next_cursor: Option<String>,
}

/// An effect needing attention.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttentionOut {
    /// The transaction.
    pub transaction: String,
    /// Whether it committed.
    pub committed: bool,
    /// The `settled` event's LSN.
    pub lsn: u64,
    /// The tag.
    pub tag: String,
    /// The disposition.
    pub disposition: String,
    /// The effect.
    pub effect: EffectOut,
    /// An operator's resolution, if one was recorded (`POST .../resolve`).
    pub resolution: Option<ResolutionOut>,
}

/// An operator's resolution of an attention entry, as the ledger's `operator` stream holds it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResolutionOut {
    /// `resolved`, `accepted`, or `retried` (a retry confirmed done).
    pub action: tidegate_service::console::OperatorAction,
    /// The operator's note.
    pub note: String,
    /// Who: `key_<id> (<role>)`.
    pub by: String,
    /// When, Unix milliseconds.
    pub at_ms: u64,
    /// The extension record's LSN.
    pub lsn: u64,
}

impl From<tidegate_service::console::Resolution> for ResolutionOut {
    fn from(r: tidegate_service::console::Resolution) -> Self {
        ResolutionOut { action: r.action, note: r.note, by: r.by, at_ms: r.at_ms, lsn: r.lsn }
    }
}

/// A tool.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolOut {
    /// Its name.
    pub name: String,
    /// The registry signature (the registry version that defined it).
    pub signature: Option<u64>,
    /// Its definition.
    pub definition: ToolDef,
}

/// A capability.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CapabilityOut {
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: CapabilitySpec,
}

/// Poll for worker tasks.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"worker": "worker-1", "capabilities": ["billing"], "max_tasks": 10, "wait_ms": 1000})
))]
pub struct PollIn {
    /// The worker's name (1-128 bytes).
    pub worker: String,
    /// Capabilities it serves (1-64).
    pub capabilities: Vec<String>,
    /// Most tasks to lease (default 1, at most 100).
    #[serde(default)]
    pub max_tasks: Option<usize>,
    /// How long to wait for a task (default 30000, at most `limits.max_wait_ms`).
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// Lease override in milliseconds.
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// Leased tasks.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PollOut {
    /// The tasks leased (empty when the wait ended without one).
    pub tasks: Vec<TaskView>,
}

/// Extend a task's lease.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"worker": "worker-1", "lease_ms": 30000})
))]
pub struct HeartbeatIn {
    /// The worker holding the lease.
    pub worker: String,
    /// New lease from now, in milliseconds (default: the task's lease).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// A worker's result.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskResultIn {
    /// Done (for a probe: the call happened).
    Done {
        /// Output (for a probe: the call's output).
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        output: Option<Value>,
        /// Residue of a compensation.
        #[serde(default)]
        residue: Option<String>,
    },
    /// Certainly not done (for a probe: the call did not happen); the same as `not_applied`
    /// without `retry`.
    Failed {
        /// Why.
        error: String,
    },
    /// Certainly not done (for a probe: the call did not happen). With `retry: true`, trying
    /// again may succeed: the task is queued again under the same key after the capability's
    /// backoff, up to its `attempts`; after the last, an eager call aborts its transaction
    /// retryably (`tool_unavailable`), as for an in-process tool.
    NotApplied {
        /// Why.
        error: String,
        /// Whether trying again may succeed (default false).
        #[serde(default)]
        retry: bool,
    },
    /// The worker cannot tell whether it took effect.
    Unknown {
        /// Why.
        error: String,
    },
}

/// Report a task's result.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"worker": "worker-1", "result": {"status": "done", "output": {"receipt": "r-881"}}}),
    json!({"worker": "worker-1", "result": {"status": "not_applied", "error": "the receiver is down", "retry": true}}),
    json!({"worker": "worker-1", "result": {"status": "failed", "error": "card declined"}}),
    json!({"worker": "worker-1", "result": {"status": "unknown", "error": "timed out after 10 s"}})
))]
pub struct ReportIn {
    /// The worker.
    pub worker: String,
    /// The result.
    pub result: TaskResultIn,
}

/// A report's receipt.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReportOut {
    /// The task.
    pub task: String,
    /// `settled`.
    pub state: String,
}

/// A speculation group to begin.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"branches": 2, "agent": "trip-planner", "may_touch": ["travel:seat:*"]})
))]
pub struct GroupIn {
    /// Number of branches (2 to `limits.max_branches`).
    pub branches: usize,
    /// The agent.
    #[serde(default)]
    pub agent: Option<String>,
    /// May-touch scopes shared by every branch.
    #[serde(default)]
    pub may_touch: Option<Vec<String>>,
    /// Lease in milliseconds (accepted for symmetry; branches use the engine's lease).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// A speculation group.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GroupOut {
    /// `grp_<tag>_<n>`.
    pub id: String,
    /// `open` (some branch unsettled) or `settled`.
    pub state: String,
    /// The committed branch, once settled with a winner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winner: Option<String>,
    /// Whether this server can act on it.
    pub resumable: bool,
    /// The branches.
    pub branches: Vec<TransactionOut>,
}

/// Commit a group's winner.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"winner": "tx_0a1b2c3d_7", "wait_ms": 5000})
))]
pub struct GroupCommitIn {
    /// The winning branch (`tx_...`).
    pub winner: String,
    /// How long to wait before answering 202 (default 30000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// A key to create.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"role": "agent", "label": "billing agent"})
))]
pub struct KeyIn {
    /// Its role.
    pub role: Role,
    /// A label for people (at most 256 bytes).
    #[serde(default)]
    pub label: Option<String>,
}

/// A key (never its secret).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct KeyOut {
    /// `key_<id>`.
    pub id: String,
    /// Its role.
    pub role: Role,
    /// Its label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Creation, Unix milliseconds.
    pub created_at_ms: i64,
    /// Revocation, Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<i64>,
}

/// A new key with its secret, shown once.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NewKeyOut {
    /// The key record.
    #[serde(flatten)]
    pub record: KeyOut,
    /// The full key: send it as `Authorization: Bearer <key>`. Not retrievable later.
    pub key: String,
}

/// The caller.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WhoamiOut {
    /// The tenant.
    pub tenant: String,
    /// The role.
    pub role: Role,
    /// The key's id.
    pub key_id: String,
}

/// Readiness.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReadyOut {
    /// Whether the server is ready.
    pub ready: bool,
    /// Whether the catalog answers.
    pub catalog: bool,
    /// Tenants whose engine is open.
    pub tenants: usize,
    /// Of those, still recovering the previous process's work.
    pub recovering: usize,
    /// Tenants whose engine failed to open or recover.
    pub failed: usize,
}
