//! Transactions and their effects as typed operations of one tenant: ids resolved (a foreign
//! id is answered as one never issued), live handles resumed after a restart, an effect call
//! planned from the tool's templates and run on a task the node owns, and the two-step
//! protocol of client-executed effects (record → ticket, report → answer, kept for a repeated
//! report).
//!
//! ```text
//!  call(tx, EffectCall) ─ plan (tool, scopes, key) ─┬─ by the server: Transaction::call_with on a node task ─► EffectAnswer
//!                                                    └─ by the client: Transaction::record ─► ticket parked ─► EffectAnswer{execute}
//!  report(tx, n, TicketResult) ─ the parked ticket ─ Ticket::report on a node task ─► EffectAnswer (kept in the slot)
//! ```

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tidegate_runtime::{Ack, CallOptions, Descriptor, EffectId, Step, Ticket, TicketAction, TxId, TxOptions};

use crate::error::{Result, ServiceError};
use crate::ids;
use crate::index::{EffectStatus, TxView};
use crate::node::Service;
use crate::settle::MAX_LEASE_MS;
use crate::tenant::{LiveTx, SettleOp, Tenant};
use crate::tickets::{Executed, TicketResult, TicketSlot};
use crate::tools::ServerTool;

/// Most scopes in a may-touch set or a scope override.
pub const MAX_SCOPES: usize = 1024;
/// Longest scope text accepted in a request.
pub const MAX_SCOPE_BYTES: usize = 1024;
/// Longest key a client or a key template may give.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest error text of a reported result.
pub const MAX_ERROR_BYTES: usize = 4096;

/// One effect call as a front door received it.
#[derive(Debug, Clone)]
pub struct EffectCall {
    /// The tool's name.
    pub tool: String,
    /// The client's arguments.
    pub args: Value,
    /// An idempotency key of the client's own (else the tool's key template, else the
    /// engine's derived key).
    pub key: Option<String>,
    /// Scopes overriding the tool's templates.
    pub scopes: Option<Vec<String>>,
    /// A plan step's compensation descriptor.
    pub compensate: Option<Descriptor>,
    /// The client runs the call itself and reports how it ended (a ticket).
    pub by_client: bool,
}

/// How an effect was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    /// Ran now (or a ticket's reported call took effect).
    Executed,
    /// A key that already executed: its recorded output, nothing ran.
    Replayed,
    /// Staged until commit (bufferable).
    Staged,
    /// Queued until commit (gated).
    Queued,
    /// A ticket: the client runs the call under the effect's key and reports it.
    Execute,
}

/// The answer to an effect call or a ticket's report.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectAnswer {
    /// The transaction.
    pub tx: TxId,
    /// The effect's issuance number.
    pub effect: EffectId,
    /// How it was acknowledged.
    pub ack: AckKind,
    /// Its output, when it ran (or replayed).
    pub output: Option<Value>,
}

/// An effect call resolved against the registry: the tool, the scopes its templates give (or
/// the caller's), and the key.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The tool.
    pub tool: Arc<ServerTool>,
    /// The scopes the call may touch.
    pub scopes: Vec<String>,
    /// The client's arguments.
    pub args: Value,
    /// The key, if the call has one of its own (else the engine derives one).
    pub key: Option<String>,
    /// A plan step's compensation descriptor.
    pub compensate: Option<Descriptor>,
}

impl Planned {
    /// The runtime tool, recorded arguments and options.
    fn parts(self) -> (tidegate_runtime::Tool, Value, CallOptions) {
        let opts = CallOptions {
            key: self.key,
            scopes: Some(self.scopes),
            compensate: self.compensate,
            ..CallOptions::default()
        };
        (self.tool.tool.clone(), self.args, opts)
    }
}

