//! Attached mode: the gateway's transactions live on a Tidegate server (`[gateway] server`),
//! so every decision is in that server's ledger, its console and its attention queue.
//!
//! The gateway is then a client of the server's HTTP API (docs/server.md) on two sides:
//!
//! - **Turns** (the agent's side): a turn is `POST /v1/transactions`; a read is
//!   `POST …/reads`; an eager call is a *client-executed* effect (`execute: "client"`): the
//!   server records it (durable) and answers a ticket, the gateway calls the upstream and
//!   reports how it ended to the ticket's `result_url`; a held call is recorded and answered
//!   `queued`; the turn ends with `POST …/commit` (`seal: true`) or `POST …/abort`.
//! - **Work** (the server's side): each upstream is a *worker* capability
//!   `<name>.<upstream>` and each governed tool a registered tool `<name>.<upstream>.<tool>`
//!   naming it for `call` (held releases), `compensate` and `probe`. A loop long-polls
//!   `POST /v1/tasks/poll` and runs each task through the upstream with the same handlers the
//!   embedded engine uses ([`crate::gateway::run_operation`]), then reports it.
//!
//! Because compensations and releases reach the gateway as worker tasks, a turn that a killed
//! gateway left open is settled by the server when its lease ends, through whichever gateway
//! of the same name polls next.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::error::GatewayError;

/// A failed request to the server.
#[derive(Debug, Clone)]
pub enum RemoteError {
    /// No answer (refused connection, timeout, a body that is not JSON).
    Transport(String),
    /// An `application/problem+json` answer.
    Problem {
        /// HTTP status.
        status: u16,
        /// The problem's `code` (`transaction_aborted`, `invalid_field`, …).
        code: String,
        /// Its `detail`.
        detail: String,
        /// Its `transaction` member (an aborted transaction).
        transaction: Option<Value>,
    },
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Transport(m) => write!(f, "the Tidegate server did not answer: {m}"),
            RemoteError::Problem { status, code, detail, .. } => {
                write!(f, "the Tidegate server answered {status} {code}: {detail}")
            }
        }
    }
}

impl RemoteError {
    /// The aborted transaction the problem carries (`409 transaction_aborted`).
    pub fn aborted(&self) -> Option<&Value> {
        match self {
            RemoteError::Problem { code, transaction, .. } if code == "transaction_aborted" => transaction.as_ref(),
            _ => None,
        }
    }
}

/// The server an attached gateway uses.
pub struct Server {
    base: String,
    key: String,
    http: reqwest::Client,
    /// The gateway's name on the server (capability and tool prefix).
    pub name: String,
    /// This process's worker name in task leases.
    pub worker: String,
    /// How long the gateway keeps asking again when the server does not answer a request
    /// whose outcome it must learn (a ticket's result, a settlement, a task's report):
    /// `gateway.server_patience_ms`.
    patience: Duration,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the API key.
        f.debug_struct("Server")
            .field("base", &self.base)
            .field("name", &self.name)
            .field("worker", &self.worker)
            .finish()
    }
}

/// The largest answer the gateway reads from the server.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// How long a commit or an abort request waits for the settlement before polling on.
const SETTLE_WAIT_MS: u64 = 30_000;

