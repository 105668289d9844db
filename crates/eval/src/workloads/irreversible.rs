//! `irreversible`: a mixed reversible/irreversible workflow under five abort sources, with
//! the valid-send positive control (the paper's Tables 2 and 15).
//!
//! The workflow reads the order, reserves stock (a reversible database row), mails the
//! customer a shipping confirmation (irreversible: the HTTP mailbox), then marks the order
//! shipped. Each abort source makes the trial's send invalid:
//!
//! | source | how it arises | who notices |
//! | --- | --- | --- |
//! | tool failure | a `charge_card` call after the send fails persistently | every mechanism (the call errors) |
//! | losing branch | the workflow runs as branch 1 of 2; branch 0 wins | the speculation controller |
//! | stale read | another agent cancels the order during the plan pause | mechanisms that validate or lock reads |
//! | pre-commit veto | the validator rejects the amount (900 > 500) | the mechanism's commit path |
//! | timeout | the agent hangs after the send past its 1 s deadline | the lease or the orchestrator's deadline |
//!
//! A leak is an invalid send the mailbox's append-only log holds (for the stale-read source:
//! a send for an order whose cancellation is live). The positive control runs the same
//! workflow with no abort source and counts trials where the send arrived and the order is
//! shipped.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use super::{CHARGE_FILE, ORDER_OP, RESERVE_ROW, SEND_MAIL, order_body};
use crate::fault::FaultProfile;
use crate::mech::tcc::Wiring;
use crate::mech::{Abort, Attempt, Body, TaskSpec, Validator, run_task};
use crate::report::{Plot, Report, Table};
use crate::sinks::Sink;
use crate::stats::Rate;
use crate::world::World;
use crate::{Env, Mode, Result};

/// An abort source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// A tool after the send fails.
    ToolFailure,
    /// The branch loses.
    LosingBranch,
    /// The order is cancelled during the plan pause.
    StaleRead,
    /// The validator vetoes.
    Veto,
    /// The agent hangs past its deadline.
    Timeout,
}

impl Source {
    /// All five.
    pub const ALL: [Source; 5] =
        [Source::ToolFailure, Source::LosingBranch, Source::StaleRead, Source::Veto, Source::Timeout];

    /// Column name.
    pub fn name(self) -> &'static str {
        match self {
            Source::ToolFailure => "Tool fail",
            Source::LosingBranch => "Losing spec.",
            Source::StaleRead => "Stale read",
            Source::Veto => "Pre-commit veto",
            Source::Timeout => "Timeout",
        }
    }
}

/// The modes of Table 2.
pub fn modes() -> Vec<Mode> {
    vec![
        Mode::TX_FULL,
        Mode::Saga,
        Mode::CheckpointReplay,
        Mode::Tcc(Wiring::Full),
        Mode::MutexWal,
        Mode::Occ,
        Mode::NoTx,
        Mode::TX_MISCLASSIFIED,
    ]
}

const DEADLINE: Duration = Duration::from_secs(1);

fn workflow(order: String, res: String, source: Option<Source>) -> Body {
    Arc::new(move |a: Arc<dyn Attempt>, attempt| {
        let (order, res) = (order.clone(), res.clone());
        Box::pin(async move {
            let seen = a.read(&format!("retail:order:{order}")).await?;
            a.call(&RESERVE_ROW, json!({"res": format!("{res}:stock-{attempt}")})).await?;
            crate::think(100).await;
            if seen.status != "pending" {
                return Ok::<(), Abort>(());
            }
            let amount = if source == Some(Source::Veto) { 900 } else { 100 };
            a.call(&SEND_MAIL, json!({"res": format!("{res}:mail"), "amount": amount, "body": {"order": order}}))
                .await?;
            match source {
                Some(Source::ToolFailure) => {
                    a.call(&CHARGE_FILE, json!({"res": format!("{res}:charge-{attempt}"), "fail": true})).await?;
                }
                Some(Source::Timeout) => crate::think(5_000).await,
                _ => {}
            }
            a.call(
                &ORDER_OP,
                json!({"order": order, "op": "ship", "based_on": seen.version, "res": format!("{res}:ship")}),
            )
            .await?;
            Ok(())
        })
    })
}

fn validator() -> Validator {
    Arc::new(|calls| {
        calls.iter().find_map(|a| {
            a["amount"].as_u64().filter(|v| *v > 500).map(|v| format!("amount {v} over the limit of 500"))
        })
    })
}

/// What one trial left behind.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    leaked: bool,
    delivered: u64,
    shipped: bool,
}

