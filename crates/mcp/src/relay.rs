//! What an upstream sends toward the agent: progress, log messages, sampling and elicitation
//! requests made during a call, and resource updates.
//!
//! **Calls in flight.** Every upstream call made for an agent's request runs with the agent's
//! connection in a task-local ([`AGENT`]); the relay keeps, per upstream, which sessions have
//! calls in flight there. A sampling or elicitation request, or a log message, that an upstream
//! sends is relayed to the one session with calls in flight on it; with none, or with several
//! (the protocol's messages do not say which call they belong to), a request is refused with
//! that reason and a log message is dropped.
//!
//! **Subscriptions.** A session's `resources/subscribe` is passed to the upstream that accepts
//! it and remembered here; the upstream's `notifications/resources/updated` goes to every
//! session subscribed to the URI; the last session's unsubscribe (or end) unsubscribes upstream.
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
    /// The session (its number) and the agent's connection of the call being served.
    pub static AGENT: (u64, Peer<RoleServer>);
}

/// Who has calls in flight on one upstream: (guard number, the session and its agent, or
/// `None` for a call made for no agent: a release, a compensation, a worker task).
type Busy = Vec<(u64, Option<(u64, Peer<RoleServer>)>)>;

/// One subscribed URI: the upstream that accepted it, and the sessions (number, agent).
type Subscribers = (String, Vec<(u64, Peer<RoleServer>)>);

/// The routes of the calls in flight.
#[derive(Debug, Default)]
pub struct Relay {
    /// The gateway, once built (for re-reading an upstream's tools).
    pub gateway: std::sync::OnceLock<std::sync::Weak<crate::gateway::Gateway>>,
    routes: Mutex<HashMap<ProgressToken, (ProgressToken, Peer<RoleServer>)>>,
    busy: Mutex<HashMap<String, Busy>>,
    guards: std::sync::atomic::AtomicU64,
    /// URI → the sessions subscribed to it (session number, agent), and the upstream that
    /// accepted the subscription.
    subscriptions: Mutex<HashMap<String, Subscribers>>,
    /// The least severity each session asked for (`logging/setLevel`), as a rank.
    levels: Mutex<HashMap<u64, u8>>,
}

/// A log level's rank: debug 0 … emergency 7.
#[allow(deprecated)] // logging is deprecated by SEP-2577; clients before 2026-07-28 still use it
pub fn level_rank(level: rmcp::model::LoggingLevel) -> u8 {
    use rmcp::model::LoggingLevel as L;
    match level {
        L::Debug => 0,
        L::Info => 1,
        L::Notice => 2,
        L::Warning => 3,
        L::Error => 4,
        L::Critical => 5,
        L::Alert => 6,
        L::Emergency => 7,
    }
}