impl Server {
    /// Connects to the server at `url` with the key in `$api_key_env`, and checks the key.
    pub async fn connect(settings: &crate::policy::AttachedSettings) -> Result<Arc<Server>, GatewayError> {
        let key = std::env::var(&settings.api_key_env).map_err(|_| {
            GatewayError::Serve(format!(
                "gateway.server is {} but ${} (gateway.api_key_env) is not set: it must hold an API key of the \
                 tenant (`tidegate keys create`, or the key `tidegate serve --bootstrap-tenant` prints)",
                settings.url, settings.api_key_env
            ))
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_millis(SETTLE_WAIT_MS + 30_000))
            .build()
            .map_err(|e| GatewayError::Serve(format!("cannot build the HTTP client: {e}")))?;
        let worker = format!("tidegate-mcp-{}-{}", settings.name, std::process::id());
        let server = Arc::new(Server {
            base: settings.url.clone(),
            key,
            http,
            name: settings.name.clone(),
            worker,
            patience: Duration::from_millis(settings.patience_ms),
        });
        server
            .send(Method::GET, "/v1/whoami", None)
            .await
            .map_err(|e| GatewayError::Serve(format!("gateway.server {}: {e}", settings.url)))?;
        Ok(server)
    }

    /// The capability that serves `upstream`'s tasks.
    pub fn capability(&self, upstream: &str) -> String {
        format!("{}.{upstream}", self.name)
    }

    /// The registered tool name of `upstream`'s `tool`.
    pub fn tool_name(&self, upstream: &str, tool: &str) -> String {
        format!("{}.{upstream}.{tool}", self.name)
    }

    /// One request; a 4xx/5xx answer is a [`RemoteError::Problem`].
    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<(u16, Value), RemoteError> {
        self.send_keyed(method, path, body, None).await
    }

    /// One request, with an `Idempotency-Key` when `key` is given (the server answers a repeat
    /// with the first answer, so the request can be sent again after a lost answer).
    pub async fn send_keyed(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Result<(u16, Value), RemoteError> {
        // Only paths on the configured server: a URL the server answers (a ticket's
        // `result_url`) never sends the API key anywhere else.
        let url = match path.strip_prefix(self.base.as_str()) {
            Some(rest) if rest.starts_with('/') => path.to_string(),
            _ if path.starts_with('/') => format!("{}{path}", self.base),
            _ => {
                return Err(RemoteError::Transport(format!(
                    "refusing to send to `{path}`: not a path on the configured server {}",
                    self.base
                )));
            }
        };
        let mut req = self.http.request(method, url).bearer_auth(&self.key);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let mut resp = req.send().await.map_err(|e| RemoteError::Transport(e.to_string()))?;
        let status = resp.status().as_u16();
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| RemoteError::Transport(e.to_string()))? {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(RemoteError::Transport(format!(
                    "answer {status} is over {MAX_ANSWER_BYTES} bytes; the gateway reads no more"
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        let v: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).map_err(|e| {
                RemoteError::Transport(clip(&format!(
                    "answer {status} is not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )))
            })?
        };
        if status >= 400 {
            let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            return Err(RemoteError::Problem {
                status,
                code: s("code"),
                detail: clip(&s("detail")),
                transaction: v.get("transaction").cloned(),
            });
        }
        Ok((status, v))
    }

    /// Sends `body` until the server answers it for good: a transport error, a 429, a 502-504
    /// or an `idempotency_key_in_progress` is sent again (with backoff, for up to
    /// `gateway.server_patience_ms`); the request must be one the server takes twice as once (an
    /// `Idempotency-Key`, a ticket's result, a task's report).
    async fn send_until_answered(
        &self,
        method: Method,
        path: &str,
        body: &Value,
        key: Option<&str>,
    ) -> Result<(u16, Value), RemoteError> {
        let deadline = tokio::time::Instant::now() + self.patience;
        let mut backoff = Duration::from_millis(100);
        loop {
            let r = self.send_keyed(method.clone(), path, Some(body), key).await;
            let again = match &r {
                Err(RemoteError::Transport(_)) => true,
                Err(RemoteError::Problem { status, code, .. }) => {
                    matches!(status, 429 | 502 | 503 | 504) || code == "idempotency_key_in_progress"
                }
                Ok(_) => false,
            };
            if !again || tokio::time::Instant::now() + backoff > deadline {
                return r;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// Registers the capabilities and tools the gateway serves (an equal definition is a
    /// no-op on the server).
    pub async fn register(&self, upstreams: &[String], tools: &[RemoteTool], task_lease_ms: u64) -> Result<(), String> {
        for u in upstreams {
            let cap = self.capability(u);
            self.send(
                Method::PUT,
                &format!("/v1/capabilities/{cap}"),
                Some(&json!({"kind": "worker", "task_lease_ms": task_lease_ms})),
            )
            .await
            .map_err(|e| format!("registering the capability `{cap}`: {e}"))?;
        }
        for t in tools {
            let cap = self.capability(&t.upstream);
            let mut def = json!({
                "class": t.class.as_str(),
                // Each call names its own scopes (the policy's templates); this one is the
                // registry's fallback and is never used by the gateway.
                "scopes": [format!("mcp:{}:{}", t.upstream, t.tool.replace('{', "{{").replace('}', "}}"))],
                "call": cap,
                "description": format!("MCP tool `{}` of upstream `{}` (tidegate-mcp `{}`)", t.tool, t.upstream, self.name),
            });
            if t.compensate {
                def["compensate"] = json!(cap);
            }
            if t.probe {
                def["probe"] = json!(cap);
            }
            let name = self.tool_name(&t.upstream, &t.tool);
            self.send(Method::PUT, &format!("/v1/tools/{name}"), Some(&def))
                .await
                .map_err(|e| format!("registering the tool `{name}`: {e}"))?;
        }
        Ok(())
    }

    /// Begins a transaction → its id.
    pub async fn begin(&self, agent: &str, lease_ms: u64) -> Result<String, RemoteError> {
        let (_, t) =
            self.send(Method::POST, "/v1/transactions", Some(&json!({"agent": agent, "lease_ms": lease_ms}))).await?;
        t.get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| RemoteError::Transport(format!("a begin answered without an id: {t}")))
    }

    /// Registers a read.
    pub async fn read(&self, tx: &str, scope: &str) -> Result<(), RemoteError> {
        self.send(Method::POST, &format!("/v1/transactions/{tx}/reads"), Some(&json!({"scope": scope}))).await?;
        Ok(())
    }

    /// Records an effect → the server's acknowledgement (`ack`, `output`, `result_url`).
    /// `request` (unique per call of the turn) is the request's `Idempotency-Key`, so a lost
    /// answer is asked for again instead of leaving a recorded effect the gateway never heard of.
    #[allow(clippy::too_many_arguments)]
    pub async fn effect(
        &self,
        tx: &str,
        tool: &str,
        args: &Value,
        key: Option<&str>,
        scopes: &[String],
        client_executed: bool,
        request: &str,
    ) -> Result<Value, RemoteError> {
        let mut body = json!({"tool": tool, "args": args, "scopes": scopes});
        if let Some(k) = key {
            body["key"] = json!(k);
        }
        if client_executed {
            body["execute"] = json!("client");
        }
        let path = format!("/v1/transactions/{tx}/effects");
        let (_, ack) = self.send_until_answered(Method::POST, &path, &body, Some(request)).await?;
        Ok(ack)
    }

    /// Reports how a ticket's call ended → the acknowledgement (`executed` with its output).
    /// A result is reported once and the server keeps its answer, so it is sent again until
    /// the server answers it.
    pub async fn report(&self, result_url: &str, result: &Value) -> Result<Value, RemoteError> {
        let (_, ack) = self.send_until_answered(Method::POST, result_url, result, None).await?;
        Ok(ack)
    }

    /// The transaction.
    pub async fn get(&self, tx: &str) -> Result<Value, RemoteError> {
        Ok(self.send(Method::GET, &format!("/v1/transactions/{tx}"), None).await?.1)
    }

    /// Waits for the transaction to settle (`settled`: a request's answer that may already
    /// be the settled transaction) → the settled transaction.
    async fn settled(&self, tx: &str, mut answer: (u16, Value)) -> Result<Value, RemoteError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        let mut backoff = Duration::from_millis(100);
        while answer.0 == 202 || answer.1.get("outcome").is_none() {
            if tokio::time::Instant::now() > deadline {
                return Err(RemoteError::Transport(format!("transaction {tx} did not settle within 600 s")));
            }
            let path = format!("/v1/transactions/{tx}/outcome?timeout_ms={SETTLE_WAIT_MS}");
            match self.send(Method::GET, &path, None).await {
                Ok(a) => {
                    answer = a;
                    backoff = Duration::from_millis(100);
                }
                // The transaction goes on settling on the server: ask again.
                Err(RemoteError::Transport(_)) | Err(RemoteError::Problem { status: 429 | 502..=504, .. }) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(answer.1)
    }

    /// Seals and commits → the settled transaction (committed or not).
    pub async fn commit(&self, tx: &str) -> Result<Value, RemoteError> {
        // A commit asked again waits for the same one (docs/server.md), so a lost answer is
        // asked for again.
        let body = json!({"seal": true, "wait_ms": SETTLE_WAIT_MS});
        let a = self.send_until_answered(Method::POST, &format!("/v1/transactions/{tx}/commit"), &body, None).await?;
        self.settled(tx, a).await
    }

    /// Aborts → the settled transaction.
    pub async fn abort(&self, tx: &str, reason: &str) -> Result<Value, RemoteError> {
        let reason: String = reason.chars().take(1000).collect();
        let body = json!({"reason": reason, "wait_ms": SETTLE_WAIT_MS});
        let a = self.send_until_answered(Method::POST, &format!("/v1/transactions/{tx}/abort"), &body, None).await?;
        self.settled(tx, a).await
    }

    /// Waits for an aborted transaction (from a problem) to settle.
    pub async fn settle_aborted(&self, tx: &str) -> Result<Value, RemoteError> {
        let now = self.send(Method::GET, &format!("/v1/transactions/{tx}"), None).await?;
        self.settled(tx, now).await
    }
}

/// A governed tool as the server knows it.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    /// The upstream.
    pub upstream: String,
    /// The upstream's tool name.
    pub tool: String,
    /// Its class.
    pub class: tidegate_runtime::EffectClass,
    /// Whether the policy gives it a compensation.
    pub compensate: bool,
    /// Whether the policy gives it a probe.
    pub probe: bool,
}

/// What a worker task's operation came to, as `POST /v1/tasks/{task}/report` takes it.
pub fn task_result(r: crate::gateway::OpResult) -> Value {
    use crate::gateway::OpResult;
    match r {
        OpResult::Done { output, residue } => {
            let mut v = json!({"status": "done", "output": output});
            if let Some(r) = residue {
                v["residue"] = json!(r);
            }
            v
        }
        OpResult::Failed(m) => json!({"status": "failed", "error": clip(&m)}),
        OpResult::Unknown(m) => json!({"status": "unknown", "error": clip(&m)}),
    }
}

/// `s`, cut to at most 4000 bytes (the server's error texts are bounded).
pub(crate) fn clip(s: &str) -> String {
    if s.len() <= 4000 {
        return s.to_string();
    }
    let mut end = 4000;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Runs one leased task through the gateway's upstreams and reports it. A `call` or
/// `release` task offered again (its `attempt` is above 1: an earlier lease ended without a
/// report) is never run again: an MCP call carries no idempotency key, so the gateway reports
/// its outcome `unknown` and the server's probe (or the engine's rule for an unknown outcome)
/// decides. The lease is renewed while the operation runs; the report is sent again until the
/// server answers it.
async fn run_task(gw: &crate::Gateway, server: &Server, task: &Value) {
    let s = |k: &str| task.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let (id, op, tool) = (s("id"), s("operation"), s("tool"));
    let attempt = task.get("attempt").and_then(Value::as_u64).unwrap_or(1);
    let args = task.get("args").cloned().unwrap_or(Value::Null);
    let output = task.get("output").cloned().unwrap_or(Value::Null);
    let result = if matches!(op.as_str(), "call" | "release") && attempt > 1 {
        crate::gateway::OpResult::Unknown(format!(
            "`{tool}` was leased before (attempt {attempt}) and its outcome was never reported; the gateway \
             does not call it again"
        ))
    } else {
        let beat = Duration::from_millis(gw.policy.gateway.call_timeout_ms.max(3_000) / 3);
        let run = gw.run_operation(&tool, &op, &args, &output);
        tokio::pin!(run);
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = tokio::time::sleep(beat) => {
                    let body = json!({"worker": server.worker});
                    if let Err(e) = server.send(Method::POST, &format!("/v1/tasks/{id}/heartbeat"), Some(&body)).await {
                        tracing::warn!(task = %id, "renewing the lease of {op} of `{tool}`: {e}");
                    }
                }
            }
        }
    };
    let body = json!({"worker": server.worker, "result": task_result(result)});
    match server.send_until_answered(Method::POST, &format!("/v1/tasks/{id}/report"), &body, None).await {
        Ok(_) => {}
        // Settled already (a report that got through before), or no longer this worker's.
        Err(RemoteError::Problem { status: 409, code, .. }) => {
            tracing::info!(task = %id, "the report of {op} of `{tool}` was not needed: {code}");
        }
        Err(e) => tracing::warn!(task = %id, "reporting {op} of `{tool}`: {e}"),
    }
}

/// Most tasks leased per poll.
const POLL_BATCH: usize = 16;
/// Most tasks an attached gateway runs at once.
pub const MAX_RUNNING_TASKS: usize = 64;

/// Long-polls the server for the tasks of `capabilities` and runs each through `gw`'s
/// upstreams until `stop` is cancelled. The tasks already running go on to their report
/// ([`crate::Gateway::shutdown`] waits for them, holding every permit of `room`).
pub fn spawn_worker(
    gw: std::sync::Weak<crate::Gateway>,
    server: Arc<Server>,
    capabilities: Vec<String>,
    stop: tokio_util::sync::CancellationToken,
    room: Arc<tokio::sync::Semaphore>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // At most MAX_RUNNING_TASKS run at once (`room`): a poll waits for room, so a server
        // that keeps offering work never makes the gateway start unbounded upstream calls.
        let mut backoff = Duration::from_millis(200);
        let poll =
            json!({"worker": server.worker, "capabilities": capabilities, "max_tasks": POLL_BATCH, "wait_ms": 10_000});
        loop {
            let mut free = tokio::select! {
                _ = stop.cancelled() => return,
                p = room.clone().acquire_many_owned(POLL_BATCH as u32) => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let got = tokio::select! {
                _ = stop.cancelled() => return,
                r = server.send(Method::POST, "/v1/tasks/poll", Some(&poll)) => r,
            };
            // The batch's room is given back task by task as each one ends.
            let mut permits: Vec<_> = (0..POLL_BATCH).filter_map(|_| free.split(1)).collect();
            drop(free);
            let tasks = match got {
                Ok((_, v)) => {
                    backoff = Duration::from_millis(200);
                    v.get("tasks").and_then(Value::as_array).cloned().unwrap_or_default()
                }
                Err(e) => {
                    tracing::warn!("polling the server for tasks: {e}; again in {} ms", backoff.as_millis());
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            for task in tasks {
                let Some(g) = gw.upgrade() else { return };
                let server = server.clone();
                let permit = permits.pop();
                // A task runs to its end and is reported even when the gateway stops: a call
                // cut off halfway would be an outcome nobody learns.
                tokio::spawn(async move {
                    let _permit = permit;
                    run_task(&g, &server, &task).await;
                });
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server {
            base: "http://127.0.0.1:9".into(),
            key: "tg_secret".into(),
            http: reqwest::Client::new(),
            name: "mcp".into(),
            worker: "w".into(),
            patience: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn the_api_key_goes_only_to_the_configured_server() {
        let s = server();
        for elsewhere in ["http://evil.example/v1/x", "http://127.0.0.1:99/v1/x", "http://127.0.0.1:9.evil/v1", "v1/x"]
        {
            match s.send(Method::POST, elsewhere, None).await {
                Err(RemoteError::Transport(m)) => assert!(m.contains("refusing"), "{elsewhere}: {m}"),
                other => panic!("{elsewhere}: {other:?}"),
            }
        }
        // A path on it is sent (and fails only because nothing listens on port 9).
        match s.send(Method::GET, "http://127.0.0.1:9/v1/whoami", None).await {
            Err(RemoteError::Transport(m)) => assert!(!m.contains("refusing"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn task_results_are_bounded_and_shaped_as_the_server_takes_them() {
        let long = "x".repeat(10_000);
        let v = task_result(crate::gateway::OpResult::Failed(long));
        assert_eq!(v["status"], "failed");
        assert!(v["error"].as_str().is_some_and(|e| e.len() <= 4004));
        let v = task_result(crate::gateway::OpResult::Done { output: json!({"a": 1}), residue: Some("fee".into()) });
        assert_eq!(v, json!({"status": "done", "output": {"a": 1}, "residue": "fee"}));
    }
}