fn trial(env: &Env, world: &Arc<World>, mode: Mode, ns: &str, source: Option<Source>) -> Result<Outcome> {
    let sinks = world.sinks.clone();
    let order = format!("{ns}-W");
    sinks.db.create_order(&order)?;
    let spec = TaskSpec {
        agent: "shipper".into(),
        may_touch: vec![
            format!("retail:order:{order}"),
            format!("db:rows:{ns}:a"),
            format!("mail:{ns}:a"),
            format!("fs:/eval/{ns}/a"),
        ],
        deadline: Some(DEADLINE),
        validator: Some(validator()),
    };
    let main_res = format!("{ns}:a");
    env.trial(async {
        let mech = mode.build(world.clone()).map_err(|detail| crate::EvalError::Mode { mode: mode.name(), detail })?;
        match source {
            Some(Source::LosingBranch) => {
                let spec = TaskSpec { may_touch: Vec::new(), ..spec.clone() };
                let branches = match mech.begin_group(&spec, 2).await {
                    Ok(b) => b,
                    Err(e) => return Err(crate::EvalError::Mode { mode: mode.name(), detail: format!("{e:?}") }),
                };
                // Branch 0 is the winner (a plain send); branch 1 is the losing variant.
                let bodies = [
                    workflow(order.clone(), format!("{ns}:win"), None),
                    workflow(order.clone(), main_res.clone(), None),
                ];
                let results = join_all(branches.iter().zip(&bodies).map(|(b, body)| body(b.clone(), 1))).await;
                // A branch whose body failed is aborted before the controller decides.
                let mut live = Vec::new();
                for (i, r) in results.into_iter().enumerate() {
                    match r {
                        Ok(()) => live.push(i),
                        Err(why) => {
                            branches[i].abort(why).await;
                        }
                    }
                }
                if live.contains(&0) {
                    mech.settle_group(&branches, 0).await;
                }
            }
            Some(Source::StaleRead) => {
                // The canceller starts first (an earlier epoch) and commits during the pause.
                let cancel_spec = TaskSpec {
                    agent: "canceller".into(),
                    may_touch: vec![format!("retail:order:{order}")],
                    ..TaskSpec::default()
                };
                let cancel = order_body(order.clone(), "cancel", 10, format!("{ns}-c"), false);
                let main = workflow(order.clone(), main_res.clone(), None);
                let m = &*mech;
                join_all([run_task(m, &cancel_spec, &cancel), run_task(m, &spec, &main)]).await;
            }
            other => {
                run_task(&*mech, &spec, &workflow(order.clone(), main_res.clone(), other)).await;
            }
        }
        Ok(())
    })??;
    let delivered = sinks.mail.live(&format!("{main_res}:mail"))?;
    let row = sinks.db.order(&order)?;
    let leaked = match source {
        None => false,
        Some(Source::StaleRead) => delivered > 0 && sinks.db.live_ops(&order, "cancel")? > 0,
        Some(_) => delivered > 0,
    };
    Ok(Outcome { leaked, delivered, shipped: row.status == "shipped" })
}

/// Runs the workload.
pub fn run(env: &Env) -> Result<Report> {
    let trials = env.cfg.trials(100, 10);
    let modes = modes();
    env.section("irreversible", modes.len() as u64 * trials * 6);
    let sinks = env.sinks()?;
    let mut t2 = Table::new(
        "table2",
        "Table 2: invalid-send leakage against the HTTP mailbox's append-only log",
        &["Mode", "Leaks", "Attempts", "Leak rate (95% CP)", "Valid sends delivered", "Duplicate deliveries"],
    );
    let mut t15 = Table::new(
        "table15",
        "Table 15: leaks per abort source",
        &["Mode", "Tool fail", "Losing spec.", "Stale read", "Pre-commit veto", "Timeout"],
    );
    let mut plot = Plot {
        id: "leaks_by_source".into(),
        title: "Leaked invalid sends per abort source (%)".into(),
        x_label: "abort source".into(),
        y_label: "leak rate (%)".into(),
        categories: Source::ALL.iter().map(|s| s.name().to_owned()).collect(),
        series: Vec::new(),
    };
    let mut cells = Vec::new();
    for mode in modes {
        if mode.supported().is_err() {
            t2.row(vec![mode.name(), "n/a".into()]);
            continue;
        }
        let tag: String = mode.name().chars().filter(char::is_ascii_alphanumeric).collect();
        let mut per_source = Vec::new();
        let (mut leaks, mut attempts, mut dups) = (0, 0, 0);
        for (si, source) in Source::ALL.iter().enumerate() {
            let mut k = 0;
            for run in 0..trials {
                let world = env.world(&sinks, "irreversible", &mode, &FaultProfile::none(), run * 8 + si as u64);
                let o = trial(env, &world, mode, &format!("ir-{tag}-{si}-{run}"), Some(*source))?;
                k += u64::from(o.leaked);
                dups += u64::from(o.delivered > 1);
                env.tick();
            }
            leaks += k;
            attempts += trials;
            per_source.push(Rate::new(k, trials));
        }
        let mut valid = 0;
        for run in 0..trials {
            let world = env.world(&sinks, "irreversible-valid", &mode, &FaultProfile::none(), run);
            let o = trial(env, &world, mode, &format!("iv-{tag}-{run}"), None)?;
            valid += u64::from(o.delivered >= 1 && o.shipped);
            dups += u64::from(o.delivered > 1);
            env.tick();
        }
        let total = Rate::new(leaks, attempts);
        t2.row(vec![
            mode.name(),
            leaks.to_string(),
            attempts.to_string(),
            total.show(),
            format!("{valid}/{trials}"),
            dups.to_string(),
        ]);
        t15.row(std::iter::once(mode.name()).chain(per_source.iter().map(Rate::show)).collect());
        plot.series
            .push((mode.name(), per_source.iter().enumerate().map(|(i, r)| (i as f64, r.p() * 100.0)).collect()));
        cells.push(json!({
            "mode": mode.name(), "leaks": leaks, "attempts": attempts, "valid_delivered": valid, "valid_trials": trials,
            "duplicates": dups,
            "per_source": Source::ALL.iter().zip(&per_source).map(|(s, r)| json!({"source": s.name(), "leaks": r.k, "trials": r.n})).collect::<Vec<_>>(),
        }));
    }
    t2.notes.push(format!(
        "{trials} invalid-send trials per (mode, abort source) and {trials} valid-send trials per mode. TCC-Confirm is \
         fully wired (the mail tool has its try/confirm/cancel triple). Tx-MisclassifiedIrreversible declares the mail \
         tool reversible."
    ));
    Ok(Report {
        workload: "irreversible".into(),
        settings: json!({"trials": trials, "seed": env.cfg.seed, "deadline_ms": DEADLINE.as_millis() as u64}),
        tables: vec![t2, t15],
        cells,
        plots: vec![plot],
        seconds: 0.0,
    })
}
