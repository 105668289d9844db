//! Capability dispatch: run an operation (call, release, compensate, probe) by capability
//! name, on an HTTP webhook or a pull-worker queue, and say whether it is done, certainly not
//! applied, or of unknown outcome, in the one dispatch vocabulary of `tidegate-core`
//! ([`DispatchRequest`], [`CallOutcome`], [`tidegate_core::Dispatch`]; docs/service.md).
//!
//! ```text
//!  runtime Tool closure ─┐                      ┌─► webhook::send  (POST, Idempotency-Key, bounded retry)
//!  plans executor ───────┼─► Dispatcher::dispatch(DispatchRequest)
//!  (issue 15)            │                      └─► queue::TaskQueue (a task; a worker leases and reports)
//!                        └── CallOutcome::{Done | NotApplied | Unknown}; each attempt in the AttemptLog
//!                            (worker tasks and attempts kept in the tenant's `state::TenantState`)
//! ```
//!
//! Contract:
//! * `dispatch` MUST NOT report `Done` unless the capability confirmed the operation (2xx, or
//!   a worker's `done`), and MUST NOT report `NotApplied` unless the operation certainly did
//!   not take effect (a 4xx, a refused connection on every attempt, a worker's `failed`, a
//!   worker task no worker ever leased before its deadline), and then with `retry: true` only
//!   when a worker said trying again may help (`not_applied` with `retry: true` on the
//!   capability's last attempt). Everything else is `Unknown`.
//! * Every attempt carries the same key (`DispatchRequest::key`, rendered to text once, here);
//!   receivers deduplicate on it. Attempts are filed under the forward effect's key.
//! * Dropping the future stops further attempts and withdraws a queued worker task; a
//!   request already sent may still land (that is why keys exist).

mod attempts;
pub mod queue;
mod webhook;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
pub use tidegate_core::{CallOutcome, DispatchKey, DispatchRequest, Operation};

pub use attempts::{Attempt, AttemptLog, now_ms};
pub use queue::{TaskQueue, TaskResult};

use crate::metrics::{DispatchLabels, Metrics};
use crate::registry::CapabilitySpec;
use crate::settings::DispatchSection;
use crate::state::TenantState;

/// The label of an outcome in metrics and attempt logs.
fn label(outcome: &CallOutcome) -> &'static str {
    match outcome {
        CallOutcome::Done { .. } => "done",
        CallOutcome::NotApplied { retry: false, .. } => "failed",
        CallOutcome::NotApplied { retry: true, .. } => "transient",
        CallOutcome::Unknown { .. } => "unknown",
    }
}

/// A registered capability: its spec and, for a webhook, its URL parsed once (the HTTP client
/// would otherwise parse the text on every request).
struct Registered {
    spec: CapabilitySpec,
    url: Option<reqwest::Url>,
}

/// Dispatches one tenant's operations.
pub struct Dispatcher {
    capabilities: RwLock<HashMap<String, Arc<Registered>>>,
    http: reqwest::Client,
    queue: Arc<TaskQueue>,
    attempts: Arc<AttemptLog>,
    defaults: DispatchSection,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("capabilities", &self.capabilities.read().len()).finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher with no capabilities, whose worker tasks and attempts are kept in
    /// `state` (the tenant tagged `tag`).
    pub fn new(
        http: reqwest::Client,
        state: &TenantState,
        tag: &str,
        defaults: DispatchSection,
        metrics: Arc<Metrics>,
    ) -> Dispatcher {
        let attempts = Arc::new(AttemptLog::new(state.attempts.clone()));
        let queue = Arc::new(TaskQueue::new(tag, state.tasks.clone(), (*attempts).clone()));
        Dispatcher { capabilities: RwLock::new(HashMap::new()), http, queue, attempts, defaults, metrics }
    }

