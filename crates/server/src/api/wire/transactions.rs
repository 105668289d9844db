//! Transactions (`/v1/transactions`, `/v1/calls`, `/v1/batches`): the transaction view,
//! begin, read, commit, abort, the one-call and batch transactions, the long-poll, the event
//! streams and the timeline.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_runtime::{AbortReason, Tag};
use utoipa::{IntoParams, ToSchema};

use tidegate_service::dispatch::Attempt;
use tidegate_service::ids;
use tidegate_service::index::TxView;
use tidegate_service::tenant::Tenant;

use super::{AckKind, EffectAckOut, EffectOut, LedgerEventOut, effect_out, empty_object};

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

list_type!(TransactionList, TransactionOut, "A page of transactions.");

/// One server-sent event of a `text/event-stream` response, as a client parses it: its name
/// and its data (a JSON text; what it holds is said per endpoint).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SseEventOut {
    /// The event's name (`state`, `snapshot`, `changes`, `resync`).
    pub event: String,
    /// The event's data: a JSON text.
    pub data: String,
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

/// A short transaction in one request: begin, the reads, each effect in order (run by the
/// server), seal and commit. Limits: 1 to 64 effects, at most 64 reads.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"reads": ["inventory:sku-7"],
           "effects": [{"tool": "send_invoice", "args": {"order_id": "o-1042", "amount_cents": 1999}},
                       {"tool": "send_invoice", "args": {"order_id": "o-1043", "amount_cents": 500}}],
           "agent": "billing-agent", "wait_ms": 1000})
))]
pub struct BatchIn {
    /// The effects, run in this order (1 to 64); the first that fails aborts the transaction.
    pub effects: Vec<BatchEffectIn>,
    /// Scopes read at their committed version before the first effect (at most 64).
    #[serde(default)]
    pub reads: Vec<String>,
    /// The agent.
    #[serde(default)]
    pub agent: Option<String>,
    /// May-touch scopes (default: the scopes of the reads and the effects).
    #[serde(default)]
    pub may_touch: Option<Vec<String>>,
    /// Lease in milliseconds.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// How long to wait for the settlement before answering 202 (default 30000).
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// One effect of a batch: a server tool's call (a batch hands out no tickets).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchEffectIn {
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
}

/// A read of a batch.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchReadOut {
    /// The scope as the request gave it.
    pub scope: String,
    /// Its committed version when it was read.
    pub version: u64,
}

/// The result of a batch transaction.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchOut {
    /// The transaction (settled unless the answer is 202).
    pub transaction: TransactionOut,
    /// Each read, in the request's order.
    pub reads: Vec<BatchReadOut>,
    /// Each effect's acknowledgement, in the request's order.
    pub effects: Vec<EffectAckOut>,
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
