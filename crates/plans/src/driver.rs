//! The executor's async driver over three traits: the durable log of plan facts, the
//! dispatcher of capabilities, and the engine clock (docs/plans.md, "Key operations").

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::sync::Mutex as SyncMutex;
use tokio::sync::{Mutex, Notify, mpsc};

use crate::error::PlanError;
use crate::executor::{Action, CallOutcome, DispatchRequest, Executor, PlanDetail, PlanView};
use crate::fact::{Choice, EffectId, Entry, Observation, PlanFact, PlanId, StuckReason, Touch, TxId, Verdict};
use crate::predicate::Predicate;
use tidegate_core::Timestamp;
pub use tidegate_core::{Clock, Dispatch};

/// The durable log the executor is a fold of: plan records and engine facts in ledger order.
pub trait PlanLog: Send + Sync + 'static {
    /// Appends entries; resolves once they are durable. The ledger-backed log appends plan
    /// records as extension records and ignores engine entries (the engine wrote them).
    fn append(&self, entries: Vec<Entry>) -> impl Future<Output = Result<(), PlanError>> + Send;
    /// Every entry from the start, in order; after [`PlanLog::initial`] handed out an
    /// executor, only the entries after the state it holds.
    fn read_all(&self) -> Result<Vec<Entry>, PlanError>;
    /// An executor of `tenant` the log already holds folded up to some entry (a checkpoint's),
    /// if any: [`Plans::start`] continues from it instead of folding from the start. Default:
    /// none.
    fn initial(&self, tenant: &str) -> Option<Executor> {
        let _ = tenant;
        None
    }
    /// Engine facts the log saw appended since the last call (after those `read_all`
    /// returned), in ledger order: a log bound to a live engine feeds them here, and the
    /// driver folds them before every command and every decision. Default: none (a log whose
    /// engine facts arrive through [`Plans::observe`]).
    fn drain(&self) -> Vec<Observation> {
        Vec::new()
    }
    /// Resolves when [`PlanLog::drain`] may have something new. Default: never.
    fn changed(&self) -> impl Future<Output = ()> + Send {
        std::future::pending::<()>()
    }
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".to_owned())
}

/// The executor's time in milliseconds of `clock` (the engine's clock reads nanoseconds).
fn now_ms(clock: &impl Clock) -> u64 {
    clock.now().0 / 1_000_000
}

/// Sleeps on `clock` until `at_ms`.
fn sleep_until_ms(clock: &impl Clock, at_ms: u64) -> tidegate_core::BoxFuture<()> {
    clock.sleep_until(Timestamp(at_ms.saturating_mul(1_000_000)))
}

/// Tokio's clock (virtual under `tokio::time::pause`), reading `base_ms` at creation: the
/// executor's own tests and benchmark run on it (an engine passes its own clock).
#[derive(Debug, Clone)]
pub struct TokioClock {
    start: tokio::time::Instant,
    base_ms: u64,
}

impl TokioClock {
    /// A clock reading `base_ms` now.
    pub fn new(base_ms: u64) -> TokioClock {
        TokioClock { start: tokio::time::Instant::now(), base_ms }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let ms = self.base_ms + self.start.elapsed().as_millis() as u64;
        Timestamp(ms.saturating_mul(1_000_000))
    }

    fn sleep_until(&self, deadline: Timestamp) -> tidegate_core::BoxFuture<()> {
        let wait = (deadline.0 / 1_000_000).saturating_sub(self.base_ms);
        Box::pin(tokio::time::sleep_until(self.start + Duration::from_millis(wait)))
    }
}

/// An in-memory log (tests, benchmarks). Clones share the log; plan records round-trip
/// through their JSON form on append.
#[derive(Debug, Clone, Default)]
pub struct MemoryLog {
    entries: Arc<SyncMutex<Vec<Entry>>>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> MemoryLog {
        MemoryLog::default()
    }

    /// Every entry.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl PlanLog for MemoryLog {
    fn append(&self, entries: Vec<Entry>) -> impl Future<Output = Result<(), PlanError>> + Send {
        let result = (|| {
            let mut decoded = Vec::with_capacity(entries.len());
            for e in entries {
                decoded.push(match e {
                    Entry::Plan(f) => Entry::Plan(PlanFact::decode(&f.encode())?),
                    e => e,
                });
            }
            let mut log = self
                .entries
                .lock()
                .map_err(|_| PlanError::log("append", false, "the memory log's lock is poisoned"))?;
            log.extend(decoded);
            Ok(())
        })();
        std::future::ready(result)
    }

    fn read_all(&self) -> Result<Vec<Entry>, PlanError> {
        Ok(self.entries())
    }
}

