//! The engine's side of tool calls: the tool registry (a versioned engine state with its own
//! ledger event), the contexts a call's handlers get, and the wake-up of L3's issuance-order
//! turnstile.

use std::sync::Arc;
use std::sync::atomic::Ordering as AtomicOrdering;

use tidegate_core::TxId;

use super::Tidegate;
use crate::tool::{CallCtx, Tool};
use crate::{Error, Result};

impl Tidegate {
    /// Registers a tool so that the engine can release and compensate its effects (tools
    /// are also registered on first use). A tool is identified by its name and declaration
    /// (class, which handlers it has, [`crate::ToolBuilder::version`]): registering another
    /// build of the same declaration is a no-op that keeps the first build's handlers; a
    /// different declaration under a taken name is refused, saying what differs (use
    /// [`Tidegate::redefine_tool`] to change one). A tool's first registration is a change
    /// of the versioned registry (docs/levels.md, L4).
    pub fn register(&self, tool: &Tool) -> Result<()> {
        if let Some(t) = self.inner.tools.read().get(tool.name()) {
            return if t.same(tool) { Ok(()) } else { Err(name_taken(t, tool)) };
        }
        let mut tools = self.inner.tools.write();
        match tools.get(tool.name()) {
            Some(t) if !t.same(tool) => Err(name_taken(t, tool)),
            Some(_) => Ok(()),
            None => {
                tools.insert(tool.name_arc().clone(), tool.clone());
                let name = tool.name_arc().clone();
                // After a restart the registry already knows the tool from the ledger.
                self.with_core(|c| {
                    if c.tool_version(&name).is_none() {
                        c.define_tool(&name)?;
                    }
                    Ok(())
                })?;
                Ok(())
            }
        }
    }

    /// Replaces the definition registered under `tool`'s name (or adds it): a new version of
    /// the tool registry. Under L4, transactions that read before the change and use the tool
    /// abort at commit (`phantom_tool`); below L4 they commit with the new definition.
    pub fn redefine_tool(&self, tool: &Tool) -> Result<()> {
        let mut tools = self.inner.tools.write();
        tools.insert(tool.name_arc().clone(), tool.clone());
        let name = tool.name_arc().clone();
        self.with_core(|c| c.define_tool(&name))?;
        Ok(())
    }

    /// Removes `name` from the tool registry. Effects already recorded still settle (the
    /// engine keeps the implementation to release or compensate them); under L4 their
    /// transactions abort at commit. Returns whether the tool was registered.
    pub fn remove_tool(&self, name: &str) -> Result<bool> {
        let name: Arc<str> = Arc::from(name);
        Ok(self.with_core(|c| c.remove_tool(&name))?.0)
    }

    /// The current registry signature of `name` (the registry version that defined it), or
    /// `None` if it is not registered.
    pub fn tool_signature(&self, name: &str) -> Option<u64> {
        self.inner.shared.lock().core.tool_version(name).map(|v| v.signature)
    }

    pub(crate) fn tool(&self, name: &str) -> Result<Tool> {
        self.inner.tools.read().get(name).cloned().ok_or_else(|| Error::UnknownTool {
            name: name.to_owned(),
            detail: "; register it before recovering or settling its effects".to_owned(),
        })
    }

    /// Wakes L3 turnstile waiters after an eager call returned (only when one ever waited).
    pub(crate) fn notify_turnstile(&self) {
        if self.inner.turnstile_used.load(AtomicOrdering::SeqCst) {
            self.inner.turnstile.notify_waiters();
        }
    }

    /// Keeps `ctx` for the handlers of its effect until its transaction settles.
    pub(crate) fn keep_ctx(&self, ctx: CallCtx) {
        self.inner.shared.lock().ctxs.entry(ctx.tx).or_default().push(ctx);
    }

    /// The context for a handler of `tool` serving effect `effect` of `tx`: the one kept
    /// from the call, else one rebuilt from the ledger's record (nothing kept: the call ran
    /// in an earlier process, or the tool takes no context).
    pub(crate) fn call_ctx(&self, tool: &Tool, tx: TxId, effect: tidegate_core::EffectId) -> CallCtx {
        let shared = self.inner.shared.lock();
        if tool.wants_ctx()
            && let Some(c) = shared.ctxs.get(&tx).and_then(|v| v.iter().find(|c| c.effect == effect))
        {
            return c.clone();
        }
        CallCtx { key: shared.core.adapter_key(tx, effect), ..CallCtx::bare(tx, effect) }
    }

    /// The context recovery gives a handler of effect `effect` of `tx`: what the ledger
    /// recorded of the call (its adapter key), no handle.
    pub(crate) fn recovered_ctx(&self, tx: TxId, effect: tidegate_core::EffectId) -> CallCtx {
        CallCtx { key: self.inner.shared.lock().core.adapter_key(tx, effect), ..CallCtx::bare(tx, effect) }
    }
}

fn name_taken(registered: &Tool, tool: &Tool) -> Error {
    Error::InvalidArgument {
        field: "tool name",
        value: format!(
            "{:?}, already registered with another declaration ({}: registered vs this one)",
            tool.name(),
            registered.differences(tool)
        ),
        expected: "a name not registered to a different declaration on this engine (building the same \
                   declaration again is fine; use `redefine_tool` to replace one)",
    }
}
