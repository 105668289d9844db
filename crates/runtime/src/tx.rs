//! The transaction handle an agent (or its orchestrator) holds.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tidegate_core::engine::{Decision, ExecResult, ReadResult, Recorded, SealedView};
use tidegate_core::{
    AbortReason, CallOutcome, EffectClass, EffectDecl, EffectId, Epoch, HeldAck, Outcome, TxId, TxState,
};
use tokio::sync::Notify;

use crate::engine::Tidegate;
use crate::hooks::{PreCommitHook, Verdict};
use crate::ticket::{Step, Ticket, TicketAction};
use crate::tool::{CallCtx, CallHandle, Tool};
use crate::{Error, Result};

/// What the agent is told about a tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum Ack {
    /// An eager effect ran; here is the tool's output. Its compensation is registered.
    Executed {
        /// Issuance position.
        effect: EffectId,
        /// The output.
        output: Arc<Value>,
    },
    /// A bufferable effect was staged; it applies on commit and reads of its scope in this
    /// transaction see it.
    Staged {
        /// Issuance position.
        effect: EffectId,
    },
    /// A gated (irreversible) effect was queued; it fires only on commit.
    Queued {
        /// Issuance position.
        effect: EffectId,
    },
    /// The idempotency key had already executed; this is the recorded output.
    Replayed {
        /// Issuance position.
        effect: EffectId,
        /// The recorded output.
        output: Arc<Value>,
    },
}

impl Ack {
    /// The output, for executed or replayed effects.
    pub fn output(&self) -> Option<&Value> {
        match self {
            Ack::Executed { output, .. } | Ack::Replayed { output, .. } => Some(output),
            _ => None,
        }
    }

    /// The effect's issuance position.
    pub fn effect(&self) -> EffectId {
        match self {
            Ack::Executed { effect, .. }
            | Ack::Staged { effect }
            | Ack::Queued { effect }
            | Ack::Replayed { effect, .. } => *effect,
        }
    }
}

/// Per-call options of [`Transaction::call_with`].
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Overrides the tool's idempotency key (engine-wide, kept across restarts; reusing it
    /// for another tool or other arguments is refused with `EngineError::KeyReused`).
    pub key: Option<String>,
    /// Overrides the tool's scope extractor.
    pub scopes: Option<Vec<String>>,
    /// Names the call within its transaction (an LLM's tool-call id, a step number), for a
    /// call without an idempotency key: calling again with the same id is a retry and
    /// replays the first call's outcome. Without it (and without a key) every call is a new
    /// one, even with the same arguments.
    pub call_id: Option<String>,
    /// An opaque value every handler of this call receives in its [`CallCtx`] while the
    /// transaction is unfinished (a binding's live objects; never recorded).
    pub handle: Option<CallHandle>,
    /// The durable compensation descriptor of a call inside a plan step (docs/plans.md):
    /// recorded in the same ledger event as the call, held until the plan ends and fired by
    /// the plan executor if the plan fails. A reversible call in a plan step needs one
    /// ([`Error::MissingDescriptor`]); a gated call cannot have one (it is irreversible).
    /// Outside a plan it is not recorded (the tool's compensation handler undoes an abort).
    pub compensate: Option<tidegate_plans::Descriptor>,
}

impl CallOptions {
    /// Options with this idempotency key.
    pub fn key(key: impl Into<String>) -> CallOptions {
        CallOptions { key: Some(key.into()), ..CallOptions::default() }
    }

    /// Options naming the call (see [`CallOptions::call_id`]).
    pub fn call_id(id: impl Into<String>) -> CallOptions {
        CallOptions { call_id: Some(id.into()), ..CallOptions::default() }
    }

    /// Options with this compensation descriptor (see [`CallOptions::compensate`]).
    pub fn compensate(descriptor: tidegate_plans::Descriptor) -> CallOptions {
        CallOptions { compensate: Some(descriptor), ..CallOptions::default() }
    }

    /// These options with a compensation descriptor.
    pub fn with_compensation(mut self, descriptor: tidegate_plans::Descriptor) -> CallOptions {
        self.compensate = Some(descriptor);
        self
    }

    /// These options with the scopes given instead of the tool's extractor's.
    pub fn with_scopes<I, S>(mut self, scopes: I) -> CallOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scopes = Some(scopes.into_iter().map(Into::into).collect());
        self
    }
}

/// Options of [`Transaction::commit_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitOptions {
    /// Abort with `wait_timeout` if the commit cannot be decided within this time.
    /// Default: wait as long as earlier transactions hold the scopes (their leases bound it).
    pub wait_timeout: Option<Duration>,
}

