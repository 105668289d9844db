//! Plans bound to the engine (docs/plans.md, "Binding"): the plan executor of
//! `tidegate-plans` over this engine's ledger, clock and a dispatcher of capabilities.
//!
//! ```text
//!  Tidegate::plan(PlanOptions) ─► plan_opened ─┐                         extension stream `plans`
//!  Plan::begin(TxOptions)      ─► step_begun ──┤  (appended durably through the engine's
//!  commit / fail / verdict / resolve / arm ────┘   append path, ordered with its events)
//!  Transaction::call_with(.., CallOptions::compensate(d)) ─► effect_recorded { compensation: d }
//!  with_core (engine lock) ─► engine events of plan steps as Observations ─► feed ─► executor
//!  executor ─► Dispatch by capability: in-process handlers ([`Tidegate::capability`]), else
//!              the embedder's [`Dispatch`] (the server's webhooks and pull workers)
//! ```
//!
//! The executor holds nothing the ledger does not show: on start it folds every plan record
//! and every engine fact of a plan step from the store, in ledger order, then follows the
//! engine's appends live. It starts at [`Tidegate::recover`] when the ledger holds a plan, or
//! at the first plan operation, and stops with [`Tidegate::stop`] or the engine's drop.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap as HashMap;
use serde_json::Value;
use tidegate_core::{BoxFuture, CallOutcome, DEFAULT_DISPATCH_DEADLINE, Dispatch, EffectClass, Event, Timestamp, TxId};
use tidegate_plans::{
    Choice, DispatchRequest, Entry, Observation, PlanDetail, PlanError, PlanFact, PlanId, PlanView, Plans, Predicate,
    STREAM, StuckReason, Verdict,
};
use tidegate_storage::{LedgerStore, Lsn};
use tokio::sync::Notify;

use crate::clock::Clock;
use crate::engine::{Inner, Tidegate, TxOptions};
use crate::error::{Error, Result};
use crate::tx::Transaction;

/// An in-process capability handler.
pub type CapabilityHandler = Arc<dyn Fn(DispatchRequest) -> BoxFuture<CallOutcome> + Send + Sync>;

/// Options of an in-process capability ([`Tidegate::capability_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapabilityOptions {
    /// How long the executor waits for one call of the handler before its outcome counts as
    /// unknown (the handler's future is dropped; a compensation is then probed, and retried
    /// or sent to the plan's owner). Default 5 minutes ([`DEFAULT_DISPATCH_DEADLINE`]); at
    /// least 1 ms.
    pub deadline: Duration,
}

impl Default for CapabilityOptions {
    fn default() -> Self {
        CapabilityOptions { deadline: DEFAULT_DISPATCH_DEADLINE }
    }
}

impl CapabilityOptions {
    /// Options with this deadline.
    pub fn deadline(deadline: Duration) -> CapabilityOptions {
        CapabilityOptions { deadline }
    }
}

/// Options of [`Tidegate::plan`].
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Who answers for the plan (1 to 256 characters).
    pub owner: String,
    /// The plan fails if it has not committed this long after it opened (engine clock).
    pub deadline: Option<Duration>,
    /// How deep a cascade may unwind this plan (default 3, at most 64).
    pub cascade_limit: Option<u32>,
    /// Predicate triggers armed when the plan opens.
    pub triggers: Vec<Predicate>,
}

impl PlanOptions {
    /// Options for a plan owned by `owner`.
    pub fn owner(owner: impl Into<String>) -> PlanOptions {
        PlanOptions { owner: owner.into(), ..PlanOptions::default() }
    }

