//! Test support: a provider that records every externalised call, with failure injection.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_runtime::{Compensation, EffectClass, Tool, ToolError};

/// One thing that reached the outside world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub tool: String,
    pub what: &'static str,
    pub args: String,
}

/// The outside world, as seen by the tests.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub log: Arc<Mutex<Vec<Hit>>>,
    fail_call: Arc<Mutex<HashMap<String, u32>>>,
    fail_comp: Arc<Mutex<HashMap<String, u32>>>,
    delay: Arc<Mutex<HashMap<String, Duration>>>,
}

impl World {
    pub fn new() -> World {
        World::default()
    }

    /// The next `n` calls of `tool` fail (known not to have happened; not retryable).
    pub fn fail_calls(&self, tool: &str, n: u32) {
        self.fail_call.lock().insert(tool.to_owned(), n);
    }

    /// The next `n` compensations of `tool` fail.
    pub fn fail_compensations(&self, tool: &str, n: u32) {
        self.fail_comp.lock().insert(tool.to_owned(), n);
    }

    pub fn delay(&self, tool: &str, d: Duration) {
        self.delay.lock().insert(tool.to_owned(), d);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.log.lock().clone()
    }

    pub fn names(&self) -> Vec<String> {
        self.log.lock().iter().map(|h| format!("{}:{}", h.what, h.tool)).collect()
    }

    pub fn count(&self, tool: &str, what: &str) -> usize {
        self.log.lock().iter().filter(|h| h.tool == tool && h.what == what).count()
    }

    fn take_failure(map: &Mutex<HashMap<String, u32>>, tool: &str) -> bool {
        let mut m = map.lock();
        match m.get_mut(tool) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// A tool of `class` on scope `{prefix}:{args.id}` that records into this world.
    pub fn tool(&self, name: &str, class: EffectClass, prefix: &str) -> Tool {
        self.tool_with(name, class, prefix, true, None)
    }

    pub fn tool_with(
        &self,
        name: &str,
        class: EffectClass,
        prefix: &str,
        compensable: bool,
        residue: Option<&str>,
    ) -> Tool {
        let prefix = prefix.to_owned();
        let (w1, w2) = (self.clone(), self.clone());
        let (n1, n2) = (name.to_owned(), name.to_owned());
        let residue = residue.map(str::to_owned);
        let what = if class.executes_eagerly() {
            "exec"
        } else if class == EffectClass::Bufferable {
            "apply"
        } else {
            "fire"
        };
        let b = Tool::builder(name, class)
            .scope(move |a: &Value| format!("{prefix}:{}", a["id"].as_str().unwrap_or("none")))
            .call(move |a| {
                let w = w1.clone();
                let n = n1.clone();
                async move {
                    let d = w.delay.lock().get(&n).copied();
                    if let Some(d) = d {
                        tokio::time::sleep(d).await;
                    }
                    if World::take_failure(&w.fail_call, &n) {
                        return Err(ToolError::failed(format!("{n} is down")));
                    }
                    w.log.lock().push(Hit { tool: n.clone(), what, args: a.to_string() });
                    Ok(json!({"ok": n, "args": *a}))
                }
            });
        let b = if !compensable {
            b.without_compensation()
        } else {
            b.compensate(move |a, _out| {
                let w = w2.clone();
                let n = n2.clone();
                let residue = residue.clone();
                async move {
                    if World::take_failure(&w.fail_comp, &n) {
                        return Err(ToolError::failed(format!("cancel of {n} refused")));
                    }
                    w.log.lock().push(Hit { tool: n.clone(), what: "compensate", args: a.to_string() });
                    Ok(Compensation { residue })
                }
            })
        };
        b.build().expect("complete tool")
    }
}
