//! Identity and readiness (`/v1/whoami`, `/readyz`).

use serde::Serialize;
use utoipa::ToSchema;

use tidegate_service::auth::Role;

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