    /// Sets the deadline, relative to now.
    pub fn deadline(mut self, deadline: Duration) -> PlanOptions {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the cascade limit.
    pub fn cascade_limit(mut self, limit: u32) -> PlanOptions {
        self.cascade_limit = Some(limit);
        self
    }

    /// Adds a predicate trigger.
    pub fn trigger(mut self, predicate: Predicate) -> PlanOptions {
        self.triggers.push(predicate);
        self
    }
}

/// A plan of this engine: steps are ordinary transactions begun with [`Plan::begin`]; their
/// compensation descriptors are held until [`Plan::commit`] and unwound last-in-first-out by
/// the executor when the plan fails (a deadline, [`Plan::fail`], a verdict, a predicate).
/// Cheap to clone; the plan outlives the handle and the process.
#[derive(Clone)]
pub struct Plan {
    engine: Tidegate,
    id: PlanId,
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Plan {
    /// The plan's id (dense per engine, from 1).
    pub fn id(&self) -> PlanId {
        self.id
    }

    /// Begins a transaction as the plan's next step. Inside it, a reversible call needs a
    /// compensation descriptor ([`crate::CallOptions::compensate`]); when the step commits,
    /// its descriptors are held (not retired) until the plan ends.
    pub async fn begin(&self, opts: TxOptions) -> Result<Transaction> {
        let plans = self.engine.plans().await?;
        let tx = self.engine.begin_with(opts)?;
        // Known to the feed before the step's first effect can be recorded.
        self.engine.inner.plans.feed.state.lock().steps.insert(tx.id(), self.id);
        if let Err(e) = plans.begin_step(self.id, tx.id().0).await {
            self.engine.inner.plans.feed.state.lock().steps.remove(&tx.id());
            let _ = tx.abort("its plan refused the step").await;
            return Err(e.into());
        }
        Ok(tx)
    }

    /// Arms a predicate trigger (docs/plans.md, "Predicates"); one naming another tenant is
    /// refused with [`PlanError::CrossTenant`].
    pub async fn arm(&self, predicate: Predicate) -> Result<()> {
        Ok(self.engine.plans().await?.arm(self.id, predicate).await?)
    }

    /// Commits the plan: every held compensation is retired at once. Refused while a step
    /// is unsettled or after a trigger fired.
    pub async fn commit(&self) -> Result<()> {
        Ok(self.engine.plans().await?.commit(self.id).await?)
    }

    /// Fails the plan with an explicit signal: the executor unwinds it last-in-first-out.
    pub async fn fail(&self, reason: &str) -> Result<()> {
        Ok(self.engine.plans().await?.signal(self.id, reason).await?)
    }

    /// Posts a compliance verdict about effect `effect` of step `tx`: `Block` compensates
    /// it, `Allow` lets it stand.
    pub async fn verdict(&self, tx: TxId, effect: tidegate_core::EffectId, verdict: Verdict) -> Result<()> {
        Ok(self.engine.plans().await?.verdict(self.id, tx.0, effect.0, verdict).await?)
    }

    /// Resolves a stuck plan with its owner's choice.
    pub async fn resolve(&self, choice: Choice) -> Result<()> {
        Ok(self.engine.plans().await?.resolve(self.id, choice).await?)
    }

    /// The plan in full: state, steps, registrations in unwind order, triggers.
    pub async fn detail(&self) -> Result<PlanDetail> {
        self.engine.plan_detail(self.id).await?.ok_or(Error::Plan(PlanError::UnknownPlan { plan: self.id }))
    }
}

/// The engine's plan state: the feed of engine facts, the capabilities, the executor.
pub(crate) struct PlanState {
    pub(crate) feed: Arc<Feed>,
    caps: RwLock<HashMap<String, (CapabilityHandler, CapabilityOptions)>>,
    external: RwLock<Option<Arc<dyn Dispatch>>>,
    tenant: String,
    running: Mutex<Option<Running>>,
    starting: tokio::sync::Mutex<()>,
    /// The executor's fold at the LSN the open replayed to (from the checkpoint's `plans`
    /// section plus the tail, or the whole ledger): the executor's start continues from it.
    boot: Mutex<Option<(Lsn, PlanShadow)>>,
}

impl PlanState {
    pub(crate) fn new(tenant: String, boot: Option<(Lsn, PlanShadow)>) -> PlanState {
        PlanState {
            feed: Arc::new(Feed::default()),
            caps: RwLock::new(HashMap::default()),
            external: RwLock::new(None),
            tenant,
            running: Mutex::new(None),
            starting: tokio::sync::Mutex::new(()),
            boot: Mutex::new(boot),
        }
    }

