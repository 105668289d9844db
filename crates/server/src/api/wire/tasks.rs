//! Pull-worker tasks (`/v1/tasks`): poll, heartbeat, report.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use tidegate_service::dispatch::queue::TaskView;

/// Poll for worker tasks.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"worker": "worker-1", "capabilities": ["billing"], "max_tasks": 10, "wait_ms": 1000})
))]
pub struct PollIn {
    /// The worker's name (1-128 bytes).
    pub worker: String,
    /// Capabilities it serves (1-64).
    pub capabilities: Vec<String>,
    /// Most tasks to lease (default 1, at most 100).
    #[serde(default)]
    pub max_tasks: Option<usize>,
    /// How long to wait for a task (default 30000, at most `limits.max_wait_ms`).
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// Lease override in milliseconds.
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// Leased tasks.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PollOut {
    /// The tasks leased (empty when the wait ended without one).
    pub tasks: Vec<TaskView>,
}

/// Extend a task's lease.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"worker": "worker-1", "lease_ms": 30000})
))]
pub struct HeartbeatIn {
    /// The worker holding the lease.
    pub worker: String,
    /// New lease from now, in milliseconds (default: the task's lease).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// A worker's result.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskResultIn {
    /// Done (for a probe: the call happened).
    Done {
        /// Output (for a probe: the call's output).
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        output: Option<Value>,
        /// Residue of a compensation.
        #[serde(default)]
        residue: Option<String>,
    },
    /// Certainly not done (for a probe: the call did not happen); the same as `not_applied`
    /// without `retry`.
    Failed {
        /// Why.
        error: String,
    },
    /// Certainly not done (for a probe: the call did not happen). With `retry: true`, trying
    /// again may succeed: the task is queued again under the same key after the capability's
    /// backoff, up to its `attempts`; after the last, an eager call aborts its transaction
    /// retryably (`tool_unavailable`), as for an in-process tool.
    NotApplied {
        /// Why.
        error: String,
        /// Whether trying again may succeed (default false).
        #[serde(default)]
        retry: bool,
    },
    /// The worker cannot tell whether it took effect.
    Unknown {
        /// Why.
        error: String,
    },
}

/// Report a task's result.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"worker": "worker-1", "result": {"status": "done", "output": {"receipt": "r-881"}}}),
    json!({"worker": "worker-1", "result": {"status": "not_applied", "error": "the receiver is down", "retry": true}}),
    json!({"worker": "worker-1", "result": {"status": "failed", "error": "card declined"}}),
    json!({"worker": "worker-1", "result": {"status": "unknown", "error": "timed out after 10 s"}})
))]
pub struct ReportIn {
    /// The worker.
    pub worker: String,
    /// The result.
    pub result: TaskResultIn,
}

/// A report's receipt.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReportOut {
    /// The task.
    pub task: String,
    /// `settled`.
    pub state: String,
}

list_type!(TaskList, TaskView, "Unsettled worker tasks.");