/// Checks a list of scopes a caller gave (`field` names it).
pub fn check_scopes(field: &str, scopes: &Option<Vec<String>>) -> Result<()> {
    if let Some(s) = scopes {
        if s.len() > MAX_SCOPES {
            return Err(ServiceError::invalid(
                field,
                format!("{} scopes", s.len()),
                format!("at most {MAX_SCOPES} scopes"),
            ));
        }
        if let Some((i, big)) = s.iter().enumerate().find(|(_, x)| x.len() > MAX_SCOPE_BYTES) {
            return Err(ServiceError::invalid(
                format!("{field}[{i}]"),
                big.as_str(),
                format!("a scope of at most {MAX_SCOPE_BYTES} bytes"),
            ));
        }
    }
    Ok(())
}

/// Longest agent name.
pub const MAX_AGENT_BYTES: usize = 256;

/// Checks an agent name a caller gave.
pub fn check_agent(agent: &Option<String>) -> Result<()> {
    if let Some(a) = agent
        && (a.is_empty() || a.len() > MAX_AGENT_BYTES)
    {
        return Err(ServiceError::invalid("agent", a.as_str(), format!("1 to {MAX_AGENT_BYTES} bytes")));
    }
    Ok(())
}

/// Checks a transaction lease a caller gave in milliseconds.
pub fn check_lease(lease_ms: Option<u64>) -> Result<Option<Duration>> {
    match lease_ms {
        None => Ok(None),
        Some(ms) if (1..=MAX_LEASE_MS).contains(&ms) => Ok(Some(Duration::from_millis(ms))),
        Some(ms) => Err(ServiceError::invalid("lease_ms", ms.to_string(), format!("1 to {MAX_LEASE_MS} milliseconds"))),
    }
}

/// What a transaction is begun with; every field is checked by the operation that takes it
/// and a refusal names the field.
#[derive(Debug, Clone, Default)]
pub struct BeginRequest {
    /// Who runs it (1 to [`MAX_AGENT_BYTES`] bytes; default: the engine's).
    pub agent: Option<String>,
    /// The scopes it may touch (at most [`MAX_SCOPES`]; default: undeclared, or for a
    /// one-call transaction the call's own scopes).
    pub may_touch: Option<Vec<String>>,
    /// Its lease in milliseconds (1 to [`MAX_LEASE_MS`]; default: the engine's).
    pub lease_ms: Option<u64>,
    /// The plan it is a step of (by public id).
    pub plan: Option<String>,
}

impl BeginRequest {
    /// Checks the fields and turns them into the engine's options.
    fn options(self, may_touch_default: Option<Vec<String>>) -> Result<(TxOptions, Option<String>)> {
        check_agent(&self.agent)?;
        check_scopes("may_touch", &self.may_touch)?;
        let lease = check_lease(self.lease_ms)?;
        let may_touch = self.may_touch.or(may_touch_default);
        Ok((TxOptions { agent: self.agent, may_touch, lease }, self.plan))
    }
}

/// Most effects in one batch transaction ([`Tenant::batch`]).
pub const MAX_BATCH_EFFECTS: usize = 64;
/// Most reads in one batch transaction.
pub const MAX_BATCH_READS: usize = 64;

/// A short transaction in one request: begun, its reads recorded, its effects run in order,
/// sealed and committed.
#[derive(Debug, Clone, Default)]
pub struct BatchRequest {
    /// How it is begun (`plan` must be unset; `may_touch` defaults to the scopes of its reads
    /// and effects).
    pub begin: BeginRequest,
    /// Scopes read at their committed version before the first effect (at most
    /// [`MAX_BATCH_READS`]).
    pub reads: Vec<String>,
    /// The effects, in order (1 to [`MAX_BATCH_EFFECTS`]; none `by_client`).
    pub effects: Vec<EffectCall>,
}

/// A read of a batch: the scope as given and the committed version it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadAnswer {
    /// The scope as the request gave it.
    pub scope: String,
    /// The committed version read.
    pub version: u64,
}

/// A batch transaction past its effects: its commit is running.
#[derive(Debug)]
pub struct Batch {
    /// Each read's version, in order.
    pub reads: Vec<ReadAnswer>,
    /// Each effect's answer, in order.
    pub answers: Vec<EffectAnswer>,
    /// The commit started after the seal; wait on it to answer settled or still settling.
    pub commit: SettleOp,
}

