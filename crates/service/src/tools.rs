//! Server tools: a [`ToolDef`] turned into a runtime [`Tool`] whose handlers dispatch by
//! capability name.
//!
//! The engine records a call's arguments as the client sent them and its key once: a key the
//! client gave (or the tool's key template rendered) is an adapter key; otherwise the engine
//! derives one from the effect's number. A handler gets the call's [`CallCtx`] and renders
//! the key every dispatch of the effect carries ([`effect_key`]): the adapter key, else
//! `<tx id>:<tool>:<effect number>`, the same before and after a restart because the number
//! is the ledger's. The tool has no scope extractor: the server always passes the scopes its
//! templates render.
//!
//! Ledgers written before this version recorded `{"args": <client args>, "key": <effect key>}`
//! with the key as an adapter key ([`legacy_envelope`] reads them back).

use std::sync::Arc;

use serde_json::Value;
use tidegate_runtime::{CallCtx, Compensation, EffectClass, Probe, Tool, ToolError};

use crate::dispatch::{CallOutcome, DispatchKey, DispatchRequest, Dispatcher, Operation};
use crate::registry::{Template, ToolDef};

/// A registered server tool.
#[derive(Debug, Clone)]
pub struct ServerTool {
    /// Its name.
    pub name: String,
    /// Its definition.
    pub def: ToolDef,
    /// The runtime tool registered with the tenant's engine.
    pub tool: Tool,
    scopes: Vec<Template>,
    key: Option<Template>,
}

/// The key the dispatches of an effect carry: its adapter key if it has one, else
/// `<tx id>:<tool>:<effect number>` (the tenant's public transaction id).
pub fn effect_key(tag: &str, tool: &str, ctx: &CallCtx) -> String {
    match &ctx.key {
        Some(k) => k.to_string(),
        None => derived_key(tag, ctx.tx, tool, ctx.effect.0),
    }
}

pub use crate::ids::{client_args, derived_key, legacy_envelope};

/// What a handler dispatches for one call: the client's arguments and the effect key.
fn call_parts(tag: &str, tool: &str, ctx: &CallCtx, recorded: &Value) -> (Value, String) {
    (client_args(recorded, ctx.key.as_deref()), effect_key(tag, tool, ctx))
}

/// The handler's error for a dispatch that did not end `Done`.
fn tool_error(o: CallOutcome) -> ToolError {
    match o {
        CallOutcome::Done { .. } => ToolError::unknown("a dispatch that succeeded was read as a failure"),
        CallOutcome::NotApplied { message, retry: false } => ToolError::failed(message),
        CallOutcome::NotApplied { message, retry: true } => ToolError::transient(message),
        CallOutcome::Unknown { message } => ToolError::unknown(message),
    }
}

