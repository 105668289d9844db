//! The registry (`/v1/tools`, `/v1/capabilities`).

use serde::Serialize;
use utoipa::ToSchema;

use tidegate_service::registry::{CapabilitySpec, ToolDef};

/// A tool.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolOut {
    /// Its name.
    pub name: String,
    /// The registry signature (the registry version that defined it).
    pub signature: Option<u64>,
    /// Its definition.
    pub definition: ToolDef,
}

/// A capability.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CapabilityOut {
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: CapabilitySpec,
}

list_type!(ToolList, ToolOut, "Every tool.");

list_type!(CapabilityList, CapabilityOut, "Every capability.");
