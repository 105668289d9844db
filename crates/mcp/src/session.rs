//! One agent session: the MCP server the agent talks to, and its turns.
//!
//! A turn is one transaction (docs/mcp.md). It begins with the first governed call after the
//! previous turn ended, and ends with `tidegate_commit`, `tidegate_abort`, the idle timer
//! (`turn.on_idle`), or the session's end (always an abort). Calls of one session are
//! handled one at a time, in the order they arrive, so a turn's end never races one of its
//! calls.

use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult, ContentBlock,
    GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{ElicitationError, RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::{Map, Value, json};
use tidegate_runtime::EffectClass;

use crate::gateway::{
    ABORT_TOOL, COMMIT_TOOL, EffectTool, Exposed, Gateway, Kind, ReleaseSlot, STATUS_TOOL, snapshot_value,
};
use crate::policy::{OnIdle, TurnMode};
use crate::template::Inputs;
use crate::turn::{Acked, Settled, TurnError, TurnTx};
use crate::upstream::Called;

/// The largest arguments object the gateway forwards, in bytes of JSON.
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;

struct Note {
    tool: String,
    class: Option<EffectClass>,
    slot: Option<Arc<ReleaseSlot>>,
    /// The task a held call answered with (the client declared the tasks extension).
    task: Option<String>,
}

/// The most tasks a session keeps; the oldest settled ones go first.
pub const MAX_TASKS_PER_SESSION: usize = 1024;

tokio::task_local! {
    /// Set while a `tools/call` of a client that declared the tasks extension runs: a held
    /// call puts the id of the task it answers with here.
    static HELD_TASK: Arc<parking_lot::Mutex<Option<String>>>;
    /// The request's cancellation (the agent's `notifications/cancelled`): a read forwards it
    /// to its upstream; an effect runs to its end.
    static CANCEL: tokio_util::sync::CancellationToken;
    /// The approval record of a call approved through the input-required flow (2026-07-28).
    static APPROVED: Value;
}

/// The most bytes of arguments (as pretty JSON) an approval shows; larger ones are refused,
/// since a person approves only what is shown.
pub const MAX_APPROVAL_TEXT: usize = 8000;

/// The most calls one turn holds; the next is refused until the turn ends.
pub const MAX_CALLS_PER_TURN: usize = 10_000;

/// The most resources a session may follow (`resources/subscribe`).
pub const MAX_SUBSCRIPTIONS_PER_SESSION: usize = 256;

/// The most approvals a session keeps waiting for an answer (input-required flow).
pub const MAX_PENDING_APPROVALS: usize = 64;

/// An approval asked through the input-required flow, waiting for the client's retry.
#[derive(Debug)]
struct PendingApproval {
    name: String,
    digest: String,
    asked_ms: u64,
    expires: Instant,
}

/// Where the input-required flow leaves a call.
enum ApprovalStep {
    /// Answer `input_required`, asking the person.
    Ask(rmcp::model::InputRequiredResult),
    /// A tool error: nothing is called.
    Refused(String),
    /// Approved: the record goes into the ledger with the call.
    Approved(Value),
}

/// A held call's task (the tasks extension): working until its turn ends.
#[derive(Debug, Clone)]
struct TaskEntry {
    task: rmcp::model::Task,
    payload: rmcp::model::TaskPayload,
}

struct Turn {
    tx: TurnTx,
    notes: Vec<Note>,
}

/// One agent session (one stdio connection, or one HTTP session).
pub struct Session {
    gw: Arc<Gateway>,
    /// The agent's connection, for asking it (approvals).
    peer: parking_lot::Mutex<Option<rmcp::Peer<RoleServer>>>,
    id: u64,
    turn: tokio::sync::Mutex<Option<Turn>>,
    last_call: parking_lot::Mutex<Instant>,
    turns: std::sync::atomic::AtomicU64,
    tasks: parking_lot::Mutex<std::collections::BTreeMap<u64, TaskEntry>>,
    next_task: std::sync::atomic::AtomicU64,
    approvals: parking_lot::Mutex<std::collections::HashMap<String, PendingApproval>>,
    /// Set once the session ended: no turn begins after it.
    ended: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("id", &self.id).finish()
    }
}

/// The MCP server handler of one session. Dropping the last handle of a session aborts its
/// open turn.
#[derive(Debug, Clone)]
pub struct SessionHandler {
    session: Arc<SessionGuard>,
    http: bool,
}

#[derive(Debug)]
struct SessionGuard(Arc<Session>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let s = self.0.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { s.end("the agent's session ended").await });
        }
    }
}

impl SessionHandler {
    /// A new session on `gw`, with its idle timer.
    pub fn new(gw: Arc<Gateway>) -> SessionHandler {
        let id = gw.next_session();
        let session = Arc::new(Session {
            gw,
            peer: parking_lot::Mutex::new(None),
            id,
            turn: tokio::sync::Mutex::new(None),
            last_call: parking_lot::Mutex::new(Instant::now()),
            turns: Default::default(),
            tasks: Default::default(),
            next_task: Default::default(),
            approvals: Default::default(),
            ended: Default::default(),
        });
        session.gw.track(&session);
        if session.gw.policy.turn.mode == TurnMode::Turn {
            tokio::spawn(idle_timer(Arc::downgrade(&session)));
        }
        SessionHandler { session: Arc::new(SessionGuard(session)), http: false }
    }

    /// This handler for an HTTP session: it negotiates only the revisions that have sessions.
    pub fn http(mut self) -> SessionHandler {
        self.http = true;
        self
    }

    /// The session.
    pub fn session(&self) -> &Arc<Session> {
        &self.session.0
    }
}

