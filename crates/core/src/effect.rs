//! Effects, their classes, and how each one settled.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{EffectId, Epoch, TxId};
use crate::scope::Scope;

/// How an effect may be undone and when it may externalise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EffectClass {
    /// Executes at once (the provider sees it); compensated on abort.
    Reversible,
    /// As `Reversible`, but compensation leaves residue (a fee) that is reported.
    ReversibleWithCost,
    /// Not executed; staged in the transaction, visible only to it; applied on commit.
    Bufferable,
    /// Irreversible: not executed; the agent gets a queued acknowledgement; fires on commit.
    Gated,
    /// Executes at once under a provider-side idempotency key; safe to retry.
    Idempotent,
}

impl EffectClass {
    /// Whether the effect runs when called (as opposed to being held until commit).
    pub fn executes_eagerly(self) -> bool {
        matches!(self, EffectClass::Reversible | EffectClass::ReversibleWithCost | EffectClass::Idempotent)
    }

    /// The snake_case name used in APIs and the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::Reversible => "reversible",
            EffectClass::ReversibleWithCost => "reversible_with_cost",
            EffectClass::Bufferable => "bufferable",
            EffectClass::Gated => "gated",
            EffectClass::Idempotent => "idempotent",
        }
    }
}

impl fmt::Display for EffectClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EffectClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "reversible" => EffectClass::Reversible,
            "reversible_with_cost" => EffectClass::ReversibleWithCost,
            "bufferable" => EffectClass::Bufferable,
            "gated" | "irreversible" | "irreversible_gated" => EffectClass::Gated,
            "idempotent" | "idempotent_known_outcome" => EffectClass::Idempotent,
            other => {
                return Err(format!(
                    "unknown effect class `{other}`; expected one of reversible, reversible_with_cost, bufferable, gated, idempotent"
                ));
            }
        })
    }
}

/// What the engine needs to know about one tool call to route it.
#[derive(Debug, Clone)]
pub struct EffectDecl {
    /// The tool's registered name.
    pub tool: Arc<str>,
    /// The effect class.
    pub class: EffectClass,
    /// The canonical scopes the call may touch (at least one).
    pub scopes: Vec<Scope>,
    /// The adapter's idempotency key, engine-wide and kept across restarts. `None` derives
    /// a key local to the transaction: `tool:tx:call:<call_id>` with [`EffectDecl::call_id`],
    /// else `tool:tx:n` with `n` the call's issuance position (so every call is a new one).
    pub key: Option<Arc<str>>,
    /// The caller's id for this call within its transaction (an LLM's tool-call id, a step
    /// number): a call repeated with the same id is a retry and replays the first one's
    /// outcome. Only used when `key` is `None`.
    pub call_id: Option<Arc<str>>,
    /// The call's arguments (also its staged value for bufferable effects).
    pub args: Arc<Value>,
    /// Whether the adapter supplied a compensation handler.
    pub compensable: bool,
}

/// How one call of a tool ended: the single result type of every call the engine makes (an
/// eager call, a release at commit) once the retry-and-probe policy is done with it, and of
/// each attempt before that. It carries the tool's own message into errors and the ledger.
///
/// The failure rule (docs/engine.md, "Failures"): only [`CallOutcome::NotApplied`] says a
/// call did not take effect. Every other failure (a plain error, a panic, a dropped call) is
/// [`CallOutcome::Unknown`]: the call may have taken effect, so it is never re-executed unless
/// the tool's probe says it did not happen.
///
/// Recorded in the ledger as the existing `effect_failed` / `released` fields (`error` is the
/// message, `unknown` tells the two failures apart); `retry` is not recorded, because a
/// recorded failure is final.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CallOutcome {
    /// The call took effect; its output.
    Done {
        /// The tool's output.
        output: Arc<Value>,
        /// What a compensation could not undo (a fee), when it reported any. `None` for a
        /// call, a release and a probe.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        residue: Option<String>,
    },
    /// The call certainly did not take effect.
    NotApplied {
        /// The tool's message.
        message: String,
        /// Whether trying again may succeed (a refused connection, a 503 before processing).
        /// After the policy's last attempt, a `retry: true` failure aborts the transaction
        /// retryably ([`AbortReason::ToolUnavailable`]).
        retry: bool,
    },
    /// The call may or may not have taken effect (a timeout after sending, a plain error, a
    /// panic, a dropped call).
    Unknown {
        /// The tool's message.
        message: String,
    },
}

impl CallOutcome {
    /// A call that took effect with `output`.
    pub fn done(output: impl Into<Arc<Value>>) -> CallOutcome {
        CallOutcome::Done { output: output.into(), residue: None }
    }

    /// A compensation that took effect with `output`, leaving `residue` (if any).
    pub fn done_with_residue(output: impl Into<Arc<Value>>, residue: Option<String>) -> CallOutcome {
        CallOutcome::Done { output: output.into(), residue }
    }

    /// A call that certainly did not take effect; `retry` says whether trying again may help.
    pub fn not_applied(message: impl Into<String>, retry: bool) -> CallOutcome {
        CallOutcome::NotApplied { message: message.into(), retry }
    }

