//! Test harness: a real server on 127.0.0.1:0, tenants with a key per role, an HTTP client,
//! and a webhook sink whose append-only log is the ground truth.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_server::AppState;
use tidegate_server::config::Config;
use tidegate_service::auth::Role;

pub struct Keys {
    pub admin: String,
    pub agent: String,
    pub operator: String,
    pub reviewer: String,
}

pub struct Harness {
    pub base: String,
    pub state: AppState,
    pub http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub dir: Option<tempfile::TempDir>,
}

pub struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Resp {
    pub fn content_type(&self) -> String {
        self.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    }
}

impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.text)
    }
}

impl Harness {
    /// A server with its catalog and ledgers in memory.
    pub async fn memory(adjust: impl FnOnce(&mut Config)) -> Harness {
        let mut cfg = Config::default();
        cfg.server.memory = true;
        cfg.server.shutdown_drain_ms = 2_000;
        adjust(&mut cfg);
        Harness::start(cfg, None).await
    }

    /// A server on a data directory (SQLite catalog and ledgers).
    pub async fn durable(dir: tempfile::TempDir, adjust: impl FnOnce(&mut Config)) -> Harness {
        let mut cfg = Config::default();
        cfg.server.data_dir = Some(dir.path().to_owned());
        cfg.server.shutdown_drain_ms = 2_000;
        adjust(&mut cfg);
        Harness::start(cfg, Some(dir)).await
    }

    async fn start(cfg: Config, dir: Option<tempfile::TempDir>) -> Harness {
        let state = AppState::open(cfg).await.expect("open the server");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = tidegate_server::api::app(state.clone(), axum::Router::new());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let task = tokio::spawn(async move {
            let _ = tidegate_server::serve(st, listener, app, async move {
                let _ = rx.await;
            })
            .await;
        });
        Harness {
            base: format!("http://{addr}"),
            state,
            http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client"),
            stop: Some(tx),
            task: Some(task),
            dir,
        }
    }

    /// Creates a tenant with a key of every role.
    pub fn tenant(&self, name: &str) -> (String, Keys) {
        let cat = self.state.catalog();
        let t = cat.create_tenant(name).expect("create tenant");
        let key = |r| cat.create_key(name, r, None).expect("create key").0.key;
        (
            t.tag,
            Keys {
                admin: key(Role::Admin),
                agent: key(Role::Agent),
                operator: key(Role::Operator),
                reviewer: key(Role::Reviewer),
            },
        )
    }

