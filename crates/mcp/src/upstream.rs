//! One upstream MCP server: started (stdio) and initialised, its tools listed, and calls to it
//! bounded in time and classified by what is known of their outcome.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam, ClientRequest, ServerResult,
    Tool,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::policy::{Transport, UpstreamSpec};
use crate::relay::{Relay, UpstreamHandler};
use crate::template::answer_text;

/// How long starting and initialising an upstream may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What an upstream call came to.
#[derive(Debug, Clone)]
pub enum Called {
    /// The tool answered (not an error): its `tools/call` result as JSON.
    Done(Value),
    /// The tool answered with an error (`isError`), or the request was refused as a
    /// request: it did not take effect.
    Failed(String),
    /// No answer (the upstream died, the connection broke, the call timed out): it may or may
    /// not have taken effect.
    Unknown(String),
}

/// A connected upstream.
#[derive(Debug)]
pub struct Upstream {
    /// Its name in the policy.
    pub name: String,
    peer: Peer<RoleClient>,
    service: Mutex<Option<RunningService<RoleClient, UpstreamHandler>>>,
    relay: Arc<Relay>,
    /// Its tools, as it listed them at start.
    pub tools: Vec<Tool>,
    timeout: Duration,
}

impl Upstream {
    /// Starts and initialises `spec`, and lists its tools.
    pub async fn connect(
        spec: &UpstreamSpec,
        timeout: Duration,
        relay: Arc<Relay>,
    ) -> Result<Arc<Upstream>, GatewayError> {
        let handler = UpstreamHandler { relay: relay.clone(), upstream: spec.name.clone() };
        let fail = |why: String| GatewayError::Upstream { upstream: spec.name.clone(), message: why };
        let service = match &spec.transport {
            Transport::Stdio { command, args, env, cwd } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env).kill_on_drop(true);
                if let Some(dir) = cwd {
                    cmd.current_dir(dir);
                }
                let (proc, _stderr) = TokioChildProcess::builder(cmd)
                    .stderr(Stdio::inherit())
                    .spawn()
                    .map_err(|e| fail(format!("cannot start `{command}`: {e}")))?;
                tokio::time::timeout(START_TIMEOUT, handler.serve(proc))
                    .await
                    .map_err(|_| fail(format!("did not initialise within {} s", START_TIMEOUT.as_secs())))?
                    .map_err(|e| fail(format!("initialisation failed: {e}")))?
            }
            Transport::Http { url } => {
                let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.as_str());
                tokio::time::timeout(START_TIMEOUT, handler.serve(transport))
                    .await
                    .map_err(|_| fail(format!("{url} did not initialise within {} s", START_TIMEOUT.as_secs())))?
                    .map_err(|e| fail(format!("{url}: initialisation failed: {e}")))?
            }
        };
        let peer = service.peer().clone();
        let tools = tokio::time::timeout(START_TIMEOUT, peer.list_all_tools())
            .await
            .map_err(|_| fail("did not list its tools in time".into()))?
            .map_err(|e| fail(format!("tools/list failed: {e}")))?;
        Ok(Arc::new(Upstream {
            name: spec.name.clone(),
            peer,
            service: Mutex::new(Some(service)),
            relay,
            tools,
            timeout,
        }))
    }

    /// Lists the upstream's tools now (after it said its list changed).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, String> {
        match tokio::time::timeout(self.timeout, self.peer.list_all_tools()).await {
            Err(_) => Err(format!("upstream `{}` did not list its tools in time", self.name)),
            Ok(r) => r.map_err(|e| format!("upstream `{}`: tools/list: {e}", self.name)),
        }
    }

    /// The peer, for passing through what the gateway does not govern.
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// Calls `tool` with `args` (an object), within the call timeout.
    pub async fn call(&self, tool: &str, args: Value) -> Called {
        self.call_until(tool, args, None).await
    }

    /// Calls `tool`, giving up when `cancel` fires: the upstream is then told
    /// (`notifications/cancelled` with the request's id) and the answer is a failure saying
    /// the agent cancelled it. Only calls whose outcome the turn does not need (reads) are
    /// given a `cancel`: an effect runs to its end.
    pub async fn call_until(&self, tool: &str, args: Value, cancel: Option<CancellationToken>) -> Called {
        let arguments = match args {
            Value::Object(m) => Some(m),
            Value::Null => None,
            other => return Called::Failed(format!("arguments of `{tool}` must be an object, got {other}")),
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        // Sampling, elicitation and log messages the upstream sends during the call go to the
        // agent it is made for.
        let _busy = self.relay.busy(&self.name);
        let call = async {
            let route = Relay::current();
            if route.is_none() && cancel.is_none() {
                return self.peer.call_tool(params).await.map(Some);
            }
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let handle = self.peer.send_request_with_option(request, PeerRequestOptions::no_options()).await?;
            // The agent asked for progress: route the upstream's progress for the token rmcp
            // sent with the request back to the agent while the call runs.
            let _route = route.map(|r| self.relay.register(handle.progress_token.clone(), r));
            let id = handle.id.clone();
            let answer = async {
                match handle.await_response().await? {
                    ServerResult::CallToolResult(r) => Ok(Some(r)),
                    _ => Err(ServiceError::UnexpectedResponse),
                }
            };
            match &cancel {
                None => answer.await,
                Some(ct) => tokio::select! {
                    r = answer => r,
                    _ = ct.cancelled() => {
                        let note = CancelledNotificationParam::new(Some(id), Some("the agent cancelled the call".into()));
                        let _ = self.peer.notify_cancelled(note).await;
                        Ok(None)
                    }
                },
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Called::Unknown(format!(
                "upstream `{}` did not answer `{tool}` within {} ms",
                self.name,
                self.timeout.as_millis()
            )),
            Ok(Ok(Some(result))) => classify(result),
            Ok(Ok(None)) => {
                Called::Failed(format!("`{tool}` was cancelled by the agent; upstream `{}` was told", self.name))
            }
            Ok(Err(ServiceError::McpError(e))) => {
                Called::Failed(format!("upstream `{}` refused `{tool}`: {} ({})", self.name, e.message, e.code.0))
            }
            Ok(Err(e)) => Called::Unknown(format!("upstream `{}` did not answer `{tool}`: {e}", self.name)),
        }
    }

    /// Closes the connection (and ends a child process).
    pub async fn close(&self) {
        let service = self.service.lock().take();
        if let Some(mut s) = service {
            let _ = s.close_with_timeout(Duration::from_secs(5)).await;
        }
    }
}

fn classify(result: CallToolResult) -> Called {
    let json = serde_json::to_value(&result).unwrap_or(Value::Null);
    if result.is_error == Some(true) {
        let text = answer_text(&json);
        Called::Failed(if text.is_empty() { "the tool reported an error".into() } else { text })
    } else {
        Called::Done(json)
    }
}

/// A tool result's text, for logs.
pub fn summary(r: &CallToolResult) -> String {
    answer_text(&serde_json::to_value(r).unwrap_or(Value::Null))
}
