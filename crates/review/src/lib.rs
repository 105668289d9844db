//! Review of LLM-generated database transactions (design: docs/review.md).
//!
//! A [`Manager`] sits in front of a relational database ([`SqliteDatabase`], [`PgDatabase`]).
//! Requests name a [`Template`] and parameters and say whether they are suspicious. Suspicious
//! transactions are buffered until a reviewer accepts or removes them (or executed at once with
//! their compensation buffered); every new transaction is checked against every buffered one
//! for invariant satisfaction ([`deps`]) and held while it depends on one; removals cascade.
//! Everything is recorded in a [`DecisionLog`] from which the manager is rebuilt.
//!
//! This crate imports no other Tidegate crate.

#![deny(missing_docs)]

pub mod bench;
pub mod db;
pub mod deps;
mod error;
pub mod exec;
pub mod log;
pub mod manager;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod plot;
pub mod template;
pub mod tpcc;
pub mod value;

pub use db::{Database, SqlBounds, SqliteDatabase};
#[cfg(feature = "postgres")]
pub use db::{PgDatabase, PgTenantOptions};
pub use deps::{Checker, EdgeKind, Granularity, Item, Touch};
pub use error::{Error, Result};
pub use log::{Decision, DecisionLog, FileLog, MemoryLog, Record};
pub use manager::{Manager, Options, Request, Stats, Status, TxView};
pub use template::{Invariant, ParamType, Strategy, Template, TemplateSet, WriteKind};