    /// Stops the executor task (the engine stopped or is dropped).
    pub(crate) fn stop(&self) {
        self.feed.state.lock().active = false;
        self.feed.listening.store(false, std::sync::atomic::Ordering::SeqCst);
        self.running.lock().take();
    }
}

pub(crate) type EnginePlans = Plans<LedgerLog, EngineDispatch, Arc<dyn Clock>>;

struct Running {
    plans: Arc<EnginePlans>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Engine facts of plan steps, fed under the engine lock in ledger order.
#[derive(Default)]
pub(crate) struct Feed {
    pub(crate) state: Mutex<FeedState>,
    notify: Notify,
    /// `state.active`, read without the lock on every engine append (set and cleared under
    /// the engine lock or before any executor exists, so `with_core` never misses a change).
    listening: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
pub(crate) struct FeedState {
    /// Set once the executor has folded the ledger: from then on every append is fed.
    pub(crate) active: bool,
    queue: Vec<Observation>,
    /// Unsettled step transactions and their plans.
    pub(crate) steps: HashMap<TxId, PlanId>,
    /// Scopes written by each unsettled transaction (for `no_commit` predicates).
    scopes: HashMap<TxId, Vec<Arc<str>>>,
}

impl FeedState {
    /// The executor's entry for one ledger event when rebuilding (a plan record decoded, a
    /// step's engine event mapped), if it is one.
    fn entry(&mut self, e: &Event) -> std::result::Result<Option<Entry>, PlanError> {
        match e {
            Event::Extension { stream, body } if &**stream == STREAM => {
                let f = PlanFact::decode(body)?;
                if let PlanFact::StepBegun { plan, tx, .. } = &f {
                    self.steps.insert(TxId(*tx), *plan);
                }
                Ok(Some(Entry::Plan(f)))
            }
            e => Ok(self.map(e, 0).map(Entry::Engine)),
        }
    }

    /// Maps one ledger event to the executor's fact, if it is one. A commit's `decided`
    /// record carries its time (the executor stamps the settlement with it); `at_ms` stands
    /// in for a commit recorded without one (the clock live, 0 when rebuilding).
    fn map(&mut self, e: &Event, at_ms: u64) -> Option<Observation> {
        match e {
            Event::Decided { tx, commit: true, at: Some(at), .. } => {
                let mut scopes: Vec<String> = self.scopes.get(tx)?.iter().map(|s| s.to_string()).collect();
                scopes.sort_unstable();
                scopes.dedup();
                Some(Observation::Committing { tx: tx.0, scopes, at_ms: at.0 / 1_000_000 })
            }
            Event::EffectRecorded { tx, effect, tool, class, scopes, key, args, compensation, .. } => {
                self.scopes.entry(*tx).or_default().extend(scopes.iter().cloned());
                let effect_scopes = scopes;
                self.steps.contains_key(tx).then(|| Observation::EffectRecorded {
                    tx: tx.0,
                    effect: effect.0,
                    tool: tool.to_string(),
                    held: !class.executes_eagerly(),
                    key: key.to_string(),
                    args: (**args).clone(),
                    // Gated effects are irreversible: never compensable, whatever was recorded.
                    descriptor: compensation
                        .as_ref()
                        .filter(|_| *class != EffectClass::Gated)
                        .and_then(|d| serde_json::from_value((**d).clone()).ok()),
                    scopes: effect_scopes.iter().map(|s| s.to_string()).collect(),
                })
            }
            Event::EffectExecuted { tx, effect, output } => self
                .steps
                .contains_key(tx)
                .then(|| Observation::EffectExecuted { tx: tx.0, effect: effect.0, output: (**output).clone() }),
            Event::EffectFailed { tx, effect, unknown, .. } => self
                .steps
                .contains_key(tx)
                .then_some(Observation::EffectFailed { tx: tx.0, effect: effect.0, unknown: *unknown }),
            Event::Released { tx, effect, output, error, unknown } => {
                self.steps.contains_key(tx).then(|| Observation::Released {
                    tx: tx.0,
                    effect: effect.0,
                    ok: error.is_none(),
                    unknown: *unknown,
                    output: output.as_ref().map(|o| (**o).clone()),
                })
            }
            Event::Settled { tx, committed, effects } => {
                self.steps.remove(tx);
                let scopes = self.scopes.remove(tx).unwrap_or_default();
                let mut scopes: Vec<String> =
                    if *committed { scopes.iter().map(|s| s.to_string()).collect() } else { Vec::new() };
                scopes.sort_unstable();
                scopes.dedup();
                Some(Observation::Settled {
                    tx: tx.0,
                    committed: *committed,
                    tags: effects.iter().map(|(e, _, t)| (e.0, t.to_string())).collect(),
                    scopes,
                    at_ms,
                })
            }
            _ => None,
        }
    }
}

/// The plan executor as a fold of the ledger up to one LSN, with the feed's own state there
/// (unsettled steps, scopes of unsettled transactions): what a checkpoint's `plans` section
/// holds, what the checkpoint thread keeps beside its replaying engine, and what an open hands
/// the live executor so that it folds only the ledger after it (docs/plans.md, "Checkpoints").
pub(crate) struct PlanShadow {
    exec: tidegate_plans::Executor,
    map: FeedState,
}

/// The header of a checkpoint's `plans` section; the executor's snapshot follows it.
#[derive(serde::Serialize, serde::Deserialize)]
struct SectionHead {
    version: u32,
    steps: Vec<(u64, PlanId)>,
    scopes: Vec<(u64, Vec<String>)>,
}

/// The version of the `plans` section this build writes and reads.
const SECTION_VERSION: u32 = 1;

/// The name of the executor's section in the engine's checkpoint.
pub(crate) const SECTION: &str = "plans";

impl PlanShadow {
    /// The fold of an empty ledger.
    pub(crate) fn new(tenant: &str) -> PlanShadow {
        PlanShadow { exec: tidegate_plans::Executor::new(tenant), map: FeedState::default() }
    }

