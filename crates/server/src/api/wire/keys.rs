//! API keys of the caller's tenant (`/v1/keys`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use tidegate_service::auth::Role;

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

list_type!(KeyList, KeyOut, "The tenant's keys.");
