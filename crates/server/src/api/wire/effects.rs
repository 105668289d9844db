//! Effects of a transaction (`/v1/transactions/{tx}/effects`): an effect as recorded, the
//! call, its compensation descriptor, the acknowledgement and a client-executed call's result.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use tidegate_service::index::{EffectRecord, EffectStatus};
use tidegate_service::registry::WireClass;

use super::empty_object;

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