async fn idle_timer(session: Weak<Session>) {
    loop {
        let (idle, last) = match session.upgrade() {
            Some(s) => (Duration::from_millis(s.gw.policy.turn.idle_ms), *s.last_call.lock()),
            None => return,
        };
        let due = last + idle;
        tokio::time::sleep_until(due.into()).await;
        let Some(s) = session.upgrade() else { return };
        if *s.last_call.lock() + idle > Instant::now() {
            continue;
        }
        let mut turn = s.turn.lock().await;
        if turn.is_some() && *s.last_call.lock() + idle <= Instant::now() {
            let t = turn.take().expect("checked");
            match s.gw.policy.turn.on_idle {
                OnIdle::Commit => {
                    let _ = commit_turn(&s, t).await;
                }
                OnIdle::Abort => {
                    let _ = abort_turn(&s, t, &format!("idle for {} ms", idle.as_millis())).await;
                }
            }
        }
        drop(turn);
        *s.last_call.lock() = Instant::now();
    }
}

/// Whether an upstream takes resource subscriptions.
fn subscribes(c: &ServerCapabilities) -> bool {
    c.resources.as_ref().and_then(|r| r.subscribe).unwrap_or(false)
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn text(t: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(t)])
}

fn tool_error(t: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(t)])
}

impl Session {
    /// Tells the agent that the tool list changed (an upstream's did, and the policy accepted it).
    pub async fn notify_tool_list_changed(&self) {
        let peer = self.peer.lock().clone();
        if let Some(p) = peer {
            let _ = p.notify_tool_list_changed().await;
        }
    }

    /// Aborts the open turn, if any (the session is going away), and drops its subscriptions.
    pub async fn end(&self, why: &str) {
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        self.unsubscribe(None).await;
        self.gw.relay.set_level(self.id, None);
        // The lock is held until the abort is done, so that whoever else ends the session
        // (its handler's drop, the stdio loop) returns only once the turn is settled.
        let mut guard = self.turn.lock().await;
        if let Some(t) = guard.take() {
            let r = abort_turn(self, t, why).await;
            tracing::info!(session = self.id, outcome = %crate::upstream::summary(&r), "session ended: its open turn aborted");
        }
    }

    async fn call(&self, name: &str, args: Value) -> CallToolResult {
        *self.last_call.lock() = Instant::now();
        let mut guard = self.turn.lock().await;
        let result = match name {
            COMMIT_TOOL => match guard.take() {
                Some(t) => commit_turn(self, t).await,
                None => text("nothing to commit: no call was made since the last turn ended"),
            },
            ABORT_TOOL => {
                let reason =
                    args.get("reason").and_then(Value::as_str).unwrap_or("the agent aborted its turn").to_string();
                match guard.take() {
                    Some(t) => abort_turn(self, t, &reason).await,
                    None => text("nothing to abort: no call was made since the last turn ended"),
                }
            }
            STATUS_TOOL => text(status(&guard)),
            _ => self.governed(&mut guard, name, args).await,
        };
        *self.last_call.lock() = Instant::now();
        result
    }

    async fn governed(&self, guard: &mut Option<Turn>, name: &str, args: Value) -> CallToolResult {
        let catalog = self.gw.exposed();
        let Some(exposed) = catalog.get(name) else {
            return tool_error(format!("no tool `{name}`"));
        };
        let upstream = &self.gw.upstreams[exposed.upstream];
        match &exposed.kind {
            Kind::Refused(why) => tool_error(why.clone()),
            Kind::Read { scopes } => {
                let scopes = match render_scopes(scopes, &args) {
                    Ok(s) => s,
                    Err(e) => return tool_error(format!("`{name}`: {e}")),
                };
                let turn = match self.open_turn(guard).await {
                    Ok(t) => t,
                    Err(e) => return tool_error(e),
                };
                for s in &scopes {
                    if let Err(e) = turn.tx.read(s).await {
                        return self.failed(guard, name, e).await;
                    }
                }
                turn.notes.push(Note { tool: name.to_string(), class: None, slot: None, task: None });
                let cancel = CANCEL.try_with(|c| c.clone()).ok();
                let result = match upstream.call_until(&exposed.tool, args, cancel).await {
                    Called::Done(v) => serde_json::from_value(v).unwrap_or_else(|e| tool_error(format!("{e}"))),
                    Called::Failed(m) => tool_error(m),
                    Called::Unknown(m) => tool_error(format!("no answer from the upstream: {m}")),
                };
                self.per_call_end(guard, result).await
            }
            Kind::Effect(e) => {
                let result = self.effect(guard, name, exposed, e, &upstream.name, args).await;
                self.per_call_end(guard, result).await
            }
        }
    }

