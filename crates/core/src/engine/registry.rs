//! The versioned tool registry (level L4, docs/levels.md).
//!
//! Every change (a tool added, redefined or removed) bumps one registry version; the
//! version a change produced is the tool's signature from then on. Each tool keeps the list
//! of its changes, so "what did this tool look like at registry version v" is a binary
//! search. The history follows registry changes, which are rare, not transactions.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::Core;
use super::apply::Given;
use crate::error::EngineError;
use crate::ledger::Event;

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
