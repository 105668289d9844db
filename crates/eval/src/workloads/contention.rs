//! `contention`: cancel-vs-modify on one order, disjoint orders, and wait scaling
//! (the paper's Table 1 and Table 10).
//!
//! Each agent reads its order, pauses to plan (50–150 ms, seeded), and if the order is still
//! pending applies its intent (even agents cancel, odd agents modify) planned on the version
//! it read. All agents start together. The orders table records, for every applied
//! operation, whether the version it was planned on was still current: a live operation
//! planned on a stale version is an invariant violation (a lost update: a committed
//! read-then-write another committed write had overtaken; a conflict-cycle witness).

use futures::future::join_all;
use serde_json::json;

use super::order_body;
use crate::fault::FaultProfile;
use crate::mech::tidegate::TgAblation;
use crate::mech::{TaskSpec, run_task};
use crate::report::{Plot, Report, Table, ms};
use crate::stats::Rate;
use crate::{Env, Mode, Result};

/// One cell's counts.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Cell {
    /// Mode.
    pub mode: String,
    /// Agents.
    pub agents: usize,
    /// One shared order (true) or one order per agent.
    pub overlap: bool,
    /// Runs.
    pub runs: u64,
    /// Invariant violations (stale live writes), summed over runs.
    pub violations: u64,
    /// Runs with at least one violation.
    pub runs_violating: u64,
    /// Tasks.
    pub tasks: u64,
    /// Tasks that waited.
    pub blocked: u64,
    /// Total wait, ms.
    pub wait_ms: f64,
    /// Refused commits.
    pub rejections: u64,
    /// Tasks that committed.
    pub committed: u64,
}

impl Cell {
    /// Violations per run.
    pub fn inv_per_run(&self) -> f64 {
        self.violations as f64 / self.runs.max(1) as f64
    }

    /// Mean wait per task, ms.
    pub fn wait_per_task(&self) -> f64 {
        self.wait_ms / self.tasks.max(1) as f64
    }
}

/// Runs one cell, or `None` if this build cannot run the mode.
pub fn cell(
    env: &Env,
    mode: Mode,
    agents: usize,
    overlap: bool,
    trials: u64,
    think: (u64, u64),
) -> Result<Option<Cell>> {
    if mode.supported().is_err() {
        return Ok(None);
    }
    let sinks = env.sinks()?;
    let mut c = Cell { mode: mode.name(), agents, overlap, ..Cell::default() };
    let tag: String = mode.name().chars().filter(char::is_ascii_alphanumeric).collect();
    for run in 0..trials {
        let ns = format!("ct-{tag}-{agents}-{overlap}-{run}");
        let orders: Vec<String> =
            (0..agents).map(|i| if overlap { format!("{ns}-W") } else { format!("{ns}-W{i}") }).collect();
        for o in &orders {
            sinks.db.create_order(o)?;
        }
        let world = env.world(&sinks, "contention", &mode, &FaultProfile::none(), run);
        let reports = env.trial(async {
            let mech =
                mode.build(world.clone()).map_err(|detail| crate::EvalError::Mode { mode: mode.name(), detail })?;
            let tasks: Vec<_> = (0..agents)
                .map(|i| {
                    let op = if i % 2 == 0 { "cancel" } else { "modify" };
                    let pause = world.uniform(think.0, think.1.max(think.0 + 1));
                    let spec = TaskSpec {
                        agent: format!("agent{i}"),
                        may_touch: vec![format!("retail:order:{}", orders[i])],
                        ..TaskSpec::default()
                    };
                    (spec, order_body(orders[i].clone(), op, pause, format!("{ns}-a{i}"), false))
                })
                .collect();
            let m = &*mech;
            Ok::<_, crate::EvalError>(join_all(tasks.iter().map(|(spec, body)| run_task(m, spec, body))).await)
        })??;
        let mut inv = 0;
        let mut seen = std::collections::HashSet::new();
        for o in &orders {
            if seen.insert(o) {
                inv += sinks.db.stale_writes(o)?;
            }
        }
        c.runs += 1;
        c.violations += inv;
        c.runs_violating += u64::from(inv > 0);
        for r in &reports {
            c.tasks += 1;
            c.blocked += u64::from(!r.wait.is_zero());
            c.wait_ms += r.wait.as_secs_f64() * 1e3;
            c.rejections += u64::from(r.rejections);
            c.committed += u64::from(r.committed);
        }
        env.tick();
    }
    Ok(Some(c))
}

