//! A turn's transaction, wherever it lives: the embedded engine ([`TurnTx::Local`]) or a
//! Tidegate server ([`TurnTx::Remote`], attached mode). Sessions speak only this vocabulary:
//! begin, read, effect, commit, abort, and the settled outcome ([`Settled`]) they turn into
//! words for the model.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tidegate_runtime::{Ack, CallHandle, CallOptions, CommitOptions, Error, Outcome, Transaction, TxOptions, TxState};

use crate::attached::{RemoteError, Server, clip};
use crate::gateway::{Backend, EffectTool, Exposed, Gateway, ReleaseSlot};
use crate::upstream::Called;

/// The transaction of one turn.
#[derive(Debug, Clone)]
pub enum TurnTx {
    /// On the gateway's own engine.
    Local(Transaction),
    /// On a Tidegate server.
    Remote {
        /// Its id on the server (`tx_<tag>_<n>`).
        id: String,
        /// The server.
        server: Arc<Server>,
        /// Effect requests sent so far (each one's `Idempotency-Key` is `<id>:<n>`).
        requests: Arc<std::sync::atomic::AtomicU64>,
    },
}

/// Why a turn aborted.
#[derive(Debug, Clone)]
pub struct Reason {
    /// `stale_read`, `tool_failed`, `explicit`, …
    pub kind: String,
    /// A sentence.
    pub message: String,
    /// The scope of a stale read.
    pub stale_scope: Option<String>,
}

/// One effect of a settled turn.
#[derive(Debug, Clone)]
pub struct SettledEffect {
    /// Its ledger name.
    pub tool: String,
    /// Whether it ran at once (else it was held until commit).
    pub eager: bool,
    /// `accepted`, `fired`, `compensated`, `discarded`, …
    pub disposition: String,
    /// `clean`, `unresolved`, `leaked`, …
    pub tag: String,
    /// Residue or error text.
    pub detail: Option<String>,
    /// A held call's answer, once released.
    pub answer: Option<Called>,
}

/// A settled turn.
#[derive(Debug, Clone)]
pub struct Settled {
    /// The transaction's id.
    pub tx: String,
    /// Committed, or aborted.
    pub committed: bool,
    /// Why it aborted.
    pub reason: Option<Reason>,
    /// Its effects, in issuance order.
    pub effects: Vec<SettledEffect>,
}

/// A turn operation that did not go through.
#[derive(Debug, Clone)]
pub enum TurnError {
    /// The turn aborted (and is settled).
    Aborted(Settled),
    /// The operation was refused; the turn is still open and goes on.
    Refused(String),
    /// The turn is in no known state (the server did not answer): the caller aborts it.
    Broken(String),
}

impl std::fmt::Display for TurnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TurnError::Aborted(s) => write!(f, "the turn aborted ({})", s.tx),
            TurnError::Refused(m) | TurnError::Broken(m) => f.write_str(m),
        }
    }
}

/// How an effect was taken.
#[derive(Debug, Clone)]
pub enum Acked {
    /// It ran: the upstream's answer (a `CallToolResult` as JSON).
    Ran(Value),
    /// Held until commit.
    Held,
}

fn name_of<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// A settled turn from the engine's outcome; `held` are the held calls' answer slots, in
/// issuance order.
pub fn from_outcome(o: &Outcome, held: &[Arc<ReleaseSlot>]) -> Settled {
    let mut slots = held.iter();
    Settled {
        tx: o.tx.to_string(),
        committed: o.committed,
        reason: o.reason.as_ref().map(|r| Reason {
            kind: r.kind().to_string(),
            message: r.to_string(),
            stale_scope: match r {
                tidegate_runtime::AbortReason::StaleRead { scope, .. } => Some(scope.to_string()),
                _ => None,
            },
        }),
        effects: o
            .effects
            .iter()
            .map(|e| {
                let eager = e.class.executes_eagerly();
                // Held effects and held slots are in the same (issuance) order.
                let answer = if eager { None } else { slots.next().and_then(|s| s.0.lock().clone()) };
                SettledEffect {
                    tool: e.tool.to_string(),
                    eager,
                    disposition: name_of(&e.disposition),
                    tag: e.tag.to_string(),
                    detail: e.detail.clone(),
                    answer,
                }
            })
            .collect(),
    }
}