    /// Folds the next ledger event (as the executor's rebuild does).
    pub(crate) fn apply(&mut self, e: &Event) -> std::result::Result<(), PlanError> {
        match self.map.entry(e)? {
            Some(entry) => self.exec.apply(&entry),
            None => Ok(()),
        }
    }

    /// Whether the ledger it folded holds any plan record.
    pub(crate) fn has_plans(&self) -> bool {
        self.exec.incarnation() > 0 || self.exec.plan_count() > 0
    }

    /// The section's bytes.
    pub(crate) fn encode(&self) -> std::result::Result<Vec<u8>, PlanError> {
        let bad = |detail: String| PlanError::Snapshot { detail };
        let head = SectionHead {
            version: SECTION_VERSION,
            steps: self.map.steps.iter().map(|(t, p)| (t.0, *p)).collect(),
            scopes: self.map.scopes.iter().map(|(t, v)| (t.0, v.iter().map(|s| s.to_string()).collect())).collect(),
        };
        let mut out = postcard::to_stdvec(&head).map_err(|e| bad(format!("encoding the section header: {e}")))?;
        out.extend_from_slice(&self.exec.snapshot()?);
        Ok(out)
    }

    /// Reads a section [`PlanShadow::encode`] wrote; refused ([`PlanError::Snapshot`]) when it
    /// is another version's, another tenant's or damaged.
    pub(crate) fn decode(tenant: &str, bytes: &[u8]) -> std::result::Result<PlanShadow, PlanError> {
        let bad = |detail: String| PlanError::Snapshot { detail };
        let (head, rest) = postcard::take_from_bytes::<SectionHead>(bytes)
            .map_err(|e| bad(format!("decoding the section header: {e}")))?;
        if head.version != SECTION_VERSION {
            return Err(bad(format!("section version {}; this build reads {SECTION_VERSION}", head.version)));
        }
        let exec = tidegate_plans::Executor::restore(tenant, rest)?;
        let map = FeedState {
            steps: head.steps.into_iter().map(|(t, p)| (TxId(t), p)).collect(),
            scopes: head.scopes.into_iter().map(|(t, v)| (TxId(t), v.into_iter().map(Arc::from).collect())).collect(),
            ..FeedState::default()
        };
        Ok(PlanShadow { exec, map })
    }
}

impl Tidegate {
    /// Feeds the events about to be appended (under the engine lock, so in ledger order)
    /// to the plan executor; called by `with_core` once they are appended.
    pub(crate) fn feed_plans(&self, events: &[Event]) {
        let feed = &self.inner.plans.feed;
        let mut st = feed.state.lock();
        if !st.active {
            return;
        }
        let now = ms(self.inner.clock.now());
        let mut any = false;
        for e in events {
            if let Some(o) = st.map(e, now) {
                st.queue.push(o);
                any = true;
            }
        }
        drop(st);
        if any {
            feed.notify.notify_one();
        }
    }