    async fn effect(
        &self,
        guard: &mut Option<Turn>,
        name: &str,
        exposed: &Exposed,
        e: &EffectTool,
        upstream: &str,
        args: Value,
    ) -> CallToolResult {
        let scopes = match render_scopes(&e.scopes, &args) {
            Ok(s) => s,
            Err(err) => return tool_error(format!("`{name}`: {err}; nothing was called")),
        };
        let key = match &e.key {
            Some(k) => match k.render_one(&Inputs { args: &args, result: None, snapshot: None }) {
                Ok(k) => Some(k),
                Err(err) => return tool_error(format!("`{name}`: its key: {err}; nothing was called")),
            },
            None => None,
        };
        let approval = if e.approval {
            match self.approve(name, &args).await {
                Ok(record) => Some(record),
                Err(why) => return tool_error(format!("{why}; nothing was called")),
            }
        } else {
            None
        };
        let snapshot = match &e.snapshot {
            Some(spec) => {
                let sargs = match spec.render(&Inputs { args: &args, result: None, snapshot: None }) {
                    Ok(a) => a,
                    Err(err) => return tool_error(format!("`{name}`: its snapshot: {err}; nothing was called")),
                };
                let up = self.gw.upstreams.iter().find(|u| u.name == upstream).expect("the tool's upstream");
                match up.call(&spec.tool, sargs).await {
                    Called::Unknown(m) => {
                        return tool_error(format!(
                            "`{name}`: the snapshot `{}` got no answer ({m}); nothing was called",
                            spec.tool
                        ));
                    }
                    c => snapshot_value(&c),
                }
            }
            None => Value::Null,
        };
        let turn = match self.open_turn(guard).await {
            Ok(t) => t,
            Err(err) => return tool_error(err),
        };
        let mut envelope = Map::new();
        envelope.insert("arguments".into(), args);
        if !snapshot.is_null() {
            envelope.insert("snapshot".into(), snapshot);
        }
        if let Some(a) = approval {
            envelope.insert("approval".into(), a);
        }
        let slot = Arc::new(ReleaseSlot::default());
        let tx = turn.tx.clone();
        match tx.effect(&self.gw, exposed, e, Value::Object(envelope), key, scopes, slot.clone()).await {
            Ok(Acked::Ran(output)) => {
                turn.notes.push(Note { tool: name.to_string(), class: Some(e.class), slot: None, task: None });
                serde_json::from_value(output).unwrap_or_else(|err| tool_error(format!("{err}")))
            }
            Ok(Acked::Held) => {
                // A client that declared the tasks extension gets a task it can poll.
                let task = HELD_TASK.try_with(|t| t.clone()).ok().map(|wanted| {
                    let id = self.open_task(name);
                    *wanted.lock() = Some(id.clone());
                    id
                });
                turn.notes.push(Note { tool: name.to_string(), class: Some(e.class), slot: Some(slot), task });
                text(format!(
                    "queued: `{name}` has not run yet; it runs when this turn commits (call `{COMMIT_TOOL}`), \
                     and never if the turn aborts"
                ))
            }
            Err(err) => self.failed(guard, name, err).await,
        }
    }

    /// Asks the agent's user to approve this exact call (the protocol's elicitation). The
    /// request names the tool, its arguments, their digest, the policy's version and when it
    /// expires; the record of the approval goes into the ledger with the call.
    async fn approve(&self, name: &str, args: &Value) -> Result<Value, String> {
        if let Ok(record) = APPROVED.try_with(Value::clone) {
            return Ok(record);
        }
        let Some(peer) = self.peer.lock().clone() else {
            return Err(format!("`{name}` needs a person's approval, and there is no client connection to ask"));
        };
        let policy = &self.gw.policy;
        let (digest, message, timeout) = self.approval_request(name, args)?;
        let asked = crate::time_ms();
        let why = match peer.elicit_with_timeout::<Approval>(message, Some(timeout)).await {
            Ok(Some(Approval { approve: true })) => {
                return Ok(json!({
                    "digest": digest, "policy": policy.version, "asked_at_ms": asked, "approved_at_ms": crate::time_ms(),
                }));
            }
            Ok(_) => "was not approved".to_string(),
            Err(ElicitationError::UserDeclined) => "was declined".to_string(),
            Err(ElicitationError::UserCancelled) => "was cancelled by the user".to_string(),
            Err(ElicitationError::CapabilityNotSupported) => {
                "needs a person's approval, and this client cannot be asked (it does not support elicitation)"
                    .to_string()
            }
            Err(ElicitationError::Service(rmcp::service::ServiceError::Timeout { .. })) => {
                format!("was not approved within {} s (the request expired)", timeout.as_secs())
            }
            Err(e) => format!("could not be approved: {e}"),
        };
        Err(format!("`{name}` {why} (digest {digest})"))
    }

