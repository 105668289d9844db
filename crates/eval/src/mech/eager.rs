//! Eager execution: every call goes straight to the provider when the agent makes it.
//! Four baselines share this executor and differ only in the two mechanisms named here.
//!
//! | baseline | isolation | on abort |
//! | --- | --- | --- |
//! | [`EagerKind::NoTx`] | none | nothing: what ran stays |
//! | [`EagerKind::Saga`] | none | compensations of the calls that returned, in reverse |
//! | [`EagerKind::WorkflowLock`] | one global lock taken at begin, held to commit/abort | as Saga |
//! | [`EagerKind::PerCallLock`] | a lock per scope, held only during each read or call | as Saga |
//!
//! All four retry a failing call up to [`super::CALL_ATTEMPTS`] times *without* an
//! idempotency key (a retry after an unknown outcome can duplicate the effect). None of them
//! gates irreversible calls: a mail is sent when the agent asks for it. The validator runs at
//! commit, after every call has already reached its provider.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;

use super::{Abort, Attempt, LockTable, Mechanism, Settled, TaskSpec, retry, undo_reverse};
use crate::world::{Observed, ToolSpec, World};

/// Which eager baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagerKind {
    /// No transactions: direct calls, naive retry, nothing undone.
    NoTx,
    /// Saga: direct calls, reverse compensation on abort.
    Saga,
    /// Saga under one global workflow lock.
    WorkflowLock,
    /// Saga with per-scope locks held only during each call.
    PerCallLock,
}

/// The eager executor for one trial.
#[derive(Debug)]
pub struct Eager {
    kind: EagerKind,
    world: Arc<World>,
    global: Arc<tokio::sync::Mutex<()>>,
    locks: LockTable,
}

impl Eager {
    /// A fresh executor (fresh locks) over `world`.
    pub fn new(kind: EagerKind, world: Arc<World>) -> Eager {
        Eager { kind, world, global: Arc::default(), locks: LockTable::default() }
    }
}

struct EagerAttempt {
    kind: EagerKind,
    world: Arc<World>,
    spec: TaskSpec,
    mech: Arc<Eager>,
    executed: Mutex<Vec<(ToolSpec, Value)>>,
    calls: Mutex<Vec<Value>>,
    workflow_guard: Mutex<Option<tokio::sync::OwnedMutexGuard<()>>>,
    wait: Mutex<Duration>,
}

impl Mechanism for Arc<Eager> {
    fn begin<'a>(&'a self, spec: &'a TaskSpec, _attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>> {
        Box::pin(async move {
            let mut wait = Duration::ZERO;
            let guard = if self.kind == EagerKind::WorkflowLock {
                let start = tokio::time::Instant::now();
                let g = self.global.clone().lock_owned().await;
                wait = start.elapsed();
                Some(g)
            } else {
                None
            };
            Ok(Arc::new(EagerAttempt {
                kind: self.kind,
                world: self.world.clone(),
                spec: spec.clone(),
                mech: self.clone(),
                executed: Mutex::new(Vec::new()),
                calls: Mutex::new(Vec::new()),
                workflow_guard: Mutex::new(guard),
                wait: Mutex::new(wait),
            }) as Arc<dyn Attempt>)
        })
    }
}

impl EagerAttempt {
    async fn per_call_lock(&self, scope: &str) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        if self.kind != EagerKind::PerCallLock {
            return None;
        }
        let (g, waited) = self.mech.locks.lock(scope, None).await?;
        *self.wait.lock() += waited;
        Some(g)
    }

    fn finish(&self, committed: bool, abort: Option<Abort>, unresolved: u32) -> Settled {
        self.workflow_guard.lock().take();
        Settled { committed, abort, wait: *self.wait.lock(), rejections: 0, reported_unresolved: unresolved }
    }
}

impl Attempt for EagerAttempt {
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>> {
        Box::pin(async move {
            let _g = self.per_call_lock(scope).await;
            Ok(self.world.observe(scope)?)
        })
    }

    fn call<'a>(&'a self, tool: &'a ToolSpec, args: Value) -> BoxFuture<'a, Result<(), Abort>> {
        Box::pin(async move {
            let _g = self.per_call_lock(&tool.scope(&args)).await;
            self.calls.lock().push(args.clone());
            retry(|| self.world.invoke(tool, &args, None)).await?;
            self.executed.lock().push((tool.clone(), args));
            Ok(())
        })
    }

    fn commit(&self) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            let veto = self.spec.validator.as_ref().and_then(|v| v(&self.calls.lock()));
            match veto {
                Some(reason) => self.abort(Abort::Veto(reason)).await,
                None => self.finish(true, None, 0),
            }
        })
    }

    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            let failed = if self.kind == EagerKind::NoTx {
                0
            } else {
                let executed = std::mem::take(&mut *self.executed.lock());
                undo_reverse(&self.world, executed).await
            };
            self.finish(false, Some(why), failed)
        })
    }
}
