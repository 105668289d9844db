//! `stress`: the combined run (the paper's Table 3). Four agents, two contended orders
//! (cancel vs modify on each), each agent reading its order, pausing to plan (50–150 ms),
//! writing its operation and mailing the customer an irreversible confirmation, under mixed
//! or single-class faults on every call.
//!
//! An agent is clean when its outcome is consistent in the sinks: its operation is applied
//! once and its confirmation delivered once, or (its plan saw a non-pending order, or it
//! gave up) neither — and it did not give up. A run is clean when all four agents are and no
//! live write on either order was planned on a stale version.

use futures::future::join_all;
use serde_json::json;

use super::order_body;
use crate::fault::{FaultClass, FaultProfile};
use crate::mech::tcc::Wiring;
use crate::mech::tidegate::TgAblation;
use crate::mech::{TaskSpec, run_task};
use crate::report::{Plot, Report, Table, ms};
use crate::sinks::Sink;
use crate::stats::Rate;
use crate::{Env, Mode, Result};

/// The modes of Table 3.
pub fn modes() -> Vec<Mode> {
    vec![
        Mode::TX_FULL,
        Mode::TX_FCW,
        Mode::Occ,
        Mode::WorkflowLock,
        Mode::Tcc(Wiring::Full),
        Mode::MutexWal,
        Mode::Saga,
        Mode::NoTx,
        Mode::tx_ablation(TgAblation::NoStaleReadAbort),
        Mode::PerCallLock,
        Mode::CheckpointReplay,
    ]
    .into_iter()
    .chain(Mode::TX_LEVELS)
    .collect()
}

/// The fault regimes (columns).
pub fn regimes() -> Vec<(&'static str, FaultProfile)> {
    vec![
        ("mixed p=0.1", FaultProfile::mixed(0.1)),
        ("mixed p=0.3", FaultProfile::mixed(0.3)),
        ("F2-only p=0.3", FaultProfile::bernoulli(0.3, &[FaultClass::F2])),
        ("F4-only p=0.3", FaultProfile::bernoulli(0.3, &[FaultClass::F4])),
    ]
}

/// Counts of one (mode, regime) cell.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Cell {
    /// Mode.
    pub mode: String,
    /// Regime.
    pub regime: String,
    /// Runs.
    pub runs: u64,
    /// Clean runs.
    pub clean: u64,
    /// Live operations applied to an already cancelled order.
    pub violations: u64,
    /// Live writes planned on a stale version.
    pub stale: u64,
    /// Confirmations delivered for an operation that is not live.
    pub leaks: u64,
    /// Operations or confirmations present more than once.
    pub duplicates: u64,
    /// Total wait, ms.
    pub wait_ms: f64,
}

/// Runs one cell, or `None` when the mode is not in this build.
pub fn cell(env: &Env, mode: Mode, regime: &str, profile: &FaultProfile, trials: u64) -> Result<Option<Cell>> {
    if mode.supported().is_err() {
        return Ok(None);
    }
    let sinks = env.sinks()?;
    let tag: String = mode.name().chars().filter(char::is_ascii_alphanumeric).collect();
    let rtag: String = regime.chars().filter(char::is_ascii_alphanumeric).collect();
    let mut c = Cell { mode: mode.name(), regime: regime.into(), ..Cell::default() };
    for run in 0..trials {
        let ns = format!("st-{tag}-{rtag}-{run}");
        let orders = [format!("{ns}-A"), format!("{ns}-B")];
        for o in &orders {
            sinks.db.create_order(o)?;
        }
        let world = env.world(&sinks, &format!("stress-{regime}"), &mode, profile, run);
        let reports = env.trial(async {
            let mech =
                mode.build(world.clone()).map_err(|detail| crate::EvalError::Mode { mode: mode.name(), detail })?;
            let tasks: Vec<_> = (0..4)
                .map(|i| {
                    let order = orders[i / 2].clone();
                    let op = if i % 2 == 0 { "cancel" } else { "modify" };
                    let res = format!("{ns}:a{i}");
                    let spec = TaskSpec {
                        agent: format!("agent{i}"),
                        may_touch: vec![format!("retail:order:{order}"), format!("mail:{res}")],
                        ..TaskSpec::default()
                    };
                    (spec, order_body(order, op, world.uniform(50, 150), res, true))
                })
                .collect();
            let m = &*mech;
            Ok::<_, crate::EvalError>(join_all(tasks.iter().map(|(s, b)| run_task(m, s, b))).await)
        })??;
        let mut clean = true;
        for o in &orders {
            let (v, s) = (sinks.db.ops_after_cancel(o)?, sinks.db.stale_writes(o)?);
            c.violations += v;
            c.stale += s;
            clean &= v == 0 && s == 0;
        }
        for (i, r) in reports.iter().enumerate() {
            let res = format!("{ns}:a{i}");
            let op = sinks.db.order_ops_live(&format!("{res}:op"))?;
            let mail = sinks.mail.live(&format!("{res}:mail"))?;
            c.leaks += u64::from(mail > 0 && op == 0);
            c.duplicates += u64::from(op > 1 || mail > 1);
            clean &= (op == 1 && mail == 1) || (op == 0 && mail == 0 && r.committed);
            c.wait_ms += r.wait.as_secs_f64() * 1e3;
        }
        c.runs += 1;
        c.clean += u64::from(clean);
        env.tick();
    }
    Ok(Some(c))
}

