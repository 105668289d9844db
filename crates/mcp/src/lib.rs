//! Tidegate as an MCP gateway (`tidegate-mcp`, also started as `tidegate mcp`).
//!
//! The gateway is an MCP server that proxies the tools of one or more upstream MCP servers.
//! Every call goes through a Tidegate engine: a turn of the agent is one transaction, calls
//! that cannot be taken back are held until the turn commits, calls that ran are compensated
//! when it aborts, and reads register their scopes so that two agents racing on one resource
//! never lose an update. The policy file ([`policy`]) decides what each upstream tool is;
//! docs/mcp.md has the design, its invariants and how they are checked.

#![deny(missing_docs)]

pub mod attached;
pub mod error;
pub mod gateway;
pub mod init;
pub mod policy;
pub mod relay;
pub mod serve;
pub mod session;
pub mod stdio;
pub mod template;
pub mod turn;
pub mod upstream;

pub use error::GatewayError;
pub use gateway::Gateway;
pub use policy::{Policy, PolicyError};
pub use session::SessionHandler;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn time_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
