//! `annotations`: adapter mistakes (the paper's Table 21) and scope aliasing (Table 20).
//!
//! Table 21 runs Tidegate with one wrong declaration at a time (see
//! [`Annotation`]). Each trial has three parts: two agents cancel and modify one order
//! (invariant violations); a workflow reserves stock, mails the customer and then fails
//! (leaked sends, and reversible residue left in the sinks, and whether the engine flagged
//! it); two agents on two *different* orders (wait: what an over-broad scope costs).
//!
//! Table 20 asks, for pairs of scope texts that should or should not conflict, whether each
//! strategy makes the second transaction wait for the first. The canonical strategy is the
//! engine itself, measured by running the two transactions; the others are the string
//! comparisons they are named after.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use super::{CHARGE_FILE, RESERVE_ROW, SEND_MAIL, order_body};
use crate::fault::FaultProfile;
use crate::mech::tidegate::Annotation;
use crate::mech::{Abort, Attempt, Body, TaskSpec, run_task};
use crate::report::{Report, Table, ms};
use crate::sinks::Sink;
use crate::stats::Rate;
use crate::{Env, Mode, Result};

fn failing_workflow(res: String) -> Body {
    Arc::new(move |a: Arc<dyn Attempt>, attempt| {
        let res = res.clone();
        Box::pin(async move {
            a.call(&RESERVE_ROW, json!({"res": format!("{res}:stock")})).await?;
            a.call(&SEND_MAIL, json!({"res": format!("{res}:mail")})).await?;
            a.call(&CHARGE_FILE, json!({"res": format!("{res}:charge-{attempt}"), "fail": true})).await?;
            Ok::<(), Abort>(())
        })
    })
}

/// Counts of one configuration.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Cell {
    /// Configuration.
    pub config: String,
    /// Trials.
    pub trials: u64,
    /// Invariant violations (live stale writes on the contended order).
    pub violations: u64,
    /// Leaked irreversible sends.
    pub leaks: u64,
    /// Trials leaving a reversible effect in its sink after the abort.
    pub residue: u64,
    /// Of those, trials where the engine reported unresolved effects.
    pub alerted: u64,
    /// Wait per task on disjoint orders, ms.
    pub disjoint_wait_ms: f64,
}

/// Runs one configuration.
pub fn cell(env: &Env, ann: Annotation, label: &str, trials: u64) -> Result<Cell> {
    let mode = Mode::tx_annotation(ann);
    let sinks = env.sinks()?;
    let tag: String = label.chars().filter(char::is_ascii_alphanumeric).collect();
    let mut c = Cell { config: label.into(), trials, ..Cell::default() };
    let mut disjoint_wait = 0.0;
    for run in 0..trials {
        let ns = format!("an-{tag}-{run}");
        let shared = format!("{ns}-W");
        let (d0, d1) = (format!("{ns}-D0"), format!("{ns}-D1"));
        for o in [&shared, &d0, &d1] {
            sinks.db.create_order(o)?;
        }
        let world = env.world(&sinks, "annotations", &mode, &FaultProfile::none(), run);
        let (fail_report, waits) = env.trial(async {
            let mech =
                mode.build(world.clone()).map_err(|detail| crate::EvalError::Mode { mode: mode.name(), detail })?;
            let m = &*mech;
            let spec = |agent: &str, order: &str| TaskSpec {
                agent: agent.into(),
                may_touch: vec![format!("retail:order:{order}")],
                ..TaskSpec::default()
            };
            let overlap = [
                (
                    spec("a0", &shared),
                    order_body(shared.clone(), "cancel", world.uniform(50, 150), format!("{ns}:a0"), false),
                ),
                (
                    spec("a1", &shared),
                    order_body(shared.clone(), "modify", world.uniform(50, 150), format!("{ns}:a1"), false),
                ),
            ];
            join_all(overlap.iter().map(|(s, b)| run_task(m, s, b))).await;
            let fail = run_task(
                m,
                &TaskSpec { agent: "f".into(), ..TaskSpec::default() },
                &failing_workflow(format!("{ns}:f")),
            )
            .await;
            let disjoint = [
                (spec("d0", &d0), order_body(d0.clone(), "modify", 100, format!("{ns}:d0"), false)),
                (spec("d1", &d1), order_body(d1.clone(), "modify", 50, format!("{ns}:d1"), false)),
            ];
            let reports = join_all(disjoint.iter().map(|(s, b)| run_task(m, s, b))).await;
            let waits: f64 = reports.iter().map(|r| r.wait.as_secs_f64() * 1e3).sum();
            Ok::<_, crate::EvalError>((fail, waits))
        })??;
        c.violations += sinks.db.stale_writes(&shared)?;
        c.leaks += u64::from(sinks.mail.live(&format!("{ns}:f:mail"))? > 0);
        let left = sinks.db.live(&format!("{ns}:f:stock"))? > 0;
        c.residue += u64::from(left);
        c.alerted += u64::from(left && fail_report.reported_unresolved > 0);
        disjoint_wait += waits / 2.0;
        env.tick();
    }
    c.disjoint_wait_ms = disjoint_wait / trials.max(1) as f64;
    Ok(c)
}

