//! Mutex+WAL+Rollback (SAFEFLOW's transactional axis, without its information-flow control).
//!
//! Mechanism: strict two-phase locking over scopes: a read or a call locks its scope and the
//! lock is held until commit or abort (a lock not granted within [`LOCK_TIMEOUT`] aborts
//! the attempt, which is retried, so lock cycles cannot hang). Every call is first appended
//! to the attempt's write-ahead log; its log sequence number is the idempotency key sent to
//! the provider, so a retried call cannot duplicate. Reversible calls are applied at once and
//! rolled back from the log, in reverse, on abort. Irreversible and bufferable calls are held
//! in the log and applied only at commit: this per-tool gating predicate is the explicit
//! wiring the paper counts against the mechanism (30 lines per tool).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;
use tidegate_runtime::EffectClass;

use super::{Abort, Attempt, LockTable, Mechanism, Settled, TaskSpec, retry};
use crate::world::{Observed, ToolSpec, World};

/// How long a lock request waits before the attempt gives up and is retried.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts in all.
pub const ATTEMPTS: u32 = 5;

/// Mutex+WAL+Rollback for one trial.
#[derive(Debug)]
pub struct MutexWal {
    world: Arc<World>,
    locks: Arc<LockTable>,
}

impl MutexWal {
    /// Over `world`.
    pub fn new(world: Arc<World>) -> MutexWal {
        MutexWal { world, locks: Arc::default() }
    }
}

struct WalEntry {
    lsn: usize,
    tool: ToolSpec,
    args: Value,
    applied: bool,
}

struct WalAttempt {
    world: Arc<World>,
    spec: TaskSpec,
    attempt: u32,
    locks: Arc<LockTable>,
    held: tokio::sync::Mutex<HashMap<String, tokio::sync::OwnedMutexGuard<()>>>,
    wal: Mutex<Vec<WalEntry>>,
    wait: Mutex<Duration>,
}

impl Mechanism for MutexWal {
    fn begin<'a>(&'a self, spec: &'a TaskSpec, attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>> {
        Box::pin(async move {
            Ok(Arc::new(WalAttempt {
                world: self.world.clone(),
                spec: spec.clone(),
                attempt,
                locks: self.locks.clone(),
                held: tokio::sync::Mutex::new(HashMap::new()),
                wal: Mutex::new(Vec::new()),
                wait: Mutex::new(Duration::ZERO),
            }) as Arc<dyn Attempt>)
        })
    }

    fn replan(&self, abort: &Abort, attempt: u32) -> bool {
        matches!(abort, Abort::Rejected(_)) && attempt < ATTEMPTS
    }
}

impl WalAttempt {
    async fn lock(&self, scope: &str) -> Result<(), Abort> {
        let mut held = self.held.lock().await;
        if held.contains_key(scope) {
            return Ok(());
        }
        let (g, waited) = self
            .locks
            .lock(scope, Some(LOCK_TIMEOUT))
            .await
            .ok_or_else(|| Abort::Rejected(format!("lock on {scope} not granted in {LOCK_TIMEOUT:?}")))?;
        *self.wait.lock() += waited;
        held.insert(scope.to_owned(), g);
        Ok(())
    }

    fn key(&self, e: &WalEntry) -> String {
        format!("wal:{}:{}:{}", e.args["res"].as_str().unwrap_or_default(), self.attempt, e.lsn)
    }

    async fn release(&self, committed: bool, abort: Option<Abort>, unresolved: u32) -> Settled {
        self.held.lock().await.clear();
        let rejections = u32::from(matches!(abort, Some(Abort::Rejected(_))));
        Settled { committed, abort, wait: *self.wait.lock(), rejections, reported_unresolved: unresolved }
    }
}

fn deferred(tool: &ToolSpec) -> bool {
    matches!(tool.class, EffectClass::Gated | EffectClass::Bufferable)
}

impl Attempt for WalAttempt {
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>> {
        Box::pin(async move {
            self.lock(scope).await?;
            Ok(self.world.observe(scope)?)
        })
    }

    fn call<'a>(&'a self, tool: &'a ToolSpec, args: Value) -> BoxFuture<'a, Result<(), Abort>> {
        Box::pin(async move {
            self.lock(&tool.scope(&args)).await?;
            let entry = {
                let mut wal = self.wal.lock();
                let lsn = wal.len() + 1;
                wal.push(WalEntry { lsn, tool: tool.clone(), args: args.clone(), applied: false });
                WalEntry { lsn, tool: tool.clone(), args, applied: false }
            };
            if deferred(tool) {
                if entry.args["fail"].as_bool() == Some(true) {
                    return Err(Abort::ToolFailed(format!("{} refused the request", tool.name)));
                }
                return Ok(());
            }
            let key = self.key(&entry);
            retry(|| self.world.invoke(tool, &entry.args, Some(&key))).await?;
            if let Some(e) = self.wal.lock().iter_mut().find(|e| e.lsn == entry.lsn) {
                e.applied = true;
            }
            Ok(())
        })
    }

    fn commit(&self) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            let args: Vec<Value> = self.wal.lock().iter().map(|e| e.args.clone()).collect();
            if let Some(reason) = self.spec.validator.as_ref().and_then(|v| v(&args)) {
                return self.abort(Abort::Veto(reason)).await;
            }
            let pending: Vec<(usize, ToolSpec, Value)> = self
                .wal
                .lock()
                .iter()
                .filter(|e| !e.applied)
                .map(|e| (e.lsn, e.tool.clone(), e.args.clone()))
                .collect();
            for (i, (lsn, tool, args)) in pending.iter().enumerate() {
                let key = self.key(&WalEntry { lsn: *lsn, tool: tool.clone(), args: args.clone(), applied: false });
                if let Err(e) = retry(|| self.world.invoke(tool, args, Some(&key))).await {
                    if i == 0 {
                        return self.abort(e.into()).await;
                    }
                    // Some deferred effects already left: a partial commit, reported.
                    return self.release(true, None, (pending.len() - i) as u32).await;
                }
                if let Some(e) = self.wal.lock().iter_mut().find(|e| e.lsn == *lsn) {
                    e.applied = true;
                }
            }
            self.release(true, None, 0).await
        })
    }

    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            let applied: Vec<(ToolSpec, Value)> =
                self.wal.lock().drain(..).filter(|e| e.applied).map(|e| (e.tool, e.args)).collect();
            let failed = super::undo_reverse(&self.world, applied).await;
            self.release(false, Some(why), failed).await
        })
    }
}
