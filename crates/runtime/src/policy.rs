//! The one retry-and-probe policy every call the engine makes goes through: eager calls,
//! releases at commit and compensations alike (docs/engine.md, "Failures").
//!
//! ```text
//!  call ──► Done ─────────────────────────────────────────────► Done(output)
//!    │
//!    ├────► NotApplied{retry} ── attempts left? ── backoff ──► call again
//!    │                 └──────── no ──────────────────────────► NotApplied (final)
//!    │
//!    └────► Unknown (incl. a plain error, a panic) ──► probe?
//!                 ├── Happened(v) ─────────────────────────────► Done(v)
//!                 ├── DidNotHappen ── attempts left? ── backoff ► call again
//!                 │                   └── no ──────────────────► NotApplied{retry: true}
//!                 └── Unknown / no probe / probe panicked ─────► Unknown (final: never re-executed)
//! ```
//!
//! A compensation is retried on every failure, whatever its kind, up to the same attempts:
//! compensation handlers must tolerate running twice (recovery may re-run them), so even an
//! unknown outcome of an undo is safe to try again.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;
use tidegate_core::CallOutcome;

use crate::engine::Tidegate;
use crate::tool::{CallCtx, Compensation, Probe, Tool};

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}

/// Runs `make` and the future it returns, turning a panic in either into `Err(message)`.
pub(crate) async fn caught<T, F>(make: impl FnOnce() -> F) -> Result<T, String>
where
    F: std::future::Future<Output = T>,
{
    let fut = std::panic::catch_unwind(AssertUnwindSafe(make)).map_err(|p| panic_message(&*p))?;
    AssertUnwindSafe(fut).catch_unwind().await.map_err(|p| panic_message(&*p))
}

/// What the policy makes of one attempt's outcome.
pub(crate) enum Judged {
    /// How the call finally ended.
    Final(CallOutcome),
    /// Not applied (or the probe says it did not happen) and attempts are left: call again
    /// after the backoff.
    Again,
}

impl Tidegate {
    /// Runs a forward call (an eager call, or a held effect's release) under the engine's
    /// [`crate::RetryPolicy`] and returns how it finally ended. Never re-executes a call whose
    /// outcome is unknown unless the tool's probe says it did not happen.
    pub(crate) async fn call_under_policy(&self, tool: &Tool, ctx: &CallCtx, args: &Arc<Value>) -> CallOutcome {
        let mut attempt = 1;
        loop {
            let outcome = self.attempt(tool, ctx, args).await;
            if let Judged::Final(outcome) = self.judge(tool, ctx, args, attempt, outcome).await {
                return outcome;
            }
            self.backoff(attempt).await;
            attempt += 1;
        }
    }

    /// One attempt of a forward call: the tool's handler, a panic caught as an unknown outcome.
    pub(crate) async fn attempt(&self, tool: &Tool, ctx: &CallCtx, args: &Arc<Value>) -> CallOutcome {
        match caught(|| tool.invoke(ctx.clone(), args.clone())).await {
            Ok(Ok(output)) => CallOutcome::done(output),
            Ok(Err(e)) => e.into_outcome(),
            Err(panic) => CallOutcome::unknown(format!("the handler panicked: {panic}")),
        }
    }

    /// The policy's verdict on attempt `attempt` (1-based) of a forward call that ended in
    /// `outcome`, wherever the call ran (in this process, or by a caller of the two-step
    /// protocol that reports it): an unknown outcome goes to the tool's probe; a failure
    /// without effect is tried again while attempts are left.
    pub(crate) async fn judge(
        &self,
        tool: &Tool,
        ctx: &CallCtx,
        args: &Arc<Value>,
        attempt: u32,
        outcome: CallOutcome,
    ) -> Judged {
        let attempts = self.inner.retry.attempts.max(1);
        match outcome {
            done @ CallOutcome::Done { .. } => Judged::Final(done),
            CallOutcome::NotApplied { retry: true, .. } if attempt < attempts => Judged::Again,
            CallOutcome::NotApplied { message, retry } => {
                let message = if attempt > 1 { format!("{message} (after {attempt} attempts)") } else { message };
                Judged::Final(CallOutcome::NotApplied { message, retry })
            }
            CallOutcome::Unknown { message } => match self.probe(tool, ctx, args).await {
                Ok(Probe::Happened(output)) => Judged::Final(CallOutcome::done(output)),
                Ok(Probe::DidNotHappen) if attempt < attempts => Judged::Again,
                Ok(Probe::DidNotHappen) => {
                    let message = format!("{message} (the probe says it did not happen; after {attempt} attempts)");
                    Judged::Final(CallOutcome::NotApplied { message, retry: true })
                }
                Ok(Probe::Unknown) => {
                    Judged::Final(CallOutcome::unknown(format!("{message} (outcome unknown; the probe did not know)")))
                }
                Err(why) => Judged::Final(CallOutcome::unknown(format!("{message} (outcome unknown; {why})"))),
            },
        }
    }

    /// Asks the tool's probe; `Err` says why there is no answer (no probe, or it panicked).
    async fn probe(&self, tool: &Tool, ctx: &CallCtx, args: &Arc<Value>) -> Result<Probe, String> {
        let probe = caught(|| async { tool.probe_call(ctx.clone(), args.clone()) }).await?;
        let Some(fut) = probe else { return Err("the tool has no probe".to_owned()) };
        caught(|| fut).await.map_err(|panic| format!("the probe panicked: {panic}"))
    }

    /// Runs a compensation under the policy: `Ok(residue)`, or the last failure after the
    /// policy's attempts.
    pub(crate) async fn compensate_under_policy(
        &self,
        tool: &Tool,
        ctx: &CallCtx,
        args: &Arc<Value>,
        output: &Arc<Value>,
    ) -> Result<Option<String>, String> {
        let attempts = self.inner.retry.attempts.max(1);
        let mut attempt = 1;
        loop {
            let Some(fut) = tool.compensate_call(ctx.clone(), args.clone(), output.clone()) else {
                return Err(format!("tool `{}` has no compensation handler", tool.name()));
            };
            let message = match caught(|| fut).await {
                Ok(Ok(Compensation { residue })) => return Ok(residue),
                Ok(Err(e)) => e.message,
                Err(panic) => format!("the compensation panicked: {panic}"),
            };
            if attempt >= attempts {
                return Err(if attempt > 1 { format!("{message} (after {attempt} attempts)") } else { message });
            }
            self.backoff(attempt).await;
            attempt += 1;
        }
    }

    /// Sleeps the policy's backoff before attempt `attempt + 1`, on the engine's clock.
    pub(crate) async fn backoff(&self, attempt: u32) {
        let at = self.inner.clock.now().after(self.inner.retry.backoff(attempt));
        self.inner.clock.sleep_until(at).await;
    }
}