/// A scope comparison: whether `b` must wait for `a` (`None`: refused).
type Strategy = dyn Fn(&str, &str) -> Option<bool>;

/// The aliasing suite: (a, b, should conflict).
pub const ALIASES: &[(&str, &str, bool)] = &[
    ("fs:/repo/src/app.py", "fs:/repo/src/app.py", true),
    ("fs:/repo/src/./app.py", "fs:/repo/src/app.py", true),
    ("fs:/repo/lib/../src/app.py", "fs:/repo/src/app.py", true),
    ("fs://repo//src/app.py", "fs:/repo/src/app.py", true),
    ("fs:/repo/src/", "fs:/repo/src/app.py", true),
    ("fs:/repo", "fs:/repo/src/app.py", true),
    ("fs:/repo/src/app.py/", "fs:/repo/src/app.py", true),
    ("fs:/a/b/c", "fs:/a/./b/c/", true),
    ("mail:Alice@Example.com", "mail:alice@example.com", true),
    ("mail:bob@x.io", "MAIL:bob@x.io", true),
    ("db:tpcc:stock", "db:tpcc:stock:w=1:i=42", true),
    ("DB:tpcc:Stock:w=1", "db:tpcc:stock:w=1", true),
    ("db:tpcc:stock:w=1:i=42:s_quantity", "db:tpcc:stock:w=1:i=42", true),
    ("retail:order:W123", "retail:order:W123:lines", true),
    ("retail:order", "retail:order:W9", true),
    ("retail:order:W1", "retail:order:W1", true),
    ("kv:note:n1", "kv:note:n1", true),
    ("kv:note", "kv:note:n1", true),
    ("web:site:page", "web:site:page:button", true),
    ("travel:hotel:H1", "travel:hotel:H1:room:2", true),
    ("fs:/repo/src/app.py", "fs:/repo/src/app.pyc", false),
    ("fs:/repo/src", "fs:/repo/srcx", false),
    ("retail:order:W1", "retail:order:W12", false),
    ("retail:order:W1", "travel:order:W1", false),
    ("kv:note:n1", "kv:note:n2", false),
    ("mail:alice@example.com", "mail:alice@example.co", false),
    ("db:tpcc:stock:w=1", "db:tpcc:stock:w=2", false),
    ("fs:/a/b", "fs:/a/c", false),
    ("web:site:page1", "web:site:page2", false),
    ("retail:order:W1", "retail:order:w1", false),
];

/// Whether the engine makes a transaction on `b` wait for an open earlier one on `a`.
/// `None`: the engine refused one of the scopes.
pub async fn engine_conflicts(a: &str, b: &str) -> Option<bool> {
    let tg = tidegate_runtime::Tidegate::in_memory().ok()?;
    let first = tg.begin_with(tidegate_runtime::TxOptions::agent("first").may_touch([a])).ok()?;
    let second = tg.begin_with(tidegate_runtime::TxOptions::agent("second").may_touch([b])).ok()?;
    second.read(b).ok()?;
    second.seal().ok()?;
    let r = second.commit_with(tidegate_runtime::CommitOptions { wait_timeout: Some(Duration::from_millis(1)) }).await;
    let _ = first.abort("done").await;
    Some(r.is_err())
}

fn canonical(a: &str) -> Option<String> {
    tidegate_runtime::ScopeRegistry::default().parse(a).ok().map(|s| s.to_string())
}

