//! The irreversible sink: a mailbox served over HTTP on 127.0.0.1.
//!
//! The server (axum) runs on its own thread and tokio runtime with real time, so it never
//! interacts with the harness's paused clock. Its append-only delivery log, also written as
//! JSON Lines to `deliveries.jsonl` in a temporary directory, is the ground truth for leaks
//! and duplicates. Endpoints:
//!
//! | method and path | body / query | effect |
//! | --- | --- | --- |
//! | `POST /send` | `{res, body, key?}` | appends a delivery (a repeated `key` is a no-op) |
//! | `POST /try` | `{res, body}` | reserves a delivery; returns `{id}` (nothing delivered) |
//! | `POST /confirm` | `{id}` | delivers a reservation (idempotent per id) |
//! | `POST /cancel` | `{id}` | drops a reservation |
//! | `GET /count?res=` | | `{count}`: deliveries of `res` |
//! | `GET /probe?key=` | | `{applied}`: whether `key` was delivered |
//!
//! The client side ([`MailSink`]) is a blocking HTTP client (ureq): a call blocks the
//! harness's single thread for its real duration and costs no virtual time.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Sink, SinkError, SinkKind, SinkResult};

#[derive(Debug)]
struct Mailbox {
    log: Vec<(String, Value)>,
    count: HashMap<String, u64>,
    keys: HashSet<String>,
    reserved: HashMap<String, (String, Value, bool)>,
    next: u64,
    file: std::fs::File,
}

type Shared = Arc<Mutex<Mailbox>>;

/// The running server.
#[derive(Debug)]
pub struct MailServer {
    addr: std::net::SocketAddr,
    dir: tempfile::TempDir,
    shared: Shared,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Deserialize)]
struct SendReq {
    res: String,
    #[serde(default)]
    body: Value,
    key: Option<String>,
}

#[derive(Deserialize)]
struct IdReq {
    id: String,
}

#[derive(Deserialize)]
struct ResQ {
    res: String,
}

#[derive(Deserialize)]
struct KeyQ {
    key: String,
}

fn deliver(m: &mut Mailbox, res: &str, body: &Value) {
    *m.count.entry(res.to_owned()).or_default() += 1;
    m.log.push((res.to_owned(), body.clone()));
    // Best effort: the in-memory log is authoritative; the file is for people to audit.
    let _ = writeln!(m.file, "{}", json!({"seq": m.log.len(), "res": res, "body": body}));
}

async fn send(State(s): State<Shared>, Json(r): Json<SendReq>) -> Json<Value> {
    let mut m = s.lock();
    if let Some(k) = &r.key
        && !m.keys.insert(k.clone())
    {
        return Json(json!({"duplicate_key": true}));
    }
    deliver(&mut m, &r.res, &r.body);
    Json(json!({"delivered": m.log.len()}))
}

async fn try_send(State(s): State<Shared>, Json(r): Json<SendReq>) -> Json<Value> {
    let mut m = s.lock();
    m.next += 1;
    let id = format!("mail-{}", m.next);
    m.reserved.insert(id.clone(), (r.res, r.body, false));
    Json(json!({"id": id}))
}

async fn confirm(State(s): State<Shared>, Json(r): Json<IdReq>) -> Json<Value> {
    let mut m = s.lock();
    let Some((res, body, done)) = m.reserved.get(&r.id).cloned() else {
        return Json(json!({"error": "no such reservation"}));
    };
    if !done {
        if let Some(e) = m.reserved.get_mut(&r.id) {
            e.2 = true;
        }
        deliver(&mut m, &res, &body);
    }
    Json(json!({"ok": true}))
}

async fn cancel(State(s): State<Shared>, Json(r): Json<IdReq>) -> Json<Value> {
    let mut m = s.lock();
    if m.reserved.get(&r.id).is_some_and(|e| !e.2) {
        m.reserved.remove(&r.id);
    }
    Json(json!({"ok": true}))
}

async fn count(State(s): State<Shared>, Query(q): Query<ResQ>) -> Json<Value> {
    Json(json!({"count": s.lock().count.get(&q.res).copied().unwrap_or(0)}))
}

async fn probe(State(s): State<Shared>, Query(q): Query<KeyQ>) -> Json<Value> {
    Json(json!({"applied": s.lock().keys.contains(&q.key)}))
}