/// Which step of a batch failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchStep {
    /// The read at this index.
    Read(usize),
    /// The effect at this index.
    Effect(usize),
    /// The seal.
    Seal,
}

/// A batch transaction that began and then failed: the step, and why.
#[derive(Debug)]
pub struct BatchFailure {
    /// The step that failed (the ones before it took effect and are being compensated).
    pub step: BatchStep,
    /// Its error (an invalid field is named under the step, e.g. `effects[1].scopes`).
    pub error: ServiceError,
}

/// A one-call transaction past its call: its commit is running.
#[derive(Debug)]
pub struct OneCall {
    /// The call's answer.
    pub answer: EffectAnswer,
    /// The commit started after the seal; wait on it to answer settled or still settling.
    pub commit: SettleOp,
}

impl Tenant {
    /// Begins a transaction (a step of `req.plan` when set, bound to it before its first
    /// effect) and registers its live handle. Returns its view as the ledger holds it.
    pub async fn begin(&self, req: BeginRequest) -> Result<(TxId, TxView)> {
        let (opts, plan) = req.options(None)?;
        let handle = match plan {
            Some(p) => self.begin_step(&p, opts).await?,
            None => self.engine.begin_with(opts).map_err(ServiceError::engine)?,
        };
        let tx = handle.id();
        self.add_live(handle, None);
        // The id is answered only once its begin is durable: an id acknowledged and then lost
        // with a crash (or a take-over by another node) would be issued again, to another
        // agent's transaction.
        self.engine.appended_durable().await.map_err(ServiceError::engine)?;
        let v = self.view(tx)?.ok_or_else(|| ServiceError::Internal("the begin is not in the ledger".into()))?;
        Ok((tx, v))
    }

    /// A one-call transaction up to its commit: begins it (touching the call's own scopes
    /// unless `req.may_touch` says otherwise), runs the call, seals and starts the commit.
    ///
    /// `Err` is a refusal before anything began. Once the transaction exists, the outcome is
    /// `(tx, Err(..))`: a call refused before it ran gives the transaction back (it is
    /// aborted here); a call that failed after it ran has already aborted it.
    pub async fn one_call(
        self: &Arc<Self>,
        node: &Service,
        req: BeginRequest,
        call: EffectCall,
    ) -> Result<(TxId, Result<OneCall>)> {
        let batch = BatchRequest { begin: req, reads: Vec::new(), effects: vec![call] };
        // One call: its fields are named as before (`tool`, not `effects[0].tool`).
        let (tx, ran) = self.spawn_batch(node, batch, false).await?;
        Ok((
            tx,
            ran.map_err(|f| f.error).and_then(|mut b| match b.answers.pop() {
                Some(answer) => Ok(OneCall { answer, commit: b.commit }),
                None => Err(ServiceError::Internal("the one-call transaction has no answer".into())),
            }),
        ))
    }

    /// A short transaction in one operation: begins it (touching the scopes of its reads and
    /// effects unless `req.begin.may_touch` says otherwise), records each read, runs each
    /// effect in order (server-executed: a batch hands out no tickets), seals and starts the
    /// commit. Every effect is planned before anything begins, so a request wrong anywhere
    /// is refused whole, naming the field (`effects[2].tool`).
    ///
    /// `Err` is a refusal before anything began. Once the transaction exists, the outcome is
    /// `(tx, Err(BatchFailure))`: the step that failed, and its error; the transaction is
    /// aborted (here, for a step refused before it ran; by the engine, for a call that failed
    /// after it ran), its executed effects compensated.
    pub async fn batch(
        self: &Arc<Self>,
        node: &Service,
        req: BatchRequest,
    ) -> Result<(TxId, std::result::Result<Batch, BatchFailure>)> {
        self.spawn_batch(node, req, true).await
    }

    /// Runs the batch on a task the node owns: a caller that goes away between two steps
    /// does not leave the transaction half done until its lease ends.
    async fn spawn_batch(
        self: &Arc<Self>,
        node: &Service,
        req: BatchRequest,
        indexed: bool,
    ) -> Result<(TxId, std::result::Result<Batch, BatchFailure>)> {
        let (tenant, n) = (self.clone(), node.clone());
        node.spawn(async move { tenant.run_batch(&n, req, indexed).await })
            .await
            .map_err(|_| ServiceError::Internal("the batch's task failed".into()))?
            .ok_or(ServiceError::ShuttingDown)?
    }

