//! Tidegate: the real engine, with the harness's tools declared to it as adapters.
//!
//! Mechanism (all of it the engine's; this file only translates): a task is a transaction
//! begun with the task's may-touch set and, when it has a deadline, a lease of that length;
//! reads register the scope's version; calls are routed by the *declared* effect class
//! (eager with a registered compensation, staged, or queued until commit); the validator is a
//! pre-commit hook on the sealed footprint; commit waits for earlier transactions on
//! overlapping scopes, validates reads, then releases held effects in issuance order. Every
//! call carries an idempotency key (`res` and attempt) that the provider honours and a probe
//! that asks the provider whether the key was applied, so an unknown outcome is resolved
//! instead of retried blindly. An aborted attempt is re-run at a fresh epoch when the engine
//! calls its abort retryable, and after a tool failure (the paper's retry-enabled Tx-Full).
//!
//! [`Annotation`] reproduces adapter mistakes (Appendix D.5) by changing only what the
//! adapter declares; [`TgConfig::ablation`] removes one engine primitive through the engine's
//! own switches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tidegate_runtime::{
    AbortReason, Compensation, EffectClass, Error, FnHook, Ordering, Outcome, Probe, Speculation, Tidegate, Tool,
    ToolError, Transaction, TxOptions, Verdict,
};

use super::{Abort, Attempt, Mechanism, Settled, TaskSpec};
use crate::world::{CallError, Observed, ToolSpec, World};

/// Attempts in all.
pub const ATTEMPTS: u32 = 5;

/// An adapter mistake (Appendix D.5), applied to every tool and read of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Annotation {
    /// Correct declarations.
    Correct,
    /// Order scopes declared as the whole collection (`retail:order`).
    OverBroadScope,
    /// Order scopes narrowed to the agent's own field (`retail:order:W1:<agent>`), so two
    /// agents' footprints on one order never overlap.
    TooNarrowScope,
    /// Irreversible tools declared reversible (the gate never holds them).
    WrongEffectClass,
    /// Reversible tools declared without their compensation handler.
    MissingCompensation,
}

/// One engine primitive removed (needs the engine's ablation switches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TgAblation {
    /// Full discipline.
    None,
    /// Commits never wait for earlier transactions.
    NoFrontier,
    /// Reads are not validated at commit.
    NoStaleReadAbort,
    /// One frontier for every scope (a global lock).
    GlobalFrontier,
}

/// A consistency level of the engine (docs/levels.md); `L1` with its isolation strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TgLevel {
    /// The engine's default (L4, every discipline).
    Default,
    /// Plain execution: no waits, no validation.
    L0,
    /// Stale-generation prevention with serializable read validation.
    L1,
    /// L1 by snapshot isolation (with its read-only bypass).
    L1Snapshot,
    /// L1 by pessimistic no-wait locking.
    L1Pessimistic,
    /// Plus causal-cascade prevention.
    L2,
    /// Plus issuance-order externalisation.
    L3,
}

/// Settings of a Tidegate mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TgConfig {
    /// Commit ordering.
    pub first_committer_wins: bool,
    /// Removed primitive.
    pub ablation: TgAblation,
    /// Adapter declarations.
    pub annotation: Annotation,
    /// Consistency level.
    pub level: TgLevel,
}

impl TgConfig {
    /// The full engine with correct adapters.
    pub const FULL: TgConfig = TgConfig {
        first_committer_wins: false,
        ablation: TgAblation::None,
        annotation: Annotation::Correct,
        level: TgLevel::Default,
    };

    /// The engine builder for this setting. Levels and ablations are set only through the
    /// engine's own switches: the harness adds no mechanism of its own.
    pub fn builder(&self) -> Result<tidegate_runtime::Builder, String> {
        let b = Tidegate::builder().ordering(if self.first_committer_wins {
            Ordering::FirstCommitterWins
        } else {
            Ordering::EpochOrder
        });
        self.engine_switches(b)
    }

