//! `speculation`: K alternative branches of one decision, each writing to all four sinks
//! (the paper's Tables 12 and 17).
//!
//! Every branch puts a buffer entry (bufferable), writes a file (reversible), inserts a
//! database row (reversible) and mails a customer (irreversible). The controller picks a
//! seeded winner, aborts the other branches as lost and commits the winner. Residue is what
//! the losers left in each sink after settlement (counted from the sinks); the positive
//! control is that the winner's four effects are each present exactly once.

use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use serde_json::json;
use tidegate_runtime::EffectClass;

use crate::fault::FaultProfile;
use crate::mech::tcc::Wiring;
use crate::mech::tidegate::TgAblation;
use crate::mech::{Abort, Attempt, Body, TaskSpec};
use crate::report::{Plot, Report, Table};
use crate::sinks::SinkKind;
use crate::stats::{Rate, mean, quantile};
use crate::world::ToolSpec;
use crate::{Env, Mode, Result};

/// The four tools of a branch, one per sink.
pub const TOOLS: [ToolSpec; 4] = [
    ToolSpec::sink("buffer_put", SinkKind::Buffer, EffectClass::Bufferable),
    ToolSpec::sink("write_file", SinkKind::Fs, EffectClass::Reversible),
    ToolSpec::sink("insert_row", SinkKind::Db, EffectClass::Reversible),
    ToolSpec::sink("send_mail", SinkKind::Mail, EffectClass::Gated),
];

fn branch(res: String) -> Body {
    Arc::new(move |a: Arc<dyn Attempt>, _| {
        let res = res.clone();
        Box::pin(async move {
            for t in &TOOLS {
                a.call(t, json!({"res": format!("{res}:{}", t.name), "body": {"branch": res}})).await?;
            }
            Ok::<(), Abort>(())
        })
    })
}

/// The modes of Table 12.
pub fn modes() -> Vec<Mode> {
    vec![
        Mode::TX_FULL,
        Mode::tx_ablation(TgAblation::GlobalFrontier),
        Mode::MutexWal,
        Mode::Tcc(Wiring::DbOnly),
        Mode::Tcc(Wiring::Full),
        Mode::Saga,
        Mode::Occ,
        Mode::TX_MISCLASSIFIED,
    ]
}