/// A transaction. Cheap to clone; clones refer to the same transaction.
#[derive(Clone)]
pub struct Transaction {
    engine: Tidegate,
    id: TxId,
    epoch: Epoch,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction").field("id", &self.id).field("epoch", &self.epoch).finish()
    }
}

impl Transaction {
    pub(crate) fn new(engine: Tidegate, id: TxId, epoch: Epoch) -> Transaction {
        Transaction { engine, id, epoch }
    }

    /// The transaction's id.
    pub fn id(&self) -> TxId {
        self.id
    }

    /// The transaction's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The engine.
    pub fn engine(&self) -> &Tidegate {
        &self.engine
    }

    /// The transaction's lifecycle state; once it has finished, an error saying how it ended
    /// ([`Error::Finished`], or `Settled` if it ended long ago).
    pub fn state(&self) -> Result<TxState> {
        self.engine.refuse_if_fenced()?;
        let g = self.engine.inner.shared.lock();
        g.core.state(self.id).map_err(|e| g.endings.explain(e))
    }

    /// Records a read of `scope` at its committed version; returns the version and, if this
    /// transaction staged a write to the scope, the staged value.
    ///
    /// Record the read *before* observing the world (or use [`Transaction::read_with`],
    /// which does both in that order): a write committed in between then makes this
    /// transaction abort `stale_read` at commit, whereas a read recorded after observing
    /// would vouch for a value older than its version.
    pub fn read(&self, scope: &str) -> Result<ReadResult> {
        let s = self.engine.parse_scope(scope, "read scope")?;
        let now = self.engine.inner.clock.now();
        Ok(self.engine.with_core(|c| c.read(self.id, &s, now))?.0)
    }

    /// Calls `tool` with `args` through the engine: executes it now (reversible,
    /// idempotent), stages it (bufferable) or queues it (gated), by its class.
    ///
    /// A failing eager call aborts the transaction: the error is [`Error::Aborted`] with
    /// every effect's settlement.
    pub async fn call(&self, tool: &Tool, args: Value) -> Result<Ack> {
        self.call_with(tool, args, CallOptions::default()).await
    }

    /// [`Transaction::call`] with per-call overrides.
    ///
    /// The two-step protocol with the tool's own handler as the caller: [`Transaction::record`],
    /// then the handler for an eager effect, reported with [`Ticket::report`] (again after
    /// each [`Step::Retry`]'s backoff).
    pub async fn call_with(&self, tool: &Tool, args: Value, opts: CallOptions) -> Result<Ack> {
        let mut ticket = self.record(tool, args, opts).await?;
        if let Some(ack) = ticket.ack() {
            return Ok(ack);
        }
        let engine = &self.engine;
        loop {
            let outcome = engine.attempt(ticket.tool(), ticket.ctx(), ticket.args()).await;
            match ticket.report(outcome).await? {
                Step::Acked(ack) => return Ok(ack),
                // The backoff on the engine's clock, as for every call under the policy.
                Step::Retry { attempt, .. } => engine.backoff(attempt - 1).await,
            }
        }
    }