    fn engine_switches(&self, mut b: tidegate_runtime::Builder) -> Result<tidegate_runtime::Builder, String> {
        use tidegate_runtime::{Ablation, Isolation, Level};
        b = match self.level {
            TgLevel::Default => b,
            TgLevel::L0 => b.level(Level::L0),
            TgLevel::L1 => b.level(Level::L1).isolation(Isolation::Serializable),
            TgLevel::L1Snapshot => b.level(Level::L1).isolation(Isolation::SnapshotIsolation),
            TgLevel::L1Pessimistic => b.level(Level::L1).isolation(Isolation::Pessimistic),
            TgLevel::L2 => b.level(Level::L2),
            TgLevel::L3 => b.level(Level::L3),
        };
        let mut a = Ablation::default();
        match self.ablation {
            TgAblation::None => {}
            TgAblation::NoFrontier => a.no_frontier = true,
            TgAblation::NoStaleReadAbort => a.no_stale_read_abort = true,
            TgAblation::GlobalFrontier => a.global_frontier = true,
        }
        Ok(b.ablation(a))
    }
}

impl Annotation {
    fn scope(self, scope: String, agent: &str) -> String {
        match (self, scope.strip_prefix("retail:order:")) {
            (Annotation::OverBroadScope, Some(_)) => "retail:order".to_owned(),
            (Annotation::TooNarrowScope, Some(_)) => format!("{scope}:{agent}"),
            _ => scope,
        }
    }
}