/// One tenant's plans: the API and the executor loop ([`Plans::run`]).
#[derive(Debug)]
pub struct Plans<L, D, C> {
    exec: Mutex<Executor>,
    log: L,
    dispatch: D,
    clock: C,
    wake: Notify,
    /// Set (to the failure) when an append failed after the executor applied what it
    /// appended: the executor and the log may differ, so it refuses everything
    /// ([`PlanError::Stopped`]) until rebuilt (`Plans::start`).
    stopped: OnceLock<PlanError>,
}

impl<L: PlanLog, D: Dispatch + 'static, C: Clock + 'static> Plans<L, D, C> {
    /// Rebuilds the executor of `tenant` from `log` and records its start.
    pub async fn start(tenant: &str, log: L, dispatch: D, clock: C) -> Result<Arc<Self>, PlanError> {
        let mut exec = log.initial(tenant).unwrap_or_else(|| Executor::new(tenant));
        for e in log.read_all()? {
            exec.apply(&e)?;
        }
        let fact = exec.start()?;
        log.append(vec![Entry::Plan(fact)]).await?;
        Ok(Arc::new(Plans {
            exec: Mutex::new(exec),
            log,
            dispatch,
            clock,
            wake: Notify::new(),
            stopped: OnceLock::new(),
        }))
    }

    /// Folds the engine facts the log has seen since the last call.
    fn catch_up(&self, exec: &mut Executor) {
        for o in self.log.drain() {
            exec.observe(&o);
        }
    }

    /// Runs one command under the lock and appends its fact; returns what `f` returned with it.
    async fn command<T>(
        &self,
        f: impl FnOnce(&mut Executor, u64) -> Result<(PlanFact, T), PlanError>,
    ) -> Result<T, PlanError> {
        let mut exec = self.exec.lock().await;
        self.check()?;
        self.catch_up(&mut exec);
        let (fact, out) = f(&mut exec, now_ms(&self.clock))?;
        self.guard(self.log.append(vec![Entry::Plan(fact)]).await)?;
        drop(exec);
        self.wake.notify_one();
        Ok(out)
    }

    /// Opens a plan; its id.
    pub async fn open(
        &self,
        owner: &str,
        deadline_ms: Option<u64>,
        cascade_limit: Option<u32>,
    ) -> Result<PlanId, PlanError> {
        self.command(|e, now| {
            let tenant = e.tenant().to_owned();
            let fact = e.open(&tenant, owner, deadline_ms, cascade_limit, now)?;
            // Plan ids are dense from 1: the plan just opened is the last one.
            let plan = e.plan_count() as PlanId;
            debug_assert!(matches!(fact, PlanFact::PlanOpened { plan: p, .. } if p == plan));
            Ok((fact, plan))
        })
        .await
    }

    /// Binds a transaction to a plan as its next step.
    pub async fn begin_step(&self, plan: PlanId, tx: TxId) -> Result<(), PlanError> {
        self.command(|e, _| Ok((e.begin_step(plan, tx)?, ()))).await
    }

    /// Arms a predicate trigger.
    pub async fn arm(&self, plan: PlanId, predicate: Predicate) -> Result<(), PlanError> {
        self.command(|e, _| Ok((e.arm(plan, predicate)?, ()))).await
    }

    /// Commits a plan.
    pub async fn commit(&self, plan: PlanId) -> Result<(), PlanError> {
        self.command(|e, now| Ok((e.commit(plan, now)?, ()))).await
    }

    /// Signals a plan's failure.
    pub async fn signal(&self, plan: PlanId, reason: &str) -> Result<(), PlanError> {
        self.command(|e, now| Ok((e.signal(plan, reason, now)?, ()))).await
    }

    /// Posts a compliance verdict.
    pub async fn verdict(&self, plan: PlanId, tx: TxId, effect: EffectId, verdict: Verdict) -> Result<(), PlanError> {
        self.command(|e, now| Ok((e.verdict(plan, tx, effect, verdict, now)?, ()))).await
    }

    /// Resolves a stuck plan.
    pub async fn resolve(&self, plan: PlanId, choice: Choice) -> Result<(), PlanError> {
        self.command(|e, now| Ok((e.resolve(plan, choice, now)?, ()))).await
    }

    /// Feeds an engine fact (the ledger-backed binding calls this from its append path).
    pub async fn observe(&self, o: Observation) -> Result<(), PlanError> {
        let mut exec = self.exec.lock().await;
        self.check()?;
        self.catch_up(&mut exec);
        exec.observe(&o);
        self.guard(self.log.append(vec![Entry::Engine(o)]).await)?;
        drop(exec);
        self.wake.notify_one();
        Ok(())
    }

