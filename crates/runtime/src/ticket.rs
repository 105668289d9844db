//! The two-step effect protocol: record an effect and get a [`Ticket`] saying what to do,
//! then report how the call ended (docs/engine.md, "The two-step effect protocol").
//!
//! ```text
//!  tx.record(tool, args, opts) ──► durable EffectRecorded ──► Ticket
//!     ExecuteNow{effect, key, call_id, attempt}: the caller runs the call under `key`
//!         ticket.report(CallOutcome) ──► the engine's policy (policy.rs)
//!             Done ─────────────────────────────► Step::Acked(Ack::Executed)  (EffectExecuted durable)
//!             NotApplied{retry}, attempts left ─► Step::Retry{attempt, backoff}: run it again, report again
//!             Unknown ── probe ─► Happened / DidNotHappen (retry) / unknown: abort, compensate blind
//!         ticket dropped unreported ──► outcome unknown (not started: not applied), settled by the engine
//!     Staged / Queued: held; the engine releases it at commit through the tool's call handler
//!     Replayed{output}: the key already executed; nothing to run
//! ```
//!
//! [`crate::Transaction::call`] is this protocol with the tool's own handler as the caller.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tidegate_core::engine::ExecResult;
use tidegate_core::{CallOutcome, EffectId};

use crate::policy::Judged;
use crate::tool::{CallCtx, Tool};
use crate::tx::{Ack, Transaction};
use crate::{Error, Result};

/// What the holder of a [`Ticket`] is to do.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TicketAction {
    /// An eager effect (reversible, idempotent): run the call now, with `key` as the
    /// provider-side idempotency key, then [`Ticket::report`] how it ended. Its pending
    /// record is durable, so after a crash the engine knows the call may have happened.
    ExecuteNow {
        /// Issuance position.
        effect: EffectId,
        /// The effect's idempotency key (the adapter's, or the one the engine derived).
        key: Arc<str>,
        /// The caller's name for the call, if given.
        call_id: Option<Arc<str>>,
        /// Which attempt to run (1 first; a [`Step::Retry`] says the next).
        attempt: u32,
    },
    /// A bufferable effect was staged: nothing to run; it applies at commit (through the
    /// tool's call handler) and reads of its scope in this transaction see it.
    Staged {
        /// Issuance position.
        effect: EffectId,
    },
    /// A gated effect was queued: nothing to run; the engine releases it at commit through
    /// the tool's call handler.
    Queued {
        /// Issuance position.
        effect: EffectId,
    },
    /// The idempotency key had already executed: nothing to run; this is its output.
    Replayed {
        /// Issuance position.
        effect: EffectId,
        /// The recorded output.
        output: Arc<Value>,
    },
}

impl TicketAction {
    /// The effect's issuance position.
    pub fn effect(&self) -> EffectId {
        match self {
            TicketAction::ExecuteNow { effect, .. }
            | TicketAction::Staged { effect }
            | TicketAction::Queued { effect }
            | TicketAction::Replayed { effect, .. } => *effect,
        }
    }
}

/// What the engine made of a report.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Step {
    /// Final: the effect executed and its compensation is registered (durable).
    Acked(Ack),
    /// The attempt did not take effect and the engine's [`crate::RetryPolicy`] has attempts
    /// left: wait `backoff`, run the call again under the same key, and report again.
    Retry {
        /// The attempt to run next.
        attempt: u32,
        /// How long to wait before it.
        backoff: Duration,
    },
}

/// An effect recorded by [`Transaction::record`], waiting for what its holder does. Send it
/// anywhere (another task, a map of a server's open requests); dropping a ticket of an
/// eager effect without a final report reports its outcome as unknown (the transaction
/// aborts and compensates it blind), as for a dropped call, so it is never left in flight.
pub struct Ticket {
    tx: Transaction,
    tool: Tool,
    args: Arc<Value>,
    ctx: CallCtx,
    action: TicketAction,
    /// Awaiting a final report (eager effects only).
    pending: bool,
    /// Handed to its holder (a drop then means the call may have run).
    started: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("tx", &self.tx.id())
            .field("tool", &self.tool.name())
            .field("action", &self.action)
            .field("pending", &self.pending)
            .finish()
    }
}

impl Ticket {
    pub(crate) fn new(tx: Transaction, tool: Tool, args: Arc<Value>, ctx: CallCtx, action: TicketAction) -> Ticket {
        let pending = matches!(action, TicketAction::ExecuteNow { .. });
        Ticket { tx, tool, args, ctx, action, pending, started: false }
    }

    pub(crate) fn start(&mut self) {
        self.started = true;
    }

    /// What to do.
    pub fn action(&self) -> &TicketAction {
        &self.action
    }

    /// The effect's issuance position.
    pub fn effect(&self) -> EffectId {
        self.action.effect()
    }

    /// The transaction the effect belongs to.
    pub fn transaction(&self) -> &Transaction {
        &self.tx
    }