/// Tidegate for one trial: one engine, the tools declared to it, and the trial's world.
pub struct TidegateMech {
    tg: Tidegate,
    world: Arc<World>,
    cfg: TgConfig,
    tools: Mutex<HashMap<(&'static str, String), Tool>>,
    groups: Mutex<Vec<Arc<Speculation>>>,
    _reaper: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TidegateMech {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TidegateMech").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

fn key_of(a: &Value) -> String {
    format!("tg:{}:{}", a["res"].as_str().unwrap_or_default(), a["attempt"].as_u64().unwrap_or(0))
}

fn tool_error(e: CallError) -> ToolError {
    match e {
        CallError::Transient(m) => ToolError::transient(m),
        CallError::Unknown(m) => ToolError::unknown(m),
        CallError::Failed(m) => ToolError::failed(m),
    }
}

fn abort_of(reason: Option<&AbortReason>) -> Abort {
    match reason {
        Some(AbortReason::StaleRead { scope, .. }) => Abort::StaleRead(scope.clone()),
        Some(AbortReason::Vetoed { reason, .. }) => Abort::Veto(reason.clone()),
        Some(AbortReason::LostBranch { .. }) => Abort::LostBranch,
        Some(AbortReason::LeaseExpired) => Abort::Timeout,
        Some(AbortReason::ToolFailed { tool, message } | AbortReason::ReleaseFailed { tool, message }) => {
            Abort::ToolFailed(format!("{tool}: {message}"))
        }
        Some(AbortReason::Explicit { reason }) => Abort::Other(reason.clone()),
        Some(r @ AbortReason::ProtocolViolation { .. }) => Abort::Other(r.to_string()),
        Some(other) => Abort::Rejected(other.kind().to_owned()),
        None => Abort::Other("aborted without a reason".into()),
    }
}

fn settled_of(o: &Outcome) -> Settled {
    let abort = (!o.committed).then(|| abort_of(o.reason.as_ref()));
    let rejections = u32::from(matches!(abort, Some(Abort::StaleRead(_) | Abort::Rejected(_))));
    Settled {
        committed: o.committed,
        abort,
        wait: Duration::ZERO,
        rejections,
        reported_unresolved: o.residue().count() as u32,
    }
}

impl TidegateMech {
    /// A fresh engine for one trial (must run inside the trial's runtime).
    pub fn new(world: Arc<World>, cfg: TgConfig) -> Result<TidegateMech, String> {
        let tg = cfg.builder()?.build().map_err(|e| e.to_string())?;
        let reaper = tg.spawn_reaper();
        Ok(TidegateMech {
            tg,
            world,
            cfg,
            tools: Mutex::new(HashMap::new()),
            groups: Mutex::new(Vec::new()),
            _reaper: reaper,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Tidegate {
        &self.tg
    }

    /// The adapter for `spec` as this configuration declares it (per agent, because a
    /// too-narrow scope names the agent).
    fn tool(&self, spec: &ToolSpec, agent: &str) -> Result<Tool, Abort> {
        let cache_key =
            (spec.name, if self.cfg.annotation == Annotation::TooNarrowScope { agent.into() } else { String::new() });
        if let Some(t) = self.tools.lock().get(&cache_key) {
            return Ok(t.clone());
        }
        let ann = self.cfg.annotation;
        let declared = match (ann, spec.class) {
            (Annotation::WrongEffectClass, EffectClass::Gated) => EffectClass::Reversible,
            (_, c) => c,
        };
        let (w, s) = (self.world.clone(), spec.clone());
        let agent_owned = agent.to_owned();
        let scope_spec = spec.clone();
        // The engine keeps one tool per name; a per-agent declaration needs its own name.
        let name = if cache_key.1.is_empty() { spec.name.to_owned() } else { format!("{}@{}", spec.name, cache_key.1) };
        let mut b = Tool::builder(name, declared)
            .scope(move |a| ann.scope(scope_spec.scope(a), &agent_owned))
            .key(key_of)
            .call({
                let (w, s) = (w.clone(), s.clone());
                move |a| {
                    let r = w.invoke(&s, &a, Some(&key_of(&a))).map(|()| json!({"ok": true})).map_err(tool_error);
                    async move { r }
                }
            })
            .probe({
                let (w, s) = (w.clone(), s.clone());
                move |a| {
                    let p = match w.probe(&s, &key_of(&a)) {
                        Ok(true) => Probe::Happened(json!({"ok": true, "probed": true})),
                        Ok(false) => Probe::DidNotHappen,
                        Err(_) => Probe::Unknown,
                    };
                    async move { p }
                }
            });
        if declared.executes_eagerly() && ann != Annotation::MissingCompensation {
            b = b.compensate(move |a, _out| {
                let r = w.undo(&s, &a).map(|()| Compensation::clean()).map_err(tool_error);
                async move { r }
            });
        } else {
            // The annotation error under study: a reversible tool declared without its undo.
            b = b.without_compensation();
        }
        let tool = b.build().map_err(|e| Abort::Other(e.to_string()))?;
        self.tools.lock().insert(cache_key, tool.clone());
        Ok(tool)
    }

    fn options(&self, spec: &TaskSpec) -> TxOptions {
        let mut o = TxOptions::agent(spec.agent.clone());
        if !spec.may_touch.is_empty() {
            o = o.may_touch(spec.may_touch.iter().map(|s| self.cfg.annotation.scope(s.clone(), &spec.agent)));
        }
        if let Some(d) = spec.deadline {
            o = o.lease(d);
        }
        o
    }

    fn attempt(self: &Arc<Self>, tx: Transaction, spec: &TaskSpec, attempt: u32) -> Arc<TgAttempt> {
        if let Some(v) = spec.validator.clone() {
            tx.add_hook(Arc::new(FnHook::new("validator", move |view: tidegate_core::engine::SealedView| {
                let args: Vec<Value> = view.effects.iter().map(|e| (*e.args).clone()).collect();
                let verdict = match v(&args) {
                    Some(reason) => Verdict::Veto(reason),
                    None => Verdict::Approve,
                };
                async move { verdict }
            })));
        }
        Arc::new(TgAttempt {
            mech: self.clone(),
            tx,
            attempt,
            spec: spec.clone(),
            began: tokio::time::Instant::now(),
            settled: Mutex::new(None),
        })
    }
}

struct TgAttempt {
    mech: Arc<TidegateMech>,
    tx: Transaction,
    attempt: u32,
    spec: TaskSpec,
    began: tokio::time::Instant,
    settled: Mutex<Option<Settled>>,
}

impl TgAttempt {
    fn fail(&self, e: Error) -> Abort {
        if let Some(o) = e.outcome() {
            let s = settled_of(o);
            let why = s.abort.clone().unwrap_or(Abort::Other(e.to_string()));
            *self.settled.lock() = Some(s);
            return why;
        }
        if self.spec.deadline.is_some_and(|d| self.began.elapsed() >= d) {
            return Abort::Timeout;
        }
        // The engine's own classification: a retryable refusal (a lock conflict) is re-planned.
        if e.retryable() {
            return Abort::Rejected(e.to_string());
        }
        Abort::Other(e.to_string())
    }
}

impl Attempt for TgAttempt {
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>> {
        Box::pin(async move {
            let declared = self.mech.cfg.annotation.scope(scope.to_owned(), &self.spec.agent);
            self.tx.read(&declared).map_err(|e| self.fail(e))?;
            Ok(self.mech.world.observe(scope)?)
        })
    }

    fn call<'a>(&'a self, tool: &'a ToolSpec, mut args: Value) -> BoxFuture<'a, Result<(), Abort>> {
        Box::pin(async move {
            let t = self.mech.tool(tool, &self.spec.agent)?;
            args["attempt"] = json!(self.attempt);
            self.tx.call(&t, args).await.map(|_| ()).map_err(|e| self.fail(e))
        })
    }

    fn commit(&self) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            if let Some(s) = self.settled.lock().clone() {
                return s;
            }
            // Commit's virtual duration is its wait for earlier transactions (plus release
            // retry backoff under faults): nothing else in it takes virtual time.
            let start = tokio::time::Instant::now();
            let r = self.tx.seal_and_commit().await;
            let wait = start.elapsed();
            let s = match r {
                Ok(o) => settled_of(&o),
                Err(e) => {
                    let why = self.fail(e);
                    self.settled.lock().clone().unwrap_or_else(|| Settled::aborted(why))
                }
            };
            Settled { wait, ..s }
        })
    }

    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            if let Some(s) = self.settled.lock().clone() {
                return s;
            }
            let rejections = u32::from(matches!(why, Abort::Rejected(_) | Abort::StaleRead(_)));
            match self.tx.abort(why.kind()).await {
                Ok(o) => Settled { abort: Some(why), rejections, ..settled_of(&o) },
                Err(_) => Settled { rejections, ..Settled::aborted(why) },
            }
        })
    }
}

