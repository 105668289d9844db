//! Opening an engine ([`Builder::build`]): the checks of its configuration, the background
//! runtime, the projections rebuilt from the ledger's checkpoint and the events after it, the
//! checkpoint thread's seed, and the engine's state assembled.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap as HashMap;
use tidegate_core::Core;
use tidegate_storage::{LedgerStore, MemoryStore, StoreError};
use tokio::sync::Notify;

use super::endings::Endings;
use super::{Builder, Inner, Shared, Tidegate};
use crate::checkpoint::{CheckpointPolicy, Checkpointer};
use crate::clock::TokioClock;
use crate::{Error, Result};

impl Builder {
    /// Builds the engine. Background work (aborts decided by lease expiry, late
    /// compensations) runs on the current tokio runtime; outside one, the engine starts a
    /// small runtime of its own.
    ///
    /// Refuses a zero lease (every transaction would expire at once), a retry policy with
    /// no attempt, and a backoff whose cap is below its start.
    pub fn build(mut self) -> Result<Tidegate> {
        if self.cfg.lease.is_zero() {
            return Err(Error::InvalidArgument {
                field: "lease",
                value: "0s".into(),
                expected: "a positive duration (an open transaction is aborted when its lease ends)",
            });
        }
        if self.retry.attempts == 0 {
            return Err(Error::InvalidArgument {
                field: "retry.attempts",
                value: "0".into(),
                expected: "at least 1 (the first attempt counts)",
            });
        }
        if self.retry.max_backoff < self.retry.initial_backoff {
            return Err(Error::InvalidArgument {
                field: "retry.max_backoff",
                value: format!("{:?} (initial_backoff {:?})", self.retry.max_backoff, self.retry.initial_backoff),
                expected: "a cap at least the initial backoff",
            });
        }
        self.cfg.trace = self.trace.is_some();
        let level = self.cfg.level;
        let (handle, own) = match tokio::runtime::Handle::try_current() {
            Ok(h) => (h, None),
            Err(_) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("tidegate-bg")
                    .enable_time()
                    .build()
                    .map_err(|e| Error::Store(StoreError::Io { op: "start the background runtime", source: e }))?;
                (rt.handle().clone(), Some(OwnedRuntime(Some(rt))))
            }
        };
        let clock = self.clock.unwrap_or_else(|| {
            let _guard = handle.enter();
            Arc::new(TokioClock::new())
        });
        // Only a store the caller gave is checkpointed; `never()` still allows `checkpoint_now`.
        let checkpointing = self.store.is_some();
        let automatic = self.checkpoints != CheckpointPolicy::never();
        let store: Arc<dyn LedgerStore> = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        // Rebuild the projections from whatever the ledger already holds: its checkpoint,
        // then the events after it (streamed, never all in memory at once).
        let tenant = self.tenant.unwrap_or_else(|| "default".to_owned());
        let crate::checkpoint::Opened { replay, plans: boot, report: open, stored } =
            crate::checkpoint::replay(&*store, &self.cfg, &self.scopes, &tenant)?;
        let checkpointer = if checkpointing {
            // The shadow starts from the replayed state; a tail the stored checkpoint does not
            // cover (or a plan fold it lacks) is checkpointed at once, so the next open does
            // not redo it. Without automatic checkpoints the shadow starts empty and replays
            // on demand.
            let lsn = if automatic { replay.lsn() } else { 0 };
            let store_now = automatic
                && (lsn > open.checkpoint_lsn.unwrap_or(0)
                    || (lsn > 0 && boot.is_some() && !open.plans_from_checkpoint));
            let encode_failed = |e: String| {
                Error::Store(StoreError::Io { op: "encode a checkpoint", source: std::io::Error::other(e) })
            };
            let bytes = match (lsn, stored) {
                (0, _) => None,
                (_, Some(b)) if !store_now => Some(b),
                _ => {
                    let section =
                        boot.as_ref().map(|p| p.encode()).transpose().map_err(|e| encode_failed(e.to_string()))?;
                    let sections: Vec<(&str, &[u8])> =
                        section.as_deref().map(|b| (crate::plan::SECTION, b)).into_iter().collect();
                    Some(replay.checkpoint_with(&sections).map_err(|e| encode_failed(e.to_string()))?)
                }
            };
            let seed = crate::checkpoint::Seed { lsn, bytes, store_now, tenant: tenant.clone() };
            Some(Checkpointer::start(store.clone(), self.cfg.clone(), self.scopes.clone(), self.checkpoints, seed)?)
        } else {
            None
        };
        let replay_lsn = replay.lsn();
        let (core, recovery) = if store.last_lsn() == 0 {
            (Core::with_scopes(self.cfg, self.scopes.clone()), None)
        } else {
            let (core, rec) = replay.finish(clock.now());
            (core, Some(rec))
        };
        let mut tools = HashMap::default();
        let mut names = Vec::new();
        for t in self.tools {
            match tools.get(t.name()) {
                Some(first) if !crate::Tool::same(first, &t) => {
                    return Err(crate::Error::InvalidArgument {
                        field: "tools",
                        value: t.name().to_owned(),
                        expected: "one declaration per tool name",
                    });
                }
                Some(_) => {}
                None => {
                    names.push(t.name_arc().clone());
                    tools.insert(t.name_arc().clone(), t);
                }
            }
        }
        let tg = Tidegate {
            inner: Arc::new(Inner {
                shared: Mutex::new(Shared {
                    core,
                    waiters: HashMap::default(),
                    endings: Endings::default(),
                    ctxs: HashMap::default(),
                    spare: None,
                }),
                recovery: Mutex::new(recovery),
                scopes: self.scopes,
                store,
                clock,
                retry: self.retry,
                hooks: RwLock::new(Vec::new()),
                tx_hooks: Mutex::new(HashMap::default()),
                tools: RwLock::new(tools),
                poisoned: AtomicBool::new(false),
                fence: tokio::sync::watch::Sender::new(None),
                stop: Notify::new(),
                trace: self.trace,
                task_scope: self.task_scope,
                turnstile: Notify::new(),
                turnstile_used: AtomicBool::new(false),
                level,
                waits: Default::default(),
                wait_ns: Default::default(),
                handle,
                checkpointer,
                open,
                plans: crate::plan::PlanState::new(tenant, boot.map(|b| (replay_lsn, b))),
                observers: self.observers,
                _own: own,
            }),
        };
        // Every tool is in place before this first change of the engine, which also sets off
        // the aborts of the leases that ran out while the ledger was closed.
        for name in names {
            tg.with_core(|c| {
                if c.tool_version(&name).is_none() {
                    c.define_tool(&name)?;
                }
                Ok(())
            })?;
        }
        Ok(tg)
    }
}

pub(super) struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
