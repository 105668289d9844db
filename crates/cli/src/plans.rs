//! `tidegate plans`: the plans of a running `tidegate serve`, over its HTTP API (`/v1/plans`,
//! docs/plans.md): list them, show one (steps, held compensations in unwind order, triggers
//! with their values), signal a failure, resolve a stuck plan.
//!
//! Output is for people by default and the server's JSON with `--json`. A refusal is one line
//! on standard error naming the code, the field and the value; the command exits non-zero.

use anyhow::bail;
use serde_json::{Value, json};

use crate::review::{Client, Conn};

/// Plans subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Every plan of the key's tenant (or, with `--stuck`, the owner-intervention queue).
    List {
        /// Only stuck plans, with why and the owner's choices.
        #[arg(long)]
        stuck: bool,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One plan: state, steps, held compensations in unwind order, triggers.
    Show {
        /// The plan's id (`plan_<tag>_<n>`).
        id: String,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fail a plan with a signal: the server's executor unwinds it last-in-first-out.
    Signal {
        /// The plan's id.
        id: String,
        /// Why.
        #[arg(long, default_value = "failure signal from the command line")]
        reason: String,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Resolve a stuck plan: `retry`, `accept` or `unwind`.
    Resolve {
        /// The plan's id.
        id: String,
        /// The owner's choice.
        #[arg(long, value_parser = ["retry", "accept", "unwind"])]
        choice: String,
        /// The server's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn checked(id: &str) -> anyhow::Result<&str> {
    if !id.starts_with("plan_") || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        bail!("invalid plan id `{id}`: expected a plan id such as plan_ab12cd34_7");
    }
    Ok(id)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn line(p: &Value) -> String {
    let deadline =
        p.get("deadline_ms").and_then(Value::as_u64).map(|d| format!(" deadline_ms={d}")).unwrap_or_default();
    let stuck = p.get("stuck").map(|r| format!(" stuck={}", s(r, "kind"))).unwrap_or_default();
    format!(
        "{}  {}  owner={}  steps={}  held={}{deadline}{stuck}",
        s(p, "id"),
        s(p, "state"),
        s(p, "owner"),
        p["steps"].as_array().map_or(0, Vec::len),
        p["held"].as_u64().unwrap_or(0),
    )
}

fn block(p: &Value) -> String {
    let mut out = vec![line(p)];
    if let Some(f) = p.get("failure") {
        out.push(format!("  failed: {} (cascade depth {})", f["cause"], f["depth"]));
    }
    let steps: Vec<&str> =
        p["steps"].as_array().map(|v| v.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    out.push(format!("  steps: {}", if steps.is_empty() { "(none)".into() } else { steps.join(", ") }));
    out.push("  registrations (unwind order):".into());
    for r in p["registrations"].as_array().into_iter().flatten() {
        let comp = match r.get("compensation") {
            Some(c) => format!("compensate via {}", s(c, "capability")),
            None => "non-compensable".into(),
        };
        out.push(format!(
            "    #{} {} effect {} tool {} key {}: forward {}, {} ({comp})",
            r["seq"],
            s(r, "transaction"),
            r["effect"],
            s(r, "tool"),
            s(r, "key"),
            s(r, "forward"),
            s(r, "state"),
        ));
    }
    out.push("  triggers:".into());
    for t in p["triggers"].as_array().into_iter().flatten() {
        out.push(format!("    {} = {} ({})", s(t, "kind"), s(t, "value"), t["detail"]));
    }
    out.join("\n")
}

fn print(v: &Value, json: bool, text: impl FnOnce(&Value) -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        println!("{}", text(v));
    }
    Ok(())
}

/// Runs one `tidegate plans` command.
pub fn run(conn: Conn, cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::List { stuck: false, json } => {
            let v = Client::new(conn)?.get("/v1/plans")?;
            print(&v, json, |v| {
                let lines: Vec<String> = v["plans"].as_array().into_iter().flatten().map(line).collect();
                if lines.is_empty() { "no plans".into() } else { lines.join("\n") }
            })
        }
        Cmd::List { stuck: true, json } => {
            let v = Client::new(conn)?.get("/v1/plans/stuck")?;
            print(&v, json, |v| {
                let lines: Vec<String> = v["stuck"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        format!(
                            "{}  owner={}  reason={}  choices: retry | accept | unwind",
                            s(p, "id"),
                            s(p, "owner"),
                            p["reason"]
                        )
                    })
                    .collect();
                if lines.is_empty() { "no stuck plans".into() } else { lines.join("\n") }
            })
        }
        Cmd::Show { id, json } => {
            let id = checked(&id)?;
            let v = Client::new(conn)?.get(&format!("/v1/plans/{id}"))?;
            print(&v, json, block)
        }
        Cmd::Signal { id, reason, json } => {
            let id = checked(&id)?;
            let v = Client::new(conn)?.call(
                "POST",
                &format!("/v1/plans/{id}/signal"),
                Some(&json!({"reason": reason})),
                None,
            )?;
            print(&v, json, line)
        }
        Cmd::Resolve { id, choice, json } => {
            let id = checked(&id)?;
            let v = Client::new(conn)?.call(
                "POST",
                &format!("/v1/plans/{id}/resolve"),
                Some(&json!({"choice": choice})),
                None,
            )?;
            print(&v, json, line)
        }
    }
}
