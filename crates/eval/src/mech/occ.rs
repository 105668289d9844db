//! OCC-Revalidate-and-Retry.
//!
//! Mechanism: a read records the version it saw. Writes to versioned database state (order
//! operations, database rows) are buffered in the attempt's write set; at commit, under one
//! commit lock, every recorded version is compared with the current one. If any moved, the
//! commit is rejected and the agent re-plans from fresh reads (up to [`ATTEMPTS`] in all);
//! otherwise the write set is applied. OCC guards only the versioned database class: calls to
//! other sinks (files, buffer, mail) go straight to the provider, and nothing is undone when
//! an attempt is rejected or aborted. Calls are retried without idempotency keys.

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;

use super::{Abort, Attempt, Mechanism, Settled, TaskSpec, retry};
use crate::sinks::SinkKind;
use crate::world::{Observed, Target, ToolSpec, World};

/// Attempts in all (the first plus re-plans).
pub const ATTEMPTS: u32 = 5;

/// OCC for one trial.
#[derive(Debug)]
pub struct Occ {
    world: Arc<World>,
    commit_lock: Arc<tokio::sync::Mutex<()>>,
}

impl Occ {
    /// Over `world`.
    pub fn new(world: Arc<World>) -> Occ {
        Occ { world, commit_lock: Arc::default() }
    }
}

struct OccAttempt {
    world: Arc<World>,
    spec: TaskSpec,
    commit_lock: Arc<tokio::sync::Mutex<()>>,
    reads: Mutex<Vec<(String, u64)>>,
    writes: Mutex<Vec<(ToolSpec, Value)>>,
    calls: Mutex<Vec<Value>>,
}

fn versioned(tool: &ToolSpec) -> bool {
    matches!(tool.target, Target::Orders | Target::Sink(SinkKind::Db))
}

impl Mechanism for Occ {
    fn begin<'a>(&'a self, spec: &'a TaskSpec, _attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>> {
        Box::pin(async move {
            Ok(Arc::new(OccAttempt {
                world: self.world.clone(),
                spec: spec.clone(),
                commit_lock: self.commit_lock.clone(),
                reads: Mutex::new(Vec::new()),
                writes: Mutex::new(Vec::new()),
                calls: Mutex::new(Vec::new()),
            }) as Arc<dyn Attempt>)
        })
    }

    fn replan(&self, abort: &Abort, attempt: u32) -> bool {
        matches!(abort, Abort::Rejected(_)) && attempt < ATTEMPTS
    }
}

impl Attempt for OccAttempt {
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>> {
        Box::pin(async move {
            let o = self.world.observe(scope)?;
            self.reads.lock().push((scope.to_owned(), o.version));
            Ok(o)
        })
    }

    fn call<'a>(&'a self, tool: &'a ToolSpec, args: Value) -> BoxFuture<'a, Result<(), Abort>> {
        Box::pin(async move {
            self.calls.lock().push(args.clone());
            if versioned(tool) {
                if args["fail"].as_bool() == Some(true) {
                    return Err(Abort::ToolFailed(format!("{} refused the request", tool.name)));
                }
                self.writes.lock().push((tool.clone(), args));
                return Ok(());
            }
            retry(|| self.world.invoke(tool, &args, None)).await?;
            Ok(())
        })
    }

    fn commit(&self) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            if let Some(reason) = self.spec.validator.as_ref().and_then(|v| v(&self.calls.lock())) {
                return Settled::aborted(Abort::Veto(reason));
            }
            let _g = self.commit_lock.lock().await;
            let reads = self.reads.lock().clone();
            for (scope, seen) in reads {
                match self.world.observe(&scope) {
                    Ok(now) if now.version == seen => {}
                    Ok(now) => {
                        return Settled {
                            rejections: 1,
                            ..Settled::aborted(Abort::Rejected(format!("{scope}: read v{seen}, now v{}", now.version)))
                        };
                    }
                    Err(e) => return Settled::aborted(e.into()),
                }
            }
            let writes = std::mem::take(&mut *self.writes.lock());
            for (tool, args) in writes {
                if let Err(e) = retry(|| self.world.invoke(&tool, &args, None)).await {
                    return Settled::aborted(e.into());
                }
            }
            Settled { committed: true, ..Settled::default() }
        })
    }

    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            self.writes.lock().clear();
            Settled::aborted(why)
        })
    }
}