    /// Whether the plan feed wants the engine's events (so `with_core` keeps a copy).
    pub(crate) fn plans_listening(&self) -> bool {
        self.inner.plans.feed.listening.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The plan `tx` is a step of, if any.
    pub(crate) fn plan_of(&self, tx: TxId) -> Option<PlanId> {
        self.inner.plans.feed.state.lock().steps.get(&tx).copied()
    }

    /// Registers an in-process handler for `capability`: the executor sends it every
    /// compensation and probe of that name (a descriptor's `capability`, `probe`,
    /// `forward_probe`). Replaces an earlier handler of the same name.
    pub fn capability<F, Fut>(&self, capability: impl Into<String>, handler: F)
    where
        F: Fn(DispatchRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = CallOutcome> + Send + 'static,
    {
        self.capability_with(capability, CapabilityOptions::default(), handler);
    }

    /// [`Tidegate::capability`] with options: the deadline after which a call of the handler
    /// counts as an unknown outcome. A handler that panics is an unknown outcome too (it may
    /// have acted before it panicked): the executor probes, then retries or makes the plan
    /// stuck, and never leaves it waiting on a call that will not answer.
    pub fn capability_with<F, Fut>(&self, capability: impl Into<String>, opts: CapabilityOptions, handler: F)
    where
        F: Fn(DispatchRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = CallOutcome> + Send + 'static,
    {
        let h: CapabilityHandler = Arc::new(move |r| Box::pin(handler(r)));
        self.inner.plans.caps.write().insert(capability.into(), (h, opts));
    }

    /// Sends the compensations and probes of capabilities without an in-process handler to
    /// `dispatch` (the server's webhooks and pull workers). Without one they fail
    /// (`not_applied`), which makes their plan stuck until the capability exists.
    pub fn set_plan_dispatch(&self, dispatch: Arc<dyn Dispatch>) {
        *self.inner.plans.external.write() = Some(dispatch);
    }

    /// Opens a plan (appends `plan_opened` durably, then arms its triggers).
    pub async fn plan(&self, opts: PlanOptions) -> Result<Plan> {
        let plans = self.plans().await?;
        let now = ms(self.inner.clock.now());
        let deadline_ms = opts.deadline.map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        let id = plans.open(&opts.owner, deadline_ms, opts.cascade_limit).await?;
        let plan = Plan { engine: self.clone(), id };
        for t in opts.triggers {
            if let Err(e) = plan.arm(t).await {
                // The plan exists (its record is durable); a refused trigger fails it so that
                // nothing runs under a plan that lacks the trigger its owner asked for.
                let _ = plan.fail(&format!("a trigger was refused when the plan opened: {e}")).await;
                return Err(e);
            }
        }
        Ok(plan)
    }

    /// A handle on plan `id` (refused if this engine has no such plan).
    pub async fn plan_by_id(&self, id: PlanId) -> Result<Plan> {
        if self.plans().await?.detail(id).await.is_none() {
            return Err(Error::Plan(PlanError::UnknownPlan { plan: id }));
        }
        Ok(Plan { engine: self.clone(), id })
    }

    /// Every plan of this engine, by id.
    pub async fn plan_list(&self) -> Result<Vec<PlanView>> {
        Ok(self.plans().await?.plans().await)
    }

    /// One plan in full, if it exists.
    pub async fn plan_detail(&self, id: PlanId) -> Result<Option<PlanDetail>> {
        Ok(self.plans().await?.detail(id).await)
    }

    /// The owner-intervention queue: stuck plans and why.
    pub async fn stuck_plans(&self) -> Result<Vec<(PlanId, StuckReason)>> {
        Ok(self.plans().await?.stuck().await)
    }

    /// The tenant the plan executor serves (`Builder::tenant`, default `default`).
    pub fn plan_tenant(&self) -> &str {
        &self.inner.plans.tenant
    }

    /// The running executor, started (rebuilt from the ledger) on first use.
    pub(crate) async fn plans(&self) -> Result<Arc<EnginePlans>> {
        if let Some(r) = self.inner.plans.running.lock().as_ref() {
            return Ok(r.plans.clone());
        }
        if self.inner.poisoned.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.stopped_error());
        }
        let _starting = self.inner.plans.starting.lock().await;
        if let Some(r) = self.inner.plans.running.lock().as_ref() {
            return Ok(r.plans.clone());
        }
        let log = LedgerLog {
            inner: Arc::downgrade(&self.inner),
            store: self.inner.store.clone(),
            feed: self.inner.plans.feed.clone(),
            resume: Mutex::new(None),
        };
        let dispatch = EngineDispatch { inner: Arc::downgrade(&self.inner) };
        let clock = self.inner.clock.clone();
        let plans = match Plans::start(&self.inner.plans.tenant, log, dispatch, clock).await {
            Ok(p) => p,
            Err(e) => {
                // Nobody folds the feed: stop filling it.
                let mut feed = self.inner.plans.feed.state.lock();
                feed.active = false;
                self.inner.plans.feed.listening.store(false, std::sync::atomic::Ordering::SeqCst);
                feed.queue.clear();
                return Err(e.into());
            }
        };
        let run = plans.clone();
        let task = self.inner.handle.spawn(async move {
            // Returns only when an append failed (the engine stopped): a reopen rebuilds it.
            let _ = run.run().await;
        });
        *self.inner.plans.running.lock() = Some(Running { plans: plans.clone(), task });
        Ok(plans)
    }

    /// Starts the executor at recovery when the ledger holds a plan record.
    pub(crate) async fn start_plans_if_any(&self) -> Result<()> {
        if self.inner.plans.running.lock().is_some() {
            return Ok(());
        }
        // The open folded the plans up to its LSN (recovery appends no plan record since);
        // without that fold (a record it could not fold), look for a plan record.
        let boot = self.inner.plans.boot.lock().as_ref().map(|(_, b)| b.has_plans());
        let any = match boot {
            Some(any) => any,
            None => {
                let mut any = false;
                self.inner.store.scan(1, &mut |_, e| {
                    if let Event::Extension { stream, .. } = e
                        && &**stream == STREAM
                    {
                        any = true;
                        return false;
                    }
                    true
                })?;
                any
            }
        };
        if any {
            self.plans().await?;
        }
        Ok(())
    }
}

fn ms(t: Timestamp) -> u64 {
    t.0 / 1_000_000
}

/// In-process capabilities first, then the embedder's dispatcher.
#[derive(Debug)]
pub(crate) struct EngineDispatch {
    inner: Weak<Inner>,
}

impl Dispatch for EngineDispatch {
    fn deadline(&self, request: &DispatchRequest) -> Duration {
        let Some(inner) = self.inner.upgrade() else { return DEFAULT_DISPATCH_DEADLINE };
        if let Some((_, opts)) = inner.plans.caps.read().get(&request.capability) {
            return opts.deadline;
        }
        match inner.plans.external.read().as_ref() {
            Some(d) => d.deadline(request),
            None => DEFAULT_DISPATCH_DEADLINE,
        }
    }