/// A settled turn from the server's transaction (`GET /v1/transactions/{tx}`).
pub fn from_json(t: &Value) -> Settled {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let outcome = t.get("outcome").cloned().unwrap_or(Value::Null);
    let reason = outcome.get("reason").filter(|r| r.is_object()).map(|r| Reason {
        kind: s(r, "kind").unwrap_or_default(),
        message: s(r, "message").unwrap_or_default(),
        stale_scope: r.get("details").and_then(|d| s(d, "scope")),
    });
    let effects = t
        .get("effects")
        .and_then(Value::as_array)
        .map(|es| {
            es.iter()
                .map(|e| {
                    let class = s(e, "class").unwrap_or_default();
                    let eager = matches!(class.as_str(), "reversible" | "reversible_with_cost" | "idempotent");
                    let status = s(e, "status").unwrap_or_default();
                    let answer = if eager {
                        None
                    } else {
                        match status.as_str() {
                            "released" => Some(Called::Done(e.get("output").cloned().unwrap_or(Value::Null))),
                            "release_failed" if e.get("outcome_unknown").and_then(Value::as_bool) == Some(true) => {
                                Some(Called::Unknown(s(e, "error").unwrap_or_default()))
                            }
                            "release_failed" => Some(Called::Failed(s(e, "error").unwrap_or_default())),
                            _ => None,
                        }
                    };
                    SettledEffect {
                        tool: s(e, "tool").unwrap_or_default(),
                        eager,
                        disposition: s(e, "disposition").unwrap_or_default(),
                        tag: s(e, "tag").unwrap_or_else(|| "clean".into()),
                        detail: s(e, "residue").or_else(|| s(e, "error")),
                        answer,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    Settled {
        tx: s(t, "id").unwrap_or_default(),
        committed: outcome.get("committed").and_then(Value::as_bool).unwrap_or(false),
        reason,
        effects,
    }
}

impl TurnTx {
    /// Begins a turn for `agent` on `gw`'s backend.
    pub async fn begin(gw: &Gateway, agent: String) -> Result<TurnTx, String> {
        let lease = crate::gateway::turn_lease(&gw.policy);
        match &gw.backend {
            Backend::Embedded(engine) => engine
                .begin_with(TxOptions::agent(agent).lease(lease))
                .map(TurnTx::Local)
                .map_err(|e| format!("the gateway could not begin a turn: {e}")),
            Backend::Attached { server, .. } => {
                let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                match server.begin(&agent, ms).await {
                    Ok(id) => Ok(TurnTx::Remote { id, server: server.clone(), requests: Default::default() }),
                    Err(e) => Err(format!("the gateway could not begin a turn: {e}")),
                }
            }
        }
    }

    /// The transaction's id.
    pub fn id(&self) -> String {
        match self {
            TurnTx::Local(t) => t.id().to_string(),
            TurnTx::Remote { id, .. } => id.clone(),
        }
    }

    fn local_error(t: &Transaction, e: Error) -> TurnError {
        match e {
            Error::Aborted(o) => TurnError::Aborted(from_outcome(&o, &[])),
            e if t.state().is_ok_and(|s| matches!(s, TxState::Open)) => TurnError::Refused(e.to_string()),
            e => TurnError::Broken(e.to_string()),
        }
    }

    async fn remote_error(server: &Server, id: &str, e: RemoteError) -> TurnError {
        if e.aborted().is_some() {
            return match server.settle_aborted(id).await {
                Ok(t) => TurnError::Aborted(from_json(&t)),
                Err(e2) => TurnError::Broken(format!("{e}; and then {e2}")),
            };
        }
        if let RemoteError::Transport(_) = e {
            return TurnError::Broken(e.to_string());
        }
        match server.get(id).await {
            Ok(t) if t.get("state").and_then(Value::as_str) == Some("open") => TurnError::Refused(e.to_string()),
            Ok(t) if t.get("outcome").is_some() => TurnError::Aborted(from_json(&t)),
            _ => TurnError::Broken(e.to_string()),
        }
    }

    /// Registers a read of `scope`.
    pub async fn read(&self, scope: &str) -> Result<(), TurnError> {
        match self {
            TurnTx::Local(t) => t.read(scope).map(|_| ()).map_err(|e| TurnTx::local_error(t, e)),
            TurnTx::Remote { id, server, .. } => match server.read(id, scope).await {
                Ok(()) => Ok(()),
                Err(e) => Err(TurnTx::remote_error(server, id, e).await),
            },
        }
    }

    /// Records (and, for an eager class, runs) a governed call. `envelope` is what the
    /// ledger keeps (`{arguments, snapshot?, approval?}`); `slot` receives a held call's
    /// answer when the embedded engine releases it.
    #[allow(clippy::too_many_arguments)]
    pub async fn effect(
        &self,
        gw: &Gateway,
        x: &Exposed,
        e: &EffectTool,
        envelope: Value,
        key: Option<String>,
        scopes: Vec<String>,
        slot: Arc<ReleaseSlot>,
    ) -> Result<Acked, TurnError> {
        match self {
            TurnTx::Local(t) => {
                let opts = CallOptions {
                    key,
                    scopes: Some(scopes),
                    handle: (!e.class.executes_eagerly()).then(|| CallHandle(slot)),
                    ..CallOptions::default()
                };
                match t.call_with(&e.tool, envelope, opts).await {
                    Ok(Ack::Executed { output, .. }) | Ok(Ack::Replayed { output, .. }) => {
                        Ok(Acked::Ran((*output).clone()))
                    }
                    Ok(_) => Ok(Acked::Held),
                    Err(err) => Err(TurnTx::local_error(t, err)),
                }
            }
            TurnTx::Remote { id, server, requests } => {
                let eager = e.class.executes_eagerly();
                let tool = gw.ledger_name(x);
                let n = requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let request = format!("{id}:{n}");
                let ack = match server.effect(id, &tool, &envelope, key.as_deref(), &scopes, eager, &request).await {
                    Ok(a) => a,
                    Err(err) => return Err(TurnTx::remote_error(server, id, err).await),
                };
                match ack.get("ack").and_then(Value::as_str) {
                    Some("execute") => {
                        let Some(url) = ack.get("result_url").and_then(Value::as_str) else {
                            return Err(TurnError::Broken(format!("a ticket without a result_url: {ack}")));
                        };
                        let args = envelope.get("arguments").cloned().unwrap_or(Value::Null);
                        let up = &gw.upstreams[x.upstream];
                        let result = match up.call(&x.tool, args).await {
                            Called::Done(v) => json!({"status": "done", "output": v}),
                            Called::Failed(m) => json!({"status": "not_applied", "error": clip(&m)}),
                            Called::Unknown(m) => json!({"status": "unknown", "error": clip(&m)}),
                        };
                        match server.report(url, &result).await {
                            Ok(done) => Ok(Acked::Ran(done.get("output").cloned().unwrap_or(Value::Null))),
                            Err(err) => match TurnTx::remote_error(server, id, err).await {
                                // The upstream was called: never "refused, did not run".
                                TurnError::Refused(m) => Err(TurnError::Broken(format!(
                                    "the call reached the upstream, but the server did not take its result: {m}"
                                ))),
                                other => Err(other),
                            },
                        }
                    }
                    Some("executed") | Some("replayed") => {
                        Ok(Acked::Ran(ack.get("output").cloned().unwrap_or(Value::Null)))
                    }
                    Some("queued") | Some("staged") => Ok(Acked::Held),
                    _ => Err(TurnError::Broken(format!(
                        "the server's acknowledgement is not one the gateway knows: {ack}"
                    ))),
                }
            }
        }
    }

    /// Seals and commits → the settled turn (committed or not). `held` are the held calls'
    /// answer slots, in order (embedded).
    pub async fn commit(&self, held: &[Arc<ReleaseSlot>]) -> Result<Settled, TurnError> {
        match self {
            TurnTx::Local(t) => {
                if let Err(e) = t.seal() {
                    return match e {
                        Error::Aborted(o) => Ok(from_outcome(&o, held)),
                        e => {
                            let _ = t.abort(format!("seal failed: {e}")).await;
                            Err(TurnError::Broken(format!("the turn could not be sealed and was aborted: {e}")))
                        }
                    };
                }
                match t.commit_with(CommitOptions { wait_timeout: Some(Duration::from_secs(60)) }).await {
                    Ok(o) => Ok(from_outcome(&o, held)),
                    Err(Error::Aborted(o)) => Ok(from_outcome(&o, held)),
                    Err(e) => Err(TurnError::Broken(format!("the commit did not complete: {e}"))),
                }
            }
            TurnTx::Remote { id, server, .. } => match server.commit(id).await {
                Ok(t) => Ok(from_json(&t)),
                Err(e) => match TurnTx::remote_error(server, id, e).await {
                    TurnError::Aborted(s) => Ok(s),
                    other => Err(other),
                },
            },
        }
    }

    /// Aborts → the settled turn.
    pub async fn abort(&self, reason: &str) -> Result<Settled, TurnError> {
        match self {
            TurnTx::Local(t) => match t.abort(reason.to_string()).await {
                Ok(o) => Ok(from_outcome(&o, &[])),
                Err(Error::Aborted(o)) => Ok(from_outcome(&o, &[])),
                Err(e) => Err(TurnError::Broken(format!("the abort did not complete: {e}"))),
            },
            TurnTx::Remote { id, server, .. } => match server.abort(id, reason).await {
                Ok(t) => Ok(from_json(&t)),
                Err(e) => match TurnTx::remote_error(server, id, e).await {
                    TurnError::Aborted(s) => Ok(s),
                    other => Err(other),
                },
            },
        }
    }
}
