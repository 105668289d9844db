//! The attempt log: every webhook request and worker lease of a dispatch, filed under the
//! forward effect's key, newest `retained` keys kept (in memory; see docs/server.md,
//! Assumptions).

use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;

use super::Operation;

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

#[derive(Debug, Default)]
struct Inner {
    by_key: HashMap<String, Vec<Attempt>>,
    order: VecDeque<String>,
}

/// Attempts by effect key.
#[derive(Debug)]
pub struct AttemptLog {
    inner: Mutex<Inner>,
    retained: usize,
}

/// Attempts kept per key (the oldest dropped beyond).
const PER_KEY: usize = 64;

impl AttemptLog {
    /// A log keeping the newest `retained` keys.
    pub fn new(retained: usize) -> AttemptLog {
        AttemptLog { inner: Mutex::new(Inner::default()), retained: retained.max(1) }
    }

    /// Records an attempt under `effect_key`.
    pub fn record(&self, effect_key: &str, attempt: Attempt) {
        let mut g = self.inner.lock();
        if !g.by_key.contains_key(effect_key) {
            g.order.push_back(effect_key.to_owned());
            while g.order.len() > self.retained {
                if let Some(old) = g.order.pop_front() {
                    g.by_key.remove(&old);
                }
            }
        }
        let v = g.by_key.entry(effect_key.to_owned()).or_default();
        if v.len() == PER_KEY {
            v.remove(0);
        }
        v.push(attempt);
    }

    /// The attempts filed under `effect_key`.
    pub fn get(&self, effect_key: &str) -> Vec<Attempt> {
        self.inner.lock().by_key.get(effect_key).cloned().unwrap_or_default()
    }
}
