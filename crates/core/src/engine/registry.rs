//! The versioned tool registry (level L4, docs/levels.md).
//!
//! Every change (a tool added, redefined or removed) bumps one registry version; the
//! version a change produced is the tool's signature from then on. Each tool keeps the list
//! of its changes, so "what did this tool look like at registry version v" is a binary
//! search. The history follows registry changes, which are rare, not transactions.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use super::Core;
use super::apply::Given;
use crate::error::EngineError;
use crate::ids::{EffectId, TxId};
use crate::ledger::Event;
use crate::scope::Scope;

/// One tool's definition as visible at some registry version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolVersion {
    /// The registry version of the change that made this definition (its signature).
    pub signature: u64,
}

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Registry {
    /// The current registry version (0: nothing ever registered).
    pub(crate) version: u64,
    /// Per tool: `(registry version of the change, present after it)`, ascending.
    pub(crate) tools: HashMap<Arc<str>, Vec<(u64, bool)>>,
}

impl Registry {
    /// The tool as visible at registry version `at`.
    pub(crate) fn at(&self, tool: &str, at: u64) -> Option<ToolVersion> {
        let h = self.tools.get(tool)?;
        let i = h.partition_point(|&(v, _)| v <= at);
        let &(v, present) = h[..i].last()?;
        present.then_some(ToolVersion { signature: v })
    }

    /// The tool as visible now.
    pub(crate) fn current(&self, tool: &str) -> Option<ToolVersion> {
        let &(v, present) = self.tools.get(tool)?.last()?;
        present.then_some(ToolVersion { signature: v })
    }

    pub(crate) fn apply(&mut self, tool: &Arc<str>, version: u64, present: bool) {
        self.version = self.version.max(version);
        self.tools.entry(tool.clone()).or_default().push((version, present));
    }
}

impl Core {
    /// Adds or redefines `tool` in the registry; returns its new signature (the registry
    /// version after the change). Transactions that pinned the earlier definition fail
    /// validation at commit under L4.
    ///
    /// Fails only with [`EngineError::Exhausted`] (the registry version at the end of its
    /// range).
    pub fn define_tool(&mut self, tool: &Arc<str>) -> Result<ToolVersion, EngineError> {
        let version = self.next_registry_version()?;
        self.emit(Event::ToolChanged { tool: tool.clone(), version, present: true }, Given::Nothing);
        Ok(ToolVersion { signature: version })
    }

    /// Records another component's opaque record ([`Event::Extension`]) in the ledger outbox,
    /// in order with the engine's own events. The state machine keeps nothing of it.
    pub fn record_extension(&mut self, stream: Arc<str>, body: Arc<serde_json::Value>) {
        self.emit(Event::Extension { stream, body }, Given::Nothing);
    }

    /// Records that a compensation of effect `effect` of the settled transaction `undoes`
    /// writes `scopes` ([`Event::Touched`]): every scope gets a fresh version, and at L2 and
    /// above the unsettled readers of an overlapping scope are doomed. Call it with `done:
    /// false` before the compensation is dispatched and with `done: true` once it ended, each
    /// time waiting for durability before going on (docs/engine.md, "A compensation advances
    /// the version"). In between, this engine refuses reads and eager effects on the scopes
    /// (`lock_conflict`, retryable), as it does for an aborting transaction's dirty marks;
    /// those marks are live state (a restart forgets them: the compensation's fate is then in
    /// doubt, and its next attempt is touched again).
    ///
    /// Refuses an empty scope list and a transaction id never issued
    /// ([`EngineError::InvalidArgument`], [`EngineError::UnknownTx`]).
    pub fn touched(
        &mut self,
        undoes: TxId,
        effect: EffectId,
        scopes: Vec<Scope>,
        done: bool,
    ) -> Result<(), EngineError> {
        if scopes.is_empty() {
            return Err(EngineError::InvalidArgument {
                field: "scopes",
                value: format!("[] (compensation of {undoes}{effect})"),
                expected: "at least one scope the compensation writes",
            });
        }
        if undoes.0 == 0 || undoes.0 >= self.next_tx {
            return Err(EngineError::UnknownTx { tx: undoes });
        }
        let scopes: SmallVec<[Scope; 2]> = SmallVec::from_vec(scopes);
        self.mark_undoing(undoes, effect, &scopes, done);
        let ev = Event::Touched { scopes: scopes.iter().map(Scope::as_arc).collect(), undoes, effect, done };
        self.emit(ev, Given::Effect(scopes));
        Ok(())
    }

    /// Removes `tool` from the registry. Returns whether it was present.
    pub fn remove_tool(&mut self, tool: &Arc<str>) -> Result<bool, EngineError> {
        if self.registry.current(tool).is_none() {
            return Ok(false);
        }
        let version = self.next_registry_version()?;
        self.emit(Event::ToolChanged { tool: tool.clone(), version, present: false }, Given::Nothing);
        Ok(true)
    }

    fn next_registry_version(&self) -> Result<u64, EngineError> {
        // Replay refuses u64::MAX, so it is never handed out.
        match self.registry.version.checked_add(1) {
            Some(v) if v < u64::MAX => Ok(v),
            _ => Err(EngineError::Exhausted { counter: "tool registry version", value: self.registry.version }),
        }
    }

    /// The current definition of `tool`, if registered.
    pub fn tool_version(&self, tool: &str) -> Option<ToolVersion> {
        self.registry.current(tool)
    }

    /// The registry version (bumped by every change).
    pub fn registry_version(&self) -> u64 {
        self.registry.version
    }
}