    /// Forgets this session's subscription to `uri` (all of them with `None`), and
    /// unsubscribes upstream from the URIs no session follows any more.
    #[allow(deprecated)] // the legacy (before 2026-07-28) form, as the agent's subscribe
    async fn unsubscribe(&self, uri: Option<&str>) {
        for (uri, upstream) in self.gw.relay.unsubscribe(uri, self.id) {
            if let Some(u) = self.gw.upstreams.iter().find(|u| u.name == upstream) {
                let _ = u.peer().unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri)).await;
            }
        }
    }

    /// What an approval of `name` with `args` asks: the digest (SHA-256 over the tool, its
    /// exact arguments and the policy's version), the message shown, and how long it stays open.
    fn approval_request(&self, name: &str, args: &Value) -> Result<(String, String, Duration), String> {
        use sha2::Digest;
        let policy = &self.gw.policy;
        let mut h = sha2::Sha256::new();
        h.update(name.as_bytes());
        h.update([0]);
        h.update(args.to_string().as_bytes());
        h.update([0]);
        h.update(policy.version.as_bytes());
        let digest: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
        let timeout = Duration::from_millis(policy.gateway.approval_timeout_ms);
        let shown: String = serde_json::to_string_pretty(args)
            .unwrap_or_default()
            .chars()
            .map(|c| match c {
                // Direction overrides and isolates would let the text shown read otherwise
                // than the arguments approved.
                '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => {
                    format!("\\u{{{:04x}}}", c as u32)
                }
                c => c.to_string(),
            })
            .collect();
        // The person approves what is shown: all of the arguments, or nothing.
        if shown.len() > MAX_APPROVAL_TEXT {
            return Err(format!(
                "`{name}` needs a person's approval, and its arguments are {} bytes as text: more than the {} a \
                 person is shown, so they cannot all be shown (digest {digest})",
                shown.len(),
                MAX_APPROVAL_TEXT
            ));
        }
        let message = format!(
            "Approve `{name}` with exactly these arguments?\n{shown}\n(digest {digest}, policy {}; this request \
             expires in {} s)",
            policy.version,
            timeout.as_secs()
        );
        Ok((digest, message, timeout))
    }

    /// The approval of a call from a client on the 2026-07-28 revision, which takes no request
    /// from the server: the first call answers `input_required` with the question and an
    /// opaque handle (`requestState`, kept here); the client's retry carries the person's
    /// answer and the handle. The retry must carry the same arguments (the digest binds them),
    /// before the request expires, and a handle answers once.
    fn input_required_approval(
        &self,
        name: &str,
        args: &Value,
        responses: Option<&rmcp::model::InputResponses>,
        state: Option<&str>,
    ) -> ApprovalStep {
        use rmcp::model::{ElicitResult, ElicitationAction};
        let (digest, message, timeout) = match self.approval_request(name, args) {
            Ok(r) => r,
            Err(why) => return ApprovalStep::Refused(format!("{why}; nothing was called")),
        };
        let now = Instant::now();
        if let (Some(handle), Some(answer)) = (state, responses.and_then(|r| r.get("approval"))) {
            let Some(p) = self.approvals.lock().remove(handle) else {
                return ApprovalStep::Refused(format!(
                    "`{name}`: the approval this call answers is unknown, already used or expired; nothing was called \
                     (call it again to be asked)"
                ));
            };
            if p.name != name || p.digest != digest {
                return ApprovalStep::Refused(format!(
                    "`{name}` was asked for approval with other arguments (digest {}, this call {digest}); nothing \
                     was called",
                    p.digest
                ));
            }
            if now > p.expires {
                return ApprovalStep::Refused(format!(
                    "`{name}` was not approved within {} s (the request expired; digest {digest}); nothing was called",
                    timeout.as_secs()
                ));
            }
            let why = match serde_json::from_value::<ElicitResult>(answer.clone()) {
                Ok(r) if r.action == ElicitationAction::Accept => {
                    match r.content.as_ref().and_then(|c| c.get("approve")).and_then(Value::as_bool) {
                        Some(true) => {
                            return ApprovalStep::Approved(json!({
                                "digest": digest, "policy": self.gw.policy.version, "asked_at_ms": p.asked_ms,
                                "approved_at_ms": crate::time_ms(), "flow": "input_required",
                            }));
                        }
                        _ => "was not approved".to_string(),
                    }
                }
                Ok(r) if r.action == ElicitationAction::Decline => "was declined".to_string(),
                Ok(_) => "was cancelled by the user".to_string(),
                Err(e) => format!("got an answer that is not an elicitation result ({e})"),
            };
            return ApprovalStep::Refused(format!("`{name}` {why} (digest {digest}); nothing was called"));
        }
        let schema = match rmcp::model::ElicitationSchema::from_type::<Approval>() {
            Ok(s) => s,
            Err(e) => return ApprovalStep::Refused(format!("`{name}`: the approval form cannot be built: {e}")),
        };
        let handle = {
            let mut pending = self.approvals.lock();
            pending.retain(|_, p| p.expires > now);
            if pending.len() >= MAX_PENDING_APPROVALS {
                return ApprovalStep::Refused(format!(
                    "`{name}`: {MAX_PENDING_APPROVALS} approvals of this session are waiting for an answer; answer \
                     them or let them expire first; nothing was called"
                ));
            }
            let n = self.next_task.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let handle = format!("approval-{}-{n}", self.id);
            pending.insert(
                handle.clone(),
                PendingApproval { name: name.to_string(), digest, asked_ms: crate::time_ms(), expires: now + timeout },
            );
            handle
        };
        let ask = rmcp::model::InputRequest::Elicitation(rmcp::model::ElicitRequest::new(
            rmcp::model::ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema },
        ));
        ApprovalStep::Ask(rmcp::model::InputRequiredResult::new(
            Some(std::collections::BTreeMap::from([("approval".to_string(), ask)])),
            Some(handle),
        ))
    }

    /// A new task for a held call of `name` (the tasks extension): working until its turn
    /// ends. The session keeps at most [`MAX_TASKS_PER_SESSION`], dropping settled ones first.
    fn open_task(&self, name: &str) -> String {
        use rmcp::model::{Task, TaskPayload, TaskStatus};
        let n = self.next_task.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let id = format!("held-{n}");
        let now = now_rfc3339();
        let task = Task::new(id.clone(), TaskStatus::Working, now.clone(), now)
            .with_status_message(format!(
                "queued: `{name}` runs when this turn commits ({COMMIT_TOOL}), and never if it aborts"
            ))
            .with_poll_interval_ms(1000);
        let mut tasks = self.tasks.lock();
        while tasks.len() >= MAX_TASKS_PER_SESSION {
            let victim = tasks
                .iter()
                .find(|(_, e)| e.task.status.is_terminal())
                .map(|(k, _)| *k)
                .or_else(|| tasks.keys().next().copied());
            match victim {
                Some(k) => tasks.remove(&k),
                None => break,
            };
        }
        tasks.insert(n, TaskEntry { task, payload: TaskPayload::Working });
        id
    }

    fn task(&self, id: &str) -> Option<TaskEntry> {
        let n = id.strip_prefix("held-")?.parse::<u64>().ok()?;
        self.tasks.lock().get(&n).cloned()
    }

    /// Completes the tasks of a turn's held calls: each with its release's answer when the
    /// turn committed, else with a tool error saying it never ran and `why`.
    fn settle_tasks(&self, notes: &[Note], settled: Option<&Settled>, why: &str) {
        use rmcp::model::{TaskPayload, TaskStatus};
        let held: Vec<_> = settled.map(|s| s.effects.iter().filter(|e| !e.eager).collect()).unwrap_or_default();
        let committed = settled.is_some_and(|s| s.committed);
        for (i, n) in notes.iter().filter(|n| n.slot.is_some()).enumerate() {
            let Some(id) = &n.task else { continue };
            let answer = held.get(i).and_then(|e| e.answer.clone());
            let result = match answer {
                Some(Called::Done(v)) if committed => {
                    serde_json::from_value(v).unwrap_or_else(|e| tool_error(format!("{e}")))
                }
                Some(Called::Failed(m)) if committed => {
                    tool_error(format!("`{}` failed when the turn released it: {m}", n.tool))
                }
                Some(Called::Unknown(m)) if committed => {
                    tool_error(format!("`{}`: the outcome of its release is unknown: {m}", n.tool))
                }
                // Nothing settled (the commit or abort did not complete): the turn may still
                // commit on its own, so nobody can say the call never ran.
                _ if settled.is_none() => tool_error(format!(
                    "`{}`: outcome unknown: {why}; the turn settles on its own and its ledger says how",
                    n.tool
                )),
                _ => tool_error(format!("`{}` never ran: {why}", n.tool)),
            };
            let Some(k) = id.strip_prefix("held-").and_then(|k| k.parse::<u64>().ok()) else { continue };
            let mut tasks = self.tasks.lock();
            if let Some(entry) = tasks.get_mut(&k) {
                let result = match serde_json::to_value(&result) {
                    Ok(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                entry.task.status = TaskStatus::Completed;
                entry.task.status_message = None;
                entry.task.last_updated_at = now_rfc3339();
                entry.payload = TaskPayload::Completed { result };
            }
        }
    }

    /// Begins a turn if none is open.
    async fn open_turn<'a>(&self, guard: &'a mut Option<Turn>) -> Result<&'a mut Turn, String> {
        if guard.is_none() {
            // A call that raced the session's end begins nothing nobody would end.
            if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("the session has ended; nothing was called".to_string());
            }
            let n = self.turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let tx = TurnTx::begin(&self.gw, format!("mcp-session-{}-turn-{n}", self.id)).await?;
            *guard = Some(Turn { tx, notes: Vec::new() });
        }
        match guard.as_mut() {
            Some(t) if t.notes.len() >= MAX_CALLS_PER_TURN => Err(format!(
                "this turn holds {MAX_CALLS_PER_TURN} calls, the most a turn may: end it with `{COMMIT_TOOL}` or \
                 `{ABORT_TOOL}` first; nothing was called"
            )),
            Some(t) => Ok(t),
            None => Err("no turn".to_string()),
        }
    }

    /// In per-call mode, ends the turn the call began.
    async fn per_call_end(&self, guard: &mut Option<Turn>, result: CallToolResult) -> CallToolResult {
        if self.gw.policy.turn.mode != TurnMode::PerCall {
            return result;
        }
        let Some(t) = guard.take() else { return result };
        if result.is_error == Some(true) {
            let _ = abort_turn(self, t, "the call failed").await;
            return result;
        }
        let held = t.notes.iter().any(|n| n.slot.is_some());
        let committed = commit_turn(self, t).await;
        if held || committed.is_error == Some(true) { committed } else { result }
    }

    /// A call the engine refused or that ended the turn.
    async fn failed(&self, guard: &mut Option<Turn>, name: &str, err: TurnError) -> CallToolResult {
        match err {
            TurnError::Aborted(settled) => {
                let said = aborted_text(&settled, Some(name));
                if let Some(t) = guard.take() {
                    self.settle_tasks(&t.notes, Some(&settled), &said);
                }
                tool_error(said)
            }
            // Refused without deciding the turn (a bad scope, a key reused): the turn goes on.
            TurnError::Refused(m) => tool_error(format!("`{name}` was refused and did not run: {m}")),
            TurnError::Broken(m) => {
                let Some(t) = guard.take() else {
                    return tool_error(format!("`{name}` failed: {m}"));
                };
                let aborted = abort_turn(self, t, &format!("`{name}` failed: {m}")).await;
                let said: String = aborted.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
                if aborted.is_error == Some(true) {
                    // Nobody could settle the turn now (the server does not answer): its lease
                    // ends it, and its compensations run then.
                    tool_error(format!(
                        "`{name}` failed: {m}. The turn could not be aborted now ({said}); it is aborted when its \
                         lease ends. The next call begins a new turn"
                    ))
                } else {
                    tool_error(format!("`{name}` failed and the turn was aborted: {m}. {said}"))
                }
            }
        }
    }
}

