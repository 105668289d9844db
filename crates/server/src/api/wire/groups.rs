//! Speculation groups (`/v1/groups`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::TransactionOut;

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