impl Mechanism for Arc<TidegateMech> {
    fn begin<'a>(&'a self, spec: &'a TaskSpec, attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>> {
        Box::pin(async move {
            let tx = self.tg.begin_with(self.options(spec)).map_err(|e| Abort::Other(e.to_string()))?;
            Ok(self.attempt(tx, spec, attempt) as Arc<dyn Attempt>)
        })
    }

    fn begin_group<'a>(&'a self, spec: &'a TaskSpec, k: usize) -> BoxFuture<'a, Result<Vec<Arc<dyn Attempt>>, Abort>> {
        Box::pin(async move {
            let group = self.tg.speculate(self.options(spec), k).map_err(|e| Abort::Other(e.to_string()))?;
            let group = Arc::new(group);
            self.groups.lock().push(group.clone());
            Ok(group.branches().iter().map(|tx| self.attempt(tx.clone(), spec, 1) as Arc<dyn Attempt>).collect())
        })
    }

    fn settle_group<'a>(&'a self, branches: &'a [Arc<dyn Attempt>], winner: usize) -> BoxFuture<'a, Vec<Settled>> {
        Box::pin(async move {
            let Some(group) = self.groups.lock().pop() else {
                return vec![Settled::aborted(Abort::Other("no speculation group".into())); branches.len()];
            };
            let ids: Vec<_> = group.branches().iter().map(Transaction::id).collect();
            let mut out = vec![Settled::aborted(Abort::LostBranch); ids.len()];
            match group.commit_winner(ids[winner]).await {
                Ok(so) => {
                    out[winner] = settled_of(&so.winner);
                    let mut losers = so.losers.iter();
                    for (i, s) in out.iter_mut().enumerate() {
                        if i != winner
                            && let Some(o) = losers.next()
                        {
                            *s = settled_of(o);
                        }
                    }
                }
                Err(e) => {
                    out[winner] = Settled::aborted(
                        e.outcome().map_or(Abort::Other(e.to_string()), |o| abort_of(o.reason.as_ref())),
                    );
                }
            }
            out
        })
    }

    fn replan(&self, abort: &Abort, attempt: u32) -> bool {
        matches!(abort, Abort::StaleRead(_) | Abort::Rejected(_) | Abort::ToolFailed(_)) && attempt < ATTEMPTS
    }

    fn enforces_deadline(&self) -> bool {
        true
    }

    fn engine_wait(&self) -> Option<(u64, Duration)> {
        Some(self.tg.wait_stats())
    }
}