    /// The tool.
    pub fn tool(&self) -> &Tool {
        &self.tool
    }

    /// The arguments as recorded.
    pub fn args(&self) -> &Arc<Value> {
        &self.args
    }

    /// The context the tool's handlers get for this effect.
    pub fn ctx(&self) -> &CallCtx {
        &self.ctx
    }

    /// Whether the ticket still waits for a report (an eager effect not finally reported).
    pub fn pending(&self) -> bool {
        self.pending
    }

    /// The acknowledgement of a ticket with nothing to run (staged, queued, replayed);
    /// `None` for an eager effect.
    pub fn ack(&self) -> Option<Ack> {
        match &self.action {
            TicketAction::ExecuteNow { .. } => None,
            TicketAction::Staged { effect } => Some(Ack::Staged { effect: *effect }),
            TicketAction::Queued { effect } => Some(Ack::Queued { effect: *effect }),
            TicketAction::Replayed { effect, output } => {
                Some(Ack::Replayed { effect: *effect, output: output.clone() })
            }
        }
    }

    fn misuse(&self, detail: String) -> Error {
        Error::TicketMisuse { tx: self.tx.id(), effect: self.effect(), detail }
    }

    /// Reports how the call of an [`TicketAction::ExecuteNow`] ticket ended, and applies
    /// the engine's retry-and-probe policy to it exactly as for a call the engine runs
    /// itself: `Done` executes the effect (its record, which registers the compensation,
    /// is durable before this returns); `NotApplied{retry: true}` with attempts left answers
    /// [`Step::Retry`]; `Unknown` asks the tool's probe; any final failure aborts the
    /// transaction ([`Error::Aborted`]; an unknown outcome is compensated blind and tagged
    /// `unresolved`). A call whose transaction was aborted meanwhile is compensated and
    /// answered [`Error::CallInterrupted`].
    ///
    /// Reporting a ticket that has nothing to run, or one already finally reported, is
    /// [`Error::TicketMisuse`] and changes nothing.
    pub async fn report(&mut self, outcome: CallOutcome) -> Result<Step> {
        let TicketAction::ExecuteNow { effect, attempt, .. } = &mut self.action else {
            return Err(self.misuse(format!("nothing to report: the effect was {}", self.action_name())));
        };
        if !self.pending {
            return Err(self.misuse("already reported: its outcome is final".to_owned()));
        }
        let (id, tried) = (*effect, *attempt);
        let engine = self.tx.engine().clone();
        // Dropped while the probe runs: still pending, so the drop reports an unknown outcome.
        let outcome = match engine.judge(&self.tool, &self.ctx, &self.args, tried, outcome).await {
            Judged::Final(o) => o,
            Judged::Again => {
                let backoff = engine.inner.retry.backoff(tried);
                if let TicketAction::ExecuteNow { attempt, .. } = &mut self.action {
                    *attempt = tried + 1;
                }
                return Ok(Step::Retry { attempt: tried + 1, backoff });
            }
        };
        self.pending = false;
        self.tx.finish_call(&self.tool, id, outcome).await.map(Step::Acked)
    }

    fn action_name(&self) -> &'static str {
        match self.action {
            TicketAction::ExecuteNow { .. } => "executed",
            TicketAction::Staged { .. } => "staged (it is applied at commit)",
            TicketAction::Queued { .. } => "queued (it is released at commit)",
            TicketAction::Replayed { .. } => "replayed from its key",
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.pending {
            return;
        }
        let tool = self.tool.name();
        let outcome = if self.started {
            CallOutcome::unknown(format!("the caller dropped the call of `{tool}` while it ran"))
        } else {
            CallOutcome::not_applied(format!("the caller dropped the call of `{tool}` before it started"), false)
        };
        let (tx, effect, engine) = (self.tx.id(), self.effect(), self.tx.engine());
        if let Ok((ExecResult::Aborted(plan), _)) = engine.with_core(|c| c.executed(tx, effect, outcome)) {
            let tg = engine.clone();
            engine.spawn_owned(async move { tg.run_abort(plan).await });
        }
        engine.notify_turnstile();
    }
}

impl Transaction {
    /// Reports `outcome` for `ticket` ([`Ticket::report`]), refusing a ticket of another
    /// transaction or engine with [`Error::TicketMisuse`].
    pub async fn report(&self, ticket: &mut Ticket, outcome: CallOutcome) -> Result<Step> {
        if ticket.tx.id() != self.id() || !Arc::ptr_eq(&ticket.tx.engine().inner, &self.engine().inner) {
            return Err(Error::TicketMisuse {
                tx: self.id(),
                effect: ticket.effect(),
                detail: if ticket.tx.id() == self.id() {
                    "the ticket belongs to another engine's transaction".to_owned()
                } else {
                    format!("the ticket belongs to transaction {}", ticket.tx.id())
                },
            });
        }
        ticket.report(outcome).await
    }
}