/// Runs the workload.
pub fn run(env: &Env) -> Result<Report> {
    let trials = env.cfg.trials(200, 20);
    let configs = [
        (Annotation::Correct, "Tx-Full (control)"),
        (Annotation::OverBroadScope, "E10-OB Over-broad scope"),
        (Annotation::TooNarrowScope, "E10-TN Too-narrow scope"),
        (Annotation::WrongEffectClass, "E10-WC Wrong effect class"),
        (Annotation::MissingCompensation, "E10-NC Missing compensation"),
    ];
    env.section("annotations", configs.len() as u64 * trials);
    let mut t21 = Table::new(
        "table21",
        "Table 21: adapter annotation errors (Tidegate, one wrong declaration at a time)",
        &[
            "Configuration",
            "Inv.",
            "Leaked irrev.",
            "Residue left",
            "Flagged by engine",
            "Disjoint wait/task ms",
            "Failure mode",
        ],
    );
    let mut cells = Vec::new();
    for (ann, label) in configs {
        let c = cell(env, ann, label, trials)?;
        let open = c.violations > 0 || c.leaks > 0 || c.residue > 0;
        let mode = match (open, c.residue > 0 && c.alerted == c.residue) {
            (false, _) if c.disjoint_wait_ms > 0.0 => "failure-closed (costs concurrency)",
            (false, _) => "none",
            (true, true) => "failure-open with alert",
            (true, false) => "failure-open",
        };
        t21.row(vec![
            label.into(),
            format!("{}/{trials}", c.violations),
            Rate::new(c.leaks, trials).show(),
            Rate::new(c.residue, trials).show(),
            format!("{}/{}", c.alerted, c.residue),
            ms(c.disjoint_wait_ms),
            mode.into(),
        ]);
        cells.push(serde_json::to_value(&c).unwrap_or_default());
    }
    t21.notes.push(format!(
        "{trials} trials per configuration. Inv.: live writes on the contended order planned on a stale version. \
         Leaked irrev.: sends of a workflow that failed after its send. Residue: its reversible stock row still present."
    ));

    let mut t20 = Table::new(
        "table20",
        "Table 20: scope canonicalisation and aliasing",
        &[
            "Scope strategy",
            "Should-conflict cases",
            "Missed conflicts (false neg.)",
            "False conflicts (false pos.)",
            "Refused",
        ],
    );
    let should = ALIASES.iter().filter(|c| c.2).count();
    let strategies: [(&str, Box<Strategy>); 3] = [
        ("Naive string equality", Box::new(|a, b| Some(a == b))),
        ("Coarse-Global", Box::new(|_, _| Some(true))),
        ("Canonical, no overlap (exact match)", Box::new(|a, b| Some(canonical(a)? == canonical(b)?))),
    ];
    let engine: Vec<Option<bool>> =
        env.trial(async { join_all(ALIASES.iter().map(|(a, b, _)| engine_conflicts(a, b))).await })?;
    let mut tally = |name: &str, answers: Vec<Option<bool>>| {
        let (mut missed, mut false_pos, mut refused) = (0, 0, 0);
        for ((_, _, want), got) in ALIASES.iter().zip(&answers) {
            match got {
                None => refused += 1,
                Some(g) if *want && !g => missed += 1,
                Some(g) if !*want && *g => false_pos += 1,
                _ => {}
            }
        }
        t20.row(vec![name.into(), should.to_string(), missed.to_string(), false_pos.to_string(), refused.to_string()]);
        cells.push(
            json!({"table": 20, "strategy": name, "missed": missed, "false_conflicts": false_pos, "refused": refused}),
        );
    };
    tally("Tidegate canonical (engine, measured)", engine);
    for (name, f) in &strategies {
        tally(name, ALIASES.iter().map(|(a, b, _)| f(a, b)).collect());
    }
    t20.notes.push(format!(
        "{} pairs: {should} should conflict, {} should not. The engine row runs two transactions per pair and records \
         whether the second one's commit had to wait for the first.",
        ALIASES.len(),
        ALIASES.len() - should
    ));
    Ok(Report {
        workload: "annotations".into(),
        settings: json!({"trials": trials, "seed": env.cfg.seed}),
        tables: vec![t21, t20],
        cells,
        plots: Vec::new(),
        seconds: 0.0,
    })
}