    pub async fn req(&self, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> Resp {
        self.req_with(method, path, key, body, &[]).await
    }

    pub async fn req_with(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self.http.request(m, format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        for (h, v) in headers {
            r = r.header(*h, *v);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Resp { status, headers, body, text }
    }

    pub async fn raw(&self, method: &str, path: &str, key: Option<&str>, body: Vec<u8>, ct: Option<&str>) -> Resp {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self.http.request(m, format!("{}{path}", self.base)).body(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Resp { status, headers, body, text }
    }

    /// Stops the server gracefully (drain, checkpoint, sync) and returns the data directory.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
        }
        self.dir.take()
    }

    /// Registers a webhook capability and a tool using it for `call`, and optionally
    /// `compensate`/`probe` on the same sink.
    pub async fn webhook_tool(&self, key: &str, sink: &Sink, tool: &str, class: &str, compensate: bool, probe: bool) {
        let cap = |suffix: &str| format!("{tool}-{suffix}");
        let put_cap = |name: String, path: String| {
            let body = json!({"kind": "webhook", "url": format!("{}/{path}", sink.url()), "timeout_ms": 2000, "attempts": 2, "backoff_ms": 10});
            async move { self.req("PUT", &format!("/v1/capabilities/{name}"), Some(key), Some(body)).await }
        };
        let r = put_cap(cap("call"), format!("{tool}/call")).await;
        assert!(r.status == 201 || r.status == 200, "{r:?}");
        let mut def = json!({"class": class, "scopes": [format!("kv:{tool}:{{id}}")], "call": cap("call")});
        if compensate {
            let r = put_cap(cap("undo"), format!("{tool}/undo")).await;
            assert!(r.status < 300, "{r:?}");
            def["compensate"] = json!(cap("undo"));
        }
        if probe {
            let r = put_cap(cap("probe"), "probe".to_owned()).await;
            assert!(r.status < 300, "{r:?}");
            def["probe"] = json!(cap("probe"));
        }
        let r = self.req("PUT", &format!("/v1/tools/{tool}"), Some(key), Some(def)).await;
        assert!(r.status < 300, "{r:?}");
    }
}

/// One request the sink received.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Delivery {
    pub path: String,
    pub key: String,
    pub operation: String,
    pub attempt: String,
    pub body: Value,
    /// The body exactly as it arrived.
    #[serde(default)]
    pub raw: String,
    /// Whether the sink applied it (false for a duplicate key or a scripted failure).
    pub applied: bool,
}

#[derive(Default)]
struct SinkState {
    applied: HashSet<String>,
    /// Scripted statuses per path, consumed in order (then 200).
    script: HashMap<String, VecDeque<u16>>,
    /// Delay per path before answering.
    delay: HashMap<String, Duration>,
}

/// A webhook receiver on 127.0.0.1 that honours `Idempotency-Key` and appends every request
/// to a JSON Lines file: the ground truth.
pub struct Sink {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<SinkState>>,
    log: Arc<Mutex<std::fs::File>>,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _task: tokio::task::JoinHandle<()>,
}

type Shared = (Arc<Mutex<SinkState>>, Arc<Mutex<std::fs::File>>);

async fn hook(
    State((st, log)): State<Shared>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> impl IntoResponse {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let key = h("idempotency-key");
    let raw = body;
    let body: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let (scripted, delay) = {
        let mut s = st.lock();
        (s.script.get_mut(&path).and_then(VecDeque::pop_front), s.delay.get(&path).copied())
    };
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    if path == "probe" {
        let happened = st.lock().applied.contains(&key);
        let d = Delivery {
            path,
            key,
            operation: h("tidegate-operation"),
            attempt: h("tidegate-attempt"),
            body,
            raw,
            applied: false,
        };
        append(&log, &d);
        return if happened {
            (StatusCode::OK, axum::Json(json!({"probed": true}))).into_response()
        } else {
            StatusCode::NOT_FOUND.into_response()
        };
    }
    let status = scripted.unwrap_or(200);
    // 599: apply, then answer 500 (the answer is lost, the effect is not).
    let applies = (200..300).contains(&status) || status == 599;
    let applied = applies && st.lock().applied.insert(key.clone());
    let status = if status == 599 { 500 } else { status };
    let d = Delivery {
        path,
        key: key.clone(),
        operation: h("tidegate-operation"),
        attempt: h("tidegate-attempt"),
        body,
        raw,
        applied,
    };
    append(&log, &d);
    if (200..300).contains(&status) {
        (StatusCode::OK, axum::Json(json!({"receipt": key}))).into_response()
    } else {
        (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), "scripted failure").into_response()
    }
}

fn append(log: &Mutex<std::fs::File>, d: &Delivery) {
    let mut f = log.lock();
    let _ = writeln!(f, "{}", serde_json::to_string(d).unwrap_or_default());
    let _ = f.flush();
}

impl Sink {
    pub async fn start() -> Sink {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("deliveries.jsonl");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("log");
        let state = Arc::new(Mutex::new(SinkState::default()));
        let log = Arc::new(Mutex::new(file));
        let app = axum::Router::new().route("/{*path}", post(hook)).with_state((state.clone(), log.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind sink");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Sink { addr, state, log, path, _dir: dir, _task: task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Makes the next requests to `path` answer these statuses (599: apply, answer 500).
    pub fn script(&self, path: &str, statuses: &[u16]) {
        self.state.lock().script.entry(path.to_owned()).or_default().extend(statuses.iter().copied());
    }

    /// Delays answers on `path`.
    pub fn delay(&self, path: &str, d: Duration) {
        self.state.lock().delay.insert(path.to_owned(), d);
    }

    /// Every request received, from the log file.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let _ = self.log.lock().flush();
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    pub fn on(&self, path: &str) -> Vec<Delivery> {
        self.deliveries().into_iter().filter(|d| d.path == path).collect()
    }
}