/// A person's answer to an approval request.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Approval {
    /// Approve this exact call?
    approve: bool,
}

rmcp::elicit_safe!(Approval);

fn render_scopes(templates: &[crate::template::Template], args: &Value) -> Result<Vec<String>, String> {
    let inputs = Inputs { args, result: None, snapshot: None };
    let mut out = Vec::new();
    for t in templates {
        out.extend(t.render(&inputs)?);
    }
    Ok(out)
}

fn status(turn: &Option<Turn>) -> String {
    match turn {
        None => "no turn is open: the next call begins one".into(),
        Some(t) => {
            let mut s = format!("turn open (transaction {}), {} call(s):\n", t.tx.id(), t.notes.len());
            for n in &t.notes {
                let what = match n.class {
                    None => "read",
                    Some(c) if !c.executes_eagerly() => "queued until commit",
                    Some(_) => "ran; undone if the turn aborts",
                };
                let _ = writeln!(s, "- {}: {what}", n.tool);
            }
            s
        }
    }
}

async fn commit_turn(s: &Session, t: Turn) -> CallToolResult {
    let held: Vec<Arc<ReleaseSlot>> = t.notes.iter().filter_map(|n| n.slot.clone()).collect();
    let r = t.tx.commit(&held).await;
    let why = match &r {
        Ok(o) | Err(TurnError::Aborted(o)) if !o.committed => aborted_text(o, None),
        Ok(_) => String::new(),
        Err(e) => format!("the commit did not complete: {e}"),
    };
    let settled = match &r {
        Ok(o) | Err(TurnError::Aborted(o)) => Some(o),
        Err(_) => None,
    };
    s.settle_tasks(&t.notes, settled, &why);
    match r {
        Ok(o) if o.committed => tool_success_commit(&o, &t.notes),
        Ok(o) => tool_error(aborted_text(&o, None)),
        Err(TurnError::Aborted(o)) => tool_error(aborted_text(&o, None)),
        Err(e) => tool_error(format!("the commit did not complete: {e}")),
    }
}

