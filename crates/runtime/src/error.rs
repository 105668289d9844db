//! The runtime's error type.

use tidegate_core::{AbortReason, CallOutcome, EffectId, EngineError, Outcome, TxId};
use tidegate_storage::StoreError;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine refused the operation (bad input, wrong state, protocol).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The transaction aborted; the outcome holds every effect's tag.
    #[error("transaction {} aborted: {}", .0.tx, .0.reason.as_ref().map_or_else(|| "unknown reason".to_owned(), ToString::to_string))]
    Aborted(Box<Outcome>),
    /// The transaction has finished (or is finishing) and takes no more work: this says how
    /// it ended. Retryable (in a new transaction) when it aborted for a retryable reason,
    /// such as an expired lease or a stale read.
    #[error("transaction {tx} {}", finished_text(*.committed, .reason.as_ref(), *.settled))]
    Finished {
        /// The transaction.
        tx: TxId,
        /// Whether it committed.
        committed: bool,
        /// Why it aborted (`None` for a commit).
        reason: Option<AbortReason>,
        /// `false` while its settlement (releases, compensations) is still running.
        settled: bool,
    },
    /// The ledger store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another owner holds this engine's ledger stream (a node that took the tenant over):
    /// the engine was fenced out and stopped, and refuses every later operation with this
    /// error. Not retryable on this engine; the work belongs to the new owner now, whose
    /// ledger holds everything this engine acknowledged.
    #[error(transparent)]
    Fenced(Fence),
    /// A malformed argument.
    #[error("invalid `{field}` = {value}: expected {expected}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// The value given.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A tool named in the ledger or a plan is not registered with this engine.
    #[error("tool `{name}` is not registered with this engine{detail}")]
    UnknownTool {
        /// The name.
        name: String,
        /// Context.
        detail: String,
    },
    /// An eager call returned after its transaction had been aborted (by another task, an
    /// expired lease, a lost speculation): what the call did was compensated or recorded, and
    /// the transaction's outcome says how it settled.
    #[error("transaction {tx} was aborted while `{tool}` ran: {detail}")]
    CallInterrupted {
        /// The transaction.
        tx: TxId,
        /// The tool.
        tool: String,
        /// What became of the call (the tool's own message when it failed).
        detail: String,
    },
    /// A ticket of the two-step effect protocol was used against it: reported when it has
    /// nothing to run or was already finally reported, or reported to a transaction it does
    /// not belong to. Nothing was recorded.
    #[error("ticket of effect {effect} of {tx} refused: {detail}")]
    TicketMisuse {
        /// The transaction the report was made to.
        tx: TxId,
        /// The ticket's effect.
        effect: EffectId,
        /// What was wrong.
        detail: String,
    },
    /// A reversible call inside a plan without a compensation descriptor
    /// ([`crate::CallOptions::compensate`]): the plan could never undo it once the step
    /// commits. Nothing was recorded.
    #[error(
        "tool `{tool}` is reversible and its call is a step of plan {plan}: give it a compensation descriptor (CallOptions::compensate), or a plan failure could never undo it"
    )]
    MissingDescriptor {
        /// The tool called.
        tool: String,
        /// The plan the transaction is a step of.
        plan: u64,
    },
    /// A plan operation was refused (unknown plan, wrong state, cross-tenant trigger,
    /// invalid field), or the plan executor's log failed.
    #[error(transparent)]
    Plan(#[from] tidegate_plans::PlanError),
    /// The trace file could not be created or written.
    #[error("trace file `{}`: {source}", path.display())]
    Trace {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Error {
    /// Whether running the same work again (at a fresh epoch, for aborts) may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Engine(e) => e.retryable(),
            Error::Aborted(o) => o.reason.as_ref().is_some_and(AbortReason::retryable),
            Error::Finished { committed, reason, .. } => {
                !committed && reason.as_ref().is_some_and(AbortReason::retryable)
            }
            Error::Store(e) => e.retryable(),
            Error::Fenced(_) => false,
            // A plan log failure is a store or engine failure: as transient as its cause (after
            // it the executor answers `PlanError::Stopped`, not retryable, until the engine is
            // reopened, as the engine itself does after a failed append). Plan refusals stay
            // not retryable here, although `PlanError::retryable` calls an unsettled step so,
            // until the front doors (in-process, Python, HTTP) share one classification.
            Error::Plan(e @ tidegate_plans::PlanError::Log { .. }) => e.retryable(),
            Error::Plan(_) | Error::MissingDescriptor { .. } => false,
            Error::InvalidArgument { .. }
            | Error::UnknownTool { .. }
            | Error::CallInterrupted { .. }
            | Error::TicketMisuse { .. }
            | Error::Trace { .. } => false,
        }
    }

    /// Whether this engine was fenced out of its ledger stream: [`Error::Fenced`], or a store
    /// or plan-log failure caused by the store refusing this handle as an old owner. A front
    /// door that sees it stops serving the engine's tenant here (another node owns it now).
    pub fn is_fenced(&self) -> bool {
        match self {
            Error::Fenced(_) => true,
            Error::Store(e) => e.is_fenced(),
            Error::Plan(p) => plan_fenced(p),
            _ => false,
        }
    }

    /// The fence that stopped the engine: [`Error::Fenced`], or a plan-log failure whose
    /// cause is one.
    pub fn fence(&self) -> Option<&Fence> {
        match self {
            Error::Fenced(f) => Some(f),
            Error::Plan(p) => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(p);
                while let Some(c) = cause {
                    if let Some(f) = c.downcast_ref::<Error>().and_then(Error::fence) {
                        return Some(f);
                    }
                    cause = c.source();
                }
                None
            }
            _ => None,
        }
    }

    /// The outcome, when the error is an abort.
    pub fn outcome(&self) -> Option<&Outcome> {
        match self {
            Error::Aborted(o) => Some(o),
            _ => None,
        }
    }

    /// The abort reason, when the error is an abort.
    pub fn abort_reason(&self) -> Option<&AbortReason> {
        self.outcome().and_then(|o| o.reason.as_ref())
    }
}