    /// Adds or replaces a capability.
    pub fn put_capability(&self, name: &str, spec: CapabilitySpec) {
        // The spec was validated, so its URL parses; one that did not would be sent as text
        // and refused by the client, as before.
        let url = match &spec {
            CapabilitySpec::Webhook(w) => reqwest::Url::parse(&w.url).ok(),
            CapabilitySpec::Worker(_) => None,
        };
        self.capabilities.write().insert(name.to_owned(), Arc::new(Registered { spec, url }));
    }

    /// Removes a capability.
    pub fn remove_capability(&self, name: &str) -> bool {
        self.capabilities.write().remove(name).is_some()
    }

    /// A capability's spec.
    pub fn capability(&self, name: &str) -> Option<CapabilitySpec> {
        self.capabilities.read().get(name).map(|r| r.spec.clone())
    }

    /// Every capability, by name.
    pub fn capabilities(&self) -> Vec<(String, CapabilitySpec)> {
        let mut v: Vec<_> = self.capabilities.read().iter().map(|(k, v)| (k.clone(), v.spec.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// How long one dispatch on `capability` may take with all its attempts and backoffs, in
    /// milliseconds, plus 10 s of slack: the plan executor's deadline for it, after which the
    /// outcome counts as unknown. A worker capability without its own `deadline_ms` (tasks
    /// wait for a worker indefinitely) and an unknown capability get `None`: the executor's
    /// default applies.
    pub fn deadline_ms(&self, capability: &str) -> Option<u64> {
        let d = &self.defaults;
        let backoffs = |backoff: u64, attempts: u32| -> u64 {
            (0..attempts.saturating_sub(1))
                .fold(0u64, |sum, i| sum.saturating_add(backoff.saturating_mul(1 << i.min(30))))
        };
        let total = match self.capability(capability)? {
            CapabilitySpec::Webhook(w) => {
                let attempts = w.attempts.unwrap_or(d.webhook_attempts);
                let per = w.timeout_ms.unwrap_or(d.webhook_timeout_ms);
                per.saturating_mul(u64::from(attempts))
                    .saturating_add(backoffs(w.backoff_ms.unwrap_or(d.webhook_backoff_ms), attempts))
            }
            CapabilitySpec::Worker(w) => {
                let attempts = w.attempts.unwrap_or(d.webhook_attempts);
                w.deadline_ms?
                    .saturating_mul(u64::from(attempts))
                    .saturating_add(backoffs(w.backoff_ms.unwrap_or(d.webhook_backoff_ms), attempts))
            }
        };
        Some(total.saturating_add(10_000))
    }

    /// The worker queue.
    pub fn queue(&self) -> &Arc<TaskQueue> {
        &self.queue
    }

    /// The attempt log.
    pub fn attempts(&self) -> &Arc<AttemptLog> {
        &self.attempts
    }

    /// Runs `req` on its capability (see the module contract).
    pub async fn dispatch(&self, req: DispatchRequest) -> CallOutcome {
        let registered = self.capabilities.read().get(&req.capability).cloned();
        let Some(registered) = registered else {
            let outcome = CallOutcome::not_applied(format!("capability `{}` is not registered", req.capability), false);
            self.count("none", req.operation, &outcome);
            return outcome;
        };
        let (kind, outcome) = match &registered.spec {
            CapabilitySpec::Webhook(w) => {
                let target = webhook::Target { spec: w, url: registered.url.as_ref() };
                (
                    "webhook",
                    webhook::send(&self.http, target, &self.defaults, &req, &self.attempts, &self.metrics).await,
                )
            }
            CapabilitySpec::Worker(w) => ("worker", self.queue.run(&req, w, &self.defaults).await),
        };
        self.count(kind, req.operation, &outcome);
        outcome
    }

    fn count(&self, kind: &str, op: Operation, outcome: &CallOutcome) {
        self.metrics
            .dispatch
            .get_or_create(&DispatchLabels {
                kind: kind.to_owned(),
                operation: op.as_str().to_owned(),
                outcome: label(outcome).to_owned(),
            })
            .inc();
    }
}