/// Runs the workload.
pub fn run(env: &Env) -> Result<Report> {
    let trials = env.cfg.trials(100, 10);
    let modes = modes();
    let regimes = regimes();
    env.section("stress", modes.len() as u64 * regimes.len() as u64 * trials);
    let mut cols = vec!["Mode".to_owned()];
    cols.extend(regimes.iter().map(|(n, _)| format!("Run-clean {n}")));
    cols.extend(
        ["Inv. (mixed 0.3)", "Stale commits", "Leaks", "Duplicates", "Wait/run ms"].iter().map(|s| (*s).to_owned()),
    );
    let mut t3 = Table::new(
        "table3",
        "Table 3: combined stress (4 agents, 2 contended orders, read → plan → write → irreversible confirmation)",
        &cols.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut plot = Plot {
        id: "run_clean".into(),
        title: "Run-clean rate by fault regime (%)".into(),
        x_label: "regime".into(),
        y_label: "run-clean (%)".into(),
        categories: regimes.iter().map(|(n, _)| (*n).to_owned()).collect(),
        series: Vec::new(),
    };
    let mut cells = Vec::new();
    for mode in modes {
        let mut row = vec![mode.name()];
        let mut pts = Vec::new();
        let mut detail = None;
        for (i, (name, profile)) in regimes.iter().enumerate() {
            match cell(env, mode, name, profile, trials)? {
                Some(c) => {
                    row.push(Rate::new(c.clean, c.runs).show());
                    pts.push((i as f64, 100.0 * c.clean as f64 / c.runs.max(1) as f64));
                    if *name == "mixed p=0.3" {
                        detail = Some(c.clone());
                    }
                    cells.push(c);
                }
                None => row.push("n/a".into()),
            }
        }
        if let Some(d) = detail {
            row.extend([
                d.violations.to_string(),
                d.stale.to_string(),
                d.leaks.to_string(),
                d.duplicates.to_string(),
                ms(d.wait_ms / d.runs.max(1) as f64),
            ]);
            plot.series.push((mode.name(), pts));
        }
        t3.row(row);
    }
    t3.notes.push(format!(
        "{trials} runs per cell. Faults hit every call (and every compensation, for F3). Counts in the last five \
         columns are totals over the mixed p=0.3 runs; wait is per run (sum over its four agents). n/a: not in this \
         engine build."
    ));
    Ok(Report {
        workload: "stress".into(),
        settings: json!({"trials": trials, "seed": env.cfg.seed, "regimes": regimes.iter().map(|(n, p)| json!({"name": n, "profile": p})).collect::<Vec<_>>()}),
        tables: vec![t3],
        cells: cells.iter().map(|c| serde_json::to_value(c).unwrap_or_default()).collect(),
        plots: vec![plot],
        seconds: 0.0,
    })
}
