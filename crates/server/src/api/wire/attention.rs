//! The attention list (`/v1/ledger/attention`): effects that did not settle clean, an
//! operator's resolution and a retry.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::EffectOut;

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

list_type!(AttentionList, AttentionOut, "A page of effects needing attention.");

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
