//! Identity, readiness and the cluster view (`/v1/whoami`, `/readyz`, `/v1/cluster`).

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

/// This node and who serves the caller's tenant.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClusterOut {
    /// This node's id (`server.node_id`).
    pub node: String,
    /// Whether the store is shared by several nodes (PostgreSQL).
    pub shared: bool,
    /// Whether this node serves the tenant now.
    pub serving_here: bool,
    /// The tenant's ledger stream (a shared store only).
    pub stream: Option<StreamOut>,
    /// The registered nodes and every lease holder, with where each answers, whether it is
    /// live and how many tenants it holds (counts, no names).
    pub nodes: Vec<NodeOut>,
}

/// A tenant's ledger stream: its owner, fencing token and lease.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamOut {
    /// The node that holds it (or took it last).
    pub owner: Option<String>,
    /// Where that node answers (its `server.advertise_url`), if it registered one.
    pub owner_address: Option<String>,
    /// The fencing token every append of the owner carries.
    pub token: u64,
    /// How long the owner's lease still runs, by the database's clock (`null`: none left).
    pub lease_left_ms: Option<u64>,
    /// The last acknowledged LSN.
    pub last_lsn: u64,
}

/// A node of the cluster.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeOut {
    /// Its id.
    pub id: String,
    /// Where it answers, if it said.
    pub address: Option<String>,
    /// Whether it said it was alive within three of its rounds (a third of its ownership
    /// lease each).
    pub live: bool,
    /// How long ago it last said so, by the database's clock (`null`: it never registered,
    /// e.g. an embedded engine holding a lease).
    pub seen_ms_ago: Option<u64>,
    /// How many tenants it holds under live leases.
    pub tenants: u64,
}
