//! Tidegate's evaluation harness.
//!
//! Reproduces the experiments of the Atomix paper (§3, Appendices B–D) on the Tidegate engine
//! and on mechanism-matched baselines, all running the same task bodies against the same real
//! sinks through the same seeded fault injector:
//!
//! - [`mech`]: the [`mech::Mechanism`] trait, Tidegate and every baseline;
//! - [`fault`]: F1–F5, Bernoulli and burst, seeded per (workload, mode, rate, run);
//! - [`sinks`]: an HTTP mailbox on 127.0.0.1, files, SQLite rows, an in-memory buffer;
//! - [`workloads`]: contention, speculation, irreversible, recovery, stress, annotations;
//! - [`stats`], [`report`]: Clopper–Pearson intervals, tables, JSON, CSV, SVG.
//!
//! Agent think time runs on tokio's paused clock: each trial is a single-threaded runtime
//! whose clock jumps to the next timer when every task is idle, so a 150 ms plan pause costs
//! no wall time and the same seed gives the same schedule. Sinks are called synchronously, so
//! a provider call never lets virtual time move under it. `--wall` runs think times on the
//! real clock instead.
//!
//! No result is decided by a mode's name: every number is counted from the sinks' own
//! records after the mechanism ran. Ground truth never asks the mechanism.

#![deny(missing_docs)]

pub mod fault;
pub mod mech;
pub mod mode;
pub mod report;
pub mod sinks;
pub mod stats;
pub mod workloads;
pub mod world;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use mode::Mode;
pub use report::Report;

use crate::fault::{FaultProfile, Injector, seed_for};
use crate::sinks::{MailServer, SinkError};
use crate::world::{Sinks, World};

/// Errors of the harness itself (never of a mechanism under test).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// A sink could not be set up or read.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The trial runtime could not start.
    #[error("start the trial runtime: {0}")]
    Runtime(std::io::Error),
    /// A mode could not be built.
    #[error("mode {mode}: {detail}")]
    Mode {
        /// The mode.
        mode: String,
        /// Why.
        detail: String,
    },
    /// An unknown workload name.
    #[error(
        "unknown workload `{0}`: expected contention, speculation, irreversible, recovery, stress, annotations or all"
    )]
    UnknownWorkload(String),
}

/// Result alias.
pub type Result<T, E = EvalError> = std::result::Result<T, E>;

/// How to run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Reduced trials (the `--quick` runs and the default test run).
    pub quick: bool,
    /// Base seed.
    pub seed: u64,
    /// Trials per cell, overriding the workload's default.
    pub trials: Option<u64>,
    /// Think times on the wall clock instead of the paused virtual clock.
    pub wall: bool,
    /// Show a progress bar.
    pub progress: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { quick: false, seed: 42, trials: None, wall: false, progress: false }
    }
}

impl Config {
    /// The quick configuration tests use.
    pub fn quick() -> Config {
        Config { quick: true, ..Config::default() }
    }

    /// Trials per cell: the override, else `quick` or `full`.
    pub fn trials(&self, full: u64, quick: u64) -> u64 {
        self.trials.unwrap_or(if self.quick { quick } else { full })
    }
}

/// What workloads share: the mail server, the config, the progress bar.
#[derive(Debug)]
pub struct Env {
    /// Settings.
    pub cfg: Config,
    server: Arc<MailServer>,
    /// Progress.
    pub progress: indicatif::ProgressBar,
}

impl Env {
    /// Starts the mail server.
    pub fn new(cfg: Config) -> Result<Env> {
        let progress = if cfg.progress {
            let pb = indicatif::ProgressBar::new(0);
            pb.set_style(
                indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} trials {elapsed_precise}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            pb
        } else {
            indicatif::ProgressBar::hidden()
        };
        Ok(Env { cfg, server: Arc::new(MailServer::start()?), progress })
    }

    /// Fresh sinks for one workload (the shared mail server, a new directory and database).
    pub fn sinks(&self) -> Result<Arc<Sinks>> {
        Ok(Arc::new(Sinks::new(&self.server)?))
    }

    /// The mail server.
    pub fn server(&self) -> &MailServer {
        &self.server
    }

    /// Starts a progress section of `total` trials.
    pub fn section(&self, name: &str, total: u64) {
        self.progress.set_prefix(name.to_owned());
        self.progress.set_length(total);
        self.progress.set_position(0);
    }

    /// One trial done.
    pub fn tick(&self) {
        self.progress.inc(1);
    }

    /// A trial's world: `sinks` plus an injector seeded by (workload, mode, rate, run).
    pub fn world(
        &self,
        sinks: &Arc<Sinks>,
        workload: &str,
        mode: &Mode,
        profile: &FaultProfile,
        run: u64,
    ) -> Arc<World> {
        let seed = seed_for(self.cfg.seed, workload, &mode.name(), profile.rate, run);
        Arc::new(World::new(sinks.clone(), Injector::new(profile.clone(), seed)))
    }

    /// Runs one trial's future on a fresh single-threaded runtime: paused (virtual) clock
    /// unless `wall`.
    pub fn trial<F: Future>(&self, f: F) -> Result<F::Output> {
        let mut b = tokio::runtime::Builder::new_current_thread();
        b.enable_time();
        if !self.cfg.wall {
            b.start_paused(true);
        }
        let rt = b.build().map_err(EvalError::Runtime)?;
        Ok(rt.block_on(f))
    }
}

/// Sleeps for an agent's think time (virtual under the paused clock).
pub async fn think(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The workload names, in `all` order.
pub const WORKLOADS: [&str; 6] = ["contention", "speculation", "irreversible", "recovery", "stress", "annotations"];

/// Runs one workload by name.
pub fn run(env: &Env, name: &str) -> Result<Report> {
    let start = std::time::Instant::now();
    let mut r = match name {
        "contention" => workloads::contention::run(env)?,
        "speculation" => workloads::speculation::run(env)?,
        "irreversible" => workloads::irreversible::run(env)?,
        "recovery" => workloads::recovery::run(env)?,
        "stress" => workloads::stress::run(env)?,
        "annotations" => workloads::annotations::run(env)?,
        other => return Err(EvalError::UnknownWorkload(other.to_owned())),
    };
    r.seconds = start.elapsed().as_secs_f64();
    Ok(r)
}