    fn dispatch(&self, request: DispatchRequest) -> BoxFuture<CallOutcome> {
        let target = self.inner.upgrade().map(|inner| {
            let local = inner.plans.caps.read().get(&request.capability).map(|(h, _)| h.clone());
            (local, inner.plans.external.read().clone())
        });
        Box::pin(async move {
            match target {
                None => CallOutcome::not_applied("the engine stopped", true),
                Some((Some(h), _)) => h(request).await,
                Some((None, Some(d))) => d.dispatch(request).await,
                Some((None, None)) => CallOutcome::not_applied(
                    format!(
                        "no capability `{}` is registered (Tidegate::capability) and no plan dispatcher is set",
                        request.capability
                    ),
                    false,
                ),
            }
        })
    }
}

/// The plan log over the engine's ledger: plan records are extension records of the stream
/// `plans`; engine facts are the engine's own events (never appended here).
pub(crate) struct LedgerLog {
    inner: Weak<Inner>,
    store: Arc<dyn LedgerStore>,
    feed: Arc<Feed>,
    /// Set by [`tidegate_plans::PlanLog::initial`]: the LSN the executor it handed out is the
    /// fold of, and the feed's state there; `read_all` continues after it.
    resume: Mutex<Option<(Lsn, FeedState)>>,
}

impl LedgerLog {
    /// The engine, unless it was dropped (then the log refuses `op` for good).
    fn engine(&self, op: &'static str) -> std::result::Result<Tidegate, PlanError> {
        self.inner
            .upgrade()
            .map(|inner| Tidegate { inner })
            .ok_or_else(|| PlanError::log(op, false, "the engine was dropped"))
    }

