//! The modes a workload compares: each names one mechanism and builds it for a trial.

use std::sync::Arc;

use serde::Serialize;

use crate::mech::Mechanism;
use crate::mech::checkpoint::CheckpointReplay;
use crate::mech::eager::{Eager, EagerKind};
use crate::mech::mutex_wal::MutexWal;
use crate::mech::occ::Occ;
use crate::mech::tcc::{Tcc, Wiring};
use crate::mech::tidegate::{Annotation, TgAblation, TgConfig, TgLevel, TidegateMech};
use crate::world::World;

/// A mechanism under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// [`EagerKind::NoTx`].
    NoTx,
    /// [`EagerKind::Saga`].
    Saga,
    /// [`EagerKind::WorkflowLock`].
    WorkflowLock,
    /// [`EagerKind::PerCallLock`].
    PerCallLock,
    /// [`CheckpointReplay`].
    CheckpointReplay,
    /// [`Occ`].
    Occ,
    /// [`Tcc`].
    Tcc(Wiring),
    /// [`MutexWal`].
    MutexWal,
    /// [`TidegateMech`].
    Tidegate(TgConfig),
}

impl Mode {
    /// Tidegate, full discipline, epoch order.
    pub const TX_FULL: Mode = Mode::Tidegate(TgConfig::FULL);
    /// Tidegate with first-committer-wins ordering.
    pub const TX_FCW: Mode = Mode::Tidegate(TgConfig { first_committer_wins: true, ..TgConfig::FULL });
    /// Tidegate with irreversible tools declared reversible (harness-side ablation).
    pub const TX_MISCLASSIFIED: Mode =
        Mode::Tidegate(TgConfig { annotation: Annotation::WrongEffectClass, ..TgConfig::FULL });

    /// Tidegate with one primitive removed.
    pub const fn tx_ablation(a: TgAblation) -> Mode {
        Mode::Tidegate(TgConfig { ablation: a, ..TgConfig::FULL })
    }

    /// Tidegate at a level.
    pub const fn tx_level(l: TgLevel) -> Mode {
        Mode::Tidegate(TgConfig { level: l, ..TgConfig::FULL })
    }

    /// Tidegate at each level below the full engine (L1 with each strategy), lowest first.
    pub const TX_LEVELS: [Mode; 6] = [
        Mode::tx_level(TgLevel::L0),
        Mode::tx_level(TgLevel::L1),
        Mode::tx_level(TgLevel::L1Snapshot),
        Mode::tx_level(TgLevel::L1Pessimistic),
        Mode::tx_level(TgLevel::L2),
        Mode::tx_level(TgLevel::L3),
    ];

    /// Tidegate with an adapter mistake.
    pub const fn tx_annotation(a: Annotation) -> Mode {
        Mode::Tidegate(TgConfig { annotation: a, ..TgConfig::FULL })
    }

    /// The row label.
    pub fn name(&self) -> String {
        match self {
            Mode::NoTx => "No-Tx".into(),
            Mode::Saga => "Saga-Compensation".into(),
            Mode::WorkflowLock => "Workflow-Lock".into(),
            Mode::PerCallLock => "Per-Call-Lock".into(),
            Mode::CheckpointReplay => "Checkpoint-Replay".into(),
            Mode::Occ => "OCC-Revalidate-and-Retry".into(),
            Mode::Tcc(Wiring::Full) => "TCC-Confirm".into(),
            Mode::Tcc(Wiring::DbOnly) => "TCC-Confirm (DB-only wiring)".into(),
            Mode::MutexWal => "Mutex+WAL+Rollback".into(),
            Mode::Tidegate(c) => {
                let mut s = String::from(match c.level {
                    TgLevel::Default => "Tx-Full",
                    TgLevel::L0 => "Tx-L0",
                    TgLevel::L1 => "Tx-L1 (serializable)",
                    TgLevel::L1Snapshot => "Tx-L1 (snapshot isolation)",
                    TgLevel::L1Pessimistic => "Tx-L1 (pessimistic)",
                    TgLevel::L2 => "Tx-L2",
                    TgLevel::L3 => "Tx-L3",
                });
                if c.first_committer_wins {
                    s = "Tx-FirstCommitterWins".into();
                }
                match c.ablation {
                    TgAblation::None => {}
                    TgAblation::NoFrontier => s = "Tx-NoFrontier+Retry".into(),
                    TgAblation::NoStaleReadAbort => s = "Tx-NoAbortOnStale".into(),
                    TgAblation::GlobalFrontier => s = "Tx-GlobalFrontier".into(),
                }
                match c.annotation {
                    Annotation::Correct => {}
                    Annotation::WrongEffectClass => s = "Tx-MisclassifiedIrreversible".into(),
                    Annotation::OverBroadScope => s = "Tx over-broad scope".into(),
                    Annotation::TooNarrowScope => s = "Tx too-narrow scope".into(),
                    Annotation::MissingCompensation => s = "Tx missing compensation".into(),
                }
                s
            }
        }
    }

    /// Whether this is Tidegate at full discipline with correct adapters (the rows the
    /// paper's safety claims are about).
    pub fn is_tidegate_full(&self) -> bool {
        matches!(self, Mode::Tidegate(c) if c.ablation == TgAblation::None && c.annotation == Annotation::Correct && c.level == TgLevel::Default)
    }

    /// Builds the mechanism for one trial (inside the trial's runtime), or says why this
    /// build cannot run it.
    pub fn build(&self, world: Arc<World>) -> Result<Arc<dyn Mechanism>, String> {
        Ok(match *self {
            Mode::NoTx => Arc::new(Arc::new(Eager::new(EagerKind::NoTx, world))),
            Mode::Saga => Arc::new(Arc::new(Eager::new(EagerKind::Saga, world))),
            Mode::WorkflowLock => Arc::new(Arc::new(Eager::new(EagerKind::WorkflowLock, world))),
            Mode::PerCallLock => Arc::new(Arc::new(Eager::new(EagerKind::PerCallLock, world))),
            Mode::CheckpointReplay => Arc::new(CheckpointReplay::new(world)),
            Mode::Occ => Arc::new(Occ::new(world)),
            Mode::Tcc(w) => Arc::new(Tcc::new(world, w)),
            Mode::MutexWal => Arc::new(MutexWal::new(world)),
            Mode::Tidegate(cfg) => Arc::new(Arc::new(TidegateMech::new(world, cfg)?)),
        })
    }

    /// Whether this build can run the mode (ablations need the engine's switches).
    pub fn supported(&self) -> Result<(), String> {
        match self {
            Mode::Tidegate(c) => c.builder().map(|_| ()),
            _ => Ok(()),
        }
    }
}
