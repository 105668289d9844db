//! Serving the agent: over stdio (one session, the pipe), or over Streamable HTTP (one
//! session per `Mcp-Session-Id`).
//!
//! A turn needs a session to belong to. Over HTTP the gateway therefore serves the protocol
//! revisions that have sessions (2025-11-25 and older); the 2026-07-28 revision removed them
//! (its requests are served one by one), so an HTTP client that speaks only that revision is
//! refused at `initialize` with the revisions the gateway offers. Over stdio the pipe is the
//! session, and every revision rmcp knows is served.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::session::SessionHandler;

/// Serves one agent on this process's stdin and stdout until it disconnects; its open turn is
/// then aborted.
pub async fn stdio(gw: Arc<Gateway>) -> Result<(), GatewayError> {
    let handler = SessionHandler::new(gw.clone());
    let session = handler.session().clone();
    let running = handler
        .serve(crate::stdio::transport(tokio::io::stdin(), tokio::io::stdout()))
        .await
        .map_err(|e| GatewayError::Serve(format!("the agent's initialize failed: {e}")))?;
    let quit = running.waiting().await;
    session.end("the agent's session ended").await;
    gw.shutdown().await;
    quit.map(|_| ()).map_err(|e| GatewayError::Serve(e.to_string()))
}

/// Serves agents over Streamable HTTP at `http://<listener>/mcp` until `stop` resolves;
/// every open turn is then aborted.
pub async fn http(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    let cancel = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default().with_cancellation_token(cancel.clone());
    let factory_gw = gw.clone();
    let service = StreamableHttpService::new(
        move || Ok(SessionHandler::new(factory_gw.clone()).http()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let addr: SocketAddr = listener.local_addr().map_err(|e| GatewayError::Serve(e.to_string()))?;
    tracing::info!(%addr, "serving MCP over Streamable HTTP at /mcp");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            stop.await;
            cancel.cancel();
        })
        .await
        .map_err(|e| GatewayError::Serve(e.to_string()))?;
    gw.shutdown().await;
    Ok(())
}