impl ServerTool {
    /// Builds the runtime tool for `def` (validated by the caller) of the tenant tagged `tag`,
    /// dispatching through `d`.
    pub fn build(
        name: &str,
        def: &ToolDef,
        d: &Arc<Dispatcher>,
        tag: &str,
    ) -> Result<ServerTool, (String, String, &'static str)> {
        def.validate()?;
        let scopes: Vec<Template> = def
            .scopes
            .iter()
            .map(|s| Template::parse(s))
            .collect::<Result<_, _>>()
            .map_err(|e| ("scopes".into(), String::new(), e))?;
        let key = def.key.as_deref().map(Template::parse).transpose().map_err(|e| ("key".into(), String::new(), e))?;
        let class: EffectClass = def.class.into();
        let op = if class.executes_eagerly() { Operation::Call } else { Operation::Release };
        let tool_name: Arc<str> = Arc::from(name);
        let tag: Arc<str> = Arc::from(tag);

        let mut b = Tool::builder(name, class);
        let (dc, cap, tn, tg) = (d.clone(), def.call.clone(), tool_name.clone(), tag.clone());
        b = b.call_ctx(move |ctx: CallCtx, recorded: Arc<Value>| {
            let (d, cap, tn) = (dc.clone(), cap.clone(), tn.clone());
            let (args, key) = call_parts(&tg, &tn, &ctx, &recorded);
            async move {
                let req = DispatchRequest {
                    capability: cap,
                    operation: op,
                    tool: tn.to_string(),
                    key: DispatchKey::effect(key),
                    args: Arc::new(args),
                    output: None,
                };
                match d.dispatch(req).await {
                    CallOutcome::Done { output, .. } => Ok(Arc::unwrap_or_clone(output)),
                    other => Err(tool_error(other)),
                }
            }
        });

        if let Some(cap) = def.compensate.clone() {
            let (dc, tn, tg) = (d.clone(), tool_name.clone(), tag.clone());
            b = b.compensate_ctx(move |ctx: CallCtx, recorded: Arc<Value>, output: Arc<Value>| {
                let (d, cap, tn) = (dc.clone(), cap.clone(), tn.clone());
                let (args, key) = call_parts(&tg, &tn, &ctx, &recorded);
                async move {
                    let req = DispatchRequest {
                        capability: cap,
                        operation: Operation::Compensate,
                        tool: tn.to_string(),
                        key: DispatchKey::compensation(key),
                        args: Arc::new(args),
                        output: Some(output),
                    };
                    match d.dispatch(req).await {
                        CallOutcome::Done { residue, .. } => Ok(Compensation { residue }),
                        other => Err(tool_error(other)),
                    }
                }
            });
        }

        if def.compensate.is_none() {
            // A tool definition may leave a reversible effect without an undo capability:
            // aborted effects are then tagged `unresolved` for an operator.
            b = b.without_compensation();
        }

        if let Some(cap) = def.probe.clone() {
            let (dc, tn, tg) = (d.clone(), tool_name.clone(), tag.clone());
            b = b.probe_ctx(move |ctx: CallCtx, recorded: Arc<Value>| {
                let (d, cap, tn) = (dc.clone(), cap.clone(), tn.clone());
                let (args, key) = call_parts(&tg, &tn, &ctx, &recorded);
                async move {
                    let req = DispatchRequest {
                        capability: cap,
                        operation: Operation::Probe,
                        tool: tn.to_string(),
                        key: DispatchKey::effect(key),
                        args: Arc::new(args),
                        output: None,
                    };
                    match d.dispatch(req).await {
                        CallOutcome::Done { output, .. } => Probe::Happened(Arc::unwrap_or_clone(output)),
                        CallOutcome::NotApplied { .. } => Probe::DidNotHappen,
                        CallOutcome::Unknown { .. } => Probe::Unknown,
                    }
                }
            });
        }

        let tool = b.build().map_err(|e| ("name".to_owned(), name.to_owned(), leak_expected(&e)))?;
        Ok(ServerTool { name: name.to_owned(), def: def.clone(), tool, scopes, key })
    }

    /// The scopes of a call with `args` (`Err((field, message))` naming the template).
    pub fn scopes(&self, args: &Value) -> Result<Vec<String>, (String, String)> {
        self.scopes
            .iter()
            .enumerate()
            .map(|(i, t)| t.render(args).map_err(|e| (format!("scopes[{i}] of tool `{}`", self.name), e)))
            .collect()
    }

    /// The key template's value for `args`, if the tool has one.
    pub fn key(&self, args: &Value) -> Option<Result<String, (String, String)>> {
        self.key.as_ref().map(|t| t.render(args).map_err(|e| (format!("key template of tool `{}`", self.name), e)))
    }
}

fn leak_expected(_e: &tidegate_runtime::Error) -> &'static str {
    "a complete tool declaration"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_legacy_envelope_is_read_only_with_its_own_key() {
        let env = json!({"args": {"order_id": "W1"}, "key": "k1"});
        assert_eq!(client_args(&env, Some("k1")), json!({"order_id": "W1"}));
        // A client value of that shape is the client's own arguments unless it repeats the
        // effect's recorded key.
        assert_eq!(client_args(&env, Some("k2")), env);
        assert_eq!(client_args(&env, None), env);
        let extra = json!({"args": 1, "key": "k1", "extra": true});
        assert_eq!(client_args(&extra, Some("k1")), extra);
    }

    #[test]
    fn a_derived_key_names_the_effect_by_its_number() {
        let ctx = CallCtx::bare(tidegate_runtime::TxId(7), tidegate_runtime::EffectId(2));
        assert_eq!(effect_key("ab12cd34", "book", &ctx), "tx_ab12cd34_7:book:2");
        let mut keyed = ctx.clone();
        keyed.key = Some(Arc::from("order-9"));
        assert_eq!(effect_key("ab12cd34", "book", &keyed), "order-9");
    }
}