    async fn run_batch(
        self: &Arc<Self>,
        node: &Service,
        req: BatchRequest,
        indexed: bool,
    ) -> Result<(TxId, std::result::Result<Batch, BatchFailure>)> {
        let BatchRequest { begin, reads, effects } = req;
        let field = |i: usize, e: ServiceError| if indexed { e.under(&format!("effects[{i}]")) } else { e };
        // The transaction's own fields are checked before the calls are planned, so a request
        // wrong in both is refused for its transaction fields first.
        check_agent(&begin.agent)?;
        check_scopes("may_touch", &begin.may_touch)?;
        check_lease(begin.lease_ms)?;
        if begin.plan.is_some() {
            return Err(ServiceError::invalid(
                "plan",
                begin.plan.as_deref().unwrap_or_default(),
                "no plan: a step of a plan is begun on its own (POST /v1/transactions)",
            ));
        }
        if effects.is_empty() || effects.len() > MAX_BATCH_EFFECTS {
            return Err(ServiceError::invalid(
                "effects",
                format!("{} effects", effects.len()),
                format!("1 to {MAX_BATCH_EFFECTS} effects"),
            ));
        }
        if reads.len() > MAX_BATCH_READS {
            return Err(ServiceError::invalid(
                "reads",
                format!("{} reads", reads.len()),
                format!("at most {MAX_BATCH_READS} reads"),
            ));
        }
        // A read's scope is checked before anything begins, as the effects are planned.
        for (i, scope) in reads.iter().enumerate() {
            let refused = if scope.len() > MAX_SCOPE_BYTES {
                Some(format!("a scope of at most {MAX_SCOPE_BYTES} bytes"))
            } else {
                self.engine.scope(scope).err().map(|e| format!("a well-formed `type:path` scope ({e})"))
            };
            if let Some(expected) = refused {
                return Err(ServiceError::invalid(format!("reads[{i}]"), scope.as_str(), expected));
            }
        }
        let mut planned = Vec::with_capacity(effects.len());
        for (i, call) in effects.iter().enumerate() {
            if call.by_client {
                return Err(field(
                    i,
                    ServiceError::invalid(
                        "execute",
                        "client",
                        "server execution: a batch runs its effects itself and hands out no tickets",
                    ),
                ));
            }
            planned.push(self.plan_effect(call).map_err(|e| field(i, e))?);
        }
        let default_touch = match begin.may_touch {
            Some(_) => None,
            None => {
                let mut all: Vec<String> = reads.clone();
                for p in &planned {
                    all.extend(p.scopes.iter().cloned());
                }
                let mut seen = std::collections::HashSet::with_capacity(all.len());
                all.retain(|s| seen.insert(s.clone()));
                Some(all)
            }
        };
        let (opts, _) = BeginRequest { plan: None, ..begin }.options(default_touch)?;
        let handle = self.engine.begin_with(opts).map_err(ServiceError::engine)?;
        let tx = handle.id();
        let lt = self.add_live(handle, None);
        let fail = |step: BatchStep, error: ServiceError| Ok((tx, Err(BatchFailure { step, error })));
        let mut read_answers = Vec::with_capacity(reads.len());
        for (i, scope) in reads.into_iter().enumerate() {
            match lt.handle.read(&scope) {
                Ok(r) => read_answers.push(ReadAnswer { scope, version: r.version.0 }),
                Err(e) => {
                    let e = ServiceError::engine(e);
                    if !e.is_abort() {
                        let _ = self.start_abort(node, &lt, format!("the batch's read {i} was refused: {e}"));
                    }
                    return fail(BatchStep::Read(i), e.under(&format!("reads[{i}]")));
                }
            }
        }
        let mut answers = Vec::with_capacity(planned.len());
        for (i, p) in planned.into_iter().enumerate() {
            match self.call_planned(node, &lt, p).await {
                Ok(a) => answers.push(a),
                Err(e) => {
                    if !e.is_abort() {
                        let what =
                            if indexed { format!("batch's effect {i}") } else { "one-call transaction's call".into() };
                        let _ = self.start_abort(node, &lt, format!("the {what} was refused: {e}"));
                    }
                    return fail(BatchStep::Effect(i), field(i, e));
                }
            }
        }
        if let Err(e) = lt.handle.seal() {
            // Its effects ran: a refused seal must not leave them to the lease.
            let e = ServiceError::engine(e);
            if !e.is_abort() {
                let _ = self.start_abort(node, &lt, format!("the batch's seal was refused: {e}"));
            }
            return fail(BatchStep::Seal, e);
        }
        let commit = self.start_commit(node, &lt, None);
        Ok((tx, Ok(Batch { reads: read_answers, answers, commit })))
    }

