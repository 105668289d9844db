//! `tidegate serve`: the Tidegate engine as an HTTP service that outlives the agents using
//! it (docs/server.md).
//!
//! One engine and one ledger per tenant; API keys with roles; an HTTP/JSON API under `/v1`
//! whose OpenAPI 3.1 document is generated from the handlers; held effects and compensations
//! dispatched by capability to webhooks or pull workers ([`dispatch`]); long-poll and SSE
//! waiting; Prometheus metrics. This crate must not reach into the engine's internals: it
//! uses the public API of `tidegate-runtime` and the `LedgerStore` contract only.
//!
//! ```no_run
//! # async fn f() -> Result<(), tidegate_server::error::ServerError> {
//! use tidegate_server::{AppState, config::Config};
//! let mut cfg = Config::default();
//! cfg.server.memory = true;
//! let state = AppState::open(cfg).await?;
//! let app = tidegate_server::api::app(state.clone(), axum::Router::new());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
//! tidegate_server::serve(state, listener, app, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod api;
pub mod bench;
pub mod bench_cluster;
pub mod config;
pub mod error;
mod server;

pub use server::AppState;

use std::future::Future;
use std::time::Duration;

/// Serves `app` on `listener` until `shutdown` resolves, then drains: stops accepting, ends
/// long-polls and streams, waits up to `server.shutdown_drain_ms` for requests and the
/// server's settlement tasks, then checkpoints and syncs every tenant's ledger.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> error::Result<()> {
    let token = state.shutdown_token().clone();
    let drain = Duration::from_millis(state.config().server.shutdown_drain_ms);
    let signal_token = token.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: draining requests");
        signal_token.cancel();
    });
    let server = tokio::spawn(async move { server.await });
    token.cancelled().await;
    let started = tokio::time::Instant::now();
    match tokio::time::timeout(drain, server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!("server error while draining: {e}"),
        Ok(Err(e)) => tracing::warn!("server task failed: {e}"),
        Err(_) => tracing::warn!("requests still open after {} ms; closing anyway", drain.as_millis()),
    }
    let left = drain.saturating_sub(started.elapsed());
    let problems = state.close(left).await;
    if problems.is_empty() {
        tracing::info!("shut down cleanly");
        Ok(())
    } else {
        Err(error::ServerError::io("closing", std::io::Error::other(problems.join("; "))))
    }
}

/// Installs the global tracing subscriber for `cfg` (text or JSON lines on standard error;
/// `RUST_LOG` overrides `log.filter`). A second call does nothing.
pub fn init_tracing(cfg: &config::LogSection) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if cfg.format == "json" { builder.json().try_init() } else { builder.try_init() };
}