    fn check(&self) -> Result<(), PlanError> {
        match self.stopped.get() {
            Some(cause) => Err(PlanError::stopped(cause.clone())),
            None => Ok(()),
        }
    }

    /// Stops the handle when `r` (an append, or the fold of a result) failed; returns `r`.
    fn guard<T>(&self, r: Result<T, PlanError>) -> Result<T, PlanError> {
        if let Err(e) = &r {
            // The first failure is the one kept: every call after it was refused by `check`.
            let _ = self.stopped.set(e.clone());
        }
        r
    }

    /// The owner-intervention queue.
    pub async fn stuck(&self) -> Vec<(PlanId, StuckReason)> {
        let mut exec = self.exec.lock().await;
        self.catch_up(&mut exec);
        exec.stuck()
    }

    /// Every plan.
    pub async fn plans(&self) -> Vec<PlanView> {
        let mut exec = self.exec.lock().await;
        self.catch_up(&mut exec);
        exec.plans()
    }

    /// One plan in full (registrations in unwind order, triggers with their values now).
    pub async fn detail(&self, plan: PlanId) -> Option<PlanDetail> {
        let mut exec = self.exec.lock().await;
        self.catch_up(&mut exec);
        exec.detail(plan, now_ms(&self.clock))
    }

    /// The tenant this executor serves.
    pub async fn tenant(&self) -> String {
        self.exec.lock().await.tenant().to_owned()
    }

    /// One dispatch under its deadline ([`Dispatch::deadline_ms`]), in a task of its own so
    /// that a panic in the dispatcher or the handler is caught: both a panic and a missed
    /// deadline are an unknown outcome (the handler may have acted before it stopped), which
    /// the executor resolves by probing, never by firing blindly again. The dispatch's future
    /// is dropped at the deadline.
    async fn bounded_dispatch(self: &Arc<Self>, request: DispatchRequest) -> CallOutcome {
        let capability = request.capability.clone();
        let limit = u64::try_from(self.dispatch.deadline(&request).as_millis()).unwrap_or(u64::MAX).max(1);
        let at = now_ms(&self.clock).saturating_add(limit);
        let this = Arc::clone(self);
        let task = tokio::spawn(async move { this.dispatch.dispatch(request).await });
        let abort = task.abort_handle();
        tokio::select! {
            r = task => match r {
                Ok(r) => r,
                Err(e) if e.is_panic() => CallOutcome::unknown(format!(
                    "the handler of capability `{capability}` panicked: {}",
                    panic_text(&*e.into_panic())
                )),
                Err(_) => CallOutcome::unknown(format!("the dispatch to capability `{capability}` was cancelled")),
            },
            () = sleep_until_ms(&self.clock, at) => {
                abort.abort();
                CallOutcome::unknown(format!(
                    "capability `{capability}` did not answer within its deadline of {limit} ms"
                ))
            }
        }
    }

    /// The executor loop: decide, make the decision durable, dispatch, record results, sleep
    /// until a command, a result or the next deadline. Returns only on a log failure.
    pub async fn run(self: Arc<Self>) -> Result<(), PlanError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Action, CallOutcome)>();
        loop {
            let (actions, next) = {
                let mut exec = self.exec.lock().await;
                self.check()?;
                self.catch_up(&mut exec);
                let d = exec.decide(now_ms(&self.clock));
                if !d.facts.is_empty() {
                    // A compensation's scopes are touched in the same append as its
                    // `comp_started`, before it is dispatched.
                    let touches = d.actions.iter().filter_map(|a| a.touch().cloned().map(Entry::Touch));
                    let entries = d.facts.into_iter().map(Entry::Plan).chain(touches).collect();
                    self.guard(self.log.append(entries).await)?;
                }
                (d.actions, exec.next_deadline())
            };
            for a in actions {
                let this = Arc::clone(&self);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let r = this.bounded_dispatch(a.request().clone()).await;
                    let _ = tx.send((a, r));
                });
            }
            let sleep = async {
                match next {
                    Some(at) => sleep_until_ms(&self.clock, at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((a, r)) = rx.recv() => {
                    let fact = a.result_fact(r);
                    let mut exec = self.exec.lock().await;
                    self.check()?;
                    self.guard(exec.apply_fact(&fact))?;
                    // Touched again with the outcome: a read made while it ran is stale.
                    let mut entries = vec![Entry::Plan(fact)];
                    entries.extend(a.touch().map(|t| Entry::Touch(Touch { done: true, ..t.clone() })));
                    self.guard(self.log.append(entries).await)?;
                }
                _ = self.wake.notified() => {}
                _ = self.log.changed() => {}
                _ = sleep => {}
            }
        }
    }
}
