//! The service layer under every front door (docs/service.md): the tenants of one node and
//! every operation on them, as typed values and domain errors, with no HTTP.
//!
//! `tidegate serve`'s HTTP API (crates/server) is an adapter over this crate; the MCP gateway
//! and any later front door sit on it the same way. What it owns:
//!
//! | module | what |
//! | --- | --- |
//! | [`node`] | the node: its catalog and tenants, the tasks it owns, authentication, close |
//! | [`tenant`] | one tenant: its engine and ledger, index, registry, dispatcher, live transactions, review manager |
//! | [`catalog`] | tenants, hashed API keys, tool and capability definitions (SQLite) |
//! | [`auth`] | roles, permissions and the key format |
//! | [`registry`], [`tools`] | tool and capability definitions, and the runtime tools they build |
//! | [`dispatch`] | calls, releases, compensations and probes sent to webhooks or pull workers |
//! | [`index`] | the ledger index every view reads (an append observer of the engine) |
//! | [`transactions`] | transactions and their effects: ids, live handles, effect calls, tickets and reports |
//! | [`groups`] | speculation groups: begin, commit the winner, abort, wait for every branch |
//! | [`plans`] | plans: open, read, commit, fail, verdicts, triggers, resolve, steps; the executor's refusals as `ServiceError` |
//! | [`tickets`] | client-executed effects' tickets and the answers they got |
//! | [`attention`] | the attention queue's operator actions: resolve, accept, retry |
//! | [`console`] | attention resolutions and per-minute series |
//! | [`review`] | each tenant's review manager over its ledger |
//! | [`idempotency`] | the records that make a repeated request return its first answer |
//! | [`state`] | what must outlive the process: idempotency records, worker tasks, attempts (memory or SQLite) |
//! | [`metrics`] | the Prometheus registry the node reports |
//! | [`ids`] | the public ids (`tx_<tag>_<n>`, ...) |
//! | [`settings`] | what a front door's configuration gives every tenant |
//! | [`settle`] | seal, commit and abort on node tasks, and the wait for a settlement |
//! | [`error`] | [`ServiceError`]: every refusal, named and classified |
//!
//! It must not depend on an HTTP server crate or on a front door (the layering test in
//! crates/cli/tests/layering.rs checks it).

#![deny(missing_docs)]

pub mod attention;
pub mod auth;
pub mod catalog;
pub mod catalog_postgres;
pub mod cluster;
pub mod console;
pub mod dispatch;
pub mod error;
pub mod groups;
pub mod idempotency;
pub mod ids;
pub mod index;
pub mod metrics;
pub mod node;
pub mod plans;
pub mod registry;
pub mod review;
pub mod settings;
pub mod settle;
pub mod state;
pub mod tap;
pub mod tenant;
pub mod tickets;
pub mod tools;
pub mod transactions;

pub use error::{ConfigError, Result, ServiceError};
pub use node::{AuthError, Authenticated, Service, ServiceSettings};
