//! TCC-Confirm (try/confirm/cancel).
//!
//! Mechanism: each *wired* tool has a try/confirm/cancel triple at its provider. A call is a
//! try: the provider reserves the effect without making it visible (`POST /try` on the
//! mailbox, a `reserved` row in the database, a reservation file, a pending buffer entry).
//! Commit runs the validator, then confirms every reservation in call order (confirm is
//! idempotent per reservation id, so retries cannot duplicate); abort cancels them. Calls
//! to tools that are not wired go straight to the provider and are never undone. Reads take
//! no locks and record nothing: TCC has no isolation.
//!
//! [`Wiring::Full`] wires every tool (the paper's Table 2 setting); [`Wiring::DbOnly`] wires
//! only database rows and orders (its Table 12 default).

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;

use super::{Abort, Attempt, Mechanism, Settled, TaskSpec, retry};
use crate::sinks::SinkKind;
use crate::world::{CallError, Observed, Target, ToolSpec, World};

/// Which tools have a try/confirm/cancel triple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Wiring {
    /// Every tool.
    Full,
    /// Database rows and orders only.
    DbOnly,
}

/// TCC for one trial.
#[derive(Debug)]
pub struct Tcc {
    world: Arc<World>,
    wiring: Wiring,
}

impl Tcc {
    /// Over `world` with `wiring`.
    pub fn new(world: Arc<World>, wiring: Wiring) -> Tcc {
        Tcc { world, wiring }
    }
}

struct TccAttempt {
    world: Arc<World>,
    spec: TaskSpec,
    wiring: Wiring,
    reserved: Mutex<Vec<(ToolSpec, Value, String)>>,
    calls: Mutex<Vec<Value>>,
}

impl Mechanism for Tcc {
    fn begin<'a>(&'a self, spec: &'a TaskSpec, _attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>> {
        Box::pin(async move {
            Ok(Arc::new(TccAttempt {
                world: self.world.clone(),
                spec: spec.clone(),
                wiring: self.wiring,
                reserved: Mutex::new(Vec::new()),
                calls: Mutex::new(Vec::new()),
            }) as Arc<dyn Attempt>)
        })
    }
}

impl TccAttempt {
    fn wired(&self, tool: &ToolSpec) -> bool {
        self.wiring == Wiring::Full || matches!(tool.target, Target::Orders | Target::Sink(SinkKind::Db))
    }

    async fn cancel_all(&self) -> u32 {
        let reserved = std::mem::take(&mut *self.reserved.lock());
        let mut failed = 0;
        for (tool, _, id) in reserved.into_iter().rev() {
            if retry(|| self.world.cancel(&tool, &id)).await.is_err() {
                failed += 1;
            }
        }
        failed
    }
}

impl Attempt for TccAttempt {
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>> {
        Box::pin(async move { Ok(self.world.observe(scope)?) })
    }

    fn call<'a>(&'a self, tool: &'a ToolSpec, args: Value) -> BoxFuture<'a, Result<(), Abort>> {
        Box::pin(async move {
            self.calls.lock().push(args.clone());
            if !self.wired(tool) {
                retry(|| self.world.invoke(tool, &args, None)).await?;
                return Ok(());
            }
            let id = retry(|| self.world.reserve(tool, &args)).await?;
            self.reserved.lock().push((tool.clone(), args, id));
            Ok(())
        })
    }

    fn commit(&self) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            if let Some(reason) = self.spec.validator.as_ref().and_then(|v| v(&self.calls.lock())) {
                return self.abort(Abort::Veto(reason)).await;
            }
            let reserved = self.reserved.lock().clone();
            for (i, (tool, args, id)) in reserved.iter().enumerate() {
                // An unknown-outcome confirm is retried: confirm is idempotent per id.
                if let Err(e) = retry(|| self.world.confirm(tool, args, id)).await {
                    // Cancel what was not confirmed; confirmed ones stand.
                    self.reserved.lock().drain(..=i);
                    let failed = self.cancel_all().await;
                    let partial = u32::from(i > 0);
                    let msg = match e {
                        CallError::Transient(m) | CallError::Unknown(m) | CallError::Failed(m) => m,
                    };
                    return Settled {
                        reported_unresolved: failed + partial,
                        ..Settled::aborted(Abort::ToolFailed(format!("confirm failed: {msg}")))
                    };
                }
            }
            self.reserved.lock().clear();
            Settled { committed: true, ..Settled::default() }
        })
    }

    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            let failed = self.cancel_all().await;
            Settled { reported_unresolved: failed, ..Settled::aborted(why) }
        })
    }
}
