//! Progress notifications from an upstream back to the agent whose call caused them.
//!
//! When the agent's `tools/call` carries `_meta.progressToken`, the upstream request carries
//! the token rmcp gives every request it sends (unique per upstream connection, so two sessions
//! that chose the same token never see each other's progress), and the gateway remembers which
//! agent and which token it stands for, for as long as the call runs. The route travels with the call in a task-local
//! ([`ROUTE`]); an upstream call made outside it (a compensation run by the engine's recovery)
//! sends no token.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::ClientHandler;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{NotificationContext, Peer, RoleClient, RoleServer};

tokio::task_local! {
    /// The agent's progress token and connection for the call being served.
    pub static ROUTE: (ProgressToken, Peer<RoleServer>);
}

/// The routes of the calls in flight.
#[derive(Debug, Default)]
pub struct Relay {
    /// The gateway, once built (for re-reading an upstream's tools).
    pub gateway: std::sync::OnceLock<std::sync::Weak<crate::gateway::Gateway>>,
    routes: Mutex<HashMap<ProgressToken, (ProgressToken, Peer<RoleServer>)>>,
}

/// Removes a route when the call it served ends, however it ends.
#[derive(Debug)]
pub struct RouteGuard {
    relay: Arc<Relay>,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.relay.routes.lock().remove(&self.token);
    }
}

impl Relay {
    /// The route of the call being served, if its agent asked for progress.
    pub fn current() -> Option<(ProgressToken, Peer<RoleServer>)> {
        ROUTE.try_with(|r| r.clone()).ok()
    }

    /// Sends progress for the upstream's `token` along `route` until the guard drops.
    pub fn register(self: &Arc<Relay>, token: ProgressToken, route: (ProgressToken, Peer<RoleServer>)) -> RouteGuard {
        self.routes.lock().insert(token.clone(), route);
        RouteGuard { relay: self.clone(), token }
    }
}

/// The gateway's client handler toward one upstream.
#[derive(Debug, Clone)]
pub struct UpstreamHandler {
    /// Where progress goes.
    pub relay: Arc<Relay>,
    /// The upstream's name (for logs).
    pub upstream: String,
}

impl ClientHandler for UpstreamHandler {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let route = self.relay.routes.lock().get(&params.progress_token).cloned();
        if let Some((token, peer)) = route {
            let mut p = params;
            p.progress_token = token;
            let _ = peer.notify_progress(p).await;
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let Some(gw) = self.relay.gateway.get().and_then(std::sync::Weak::upgrade) else { return };
        let upstream = self.upstream.clone();
        // Not in the notification's handler: re-listing asks the same connection.
        tokio::spawn(async move {
            match gw.refresh(&upstream).await {
                Ok(true) => tracing::info!(%upstream, "the upstream's tools changed: re-checked against the policy"),
                Ok(false) => {}
                Err(e) => tracing::warn!(%upstream, "the upstream's new tool list is not used: {e}"),
            }
        });
    }
}
