//! The dispatch vocabulary every layer shares (docs/service.md, "Dispatch vocabulary"): what
//! a dispatch asks ([`Operation`], [`DispatchRequest`]), under which key ([`DispatchKey`], a
//! value rendered to text once, where it leaves the process), how it ended
//! ([`crate::CallOutcome`]), who runs it ([`Dispatch`]: the in-process capabilities of an
//! engine, a server's webhooks and pull workers, later an MCP upstream) and the time it is
//! measured by ([`Clock`]). The plan executor, the runtime, the service and the language
//! bindings all speak it; nothing is spelled twice.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::effect::CallOutcome;
use crate::ids::Timestamp;

/// A boxed future that can cross threads (what [`Dispatch`] and [`Clock`] return).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a dispatch asks a capability to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Run an eager effect's call.
    Call,
    /// Release a held effect at commit.
    Release,
    /// Undo an executed effect.
    Compensate,
    /// Ask whether the operation with this key took effect.
    Probe,
}

impl Operation {
    /// `call`, `release`, `compensate` or `probe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Call => "call",
            Operation::Release => "release",
            Operation::Compensate => "compensate",
            Operation::Probe => "probe",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The idempotency key a dispatch carries, kept as what it is (the forward effect's key, a
/// compensation of it, or a key a descriptor named) and rendered to text once, where the
/// dispatch leaves the process: `<key>` for a call, a release and a probe of the forward
/// effect, `<key>#compensate` for its compensation. Attempts are filed under the forward
/// effect's key ([`DispatchKey::effect`]) whatever the operation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DispatchKey {
    effect: Arc<str>,
    kind: KeyKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyKind {
    Effect,
    Compensation,
    Given(Arc<str>),
}

/// The suffix that names a compensation's key.
const COMPENSATE: &str = "#compensate";

impl DispatchKey {
    /// The forward effect's own key (a call, a release, a probe of it).
    pub fn effect(key: impl Into<Arc<str>>) -> DispatchKey {
        DispatchKey { effect: key.into(), kind: KeyKind::Effect }
    }

    /// The key of the compensation of the effect keyed `key`.
    pub fn compensation(key: impl Into<Arc<str>>) -> DispatchKey {
        DispatchKey { effect: key.into(), kind: KeyKind::Compensation }
    }

    /// A key a descriptor named for the dispatch (a plan's compensation with its own key),
    /// for the effect keyed `effect`.
    pub fn given(effect: impl Into<Arc<str>>, key: impl Into<Arc<str>>) -> DispatchKey {
        DispatchKey { effect: effect.into(), kind: KeyKind::Given(key.into()) }
    }

    /// The forward effect's key (what attempts are filed under).
    pub fn forward(&self) -> &str {
        &self.effect
    }

    /// Whether this is the key of a compensation (derived or named).
    pub fn is_compensation(&self) -> bool {
        !matches!(self.kind, KeyKind::Effect)
    }
}

impl fmt::Display for DispatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KeyKind::Effect => f.write_str(&self.effect),
            KeyKind::Compensation => write!(f, "{}{COMPENSATE}", self.effect),
            KeyKind::Given(k) => f.write_str(k),
        }
    }
}

/// Serialized as its rendered text (the form every attempt carries).
impl serde::Serialize for DispatchKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One dispatch: a call, a release, a compensation or a probe sent to a handler by name.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchRequest {
    /// The handler's name (a capability of a server or an engine).
    pub capability: String,
    /// What it is asked to do.
    pub operation: Operation,
    /// The forward effect's tool.
    pub tool: String,
    /// The key every attempt carries.
    pub key: DispatchKey,
    /// The arguments (for a compensation, a descriptor's references already resolved).
    pub args: Arc<Value>,
    /// The forward effect's output, when known (compensations).
    pub output: Option<Arc<Value>>,
}

/// The default time a caller waits for one dispatch before its outcome counts as unknown
/// (5 minutes); see [`Dispatch::deadline`].
pub const DEFAULT_DISPATCH_DEADLINE: Duration = Duration::from_secs(300);

/// Runs dispatches by name: the one trait behind an engine's in-process capabilities, a
/// server's webhooks and pull workers (and any later backend, an MCP upstream among them).
///
/// Contract: `dispatch` runs the request with the backend's own retries and answers how it
/// ended, in the one vocabulary: `Done` (took effect; for a probe: it happened), `NotApplied`
/// (certainly did not; `retry` if trying again may help), `Unknown` (may have). It MUST NOT
/// answer `Done` or `NotApplied` unless it knows; a panic or a timeout is `Unknown`. Every
/// attempt carries `request.key` rendered as text.
pub trait Dispatch: Send + Sync + fmt::Debug {
    /// Runs one dispatch.
    fn dispatch(&self, request: DispatchRequest) -> BoxFuture<CallOutcome>;

    /// How long a caller waits for `request` before it stops waiting and takes the outcome
    /// as unknown (the future is dropped). Default [`DEFAULT_DISPATCH_DEADLINE`]; a backend
    /// returns each handler's own bound.
    fn deadline(&self, request: &DispatchRequest) -> Duration {
        let _ = request;
        DEFAULT_DISPATCH_DEADLINE
    }
}

/// A source of time and sleeps: the one clock every layer reads (the engine, its plan
/// executor, a server's tickets), never the system's directly, so that tests run on a paused
/// or manual clock.
///
/// `now` MUST be monotonic. `sleep_until` MUST NOT resolve before `now() >= deadline`.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
    /// A future that resolves once `now() >= deadline`.
    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<()>;
}

impl<D: Dispatch + ?Sized> Dispatch for Arc<D> {
    fn dispatch(&self, request: DispatchRequest) -> BoxFuture<CallOutcome> {
        (**self).dispatch(request)
    }

    fn deadline(&self, request: &DispatchRequest) -> Duration {
        (**self).deadline(request)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }

    fn sleep_until(&self, deadline: Timestamp) -> BoxFuture<()> {
        (**self).sleep_until(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_rendered_once_at_the_edge_and_files_under_the_forward_key() {
        let k = DispatchKey::effect("tx_ab_7:book:0");
        assert_eq!(k.to_string(), "tx_ab_7:book:0");
        let c = DispatchKey::compensation("tx_ab_7:book:0");
        assert_eq!(c.to_string(), "tx_ab_7:book:0#compensate");
        assert_eq!(c.forward(), "tx_ab_7:book:0");
        assert!(c.is_compensation() && !k.is_compensation());
        let g = DispatchKey::given("tx_ab_7:book:0", "refund-77");
        assert_eq!((g.to_string().as_str(), g.forward()), ("refund-77", "tx_ab_7:book:0"));
    }
}
