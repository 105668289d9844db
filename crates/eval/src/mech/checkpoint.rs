//! Checkpoint-Replay (LangGraph-checkpointer style).
//!
//! Mechanism: before the body runs, the agent's state is checkpointed (here: the body starts
//! from its beginning with the same inputs). Calls go straight to the provider, once, with no
//! idempotency key. When a call fails or the task times out, the agent's state is restored
//! from the checkpoint and the body is replayed, up to [`REPLAYS`] times: every call made
//! before the failure is made again. The checkpoint holds the agent's memory, not the world,
//! so nothing that reached a provider is undone, on replay or on abort (a veto, a lost
//! branch or a stale plan simply abandons the run).

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;

use super::{Abort, Attempt, Mechanism, Settled, TaskSpec};
use crate::world::{Observed, ToolSpec, World};

/// Replays after the first run.
pub const REPLAYS: u32 = 3;

/// Checkpoint-Replay for one trial.
#[derive(Debug)]
pub struct CheckpointReplay {
    world: Arc<World>,
}

impl CheckpointReplay {
    /// Over `world`.
    pub fn new(world: Arc<World>) -> CheckpointReplay {
        CheckpointReplay { world }
    }
}

struct Run {
    world: Arc<World>,
    spec: TaskSpec,
    calls: Mutex<Vec<Value>>,
}

impl Mechanism for CheckpointReplay {
    fn begin<'a>(&'a self, spec: &'a TaskSpec, _attempt: u32) -> BoxFuture<'a, Result<Arc<dyn Attempt>, Abort>> {
        Box::pin(async move {
            Ok(Arc::new(Run { world: self.world.clone(), spec: spec.clone(), calls: Mutex::new(Vec::new()) })
                as Arc<dyn Attempt>)
        })
    }

    fn replan(&self, abort: &Abort, attempt: u32) -> bool {
        matches!(abort, Abort::ToolFailed(_) | Abort::Timeout) && attempt <= REPLAYS
    }
}

impl Attempt for Run {
    fn read<'a>(&'a self, scope: &'a str) -> BoxFuture<'a, Result<Observed, Abort>> {
        Box::pin(async move { Ok(self.world.observe(scope)?) })
    }

    fn call<'a>(&'a self, tool: &'a ToolSpec, args: Value) -> BoxFuture<'a, Result<(), Abort>> {
        Box::pin(async move {
            self.calls.lock().push(args.clone());
            Ok(self.world.invoke(tool, &args, None)?)
        })
    }

    fn commit(&self) -> BoxFuture<'_, Settled> {
        Box::pin(async move {
            match self.spec.validator.as_ref().and_then(|v| v(&self.calls.lock())) {
                Some(reason) => Settled::aborted(Abort::Veto(reason)),
                None => Settled { committed: true, ..Settled::default() },
            }
        })
    }

    fn abort(&self, why: Abort) -> BoxFuture<'_, Settled> {
        Box::pin(async move { Settled::aborted(why) })
    }
}