    /// A call whose outcome is unknown.
    pub fn unknown(message: impl Into<String>) -> CallOutcome {
        CallOutcome::Unknown { message: message.into() }
    }

    /// The output, when the call took effect.
    pub fn output(&self) -> Option<&Arc<Value>> {
        match self {
            CallOutcome::Done { output, .. } => Some(output),
            _ => None,
        }
    }

    /// Whether it took effect.
    pub fn is_done(&self) -> bool {
        matches!(self, CallOutcome::Done { .. })
    }

    /// The tool's message, when the call failed.
    pub fn message(&self) -> Option<&str> {
        match self {
            CallOutcome::Done { .. } => None,
            CallOutcome::NotApplied { message, .. } | CallOutcome::Unknown { message } => Some(message),
        }
    }

    /// Whether the call may have taken effect without the engine knowing (an unknown outcome).
    pub fn is_unknown(&self) -> bool {
        matches!(self, CallOutcome::Unknown { .. })
    }
}

/// The acknowledgement the agent gets for a held effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldAck {
    /// A bufferable effect was staged; it applies on commit.
    Staged,
    /// A gated effect was queued; it fires on commit.
    Queued,
}

/// The per-effect outcome tag of a settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Tag {
    /// Settled as intended: released on commit, or discarded/compensated on abort.
    Clean,
    /// An irreversible effect left before the abort decision.
    Leaked,
    /// Needs an operator: compensation failed or missing, residue of a reversible-with-cost
    /// effect, or an outcome that is unknown.
    Unresolved,
    /// Of several held releases, some fired and this one failed (or was never attempted).
    PartialCommit,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tag::Clean => "clean",
            Tag::Leaked => "leaked",
            Tag::Unresolved => "unresolved",
            Tag::PartialCommit => "partial-commit",
        })
    }
}

/// What finally happened to an effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Disposition {
    /// Executed eagerly and accepted as final on commit.
    Accepted,
    /// Staged and applied on commit.
    Applied,
    /// Queued and fired on commit.
    Fired,
    /// Held and dropped: never executed.
    Discarded,
    /// Executed, then compensated on abort.
    Compensated,
    /// Executed; compensation failed after retries.
    CompensationFailed,
    /// Executed; no compensation handler exists, so it stands at the provider.
    NotCompensable,
    /// A held release failed after retries.
    ReleaseFailed,
    /// A held release not attempted because an earlier one failed.
    NotReleased,
    /// The call's outcome is unknown (crash, timeout with no probe).
    Unknown,
    /// The key had already executed; the recorded outcome was returned instead.
    Replayed,
}

/// How one effect settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectOutcome {
    /// Issuance position.
    pub id: EffectId,
    /// Tool name.
    pub tool: Arc<str>,
    /// Effect class.
    pub class: EffectClass,
    /// Idempotency key.
    pub key: Arc<str>,
    /// What happened.
    pub disposition: Disposition,
    /// The settlement tag.
    pub tag: Tag,
    /// Why, when it is not plain (error text, residue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Why a transaction aborted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AbortReason {
    /// A tool call failed.
    ToolFailed {
        /// The tool.
        tool: String,
        /// The failure.
        message: String,
    },
    /// A tool call certainly did not take effect and still failed transiently after the
    /// retry policy's last attempt (or its probe kept saying it did not happen): nothing of it
    /// left, so running the work again later may succeed.
    ToolUnavailable {
        /// The tool.
        tool: String,
        /// The last failure.
        message: String,
    },
    /// A held effect could not be released at commit, before anything had been released.
    ReleaseFailed {
        /// The tool.
        tool: String,
        /// The failure.
        message: String,
    },
    /// A pre-commit hook vetoed.
    Vetoed {
        /// The hook's name.
        hook: String,
        /// Its reason.
        reason: String,
    },
    /// Another branch of the speculation group won.
    LostBranch {
        /// The winning transaction.
        winner: TxId,
    },
    /// A scope this transaction read was overwritten by a commit before it could commit.
    StaleRead {
        /// The scope.
        scope: String,
        /// The version read.
        read: u64,
        /// The version at commit time.
        current: u64,
    },
    /// The transaction's lease expired while it was open.
    LeaseExpired,
    /// The commit wait exceeded the caller's timeout.
    WaitTimeout,
    /// The transaction broke the protocol (late effect, scope outside may-touch, ...).
    ProtocolViolation {
        /// What happened.
        what: String,
    },
    /// The caller aborted.
    Explicit {
        /// The caller's reason.
        reason: String,
    },
    /// Snapshot isolation: a scope this transaction writes was committed by another
    /// transaction after this one began.
    WriteConflict {
        /// The scope.
        scope: String,
        /// The commit stamp the transaction began at.
        snapshot: u64,
        /// The scope's version at commit time.
        current: u64,
    },
    /// Pessimistic locking: an earlier transaction holds a scope this one touched.
    LockConflict {
        /// The scope.
        scope: String,
    },
    /// L2: a committed transaction whose writes this one read was retracted.
    CascadingAbort {
        /// The retracted predecessor.
        predecessor: TxId,
    },
    /// L4: a tool this transaction used changed or disappeared since its first read.
    PhantomTool {
        /// The tool.
        tool: String,
        /// Its signature when the transaction first read.
        pinned: u64,
        /// Its signature now (`None`: removed).
        current: Option<u64>,
    },
}