    /// Records a call of `tool` with `args` and returns the [`Ticket`] that says what to do,
    /// once the record is durable (the two-step effect protocol; docs/engine.md). The same
    /// keys, footprint, lease, level and protocol rules apply as for [`Transaction::call`]:
    /// an eager effect answers [`TicketAction::ExecuteNow`] (the caller runs the call under
    /// the ticket's key and reports it), a bufferable one `Staged`, a gated one `Queued`
    /// (both released at commit through the tool's call handler), a key that already
    /// executed `Replayed`.
    pub async fn record(&self, tool: &Tool, args: Value, opts: CallOptions) -> Result<Ticket> {
        self.engine.register(tool)?;
        let compensation = self.compensation(tool, opts.compensate)?;
        let texts = match opts.scopes {
            Some(s) => s,
            None => tool.scopes(&args).ok_or_else(|| Error::InvalidArgument {
                field: "scopes",
                value: format!("none given for tool `{}`, which has no scope extractor", tool.name()),
                expected: "CallOptions::scopes naming what the call may touch (or a tool built with `scope(..)`)",
            })?,
        };
        let mut scopes = Vec::with_capacity(texts.len());
        for t in &texts {
            // The field's name is built only for an error (not on every call).
            let scope = self.engine.inner.scopes.parse(t).map_err(|source| {
                let field = format!("scope of tool `{}`", tool.name());
                Error::Engine(tidegate_core::EngineError::Scope { field, source })
            })?;
            scopes.push(scope);
        }
        let key: Option<Arc<str>> = opts.key.or_else(|| tool.key(&args)).map(Arc::from);
        let call_id: Option<Arc<str>> = opts.call_id.map(Arc::from);
        // The handlers' context is kept only for tools that take one or calls with a handle.
        let keep = tool.wants_ctx() || opts.handle.is_some();
        let given_key = key.clone();
        let ticket_call_id = call_id.clone();
        let ctx_parts = keep.then(|| (key.clone(), call_id.clone(), opts.handle));
        let args = Arc::new(args);
        let decl = EffectDecl {
            tool: tool.name_arc().clone(),
            class: tool.class(),
            scopes,
            key,
            call_id,
            args: args.clone(),
            compensable: tool.compensable(),
        };
        let now = self.engine.inner.clock.now();
        // Under L3 a call waits for the calls this transaction issued before it (asked under
        // the same lock, so the usual one-call-at-a-time path costs no second lock). The key
        // an eager call runs under is read under it too (derived keys live in the engine).
        let ((recorded, must_wait, exec_key), lsn) = self.engine.with_core(|c| {
            let r = c.record_effect_with(self.id, decl, compensation, now)?;
            let (wait, key) = match r {
                Recorded::Execute(id) => {
                    let key = given_key.or_else(|| c.effect_key(self.id, id)).unwrap_or_default();
                    (c.earlier_in_flight(self.id, id), Some(key))
                }
                _ => (false, None),
            };
            Ok((r, wait, key))
        })?;
        let ctx = |effect| match ctx_parts {
            Some((key, call_id, handle)) => {
                let ctx = CallCtx { tx: self.id, effect, key, call_id, handle };
                self.engine.keep_ctx(ctx.clone());
                ctx
            }
            None => CallCtx::bare(self.id, effect),
        };
        let ticket = |ctx, action| Ticket::new(self.clone(), tool.clone(), args.clone(), ctx, action);
        let id = match recorded {
            // A held effect needs no sync before its acknowledgement: until the commit decision
            // is durable, a crash only means the transaction never commits.
            Recorded::Held(effect, HeldAck::Staged) => {
                return Ok(ticket(ctx(effect), TicketAction::Staged { effect }));
            }
            Recorded::Held(effect, _) => return Ok(ticket(ctx(effect), TicketAction::Queued { effect })),
            Recorded::Replay(effect, output) => {
                self.engine.durable(lsn).await?;
                return Ok(ticket(CallCtx::bare(self.id, effect), TicketAction::Replayed { effect, output }));
            }
            Recorded::Execute(id) => id,
        };
        // From here the call is in flight: if the caller drops this future or the ticket,
        // the ticket reports it (not started: did not happen; started: outcome unknown), so it
        // never stays in flight with nobody to finish it (the lease runs on while it is).
        let key = exec_key.unwrap_or_default();
        let mut ticket =
            ticket(ctx(id), TicketAction::ExecuteNow { effect: id, key, call_id: ticket_call_id, attempt: 1 });
        // The pending record is durable before the call, so that after a crash the ledger
        // knows the call may have happened (and never repeats it blindly).
        self.engine.durable(lsn).await?;
        if must_wait {
            self.turnstile(id).await;
            // The engine may have stopped while this call waited (its store fenced it out):
            // then the call never starts (the dropped ticket reports it did not happen).
            self.engine.refuse_if_fenced()?;
        }
        ticket.start();
        Ok(ticket)
    }

    /// The descriptor to record with a call of `tool`: checked inside a plan step (a
    /// reversible call needs one, a gated call cannot have one), dropped outside.
    fn compensation(&self, tool: &Tool, descriptor: Option<tidegate_plans::Descriptor>) -> Result<Option<Arc<Value>>> {
        let Some(plan) = self.engine.plan_of(self.id) else { return Ok(None) };
        let class = tool.class();
        match descriptor {
            None if matches!(class, EffectClass::Reversible | EffectClass::ReversibleWithCost) => {
                Err(Error::MissingDescriptor { tool: tool.name().to_owned(), plan })
            }
            None => Ok(None),
            Some(_) if class == EffectClass::Gated => Err(Error::InvalidArgument {
                field: "compensate",
                value: format!("a descriptor for gated tool `{}`", tool.name()),
                expected: "no descriptor: a gated effect is irreversible (inside a plan it is recorded as \
                           non-compensable and a plan failing after it fired waits for its owner)",
            }),
            Some(d) => {
                d.validate()?;
                let v = serde_json::to_value(&d).map_err(|e| Error::InvalidArgument {
                    field: "compensate",
                    value: e.to_string(),
                    expected: "a descriptor that serialises to JSON",
                })?;
                Ok(Some(Arc::new(v)))
            }
        }
    }