    fn scan(
        &self,
        from: Lsn,
        st: &mut FeedState,
        out: &mut Vec<Entry>,
        error: &mut Option<PlanError>,
    ) -> std::result::Result<Lsn, PlanError> {
        let mut last = from.saturating_sub(1);
        self.store
            .scan(from, &mut |lsn, e| {
                last = lsn;
                match st.entry(e) {
                    Ok(Some(entry)) => out.push(entry),
                    Ok(None) => {}
                    Err(err) => {
                        *error = Some(err);
                        return false;
                    }
                }
                true
            })
            .map_err(|e| PlanError::log("read the ledger", e.retryable(), e))?;
        Ok(last)
    }
}

impl tidegate_plans::PlanLog for LedgerLog {
    fn append(&self, entries: Vec<Entry>) -> impl Future<Output = std::result::Result<(), PlanError>> + Send {
        let recorded = (|| {
            let mut facts: Vec<Value> = Vec::with_capacity(entries.len());
            let mut touches = Vec::new();
            for e in entries {
                match e {
                    Entry::Plan(f) => facts.push(f.encode()),
                    Entry::Touch(t) if !t.scopes.is_empty() => touches.push(t),
                    Entry::Touch(_) | Entry::Engine(_) => {}
                }
            }
            if facts.is_empty() && touches.is_empty() {
                return Ok(0);
            }
            let tg = self.engine("append")?;
            tg.record_extensions_touching(STREAM, facts, touches)
                .map_err(|e| PlanError::log("append", e.retryable(), e))
        })();
        let (store, inner) = (self.store.clone(), self.inner.clone());
        async move {
            let lsn = recorded?;
            if lsn != 0 && !store.is_durable(lsn) {
                tidegate_storage::durable(&*store, lsn).await.map_err(|e| {
                    // A fence stops the engine as its own waits do (`Tidegate::store_failed`).
                    let e = match inner.upgrade() {
                        Some(inner) => Tidegate { inner }.store_failed(e),
                        None => Error::Store(e),
                    };
                    PlanError::log("make an append durable", e.retryable(), e)
                })?;
            }
            Ok(())
        }
    }

    fn initial(&self, tenant: &str) -> Option<tidegate_plans::Executor> {
        let inner = self.inner.upgrade()?;
        let (lsn, boot) = inner.plans.boot.lock().take()?;
        if boot.exec.tenant() != tenant {
            return None;
        }
        *self.resume.lock() = Some((lsn, boot.map));
        Some(boot.exec)
    }

    fn read_all(&self) -> std::result::Result<Vec<Entry>, PlanError> {
        let (from, mut st) = match self.resume.lock().take() {
            Some((lsn, st)) => (lsn + 1, st),
            None => (1, FeedState::default()),
        };
        let mut out = Vec::new();
        let mut error = None;
        // Most of the ledger without the engine lock, then the rest under it, where the feed
        // is switched on: every later append is fed, none is missed or folded twice.
        let last = self.scan(from, &mut st, &mut out, &mut error)?;
        if let Some(e) = error {
            return Err(e);
        }
        let tg = self.engine("read the ledger")?;
        let _engine = tg.inner.shared.lock();
        self.scan(last + 1, &mut st, &mut out, &mut error)?;
        if let Some(e) = error {
            return Err(e);
        }
        let mut feed = self.feed.state.lock();
        feed.active = true;
        self.feed.listening.store(true, std::sync::atomic::Ordering::SeqCst);
        feed.queue.clear();
        feed.steps = st.steps;
        feed.scopes = st.scopes;
        Ok(out)
    }

    fn drain(&self) -> Vec<Observation> {
        std::mem::take(&mut self.feed.state.lock().queue)
    }

    fn changed(&self) -> impl Future<Output = ()> + Send {
        let feed = self.feed.clone();
        async move { feed.notify.notified().await }
    }
}