fn tool_success_commit(o: &Settled, notes: &[Note]) -> CallToolResult {
    let mut s = format!("committed ({} call(s)).", o.effects.len());
    let mut structured = Vec::new();
    // Held effects and held notes are in the same (issuance) order.
    let mut held = notes.iter().filter(|n| n.slot.is_some());
    for e in &o.effects {
        let note = if e.eager { None } else { held.next() };
        let mut answer = Value::Null;
        if let Some(c) = &e.answer {
            let shown = note.map(|n| n.tool.as_str()).unwrap_or(e.tool.as_str());
            answer = match c {
                Called::Done(v) => {
                    let _ = write!(s, "\n- {shown} ran: {}", crate::template::answer_text(v));
                    v.clone()
                }
                Called::Failed(m) => {
                    let _ = write!(s, "\n- {shown} failed: {m}");
                    json!({"error": m})
                }
                Called::Unknown(m) => {
                    let _ = write!(s, "\n- {shown}: outcome unknown: {m}");
                    json!({"error": m, "outcome_unknown": true})
                }
            };
        }
        if e.tag != "clean" {
            let _ = write!(s, "\n- {} needs attention ({}): {}", e.tool, e.tag, e.detail.as_deref().unwrap_or(""));
        }
        structured.push(json!({
            "tool": e.tool, "disposition": e.disposition, "tag": e.tag, "answer": answer,
        }));
    }
    let mut r = text(s);
    r.structured_content = Some(json!({"committed": true, "transaction": o.tx, "effects": structured}));
    r
}

async fn abort_turn(s: &Session, t: Turn, reason: &str) -> CallToolResult {
    let r = t.tx.abort(reason).await;
    s.settle_tasks(&t.notes, r.as_ref().ok(), reason);
    match r {
        Ok(o) => {
            let mut r = text(aborted_text(&o, None));
            r.structured_content = Some(outcome_json(&o));
            r
        }
        Err(TurnError::Aborted(o)) => text(aborted_text(&o, None)),
        Err(e) => tool_error(format!("the abort did not complete: {e}")),
    }
}

fn outcome_json(o: &Settled) -> Value {
    json!({
        "committed": o.committed,
        "transaction": o.tx,
        "reason": o.reason.as_ref().map(|r| r.message.clone()),
        "effects": o.effects.iter().map(|e| json!({
            "tool": e.tool, "disposition": e.disposition, "tag": e.tag, "detail": e.detail,
        })).collect::<Vec<_>>(),
    })
}

/// What an aborted turn says to the model.
fn aborted_text(o: &Settled, during: Option<&str>) -> String {
    let mut s = String::from("this turn was aborted");
    if let Some(n) = during {
        let _ = write!(s, " during `{n}`");
    }
    if let Some(r) = &o.reason {
        let _ = write!(s, ": {}", r.message);
        if let Some(scope) = &r.stale_scope {
            let _ = write!(
                s,
                ". Another agent changed `{scope}` after this turn read it: read it again and retry the turn"
            );
        }
    }
    s.push('.');
    let undone: Vec<&str> =
        o.effects.iter().filter(|e| e.disposition == "compensated").map(|e| e.tool.as_str()).collect();
    let dropped: Vec<&str> =
        o.effects.iter().filter(|e| e.disposition == "discarded").map(|e| e.tool.as_str()).collect();
    if !undone.is_empty() {
        let _ = write!(s, " Undone: {}.", undone.join(", "));
    }
    if !dropped.is_empty() {
        let _ = write!(s, " Never run: {}.", dropped.join(", "));
    }
    for e in o.effects.iter().filter(|e| e.tag != "clean") {
        let _ = write!(s, " `{}` needs attention ({}): {}.", e.tool, e.tag, e.detail.as_deref().unwrap_or(""));
    }
    s.push_str(" Nothing of this turn stands; the next call begins a new turn.");
    s
}

fn own_tools() -> Vec<rmcp::model::Tool> {
    let schema = |props: Value| -> Arc<Map<String, Value>> {
        match json!({"type": "object", "properties": props}) {
            Value::Object(m) => Arc::new(m),
            _ => Arc::new(Map::new()),
        }
    };
    vec![
        rmcp::model::Tool::new(
            COMMIT_TOOL,
            "Ends the current turn and makes it permanent: the calls marked \"held until the turn commits\" run now, \
             in order. Call it when the task is done.",
            schema(json!({})),
        ),
        rmcp::model::Tool::new(
            ABORT_TOOL,
            "Ends the current turn and undoes it: calls that ran are compensated (newest first) and held calls never run.",
            schema(json!({"reason": {"type": "string", "description": "Why (recorded in the ledger)."}})),
        ),
        rmcp::model::Tool::new(STATUS_TOOL, "Says what the current turn has done and holds.", schema(json!({}))),
    ]
}

