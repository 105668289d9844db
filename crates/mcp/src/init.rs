//! `tidegate-mcp init`: a starter policy from an upstream's tool list.
//!
//! The starter is deliberately cautious. A tool the upstream annotates `readOnlyHint` is
//! suggested as a `read`; every other tool is `gated` (held until the turn commits), because
//! the protocol says annotations from an untrusted server are hints, and only a person who
//! knows the tool can name its compensation. Every scope is the whole upstream
//! (`mcp:<name>`), which is safe and coarse: narrow it over the tool's arguments.

use std::fmt::Write as _;

use crate::policy::{Transport, UpstreamSpec};
use crate::upstream::Upstream;

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The starter policy for `spec`.
pub async fn starter(spec: &UpstreamSpec) -> Result<String, crate::GatewayError> {
    let up = Upstream::connect(spec, std::time::Duration::from_secs(30), Default::default()).await?;
    let mut out = String::new();
    let _ = writeln!(out, "# A starter policy for upstream `{}`, written by `tidegate-mcp init`.", spec.name);
    let _ = writeln!(out, "# Tool annotations only suggested the classes below; check every entry: narrow each");
    let _ = writeln!(out, "# scope over the tool's arguments, and declare the tools you can undo `reversible`");
    let _ = writeln!(out, "# with their compensation (docs/mcp.md).");
    let _ = writeln!(out, "default = \"refuse\"\n");
    let _ = writeln!(out, "[upstreams.{}]", spec.name);
    match &spec.transport {
        Transport::Stdio { command, args, env, cwd } => {
            let _ = writeln!(out, "command = {}", toml_str(command));
            let list: Vec<String> = args.iter().map(|a| toml_str(a)).collect();
            let _ = writeln!(out, "args = [{}]", list.join(", "));
            if !env.is_empty() {
                let kv: Vec<String> = env.iter().map(|(k, v)| format!("{} = {}", toml_str(k), toml_str(v))).collect();
                let _ = writeln!(out, "env = {{ {} }}", kv.join(", "));
            }
            if let Some(c) = cwd {
                let _ = writeln!(out, "cwd = {}", toml_str(&c.display().to_string()));
            }
        }
        Transport::Http { url } => {
            let _ = writeln!(out, "url = {}", toml_str(url));
        }
    }
    for t in &up.tools {
        let read_only = t.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true);
        let destructive = t.annotations.as_ref().and_then(|a| a.destructive_hint);
        let _ = writeln!(out, "\n[[tools]]");
        let _ = writeln!(out, "upstream = {}", toml_str(&spec.name));
        let _ = writeln!(out, "match = {}", toml_str(&t.name));
        if read_only {
            let _ = writeln!(out, "class = \"read\"            # annotated readOnlyHint");
        } else {
            let why = match destructive {
                Some(false) => "annotated destructiveHint = false: if it can be undone, declare it reversible",
                _ => "held until commit until you know better",
            };
            let _ = writeln!(out, "class = \"gated\"           # {why}");
        }
        let _ = writeln!(out, "scopes = [{}]", toml_str(&format!("mcp:{}", spec.name)));
    }
    up.close().await;
    Ok(out)
}
