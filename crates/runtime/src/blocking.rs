//! Blocking wrappers for plain threads. Each call drives the async operation on the
//! engine's runtime; do not call them from inside an async task (they would block it).

use serde_json::Value;
use tidegate_core::Outcome;

use crate::Result;
use crate::tool::Tool;
use crate::tx::{Ack, Transaction};

impl Transaction {
    /// Blocking [`Transaction::call`].
    pub fn call_blocking(&self, tool: &Tool, args: Value) -> Result<Ack> {
        self.engine().inner.handle.block_on(self.call(tool, args))
    }

    /// Blocking [`Transaction::commit`].
    pub fn commit_blocking(&self) -> Result<Outcome> {
        self.engine().inner.handle.block_on(self.commit())
    }

    /// Blocking [`Transaction::abort`].
    pub fn abort_blocking(&self, reason: impl Into<String>) -> Result<Outcome> {
        self.engine().inner.handle.block_on(self.abort(reason))
    }
}