    /// The transaction named by the public id `id` (`tx_<tag>_<n>`); another tenant's id, or
    /// a malformed one, is `NotFound` like one never issued.
    pub fn parse_tx(&self, id: &str) -> Result<TxId> {
        ids::parse(ids::Kind::Tx, &self.tag, id)
            .map(TxId)
            .ok_or_else(|| ServiceError::NotFound { what: "transaction", name: id.to_owned() })
    }

    /// The transaction `tx` as the ledger shows it (`None`: never begun). A ledger that
    /// cannot be read is `Unavailable`, never "no such transaction".
    pub fn view(&self, tx: TxId) -> Result<Option<TxView>> {
        self.index.view(&*self.store, tx).map_err(|e| ServiceError::Unavailable {
            code: "store_unavailable",
            detail: format!("the tenant's ledger cannot be read: {e}"),
            retry_after: Some(1),
        })
    }

    /// The transaction `id` as the ledger shows it.
    pub fn view_of(&self, id: &str) -> Result<(TxId, TxView)> {
        let tx = self.parse_tx(id)?;
        let v = self.view(tx)?.ok_or_else(|| ServiceError::NotFound { what: "transaction", name: id.to_owned() })?;
        Ok((tx, v))
    }

    /// The live handle of the unsettled transaction `id`: the one this process began, or the
    /// engine's, resumed, for one kept open across a restart.
    pub fn live_of(&self, id: &str) -> Result<(Arc<LiveTx>, TxView)> {
        let (tx, v) = self.view_of(id)?;
        if v.phase.settled() {
            return Err(ServiceError::conflict(
                "wrong_state",
                format!("transaction {id} has already settled ({})", v.state()),
            ));
        }
        if let Some(lt) = self.live(tx) {
            return Ok((lt, v));
        }
        // Kept open across a restart (`recover_keeping_open`): resume it through the engine.
        let handle = self.engine.transaction(tx)?;
        Ok((self.resume_live(handle, v.group.map(|g| g.0)), v))
    }

    /// Resolves an effect call against the registry: the tool, its scopes (the caller's, else
    /// the tool's templates rendered on the arguments) and its key (the caller's, else the
    /// key template's, else none: the engine derives one).
    pub fn plan_effect(&self, call: &EffectCall) -> Result<Planned> {
        let tool = self.tool(&call.tool).ok_or_else(|| {
            ServiceError::invalid("tool", call.tool.as_str(), "the name of a tool registered with this tenant")
        })?;
        check_scopes("scopes", &call.scopes)?;
        let scopes = match &call.scopes {
            Some(s) if !s.is_empty() => s.clone(),
            Some(_) => {
                return Err(ServiceError::invalid(
                    "scopes",
                    "[]",
                    "at least one scope, or no `scopes` to use the tool's",
                ));
            }
            None => tool
                .scopes(&call.args)
                .map_err(|(f, m)| ServiceError::invalid(f, m, "arguments that fill every scope template"))?,
        };
        let key = match &call.key {
            Some(k) if k.is_empty() || k.len() > MAX_KEY_BYTES => {
                return Err(ServiceError::invalid("key", k.as_str(), format!("1 to {MAX_KEY_BYTES} bytes")));
            }
            Some(k) => Some(k.clone()),
            None => match tool.key(&call.args) {
                Some(Ok(k)) if !k.is_empty() && k.len() <= MAX_KEY_BYTES => Some(k),
                Some(Ok(k)) => {
                    return Err(ServiceError::invalid(
                        "key",
                        k,
                        format!("a key template value of 1 to {MAX_KEY_BYTES} bytes"),
                    ));
                }
                Some(Err((f, m))) => return Err(ServiceError::invalid(f, m, "arguments that fill the key template")),
                None => None,
            },
        };
        Ok(Planned { tool, scopes, args: call.args.clone(), key, compensate: call.compensate.clone() })
    }