/// Runs the workload.
pub fn run(env: &Env) -> Result<Report> {
    let trials = env.cfg.trials(100, 10);
    let ks: [usize; 4] = [2, 4, 8, 16];
    let modes = modes();
    env.section("speculation", modes.len() as u64 * trials * ks.len() as u64);
    let sinks = env.sinks()?;
    let mut t12 = Table::new(
        "table12",
        "Table 12: losing-branch residue per sink (losing branches that left the effect, all K pooled)",
        &["Mode", "Buffer", "Filesystem", "DB rows", "Mailbox", "Winner complete"],
    );
    let mut tk = Table::new(
        "table12k",
        "Mailbox residue by K (leaked losing-branch sends / losing branches)",
        &["Mode", "K=2", "K=4", "K=8", "K=16"],
    );
    let mut t17 = Table::new(
        "table17",
        "Table 17: Tx-Full speculation latency (µs, wall clock)",
        &["Branches (K)", "Setup", "Commit", "Total", "p99 total"],
    );
    let mut plot = Plot {
        id: "residue_by_k".into(),
        title: "Losing-branch mailbox residue".into(),
        x_label: "branches K".into(),
        y_label: "leaked sends per trial".into(),
        categories: Vec::new(),
        series: Vec::new(),
    };
    let mut cells = Vec::new();
    for mode in modes {
        if mode.supported().is_err() {
            t12.row(vec![mode.name(), "n/a (not in this engine build)".into()]);
            continue;
        }
        let tag: String = mode.name().chars().filter(char::is_ascii_alphanumeric).collect();
        let mut residue = [0u64; 4];
        let mut losers = 0u64;
        let mut winners_ok = 0u64;
        let mut runs = 0u64;
        let mut by_k = Vec::new();
        let mut pts = Vec::new();
        for &k in &ks {
            let (mut setup, mut commit, mut total) = (Vec::new(), Vec::new(), Vec::new());
            let mut mail_k = 0;
            for run in 0..trials {
                let world = env.world(&sinks, "speculation", &mode, &FaultProfile::none(), run * 32 + k as u64);
                let winner = world.uniform(0, k as u64) as usize;
                let ns = format!("sp-{tag}-{k}-{run}");
                let timing = env.trial(async {
                    let mech = mode
                        .build(world.clone())
                        .map_err(|detail| crate::EvalError::Mode { mode: mode.name(), detail })?;
                    let t0 = Instant::now();
                    let spec = TaskSpec { agent: "speculator".into(), ..TaskSpec::default() };
                    let branches = mech
                        .begin_group(&spec, k)
                        .await
                        .map_err(|e| crate::EvalError::Mode { mode: mode.name(), detail: format!("{e:?}") })?;
                    let t1 = Instant::now();
                    let results =
                        join_all(branches.iter().enumerate().map(|(i, b)| branch(format!("{ns}:b{i}"))(b.clone(), 1)))
                            .await;
                    let t2 = Instant::now();
                    if results.iter().all(Result::is_ok) {
                        mech.settle_group(&branches, winner).await;
                    } else {
                        for (b, r) in branches.iter().zip(results) {
                            if let Err(why) = r {
                                b.abort(why).await;
                            }
                        }
                    }
                    let t3 = Instant::now();
                    Ok::<_, crate::EvalError>(((t1 - t0).as_secs_f64() * 1e6, (t3 - t2).as_secs_f64() * 1e6))
                })??;
                setup.push(timing.0);
                commit.push(timing.1);
                total.push(timing.0 + timing.1);
                for i in 0..k {
                    for (s, t) in TOOLS.iter().enumerate() {
                        let live = world.live(t, &json!({"res": format!("{ns}:b{i}:{}", t.name)}))?;
                        if i == winner {
                            continue;
                        }
                        residue[s] += u64::from(live > 0);
                        if s == 3 {
                            mail_k += u64::from(live > 0);
                        }
                    }
                }
                let complete = TOOLS.iter().all(|t| {
                    world.live(t, &json!({"res": format!("{ns}:b{winner}:{}", t.name)})).is_ok_and(|n| n == 1)
                });
                winners_ok += u64::from(complete);
                losers += k as u64 - 1;
                runs += 1;
                env.tick();
            }
            by_k.push(Rate::new(mail_k, trials * (k as u64 - 1)));
            pts.push((k as f64, mail_k as f64 / trials as f64));
            if mode == Mode::TX_FULL {
                t17.row(vec![
                    k.to_string(),
                    format!("{:.0}", mean(&setup)),
                    format!("{:.0}", mean(&commit)),
                    format!("{:.0}", mean(&total)),
                    format!("{:.0}", quantile(&total, 0.99)),
                ]);
            }
        }
        t12.row(
            std::iter::once(mode.name())
                .chain(residue.iter().map(|r| Rate::new(*r, losers).show()))
                .chain(std::iter::once(format!("{winners_ok}/{runs}")))
                .collect(),
        );
        tk.row(std::iter::once(mode.name()).chain(by_k.iter().map(Rate::show)).collect());
        plot.series.push((mode.name(), pts));
        cells.push(json!({
            "mode": mode.name(), "losing_branches": losers, "residue": {"buffer": residue[0], "fs": residue[1], "db": residue[2], "mail": residue[3]},
            "winner_complete": winners_ok, "runs": runs,
        }));
    }
    t12.notes.push(format!(
        "{trials} trials per K in {ks:?}. TCC-Confirm (DB-only wiring) has try/confirm/cancel for database rows only, \
         the paper's Table 12 default; TCC-Confirm is fully wired. Latency includes the real sinks (HTTP, SQLite, files) \
         and, in dev builds, unoptimised code; report release figures."
    ));
    Ok(Report {
        workload: "speculation".into(),
        settings: json!({"trials": trials, "k": ks, "seed": env.cfg.seed}),
        tables: vec![t12, tk, t17],
        cells,
        plots: vec![plot],
        seconds: 0.0,
    })
}
