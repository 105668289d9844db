//! Tidegate's runtime: the engine you embed.
//!
//! [`Tidegate`] wraps the pure state machine of `tidegate-core` and executes what it decides:
//! calls tools, stages and queues held effects, waits for earlier transactions, runs
//! pre-commit hooks, releases held effects in issuance order with bounded retry, and runs
//! compensations in reverse order on abort. It works from async code (tokio) and, through the
//! `*_blocking` methods, from plain threads. Time comes from an injected [`Clock`].
//!
//! ```
//! use serde_json::json;
//! use tidegate_runtime::{Compensation, EffectClass, Tidegate, Tool, TxOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tidegate_runtime::Error> {
//! let tg = Tidegate::in_memory()?;
//! let refund = Tool::builder("refund", EffectClass::Reversible)
//!     .scope(|a| format!("retail:order:{}", a["order"].as_str().unwrap_or_default()))
//!     .call(|a| async move { Ok(json!({"refund_id": format!("R-{}", a["order"])})) })
//!     .compensate(|_, _| async { Ok(Compensation::clean()) })
//!     .build()?;
//! let tx = tg.begin_with(TxOptions::agent("support").may_touch(["retail:order:W1"]))?;
//! tx.read("retail:order:W1")?;
//! tx.call(&refund, json!({"order": "W1"})).await?;
//! tx.seal()?;
//! let outcome = tx.commit().await?;
//! assert!(outcome.committed && outcome.is_clean());
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod blocking;
pub mod checkpoint;
mod clock;
mod engine;
mod error;
pub mod extension;
mod group;
pub mod hooks;
mod observer;
mod plan;
mod policy;
mod read;
mod recover;
mod run;
mod settle;
mod store_url;
mod ticket;
mod tool;
pub mod trace;
mod tx;

pub use checkpoint::{CheckpointInfo, CheckpointPolicy, ReplayReport};
pub use clock::{Clock, ManualClock, TokioClock};
pub use engine::{Builder, RetryPolicy, TaskScope, Tidegate, TxOptions};
pub use error::{Error, FailureKind, Fence, Result};
pub use extension::MAX_STREAM_BYTES;
pub use group::{Speculation, SpeculationOutcome};
pub use hooks::{FnHook, PreCommitHook, Verdict};
pub use observer::AppendObserver;
pub use plan::{CapabilityHandler, CapabilityOptions, Plan, PlanOptions};
pub use read::Read;
pub use recover::RecoveryReport;
pub use run::{Attempt, DEFAULT_ATTEMPTS, RunReport};
pub use store_url::{OpenedStore, StoreUrl};
pub use ticket::{Step, Ticket, TicketAction};
pub use tidegate_core::engine::{EffectView, ReadResult, SealedView, WaitCause, WaitsFor};
pub use tidegate_core::scope::{CaseRule, MAX_SCOPE_BYTES, MAX_SCOPE_SEGMENTS, PathStyle, ScopeError, ScopeRule};
pub use tidegate_core::{
    Ablation, AbortReason, BoxFuture, CallOutcome, DEFAULT_DISPATCH_DEADLINE, Dispatch, DispatchKey, DispatchRequest,
    Disposition, EffectClass, EffectId, EffectOutcome, EngineError, Epoch, GroupId, Isolation, Level, Operation,
    Ordering, Outcome, PartialCommit, Scope, ScopeRegistry, Tag, TxId, TxState, Version,
};
/// The plan executor's crate (descriptors, predicates, views, errors), re-exported.
pub use tidegate_plans as plans;
pub use tidegate_plans::{Choice, Descriptor, PlanDetail, PlanError, PlanId, Predicate};
/// The embedded ledger backend (feature `sqlite`, default on): a durable engine is
/// `Tidegate::builder().store(Arc::new(SqliteStore::open(dir)?)).build()`.
#[cfg(feature = "sqlite")]
pub use tidegate_sqlite::{self as sqlite, SqliteStore};
pub use tidegate_storage::{LedgerStore, MemoryStore, StoreError};
pub use tool::{CallCtx, CallHandle, Compensation, IntoScopes, Probe, Tool, ToolBuilder, ToolError};
pub use trace::{FileTrace, TraceBuffer, TraceRecord, TraceSink};
pub use tx::{Ack, CallOptions, CommitOptions, Transaction};