/// Takes a call off an upstream's calls in flight when it ends, however it ends.
#[derive(Debug)]
pub struct BusyGuard {
    relay: Arc<Relay>,
    upstream: String,
    id: u64,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let mut busy = self.relay.busy.lock();
        if let Some(list) = busy.get_mut(&self.upstream) {
            list.retain(|(g, _)| *g != self.id);
            if list.is_empty() {
                busy.remove(&self.upstream);
            }
        }
    }
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

    /// Marks a call in flight on `upstream` until the guard drops: the current agent's
    /// ([`AGENT`]), or a call made for no agent (a release, a compensation, a worker task),
    /// which makes what the upstream sends meanwhile unattributable.
    pub fn busy(self: &Arc<Relay>, upstream: &str) -> BusyGuard {
        let agent = AGENT.try_with(|a| a.clone()).ok();
        let id = self.guards.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.busy.lock().entry(upstream.to_string()).or_default().push((id, agent));
        BusyGuard { relay: self.clone(), upstream: upstream.to_string(), id }
    }

    /// Sets the least severity relayed to `session` (`None`: forget it, the session ended).
    pub fn set_level(&self, session: u64, rank: Option<u8>) {
        match rank {
            Some(r) => self.levels.lock().insert(session, r),
            None => self.levels.lock().remove(&session),
        };
    }

    /// The agent whose call `upstream` is serving: the one session with calls in flight there.
    pub fn agent_for(&self, upstream: &str) -> Result<Peer<RoleServer>, String> {
        self.agent_session_for(upstream).map(|(_, p)| p)
    }

    fn agent_session_for(&self, upstream: &str) -> Result<(u64, Peer<RoleServer>), String> {
        let busy = self.busy.lock();
        let list = busy.get(upstream).map(Vec::as_slice).unwrap_or_default();
        if list.iter().any(|(_, a)| a.is_none()) {
            return Err(format!(
                "tidegate-mcp: upstream `{upstream}` is running a call made for no agent (a release or a \
                 compensation); the request cannot be attributed, so no agent is asked"
            ));
        }
        let mut sessions: Vec<u64> = list.iter().filter_map(|(_, a)| a.as_ref().map(|(s, _)| *s)).collect();
        sessions.sort_unstable();
        sessions.dedup();
        match (sessions.len(), list.first()) {
            (1, Some((_, Some((session, peer))))) => Ok((*session, peer.clone())),
            (0, _) | (_, None) | (1, _) => {
                Err(format!("tidegate-mcp: no agent call is in flight on upstream `{upstream}` to ask"))
            }
            (n, _) => Err(format!(
                "tidegate-mcp: {n} agents have calls in flight on upstream `{upstream}`; the request does not say \
                 whose call it belongs to, so none is asked"
            )),
        }
    }

    /// How many URIs `session` is subscribed to.
    pub fn subscriptions_of(&self, session: u64) -> usize {
        self.subscriptions.lock().values().filter(|(_, l)| l.iter().any(|(s, _)| *s == session)).count()
    }

    /// Remembers `session`'s subscription to `uri`, accepted by `upstream`. Returns whether
    /// the URI had no subscriber before.
    pub fn subscribe(&self, uri: &str, upstream: &str, session: u64, peer: Peer<RoleServer>) -> bool {
        let mut subs = self.subscriptions.lock();
        let entry = subs.entry(uri.to_string()).or_insert_with(|| (upstream.to_string(), Vec::new()));
        let first = entry.1.is_empty();
        if !entry.1.iter().any(|(s, _)| *s == session) {
            entry.1.push((session, peer));
        }
        first
    }

    /// The upstream subscribed to `uri`, if any session is.
    pub fn subscribed_upstream(&self, uri: &str) -> Option<String> {
        self.subscriptions.lock().get(uri).map(|(u, _)| u.clone())
    }

    /// Forgets `session`'s subscription to `uri` (every URI when `uri` is `None`). Returns the
    /// (URI, upstream) pairs no session is subscribed to any more.
    pub fn unsubscribe(&self, uri: Option<&str>, session: u64) -> Vec<(String, String)> {
        let mut subs = self.subscriptions.lock();
        let mut gone = Vec::new();
        subs.retain(|u, (up, list)| {
            if uri.is_none_or(|x| x == u) {
                list.retain(|(s, _)| *s != session);
            }
            if list.is_empty() {
                gone.push((u.clone(), up.clone()));
                false
            } else {
                true
            }
        });
        gone
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

fn as_mcp(e: rmcp::service::ServiceError) -> rmcp::ErrorData {
    match e {
        rmcp::service::ServiceError::McpError(e) => e,
        other => rmcp::ErrorData::internal_error(format!("the agent did not answer: {other}"), None),
    }
}

impl ClientHandler for UpstreamHandler {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        // The gateway relays sampling and elicitation to the agent whose call is in flight,
        // so it declares both to its upstreams; an agent that cannot answer makes the
        // upstream's request fail with the agent's error.
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.sampling = Some(Default::default());
        capabilities.elicitation = Some(Default::default());
        rmcp::model::ClientConfig::new(
            capabilities,
            rmcp::model::Implementation::new("tidegate-mcp", env!("CARGO_PKG_VERSION")),
        )
    }

    // Sampling is deprecated by SEP-2577; clients before 2026-07-28 still answer it.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let peer = self.relay.agent_for(&self.upstream).map_err(|m| rmcp::ErrorData::invalid_request(m, None))?;
        peer.create_message(params).await.map_err(as_mcp)
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        let peer = self.relay.agent_for(&self.upstream).map_err(|m| rmcp::ErrorData::invalid_request(m, None))?;
        peer.create_elicitation(request).await.map_err(as_mcp)
    }

    // Logging is deprecated by SEP-2577; clients before 2026-07-28 still use it.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // Relayed to the agent whose call is in flight, at or above the level it set (every
        // level if it set none).
        if let Ok((session, peer)) = self.relay.agent_session_for(&self.upstream) {
            let least = self.relay.levels.lock().get(&session).copied().unwrap_or(0);
            if level_rank(params.level) < least {
                return;
            }
            let _ = peer.notify_logging_message(params).await;
        }
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let to: Vec<Peer<RoleServer>> = self
            .relay
            .subscriptions
            .lock()
            .get(&params.uri)
            .filter(|(up, _)| *up == self.upstream)
            .map(|(_, list)| list.iter().map(|(_, p)| p.clone()).collect())
            .unwrap_or_default();
        for peer in to {
            let _ = peer.notify_resource_updated(params.clone()).await;
        }
    }

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