/// Whether a plan error was caused by a fenced store or engine (its cause chain holds one).
fn plan_fenced(p: &tidegate_plans::PlanError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(p);
    while let Some(c) = cause {
        if let Some(e) = c.downcast_ref::<Error>()
            && e.is_fenced()
        {
            return true;
        }
        if c.downcast_ref::<StoreError>().is_some_and(StoreError::is_fenced) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Why an engine stopped as a fenced-out owner: whose ledger stream, the token this engine
/// appended with, and the newer owner's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant `{tenant}`: ledger stream {stream} is owned by token {current} now; this engine (token {token}) was \
     fenced out and stopped: it accepts nothing more, and the new owner serves the tenant"
)]
pub struct Fence {
    /// The tenant the engine served ([`crate::Builder::tenant`], `default` unless set).
    pub tenant: String,
    /// The ledger stream, in the backend's terms (a data directory, a stream name).
    pub stream: String,
    /// The fencing token this engine appended with.
    pub token: u64,
    /// The token of the owner that holds the stream now (0 if the store did not say).
    pub current: u64,
}

impl Fence {
    /// The fence `err` reports for an engine serving `tenant`, if `err` is (or was caused by)
    /// the store refusing an old owner.
    pub(crate) fn from_store(tenant: &str, err: &StoreError) -> Option<Fence> {
        match err {
            StoreError::Fenced { stream, token, current } => {
                Some(Fence { tenant: tenant.to_owned(), stream: stream.clone(), token: *token, current: *current })
            }
            StoreError::Failed { cause } => Fence::from_store(tenant, cause),
            _ => None,
        }
    }
}

fn finished_text(committed: bool, reason: Option<&AbortReason>, settled: bool) -> String {
    let how = match (committed, settled) {
        (true, true) => "has already committed",
        (true, false) => "is committing",
        (false, true) => "has already aborted",
        (false, false) => "is aborting",
    };
    match reason {
        Some(r) if r.retryable() => format!("{how}: {r}; retry the work in a new transaction"),
        Some(r) => format!("{how}: {r}"),
        None => format!("{how}; it takes no more reads, calls or decisions"),
    }
}

/// How a tool handler failed, as the adapter reports it.
///
/// Only [`ToolError::failed`] and [`ToolError::transient`] say the call did not take effect;
/// every other failure (an [`ToolError::unknown`], a plain error converted with `?` or
/// `.into()`, a panic) is an unknown outcome: the engine asks the tool's probe and otherwise
/// never assumes it did not happen (docs/engine.md, "Failures").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// What went wrong, in the tool's words (kept in errors and the ledger).
    pub message: String,
    /// Which failure it is.
    pub kind: FailureKind,
}

/// The kind of a [`ToolError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The call certainly did not take effect, and trying again will not help (the provider
    /// refused it).
    NotApplied,
    /// The call certainly did not take effect, and trying again may help (a refused
    /// connection, a 503 before processing). Never use it for timeouts.
    Transient,
    /// The call may or may not have taken effect (a timeout after sending, a reset
    /// connection, any error the handler did not classify).
    Unknown,
}

impl ToolError {
    /// The provider refused the call: it certainly did not take effect; not worth retrying.
    pub fn failed(message: impl Into<String>) -> ToolError {
        ToolError { message: message.into(), kind: FailureKind::NotApplied }
    }

    /// A transient failure certainly without effect; the runtime retries it with backoff.
    pub fn transient(message: impl Into<String>) -> ToolError {
        ToolError { message: message.into(), kind: FailureKind::Transient }
    }

    /// The call may or may not have taken effect (timeout). The runtime asks the tool's probe;
    /// without one the effect is compensated (if it can be) and tagged `unresolved`.
    pub fn unknown(message: impl Into<String>) -> ToolError {
        ToolError { message: message.into(), kind: FailureKind::Unknown }
    }

    /// Whether the call is known not to have taken effect and may be retried.
    pub fn retryable(&self) -> bool {
        self.kind == FailureKind::Transient
    }

    /// Whether the call may have taken effect.
    pub fn outcome_unknown(&self) -> bool {
        self.kind == FailureKind::Unknown
    }

    /// The engine's typed outcome for this failure.
    pub fn into_outcome(self) -> CallOutcome {
        match self.kind {
            FailureKind::NotApplied => CallOutcome::NotApplied { message: self.message, retry: false },
            FailureKind::Transient => CallOutcome::NotApplied { message: self.message, retry: true },
            FailureKind::Unknown => CallOutcome::Unknown { message: self.message },
        }
    }
}

/// A plain message is an unclassified failure: outcome unknown.
impl From<String> for ToolError {
    fn from(message: String) -> ToolError {
        ToolError::unknown(message)
    }
}

/// A plain message is an unclassified failure: outcome unknown.
impl From<&str> for ToolError {
    fn from(message: &str) -> ToolError {
        ToolError::unknown(message)
    }
}

/// An I/O error says nothing about whether the provider acted: outcome unknown.
impl From<std::io::Error> for ToolError {
    fn from(e: std::io::Error) -> ToolError {
        ToolError::unknown(e.to_string())
    }
}
