//! The attempt log: every webhook request and worker lease of a dispatch, filed under the
//! forward effect's key, newest `dispatch.attempts_retained` keys kept, in the tenant's
//! [`AttemptStore`] (durable with a durable store; see docs/server.md, Assumptions).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::Operation;
use crate::error::Result;
use crate::state::AttemptStore;

/// One attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    /// The operation.
    pub operation: Operation,
    /// The capability.
    pub capability: String,
    /// `webhook` or `worker`.
    pub kind: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The key sent.
    pub key: String,
    /// Start, Unix milliseconds.
    pub started_at_ms: u64,
    /// End, Unix milliseconds (for a worker lease: when it was reported or expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// `done`, `failed`, `unknown`, `retry`, `leased`, `expired`.
    pub result: String,
    /// Status code, error text, worker name.
    pub detail: String,
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Attempts by effect key, over the tenant's [`AttemptStore`].
#[derive(Debug, Clone)]
pub struct AttemptLog {
    store: Arc<dyn AttemptStore>,
}

impl AttemptLog {
    /// The log kept in `store`.
    pub fn new(store: Arc<dyn AttemptStore>) -> AttemptLog {
        AttemptLog { store }
    }

    /// Records an attempt under `effect_key`. The dispatch does not wait for it: the record
    /// is submitted now (so a later [`AttemptLog::get`] sees it) and a failure is logged.
    pub fn record(&self, effect_key: &str, attempt: Attempt) {
        self.store.record_unwaited(effect_key, attempt);
    }

    /// Records an attempt under `effect_key` and waits until the state has it (a worker's
    /// lease, report or expiry: the worker is answered after its attempt is kept, so a crash
    /// right after the answer does not lose it from the timeline). A failure is logged.
    pub async fn record_and_wait(&self, effect_key: &str, attempt: Attempt) {
        if let Err(e) = self.store.record(effect_key, attempt).await {
            tracing::warn!("recording a dispatch attempt: {e}");
        }
    }

    /// The attempts filed under `effect_key`, oldest first.
    pub async fn get(&self, effect_key: &str) -> Result<Vec<Attempt>> {
        Ok(self.store.list(effect_key).await?)
    }
}
