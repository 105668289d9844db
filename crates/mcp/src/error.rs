//! The gateway's errors.

use crate::policy::PolicyError;

/// Why the gateway cannot start or go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The policy file is wrong (file, line, key).
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// An upstream could not be started, initialised or listed.
    #[error("upstream `{upstream}`: {message}")]
    Upstream {
        /// The upstream's name.
        upstream: String,
        /// What happened.
        message: String,
    },
    /// The engine refused (its store, a tool declaration).
    #[error("engine: {0}")]
    Engine(#[from] tidegate_runtime::Error),
    /// Serving the agent failed (stdio or HTTP).
    #[error("serving the agent: {0}")]
    Serve(String),
}

impl GatewayError {
    /// Whether trying again may succeed without changing anything (an upstream that was
    /// slow to start, a store that was busy).
    pub fn retryable(&self) -> bool {
        match self {
            GatewayError::Policy(_) => false,
            GatewayError::Upstream { .. } | GatewayError::Serve(_) => true,
            GatewayError::Engine(e) => e.retryable(),
        }
    }
}