impl ServerHandler for SessionHandler {
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [rmcp::model::ProtocolVersion]> {
        if self.http {
            std::borrow::Cow::Borrowed(rmcp::model::ProtocolVersion::known_up_to(
                &rmcp::model::ProtocolVersion::V_2025_11_25,
            ))
        } else {
            std::borrow::Cow::Borrowed(rmcp::model::ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    fn get_info(&self) -> ServerConfig {
        let gw = &self.session().gw;
        let mut built = ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build();
        // Held calls answer with a task to a client that declared the tasks extension.
        built
            .extensions
            .get_or_insert_with(Default::default)
            .insert(rmcp::model::TASKS_EXTENSION_ID.to_string(), Map::new());
        if gw.offering(|c| c.resources.is_some()).next().is_some() {
            let subscribe = gw.offering(subscribes).next().is_some();
            built.resources = if subscribe {
                ServerCapabilities::builder().enable_resources().enable_resources_subscribe().build().resources
            } else {
                ServerCapabilities::builder().enable_resources().build().resources
            };
        }
        // Log messages upstreams send during a session's calls are relayed (and filtered by
        // the session's level), whether or not an upstream declared logging.
        built.logging = Some(Default::default());
        if gw.offering(|c| c.prompts.is_some()).next().is_some() {
            built.prompts = ServerCapabilities::builder().enable_prompts().build().prompts;
        }
        if gw.offering(|c| c.completions.is_some()).next().is_some() {
            built.completions = ServerCapabilities::builder().enable_completions().build().completions;
        }
        ServerConfig::new(built)
            .with_server_info(Implementation::new("tidegate-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "Tool calls go through Tidegate (policy {}). A turn is one transaction: some tools run at once and \
                 are undone if the turn aborts, some are held until you call `{COMMIT_TOOL}`. Call `{COMMIT_TOOL}` \
                 when the task is done, or `{ABORT_TOOL}` to undo it.",
                gw.policy.version
            ))
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        *self.session().peer.lock() = Some(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools: Vec<rmcp::model::Tool> =
            self.session().gw.exposed().exposed.iter().map(|e| e.listing.clone()).collect();
        tools.extend(own_tools());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let known = matches!(name.as_str(), COMMIT_TOOL | ABORT_TOOL | STATUS_TOOL)
            || self.session().gw.exposed().get(&name).is_some();
        if !known {
            return Err(McpError::invalid_params(format!("no tool `{name}`: tools/list names the tools"), None));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let size = serde_json::to_vec(&args).map(|v| v.len()).unwrap_or(usize::MAX);
        if size > MAX_ARGUMENTS_BYTES {
            return Ok(tool_error(format!(
                "the arguments of `{name}` are {size} bytes; the gateway forwards at most {MAX_ARGUMENTS_BYTES}"
            ))
            .into());
        }
        let session = self.session().clone();
        *session.peer.lock() = Some(context.peer.clone());
        // A client on the 2026-07-28 revision takes no request from the server: an approval
        // is asked through the input-required flow instead of elicitation.
        let modern = context.protocol_version().is_some_and(|v| v.as_str() >= "2026-07-28");
        let needs_approval = matches!(
            session.gw.exposed().get(&name).map(|x| &x.kind),
            Some(Kind::Effect(e)) if e.approval
        );
        let mut approved = None;
        if modern && needs_approval {
            match session.input_required_approval(
                &name,
                &args,
                request.input_responses.as_ref(),
                request.request_state.as_deref(),
            ) {
                ApprovalStep::Ask(ask) => {
                    // The person's answer takes a while: the turn is not idle meanwhile.
                    *session.last_call.lock() = Instant::now();
                    return Ok(CallToolResponse::InputRequired(ask));
                }
                ApprovalStep::Refused(why) => return Ok(tool_error(why).into()),
                ApprovalStep::Approved(record) => approved = Some(record),
            }
        }
        let progress = context.meta.get_progress_token().map(|t| (t, context.peer.clone()));
        let wants_task = context.client_capabilities().is_some_and(|c| c.supports_tasks());
        let held_task = wants_task.then(|| Arc::new(parking_lot::Mutex::new(None)));
        let (runner, slot, cancel) = (session.clone(), held_task.clone(), context.ct.clone());
        let (agent_session, agent) = (session.id, context.peer.clone());
        // The call runs to its end even if the agent stops waiting for it: a turn is never left
        // between recording an effect and learning its outcome.
        let handle = tokio::spawn(async move {
            let call = async {
                match progress {
                    Some(route) => crate::relay::ROUTE.scope(route, runner.call(&name, args)).await,
                    None => runner.call(&name, args).await,
                }
            };
            let call = CANCEL.scope(cancel, call);
            let call = crate::relay::AGENT.scope((agent_session, agent), call);
            let call = async move {
                match approved {
                    Some(record) => APPROVED.scope(record, call).await,
                    None => call.await,
                }
            };
            match slot {
                Some(slot) => HELD_TASK.scope(slot, call).await,
                None => call.await,
            }
        });
        match handle.await {
            Ok(r) => {
                let task = held_task.and_then(|t| t.lock().take()).and_then(|id| session.task(&id));
                match task {
                    Some(t) => Ok(CallToolResponse::Task(rmcp::model::CreateTaskResult::new(t.task))),
                    None => Ok(r.into()),
                }
            }
            Err(e) => Err(McpError::internal_error(format!("the gateway's call handler failed: {e}"), None)),
        }
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        match self.session().task(&request.task_id) {
            Some(e) => Ok(rmcp::model::GetTaskResult::new(rmcp::model::DetailedTask::new(e.task, e.payload))),
            None => Err(McpError::invalid_params(format!("no task `{}` in this session", request.task_id), None)),
        }
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        match self.session().task(&request.task_id) {
            Some(e) if e.task.status.is_terminal() => Err(McpError::invalid_params(
                format!("task `{}` has already ended ({:?})", request.task_id, e.task.status),
                None,
            )),
            Some(_) => Err(McpError::invalid_params(
                format!(
                    "task `{}` is a held call of the open turn: it cannot be withdrawn alone; end the turn with \
                     `{ABORT_TOOL}` so that it never runs",
                    request.task_id
                ),
                None,
            )),
            None => Err(McpError::invalid_params(format!("no task `{}` in this session", request.task_id), None)),
        }
    }

    // Logging is deprecated by SEP-2577; clients before 2026-07-28 still set levels.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // Log messages an upstream sends during this session's calls are relayed to it, at or
        // above this level (the gateway filters); upstreams that declare logging are told the
        // level too (the last session's level wins there, so the gateway's filter is the one
        // each session can count on).
        let session = self.session();
        session.gw.relay.set_level(session.id, Some(crate::relay::level_rank(request.level)));
        for u in session.gw.offering(|c| c.logging.is_some()) {
            if let Err(e) = u.peer().set_level(request.clone()).await {
                tracing::warn!(upstream = %u.name, "logging/setLevel: {e}");
            }
        }
        Ok(())
    }

    // resources/subscribe is the legacy (before 2026-07-28) form, which the gateway passes on.
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let session = self.session();
        let gw = &session.gw;
        if gw.relay.subscriptions_of(session.id) >= MAX_SUBSCRIPTIONS_PER_SESSION {
            return Err(McpError::invalid_params(
                format!(
                    "this session follows {MAX_SUBSCRIPTIONS_PER_SESSION} resources already (the most a session may); \
                     unsubscribe from one first"
                ),
                None,
            ));
        }
        // A URI another session follows is already subscribed upstream.
        if let Some(up) = gw.relay.subscribed_upstream(&request.uri) {
            gw.relay.subscribe(&request.uri, &up, session.id, context.peer.clone());
            return Ok(());
        }
        let mut last = None;
        for u in gw.offering(subscribes) {
            match u.peer().subscribe(request.clone()).await {
                Ok(()) => {
                    gw.relay.subscribe(&request.uri, &u.name, session.id, context.peer.clone());
                    return Ok(());
                }
                Err(e) => last = Some(format!("upstream `{}`: {e}", u.name)),
            }
        }
        Err(McpError::invalid_params(
            format!(
                "no upstream takes a subscription to `{}`{}",
                request.uri,
                last.map(|l| format!(" ({l})")).unwrap_or_default()
            ),
            None,
        ))
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.session().unsubscribe(Some(&request.uri)).await;
        Ok(())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let mut last = None;
        for u in self.session().gw.offering(|c| c.completions.is_some()) {
            match u.peer().complete(request.clone()).await {
                Ok(r) if !r.completion.values.is_empty() => return Ok(r),
                Ok(r) => last = Some(Ok(r)),
                Err(e) => last = Some(Err(e.to_string())),
            }
        }
        match last {
            Some(Ok(r)) => Ok(r),
            Some(Err(e)) => Err(McpError::invalid_params(format!("completion/complete: {e}"), None)),
            None => Err(McpError::method_not_found::<rmcp::model::CompleteRequestMethod>()),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut all = Vec::new();
        for u in self.session().gw.offering(|c| c.resources.is_some()) {
            if let Ok(r) = u.peer().list_resources(request.clone()).await {
                all.extend(r.resources);
            }
        }
        Ok(ListResourcesResult::with_all_items(all))
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut all = Vec::new();
        for u in self.session().gw.offering(|c| c.resources.is_some()) {
            if let Ok(r) = u.peer().list_resource_templates(request.clone()).await {
                all.extend(r.resource_templates);
            }
        }
        Ok(ListResourceTemplatesResult::with_all_items(all))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let mut last = None;
        for u in self.session().gw.offering(|c| c.resources.is_some()) {
            match u.peer().read_resource(request.clone()).await {
                Ok(r) => return Ok(r.into()),
                Err(e) => last = Some(e.to_string()),
            }
        }
        Err(McpError::resource_not_found(
            format!("no upstream has `{}`{}", request.uri, last.map(|l| format!(" ({l})")).unwrap_or_default()),
            None,
        ))
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let mut all = Vec::new();
        for u in self.session().gw.offering(|c| c.prompts.is_some()) {
            if let Ok(r) = u.peer().list_prompts(request.clone()).await {
                all.extend(r.prompts);
            }
        }
        Ok(ListPromptsResult::with_all_items(all))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let mut last = None;
        for u in self.session().gw.offering(|c| c.prompts.is_some()) {
            match u.peer().get_prompt(request.clone()).await {
                Ok(r) => return Ok(r.into()),
                Err(e) => last = Some(e.to_string()),
            }
        }
        Err(McpError::invalid_params(
            format!(
                "no upstream has the prompt `{}`{}",
                request.name,
                last.map(|l| format!(" ({l})")).unwrap_or_default()
            ),
            None,
        ))
    }
}