impl AbortReason {
    /// Whether re-running the transaction's work at a fresh epoch may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            AbortReason::StaleRead { .. }
                | AbortReason::ToolUnavailable { .. }
                | AbortReason::LeaseExpired
                | AbortReason::WaitTimeout
                | AbortReason::WriteConflict { .. }
                | AbortReason::LockConflict { .. }
                | AbortReason::CascadingAbort { .. }
                | AbortReason::PhantomTool { .. }
        )
    }

    /// A short machine name, e.g. `stale_read`.
    pub fn kind(&self) -> &'static str {
        match self {
            AbortReason::ToolFailed { .. } => "tool_failed",
            AbortReason::ToolUnavailable { .. } => "tool_unavailable",
            AbortReason::ReleaseFailed { .. } => "release_failed",
            AbortReason::Vetoed { .. } => "vetoed",
            AbortReason::LostBranch { .. } => "lost_branch",
            AbortReason::StaleRead { .. } => "stale_read",
            AbortReason::LeaseExpired => "lease_expired",
            AbortReason::WaitTimeout => "wait_timeout",
            AbortReason::ProtocolViolation { .. } => "protocol_violation",
            AbortReason::Explicit { .. } => "explicit",
            AbortReason::WriteConflict { .. } => "write_conflict",
            AbortReason::LockConflict { .. } => "lock_conflict",
            AbortReason::CascadingAbort { .. } => "cascading_abort",
            AbortReason::PhantomTool { .. } => "phantom_tool",
        }
    }
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortReason::ToolFailed { tool, message } => write!(f, "tool `{tool}` failed: {message}"),
            AbortReason::ToolUnavailable { tool, message } => {
                write!(f, "tool `{tool}` unavailable (the call did not take effect): {message}")
            }
            AbortReason::ReleaseFailed { tool, message } => {
                write!(f, "release of `{tool}` failed at commit: {message}")
            }
            AbortReason::Vetoed { hook, reason } => write!(f, "vetoed by hook `{hook}`: {reason}"),
            AbortReason::LostBranch { winner } => write!(f, "lost the speculation to {winner}"),
            AbortReason::StaleRead { scope, read, current } => {
                write!(f, "stale read of `{scope}`: read v{read}, now v{current}")
            }
            AbortReason::LeaseExpired => f.write_str("lease expired while open"),
            AbortReason::WaitTimeout => f.write_str("commit wait timed out"),
            AbortReason::ProtocolViolation { what } => write!(f, "protocol violation: {what}"),
            AbortReason::Explicit { reason } => write!(f, "aborted by caller: {reason}"),
            AbortReason::WriteConflict { scope, snapshot, current } => {
                write!(f, "write conflict on `{scope}`: began at stamp {snapshot}, now v{current}")
            }
            AbortReason::LockConflict { scope } => {
                write!(f, "lock conflict: an earlier transaction holds `{scope}`")
            }
            AbortReason::CascadingAbort { predecessor } => {
                write!(f, "cascading abort: {predecessor}, whose writes were read, was retracted")
            }
            AbortReason::PhantomTool { tool, pinned, current: Some(c) } => {
                write!(f, "phantom tool `{tool}`: pinned signature {pinned}, now {c}")
            }
            AbortReason::PhantomTool { tool, pinned, current: None } => {
                write!(f, "phantom tool `{tool}`: pinned signature {pinned}, now removed")
            }
        }
    }
}

/// Which releases of a commit left and which did not, when one failed after others fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartialCommit {
    /// Effects released before the failure.
    pub released: Vec<EffectId>,
    /// The effect whose release failed after retries.
    pub failed: EffectId,
    /// The error of the last attempt.
    pub error: String,
    /// Effects after the failed one, never attempted.
    pub not_attempted: Vec<EffectId>,
}

/// The settlement of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The transaction.
    pub tx: TxId,
    /// Its epoch.
    pub epoch: Epoch,
    /// The agent that ran it.
    pub agent: Arc<str>,
    /// Committed (`true`) or aborted.
    pub committed: bool,
    /// Why it aborted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<AbortReason>,
    /// Every effect, in issuance order.
    pub effects: Vec<EffectOutcome>,
    /// Set when a commit externalised only part of its held effects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialCommit>,
}

impl Outcome {
    /// Effects whose tag is not `clean` (what an operator must look at).
    pub fn residue(&self) -> impl Iterator<Item = &EffectOutcome> {
        self.effects.iter().filter(|e| e.tag != Tag::Clean)
    }

    /// Whether every effect settled `clean`.
    pub fn is_clean(&self) -> bool {
        self.effects.iter().all(|e| e.tag == Tag::Clean)
    }
}