    /// Calls a tool in the live transaction `id`: run by the server now (an eager class, on a
    /// task the node owns, so a caller that goes away does not cut it short), staged or queued
    /// until commit (a held class), or, `by_client`, recorded and answered with a ticket the
    /// client runs under the effect's key and reports with [`Tenant::report`].
    pub async fn call(self: &Arc<Self>, node: &Service, id: &str, call: EffectCall) -> Result<EffectAnswer> {
        let (lt, _) = self.live_of(id)?;
        let by_client = call.by_client;
        let planned = self.plan_effect(&call)?;
        if by_client {
            return self.record(node, &lt, planned).await;
        }
        self.call_planned(node, &lt, planned).await
    }

    /// Runs a planned call in the live transaction `lt` on a task the node owns.
    async fn call_planned(
        self: &Arc<Self>,
        node: &Service,
        lt: &Arc<LiveTx>,
        planned: Planned,
    ) -> Result<EffectAnswer> {
        let tx = lt.handle.id();
        let (tool, args, opts) = planned.parts();
        let handle = lt.handle.clone();
        // A call waiting on a worker that cannot report any more (the tenant's store fenced
        // this node out, so the node dropped it) ends with the fence rather than waiting on.
        let fenced = self.engine.when_fenced();
        let ack = node
            .spawn(async move {
                tokio::select! {
                    r = handle.call_with(&tool, args, opts) => r,
                    Some(fence) = fenced => Err(tidegate_runtime::Error::Fenced(fence)),
                }
            })
            .await
            .map_err(|_| ServiceError::Internal("the call's task failed".into()))?
            .ok_or(ServiceError::ShuttingDown)??;
        let (ack_kind, output) = match &ack {
            Ack::Executed { output, .. } => (AckKind::Executed, Some((**output).clone())),
            Ack::Replayed { output, .. } => (AckKind::Replayed, Some((**output).clone())),
            Ack::Staged { .. } => (AckKind::Staged, None),
            Ack::Queued { .. } => (AckKind::Queued, None),
        };
        Ok(EffectAnswer { tx, effect: ack.effect(), ack: ack_kind, output })
    }

    /// Records a client-executed effect and answers its ticket (parked in the live
    /// transaction until the client reports, or until the lease ends: then it is dropped, its
    /// outcome is unknown and the transaction aborts).
    async fn record(self: &Arc<Self>, node: &Service, lt: &Arc<LiveTx>, planned: Planned) -> Result<EffectAnswer> {
        let tx = lt.handle.id();
        let (tool, args, opts) = planned.parts();
        let handle = lt.handle.clone();
        // On a node task: a caller that goes away does not cut the record short (a ticket
        // dropped before it was handed out is reported as not applied, so nothing is stuck).
        let ticket = node
            .spawn(async move { handle.record(&tool, args, opts).await })
            .await
            .map_err(|_| ServiceError::Internal("the record's task failed".into()))?
            .ok_or(ServiceError::ShuttingDown)??;
        let effect = ticket.effect();
        let (ack, output) = match ticket.action() {
            TicketAction::ExecuteNow { .. } => (AckKind::Execute, None),
            TicketAction::Staged { .. } => (AckKind::Staged, None),
            TicketAction::Queued { .. } => (AckKind::Queued, None),
            TicketAction::Replayed { output, .. } => (AckKind::Replayed, Some((**output).clone())),
            _ => return Err(ServiceError::Internal("the engine answered a ticket this service does not know".into())),
        };
        if ticket.pending() {
            node.metrics().client_tickets.inc();
            lt.tickets.lock().insert(effect.0, TicketSlot::Open(ticket));
            self.expire_later(node, lt, effect.0);
        }
        Ok(EffectAnswer { tx, effect, ack, output })
    }

