//! Errors of starting and running the server: the service's (the HTTP API's own errors are
//! [`crate::api::problem::ApiError`], which renders a [`ServiceError`] as a problem document).

pub use tidegate_service::error::{ConfigError, ServiceError};

/// What can go wrong opening or running the server: the service's error.
pub type ServerError = ServiceError;

/// Result with [`ServerError`] as the default error.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;
