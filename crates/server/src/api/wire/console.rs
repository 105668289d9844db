//! The operator console's figures (`/v1/console/series`).

use serde::Serialize;
use utoipa::ToSchema;

/// One minute of the console's picture.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MinuteOut {
    /// The minute's start, Unix milliseconds.
    pub start_ms: u64,
    /// Commit decisions.
    pub commits: u64,
    /// Abort decisions by reason kind (`stale_read`, `lease_expired`, ...).
    pub aborts: std::collections::BTreeMap<String, u64>,
    /// Commits that had to wait for earlier transactions.
    pub waits: u64,
    /// The most transactions waiting to commit at one sample in the minute.
    pub waiting_max: u64,
}

/// The tenant's figures of the last hour, one entry per minute, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SeriesOut {
    /// 60 minutes, the current one last.
    pub minutes: Vec<MinuteOut>,
}