    /// Drops the ticket of effect `n` if no result came within the transaction's lease (at
    /// least the configured lease): its outcome is then unknown, and the transaction aborts.
    fn expire_later(&self, node: &Service, lt: &Arc<LiveTx>, n: u32) {
        let configured = self.settings().lease;
        let now = self.engine.clock().now();
        let lease =
            self.view(lt.handle.id()).ok().flatten().map_or(configured, |v| v.lease_until.since(now).max(configured));
        let (lt, stop, metrics) = (Arc::downgrade(lt), node.shutdown_token().clone(), node.metrics().clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(lease) => {}
                // At shutdown the ticket stays where it is; the tenant's close drops it.
                _ = stop.cancelled() => return,
            }
            let Some(lt) = lt.upgrade() else { return };
            let expired = {
                let mut slots = lt.tickets.lock();
                match slots.get_mut(&n) {
                    Some(slot @ TicketSlot::Open(_)) => Some(std::mem::replace(slot, TicketSlot::Expired)),
                    _ => None,
                }
            };
            if expired.is_some() {
                metrics.client_tickets_expired.inc();
            }
            // Outside the lock: the drop reports the outcome unknown to the engine.
            drop(expired);
        });
    }

    /// Reports how a client-executed effect's call ended (the second step of its ticket). The
    /// report runs on a node task and its answer is kept: the same result reported again gets
    /// the same answer, another one `result_conflict`. For a transaction this process no
    /// longer holds (settled, or begun before a restart), the ledger answers a repeated result.
    pub async fn report(
        self: &Arc<Self>,
        node: &Service,
        id: &str,
        effect: &str,
        result: TicketResult,
    ) -> Result<EffectAnswer> {
        let (tx, v) = self.view_of(id)?;
        let n: u32 = effect.parse().map_err(|_| ServiceError::NotFound { what: "effect", name: effect.to_owned() })?;
        if let TicketResult::NotApplied { error, .. } | TicketResult::Unknown { error } = &result
            && error.len() > MAX_ERROR_BYTES
        {
            return Err(ServiceError::invalid("error", error.as_str(), format!("at most {MAX_ERROR_BYTES} bytes")));
        }
        let Some(rec) = v.effects.iter().find(|e| e.id.0 == n) else {
            return Err(ServiceError::NotFound { what: "effect", name: format!("{id}/effects/{n}") });
        };
        let Some(lt) = self.live(tx) else {
            return settled_answer(tx, id, n, rec.status, rec.output.as_deref(), &result);
        };
        let ticket = {
            let mut slots = lt.tickets.lock();
            match slots.get_mut(&n) {
                None => {
                    drop(slots);
                    if v.phase.settled() {
                        return settled_answer(tx, id, n, rec.status, rec.output.as_deref(), &result);
                    }
                    return Err(ServiceError::conflict(
                        "not_client_executed",
                        format!("effect {n} of {id} is not a client-executed ticket: the server runs or releases it"),
                    ));
                }
                Some(TicketSlot::Expired) => {
                    return Err(ServiceError::conflict(
                        "ticket_expired",
                        format!(
                            "no result for effect {n} came within the transaction's lease: its outcome was taken as \
                             unknown and the transaction aborted"
                        ),
                    ));
                }
                Some(TicketSlot::Reporting(first)) if *first == result => {
                    return Err(ServiceError::Conflict {
                        code: "result_in_progress",
                        detail: "this result is being reported".into(),
                        retry_after: Some(1),
                    });
                }
                Some(TicketSlot::Reporting(first)) => return Err(result_conflict(n, first)),
                Some(TicketSlot::Reported(kept)) if kept.0 == result => {
                    return kept.1.clone().map(|e| EffectAnswer {
                        tx,
                        effect: EffectId(n),
                        ack: AckKind::Executed,
                        output: e.output,
                    });
                }
                Some(TicketSlot::Reported(kept)) => return Err(result_conflict(n, &kept.0)),
                Some(slot @ TicketSlot::Open(_)) => {
                    match std::mem::replace(slot, TicketSlot::Reporting(result.clone())) {
                        TicketSlot::Open(ticket) => ticket,
                        _ => return Err(ServiceError::Internal("the ticket changed under its lock".into())),
                    }
                }
            }
        };
        node.metrics()
            .client_results
            .get_or_create(&crate::metrics::ResultLabel { result: result.kind().to_owned() })
            .inc();
        let lt2 = lt.clone();
        // On a node task: the report (a probe, an abort's compensations) finishes and its
        // answer is kept even if the caller goes away.
        let answer = node
            .spawn(async move { report_ticket(&lt2, n, ticket, result).await })
            .await
            .map_err(|_| ServiceError::Internal("the report's task failed".into()))?
            .ok_or(ServiceError::ShuttingDown)?;
        answer.map(|e| EffectAnswer { tx, effect: EffectId(n), ack: AckKind::Executed, output: e.output })
    }
}