    /// Records how an eager call finally ended (the policy is done with it) and answers
    /// the caller: the last half of [`Ticket::report`].
    pub(crate) async fn finish_call(&self, tool: &Tool, id: EffectId, result: CallOutcome) -> Result<Ack> {
        let now = self.engine.inner.clock.now();
        let exec = self.engine.with_core(|c| {
            let r = c.executed(self.id, id, result.clone());
            // The lease runs from the call's return: a long call does not cost it.
            c.renew_lease(self.id, now);
            r
        });
        self.engine.notify_turnstile();
        let (exec, lsn) = exec?;
        // The compensation registration (EffectExecuted) is durable before the agent hears.
        self.engine.durable(lsn).await?;
        match exec {
            ExecResult::Done => match result {
                CallOutcome::Done { output, .. } => Ok(Ack::Executed { effect: id, output }),
                // Failed while the transaction was already aborting.
                failed => Err(self.interrupted(tool, failed.message().unwrap_or_default().to_owned())),
            },
            ExecResult::Aborted(plan) => Err(Error::Aborted(Box::new(self.engine.run_abort_detached(plan).await?))),
            ExecResult::Late(task) => {
                let detail = match result.message() {
                    Some(m) => format!("{m} (outcome unknown; compensated blind)"),
                    None => "it returned after the abort and was compensated".to_owned(),
                };
                let tg = self.engine.clone();
                self.engine
                    .detached(async move {
                        tg.late_compensate(task).await;
                        Ok(())
                    })
                    .await?;
                Err(self.interrupted(tool, detail))
            }
        }
    }

    /// L3: waits until every eager call this transaction issued before `effect` has
    /// returned, so that calls reach the world in issuance order even when the agent issues
    /// them concurrently (`Core::earlier_in_flight` is false below L3).
    async fn turnstile(&self, effect: tidegate_core::EffectId) {
        let inner = &self.engine.inner;
        loop {
            // Announced before the check, so the call that returns after it wakes us.
            inner.turnstile_used.store(true, std::sync::atomic::Ordering::SeqCst);
            let notified = inner.turnstile.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // A stopped engine wakes its turnstile: the caller then finds it stopped.
            if inner.poisoned.load(std::sync::atomic::Ordering::SeqCst)
                || !inner.shared.lock().core.earlier_in_flight(self.id, effect)
            {
                return;
            }
            notified.await;
        }
    }

    /// Calls the tool registered under `name` (its current definition).
    pub async fn call_named(&self, name: &str, args: Value) -> Result<Ack> {
        let tool = self.engine.tool(name)?;
        self.call(&tool, args).await
    }

    fn interrupted(&self, tool: &Tool, detail: String) -> Error {
        Error::CallInterrupted { tx: self.id, tool: tool.name().to_owned(), detail }
    }

    /// Adds a pre-commit hook for this transaction only (for example a human approval).
    pub fn add_hook(&self, hook: Arc<dyn PreCommitHook>) {
        self.engine.inner.tx_hooks.lock().entry(self.id).or_default().push(hook);
    }

    /// Freezes the footprint. Any later read or effect aborts the transaction as a protocol
    /// violation.
    pub fn seal(&self) -> Result<()> {
        let now = self.engine.inner.clock.now();
        self.engine.with_core(|c| c.seal(self.id, now))?;
        Ok(())
    }

    /// Commits a sealed transaction: runs the pre-commit hooks, waits until no earlier
    /// transaction may touch its footprint, validates its reads, then releases its held
    /// effects in issuance order. An abort (stale read, veto, ...) is [`Error::Aborted`].
    pub async fn commit(&self) -> Result<Outcome> {
        self.commit_with(CommitOptions::default()).await
    }

    /// Seals (if still open) and commits.
    pub async fn seal_and_commit(&self) -> Result<Outcome> {
        if self.state()? == TxState::Open {
            self.seal()?;
        }
        self.commit().await
    }

    /// [`Transaction::commit`] with options.
    ///
    /// Settlement does not depend on this future: the decision, the releases and any
    /// compensations run in a task of their own that the future only waits for, so a commit
    /// dropped at any await (a timeout, `select!`, a cancelled task) still settles.
    pub async fn commit_with(&self, opts: CommitOptions) -> Result<Outcome> {
        self.engine.with_core(|c| c.request_commit(self.id))?;
        let tx = self.clone();
        self.engine
            .detached(async move {
                let result = tx.decide(opts).await;
                tx.engine.inner.tx_hooks.lock().remove(&tx.id);
                tx.engine.inner.shared.lock().waiters.remove(&tx.id);
                result
            })
            .await
    }