/// The modes of Table 1.
pub fn table1_modes() -> Vec<Mode> {
    vec![Mode::TX_FULL, Mode::TX_FCW, Mode::WorkflowLock, Mode::PerCallLock, Mode::Occ, Mode::NoTx]
}

/// The ablations and levels of Table 11.
pub fn ablation_modes() -> Vec<Mode> {
    vec![
        Mode::TX_FULL,
        Mode::tx_ablation(TgAblation::NoStaleReadAbort),
        Mode::tx_ablation(TgAblation::NoFrontier),
        Mode::tx_ablation(TgAblation::GlobalFrontier),
    ]
    .into_iter()
    .chain(Mode::TX_LEVELS)
    .collect()
}

/// Runs the workload.
pub fn run(env: &Env) -> Result<Report> {
    let trials = env.cfg.trials(100, 20);
    let scale_trials = env.cfg.trials(20, 3);
    let think = (50, 150);
    let modes = table1_modes();
    let scale_agents: Vec<usize> = if env.cfg.quick { vec![2, 4, 8, 16] } else { vec![2, 4, 8, 16, 32, 64] };
    let scale_modes = [Mode::TX_FULL, Mode::WorkflowLock, Mode::tx_ablation(TgAblation::GlobalFrontier)];
    env.section(
        "contention",
        (modes.len() as u64 * 4 + ablation_modes().len() as u64 * 2) * trials
            + scale_modes.len() as u64 * scale_trials * scale_agents.len() as u64,
    );
    let mut cells = Vec::new();
    let mut t1 = Table::new(
        "table1",
        "Table 1: contention (forced overlap: 4 agents, one order; disjoint: one order per agent)",
        &[
            "Mode",
            "Inv./run (4 ag overlap)",
            "Runs with a violation",
            "Wait/task ms",
            "Blocked",
            "Rejections/run",
            "Tasks committed",
            "Inv./run disjoint 2/4/8",
            "Disjoint wait/task ms 2/4/8",
        ],
    );
    for mode in &modes {
        let Some(o) = cell(env, *mode, 4, true, trials, think)? else {
            t1.row(vec![mode.name(), "n/a (not in this engine build)".into()]);
            continue;
        };
        let mut dis = Vec::new();
        for n in [2, 4, 8] {
            if let Some(d) = cell(env, *mode, n, false, trials, think)? {
                dis.push(d);
            }
        }
        t1.row(vec![
            mode.name(),
            format!("{:.2}", o.inv_per_run()),
            Rate::new(o.runs_violating, o.runs).show(),
            ms(o.wait_per_task()),
            Rate::new(o.blocked, o.tasks).show(),
            format!("{:.2}", o.rejections as f64 / o.runs.max(1) as f64),
            format!("{}/{}", o.committed, o.tasks),
            dis.iter().map(|d| format!("{:.2}", d.inv_per_run())).collect::<Vec<_>>().join(" / "),
            dis.iter().map(|d| ms(d.wait_per_task())).collect::<Vec<_>>().join(" / "),
        ]);
        cells.push(o);
        cells.extend(dis);
    }
    t1.notes.push(format!(
        "{trials} runs per cell; plan pause uniform {}–{} ms (virtual). Inv. = live writes planned on a stale version \
         (conflict-cycle witnesses), counted from the orders table. Wait = time blocked on locks or on earlier \
         transactions. Rejections = refused commits (OCC conflicts, Tidegate stale-read aborts), each followed by a re-plan.",
        think.0, think.1
    ));

    let mut t11 = Table::new(
        "table11",
        "Table 11: composition ablations and levels (forced overlap, 4 agents; disjoint, 8 agents)",
        &["Mode", "Inv./run", "Wait/task ms", "Rejections/run", "Tasks committed", "Disjoint wait/task ms (8 ag)"],
    );
    for mode in ablation_modes() {
        let (Some(o), Some(d)) = (cell(env, mode, 4, true, trials, think)?, cell(env, mode, 8, false, trials, think)?)
        else {
            t11.row(vec![mode.name(), "n/a (not in this engine build)".into()]);
            continue;
        };
        t11.row(vec![
            mode.name(),
            format!("{:.2}", o.inv_per_run()),
            ms(o.wait_per_task()),
            format!("{:.2}", o.rejections as f64 / o.runs.max(1) as f64),
            format!("{}/{}", o.committed, o.tasks),
            ms(d.wait_per_task()),
        ]);
        cells.push(o);
        cells.push(d);
    }
    t11.notes.push(
        "Each ablation removes one engine primitive through the engine's own switch; each level is the engine run at \
         that level (Tx-Full is L4)."
            .into(),
    );

    let mut t10 = Table::new(
        "table10",
        "Table 10: wait per task (ms) on disjoint orders as agents grow (plan pause 50 ms)",
        &std::iter::once("Mode".to_owned())
            .chain(scale_agents.iter().map(|n| format!("n={n}")))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let mut plot = Plot {
        id: "wait_scaling".into(),
        title: "Wait per task on disjoint orders".into(),
        x_label: "agents".into(),
        y_label: "wait per task (ms)".into(),
        categories: Vec::new(),
        series: Vec::new(),
    };
    for mode in scale_modes {
        let mut row = vec![mode.name()];
        let mut pts = Vec::new();
        for &n in &scale_agents {
            match cell(env, mode, n, false, scale_trials, (50, 50))? {
                Some(c) => {
                    row.push(ms(c.wait_per_task()));
                    pts.push((n as f64, c.wait_per_task()));
                    cells.push(c);
                }
                None => row.push("n/a".into()),
            }
        }
        if !pts.is_empty() {
            plot.series.push((mode.name(), pts));
        }
        t10.row(row);
    }
    t10.notes.push(format!(
        "{scale_trials} runs per cell. n/a: the engine in this build has no such switch. The engine's global frontier \
         orders commit decisions, not whole tasks: with equal plan pauses every agent reaches commit at the same \
         virtual instant and none waits (Table 11 shows its cost with varied pauses); Workflow-Lock holds its lock \
         for the whole task."
    ));
    let mut bars = Plot {
        id: "overlap".into(),
        title: "Forced overlap (4 agents): violations per run and wait per task".into(),
        x_label: "mode".into(),
        y_label: "value".into(),
        categories: Vec::new(),
        series: vec![("inv./run".into(), Vec::new()), ("wait/task (ms/100)".into(), Vec::new())],
    };
    for (i, c) in cells.iter().filter(|c| c.overlap).enumerate() {
        bars.categories.push(c.mode.clone());
        bars.series[0].1.push((i as f64, c.inv_per_run()));
        bars.series[1].1.push((i as f64, c.wait_per_task() / 100.0));
    }
    Ok(Report {
        workload: "contention".into(),
        settings: json!({"trials": trials, "scale_trials": scale_trials, "think_ms": think, "seed": env.cfg.seed}),
        tables: vec![t1, t11, t10],
        cells: cells.iter().map(|c| serde_json::to_value(c).unwrap_or_default()).collect(),
        plots: vec![plot, bars],
        seconds: 0.0,
    })
}