/// Reports `result` through `ticket` and keeps the answer in the transaction's slot `n`.
async fn report_ticket(
    lt: &Arc<LiveTx>,
    n: u32,
    mut ticket: Ticket,
    result: TicketResult,
) -> std::result::Result<Executed, ServiceError> {
    let answer = match ticket.report(result.outcome()).await {
        Ok(Step::Acked(ack)) => Ok(Executed { output: ack.output().cloned() }),
        Ok(Step::Retry { backoff, .. }) => {
            // Only with an engine retry policy of several attempts (the server's has one).
            lt.tickets.lock().insert(n, TicketSlot::Open(ticket));
            return Err(ServiceError::Conflict {
                code: "call_again",
                detail: "the call did not take effect: run it again under the same key, then report".into(),
                retry_after: Some(backoff.as_secs().max(1)),
            });
        }
        Ok(_) => Err(ServiceError::Internal("the engine answered a report this service does not know".into())),
        Err(e) => Err(ServiceError::engine(e)),
    };
    lt.tickets.lock().insert(n, TicketSlot::Reported(Box::new((result, answer.clone()))));
    answer
}

fn result_conflict(n: u32, first: &TicketResult) -> ServiceError {
    ServiceError::conflict(
        "result_conflict",
        format!("effect {n} already has another result (`{}`); a result is reported once", first.kind()),
    )
}

/// The answer to a result for an effect whose transaction this process no longer holds:
/// the same answer a first `done` got if the ledger shows it executed with that output,
/// the aborted transaction for a failure the ledger recorded, else a conflict.
fn settled_answer(
    tx: TxId,
    id: &str,
    n: u32,
    status: EffectStatus,
    output: Option<&Value>,
    result: &TicketResult,
) -> Result<EffectAnswer> {
    let executed =
        matches!(status, EffectStatus::Executed | EffectStatus::Compensated | EffectStatus::CompensationFailed);
    match result {
        TicketResult::Done { output: given } if executed && output == Some(given.as_ref().unwrap_or(&Value::Null)) => {
            Ok(EffectAnswer { tx, effect: EffectId(n), ack: AckKind::Executed, output: output.cloned() })
        }
        TicketResult::NotApplied { .. } | TicketResult::Unknown { .. } if status == EffectStatus::Failed => Err(
            ServiceError::conflict("transaction_aborted", format!("the call of effect {n} failed and {id} aborted")),
        ),
        _ => Err(ServiceError::conflict(
            "wrong_state",
            format!(
                "{id} is settled or was begun before the server restarted, and effect {n} is {}; the result cannot \
                 be reported",
                status.name()
            ),
        )),
    }
}

/// How long a transaction may ask for, at most (7 days).
pub const MAX_LEASE: Duration = Duration::from_millis(7 * 86_400_000);