impl MailServer {
    /// Starts the server on an ephemeral port of 127.0.0.1.
    pub fn start() -> SinkResult<MailServer> {
        let io = |op: &'static str| move |source| SinkError::Io { op, path: "127.0.0.1".into(), source };
        let dir = tempfile::Builder::new().prefix("tidegate-eval-mail-").tempdir().map_err(io("create temp dir"))?;
        let file = std::fs::File::create(dir.path().join("deliveries.jsonl")).map_err(io("create log"))?;
        let shared: Shared = Arc::new(Mutex::new(Mailbox {
            log: Vec::new(),
            count: HashMap::new(),
            keys: HashSet::new(),
            reserved: HashMap::new(),
            next: 0,
            file,
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("bind"))?;
        listener.set_nonblocking(true).map_err(io("set non-blocking"))?;
        let addr = listener.local_addr().map_err(io("local address"))?;
        let app = Router::new()
            .route("/send", post(send))
            .route("/try", post(try_send))
            .route("/confirm", post(confirm))
            .route("/cancel", post(cancel))
            .route("/count", get(count))
            .route("/probe", get(probe))
            .with_state(shared.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("start runtime"))?;
        let thread = std::thread::Builder::new()
            .name("tidegate-eval-mail".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = rx.await;
                        })
                        .await;
                });
            })
            .map_err(io("spawn server thread"))?;
        Ok(MailServer { addr, dir, shared, shutdown: Some(tx), thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where the delivery log is written.
    pub fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("deliveries.jsonl")
    }

    /// Deliveries so far (read directly from the server's log).
    pub fn deliveries(&self) -> usize {
        self.shared.lock().log.len()
    }

    /// A client whose effect ids and keys are prefixed with a number unique in this process,
    /// so that clients (one per workload run) never see each other's deliveries.
    pub fn client(&self) -> MailSink {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        MailSink {
            base: self.url(),
            prefix: format!("c{n}/"),
            agent: ureq::AgentBuilder::new().timeout(std::time::Duration::from_secs(10)).build(),
        }
    }
}

impl Drop for MailServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The client of the mailbox.
#[derive(Debug, Clone)]
pub struct MailSink {
    base: String,
    prefix: String,
    agent: ureq::Agent,
}

impl MailSink {
    fn post(&self, path: &'static str, body: Value) -> SinkResult<Value> {
        let url = format!("{}{path}", self.base);
        let err = |detail: String| SinkError::Http { op: "POST", url: url.clone(), detail };
        self.agent
            .post(&url)
            .send_json(body)
            .map_err(|e| err(e.to_string()))?
            .into_json()
            .map_err(|e| err(e.to_string()))
    }

    fn get(&self, path: &'static str, name: &str, value: &str) -> SinkResult<Value> {
        let url = format!("{}{path}", self.base);
        let err = |detail: String| SinkError::Http { op: "GET", url: url.clone(), detail };
        self.agent
            .get(&url)
            .query(name, value)
            .call()
            .map_err(|e| err(e.to_string()))?
            .into_json()
            .map_err(|e| err(e.to_string()))
    }
}

impl Sink for MailSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Mail
    }

    fn apply(&self, res: &str, body: &Value, key: Option<&str>) -> SinkResult<()> {
        let key = key.map(|k| format!("{}{k}", self.prefix));
        self.post("/send", json!({"res": format!("{}{res}", self.prefix), "body": body, "key": key})).map(|_| ())
    }

    fn undo(&self, res: &str) -> SinkResult<()> {
        Err(SinkError::NotUndoable { sink: "mailbox", res: res.to_owned() })
    }

    fn applied_key(&self, key: &str) -> SinkResult<bool> {
        Ok(self.get("/probe", "key", &format!("{}{key}", self.prefix))?["applied"].as_bool().unwrap_or(false))
    }

    fn live(&self, res: &str) -> SinkResult<u64> {
        Ok(self.get("/count", "res", &format!("{}{res}", self.prefix))?["count"].as_u64().unwrap_or(0))
    }

    fn reserve(&self, res: &str, body: &Value) -> SinkResult<String> {
        let v = self.post("/try", json!({"res": format!("{}{res}", self.prefix), "body": body}))?;
        v["id"].as_str().map(str::to_owned).ok_or_else(|| SinkError::Http {
            op: "POST",
            url: format!("{}/try", self.base),
            detail: format!("no reservation id in {v}"),
        })
    }

    fn confirm(&self, id: &str) -> SinkResult<()> {
        let v = self.post("/confirm", json!({"id": id}))?;
        if v.get("error").is_some() {
            return Err(SinkError::NoReservation { sink: "mailbox", id: id.to_owned() });
        }
        Ok(())
    }

    fn cancel(&self, id: &str) -> SinkResult<()> {
        self.post("/cancel", json!({"id": id})).map(|_| ())
    }
}
