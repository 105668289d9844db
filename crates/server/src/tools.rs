//! Server tools: a [`ToolDef`] turned into a runtime [`Tool`] whose closures dispatch by
//! capability name.
//!
//! The runtime gives a tool's closures only the arguments it recorded, so a server tool's
//! recorded arguments are an *envelope* `{"args": <client args>, "key": <effect key>}`: the
//! key every dispatch of the effect carries travels with them (through the ledger, so also
//! after a restart).

use std::sync::Arc;

use serde_json::{Value, json};
use tidegate_runtime::{Compensation, EffectClass, Probe, Tool, ToolError};

use crate::dispatch::{DispatchOutcome, DispatchRequest, Dispatcher, Operation};
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

/// The key of a compensation dispatch for the effect keyed `key`.
pub fn compensation_key(key: &str) -> String {
    format!("{key}#compensate")
}

/// The envelope the engine records for a call.
pub fn envelope(args: Value, key: &str) -> Value {
    json!({"args": args, "key": key})
}

/// `(args, key)` from a recorded envelope (a value that is not one is taken as bare args).
pub fn open_envelope(env: &Value) -> (Value, String) {
    match (env.get("args"), env.get("key").and_then(Value::as_str)) {
        (Some(a), Some(k)) if env.as_object().is_some_and(|o| o.len() == 2) => (a.clone(), k.to_owned()),
        _ => (env.clone(), String::new()),
    }
}

impl ServerTool {
    /// Builds the runtime tool for `def` (validated by the caller) dispatching through `d`.
    pub fn build(name: &str, def: &ToolDef, d: &Arc<Dispatcher>) -> Result<ServerTool, (String, String, &'static str)> {
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

        let scope_templates = scopes.clone();
        let mut b = Tool::builder(name, class).scope(move |env: &Value| {
            let (args, _) = open_envelope(env);
            // Only used when the server did not pass the scopes itself (it always does).
            scope_templates
                .iter()
                .map(|t| t.render(&args).unwrap_or_else(|e| format!("invalid:{e}")))
                .collect::<Vec<_>>()
        });

        let (dc, cap, tn) = (d.clone(), def.call.clone(), tool_name.clone());
        b = b.call(move |env: Arc<Value>| {
            let (d, cap, tn) = (dc.clone(), cap.clone(), tn.clone());
            async move {
                let (args, key) = open_envelope(&env);
                let req = DispatchRequest {
                    capability: cap,
                    operation: op,
                    tool: tn.to_string(),
                    key: key.clone(),
                    effect_key: key,
                    args: Arc::new(args),
                    output: None,
                };
                match d.dispatch(req).await {
                    DispatchOutcome::Done { output, .. } => Ok(output),
                    DispatchOutcome::Failed(m) => Err(ToolError::failed(m)),
                    DispatchOutcome::Transient(m) => Err(ToolError::transient(m)),
                    DispatchOutcome::Unknown(m) => Err(ToolError::unknown(m)),
                }
            }
        });

        if let Some(cap) = def.compensate.clone() {
            let (dc, tn) = (d.clone(), tool_name.clone());
            b = b.compensate(move |env: Arc<Value>, output: Arc<Value>| {
                let (d, cap, tn) = (dc.clone(), cap.clone(), tn.clone());
                async move {
                    let (args, key) = open_envelope(&env);
                    let req = DispatchRequest {
                        capability: cap,
                        operation: Operation::Compensate,
                        tool: tn.to_string(),
                        key: compensation_key(&key),
                        effect_key: key,
                        args: Arc::new(args),
                        output: Some(output),
                    };
                    match d.dispatch(req).await {
                        DispatchOutcome::Done { residue, .. } => Ok(Compensation { residue }),
                        DispatchOutcome::Failed(m) => Err(ToolError::failed(m)),
                        DispatchOutcome::Transient(m) => Err(ToolError::transient(m)),
                        DispatchOutcome::Unknown(m) => Err(ToolError::unknown(m)),
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
            let (dc, tn) = (d.clone(), tool_name.clone());
            b = b.probe(move |env: Arc<Value>| {
                let (d, cap, tn) = (dc.clone(), cap.clone(), tn.clone());
                async move {
                    let (args, key) = open_envelope(&env);
                    let req = DispatchRequest {
                        capability: cap,
                        operation: Operation::Probe,
                        tool: tn.to_string(),
                        key: key.clone(),
                        effect_key: key,
                        args: Arc::new(args),
                        output: None,
                    };
                    match d.dispatch(req).await {
                        DispatchOutcome::Done { output, .. } => Probe::Happened(output),
                        DispatchOutcome::Failed(_) | DispatchOutcome::Transient(_) => Probe::DidNotHappen,
                        DispatchOutcome::Unknown(_) => Probe::Unknown,
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

    #[test]
    fn envelopes_round_trip_and_foreign_values_are_bare_args() {
        let env = envelope(json!({"order_id": "W1"}), "k1");
        assert_eq!(open_envelope(&env), (json!({"order_id": "W1"}), "k1".to_owned()));
        let bare = json!({"args": 1, "key": "k", "extra": true});
        assert_eq!(open_envelope(&bare).1, "");
        assert_eq!(compensation_key("k1"), "k1#compensate");
    }
}