    async fn decide(&self, opts: CommitOptions) -> Result<Outcome> {
        if let Some(reason) = self.run_hooks().await? {
            let plan = self.engine.with_core(|c| c.abort(self.id, reason))?.0;
            return Err(Error::Aborted(Box::new(self.engine.run_abort(plan).await?)));
        }
        let clock = self.engine.inner.clock.clone();
        let deadline = opts.wait_timeout.map(|d| clock.now().after(d));
        let mut notify: Option<Arc<Notify>> = None;
        let started = clock.now();
        let id = self.id;
        loop {
            let now = clock.now();
            // Past the deadline, decide once more (the wake may have come just as the time ran
            // out) and abort if the answer is still "wait".
            let timed_out = deadline.is_some_and(|d| now >= d);
            let (decision, _) = self.engine.with_core(|c| {
                let d = c.try_commit(id, now)?;
                Ok((d, c.next_lease_deadline()))
            })?;
            let (decision, next_lease) = decision;
            let plan = match decision {
                Decision::Commit(plan) => {
                    self.forget_waiter(&notify, started);
                    return self.engine.release(plan).await;
                }
                Decision::Abort(plan) => Some(plan),
                Decision::Wait if timed_out => {
                    Some(self.engine.with_core(|c| c.abort(id, AbortReason::WaitTimeout))?.0)
                }
                Decision::Wait => None,
            };
            if let Some(plan) = plan {
                self.forget_waiter(&notify, started);
                return Err(Error::Aborted(Box::new(self.engine.run_abort(plan).await?)));
            }
            let Some(waiter) = notify.clone() else {
                // First refusal: register the waiter, then decide once more before sleeping.
                // A wake issued between the refusal and the registration found no waiter; the
                // second decision sees its effect instead.
                let w = Arc::new(Notify::new());
                self.engine.inner.shared.lock().waiters.insert(id, w.clone());
                notify = Some(w);
                continue;
            };
            // The waiter was registered before this decision, so a wake issued since left a
            // permit in the Notify. Sleep at most until the next lease or our own deadline.
            let wake_at = match (next_lease, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake_at {
                Some(t) => {
                    let sleep = clock.sleep_until(t);
                    tokio::select! {
                        _ = waiter.notified() => {}
                        _ = sleep => {}
                    }
                }
                None => waiter.notified().await,
            }
            if next_lease.is_some_and(|l| clock.now() >= l) {
                self.engine.reap().await?;
            }
        }
    }

    fn forget_waiter(&self, notify: &Option<Arc<Notify>>, since: tidegate_core::Timestamp) {
        if notify.is_some() {
            self.engine.inner.shared.lock().waiters.remove(&self.id);
            let waited = self.engine.inner.clock.now().since(since);
            let inner = &self.engine.inner;
            inner.waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            inner
                .wait_ns
                .fetch_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX), std::sync::atomic::Ordering::Relaxed);
        }
    }

    async fn run_hooks(&self) -> Result<Option<AbortReason>> {
        let mut hooks = self.engine.inner.hooks.read().clone();
        if let Some(own) = self.engine.inner.tx_hooks.lock().get(&self.id) {
            hooks.extend(own.iter().cloned());
        }
        if hooks.is_empty() {
            return Ok(None);
        }
        let view: SealedView = self.engine.inner.shared.lock().core.view(self.id)?;
        for hook in hooks {
            // A panicking hook is a failed hook: it vetoes, and the engine stays live.
            let verdict = crate::policy::caught(|| hook.check(&view))
                .await
                .unwrap_or_else(|panic| Verdict::Veto(format!("the hook panicked: {panic}")));
            if let Verdict::Veto(reason) = verdict {
                return Ok(Some(AbortReason::Vetoed { hook: hook.name().to_owned(), reason }));
            }
        }
        Ok(None)
    }

    /// Aborts the transaction: held effects are dropped, executed ones compensated in reverse
    /// issuance order. Returns every effect's settlement.
    pub async fn abort(&self, reason: impl Into<String>) -> Result<Outcome> {
        let reason = AbortReason::Explicit { reason: reason.into() };
        let plan = self.engine.with_core(|c| c.abort(self.id, reason))?.0;
        self.engine.inner.tx_hooks.lock().remove(&self.id);
        // A committer waiting for this transaction's turn learns it was aborted.
        if let Some(w) = self.engine.inner.shared.lock().waiters.get(&self.id) {
            w.notify_one();
        }
        self.engine.run_abort_detached(plan).await
    }
}
