//! Issue 28 item 5: idempotency records, worker tasks and dispatch attempts outlive the
//! process. The real `tidegate serve` binary runs on a durable data directory and is
//! SIGKILLed; a server of an earlier version kept them in memory only, so a retried POST ran
//! again (a second transaction, a second webhook call) and a worker's lease was forgotten.
//!
//! Needs the binary: `cargo build -p tidegate` (see crash.rs).

use std::path::Path;

use serde_json::{Value, json};

use crate::common::Sink;
use crate::crash::{Server, binary, start};

struct Answer {
    status: u16,
    location: Option<String>,
    replayed: bool,
    text: String,
}

async fn send(http: &reqwest::Client, s: &Server, method: &str, path: &str, key: Option<&str>, body: Value) -> Answer {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = http.request(m, format!("http://{}{path}", s.addr)).bearer_auth(s.key.as_deref().unwrap()).json(&body);
    if let Some(k) = key {
        r = r.header("Idempotency-Key", k);
    }
    let resp = r.send().await.unwrap();
    let header = |h: &str| resp.headers().get(h).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (status, location, replayed) =
        (resp.status().as_u16(), header("location"), header("idempotent-replayed").as_deref() == Some("true"));
    Answer { status, location, replayed, text: resp.text().await.unwrap() }
}

fn json_of(a: &Answer) -> Value {
    serde_json::from_str(&a.text).unwrap_or(Value::Null)
}

/// Kills the server (SIGKILL: nothing is drained, checkpointed or synced) and starts it
/// again on the same directory, with the first start's key.
async fn kill_and_restart(bin: &Path, dir: &Path, mut s: Server) -> Server {
    s.child.start_kill().expect("SIGKILL");
    let _ = s.child.wait().await;
    let mut again = start(bin, dir, "127.0.0.1:0").await;
    again.key = s.key.take();
    again
}

/// The regression: the record of a completed POST was in memory, so after a crash the retry
/// ran the request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_post_answers_the_same_after_a_sigkill_without_a_second_effect() {
    let Some(bin) = binary() else {
        eprintln!("skipped: no tidegate binary (set TIDEGATE_BIN or `cargo build -p tidegate`)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let s = start(&bin, dir.path(), "127.0.0.1:0").await;
    let sink = Sink::start().await;
    let cap = json!({"kind": "webhook", "url": format!("{}/send", sink.url()), "timeout_ms": 2000, "attempts": 1});
    assert!(send(&http, &s, "PUT", "/v1/capabilities/send", None, cap).await.status < 300);
    let tool = json!({"class": "gated", "scopes": ["kv:send:{id}"], "call": "send"});
    assert!(send(&http, &s, "PUT", "/v1/tools/send", None, tool).await.status < 300);
    let begin = json!({"may_touch": ["kv:open:*"], "lease_ms": 600000});
    let call = json!({"tool": "send", "args": {"id": "a"}});

    let first_call = send(&http, &s, "POST", "/v1/calls", Some("call-1"), call.clone()).await;
    assert_eq!(first_call.status, 200, "{}", first_call.text);
    assert_eq!(json_of(&first_call)["transaction"]["state"], "committed", "{}", first_call.text);
    let first_begin = send(&http, &s, "POST", "/v1/transactions", Some("begin-1"), begin.clone()).await;
    assert_eq!(first_begin.status, 201, "{}", first_begin.text);
    assert_eq!(sink.on("send").len(), 1);

    let s = kill_and_restart(&bin, dir.path(), s).await;
    for (key, body, first, path) in
        [("call-1", &call, &first_call, "/v1/calls"), ("begin-1", &begin, &first_begin, "/v1/transactions")]
    {
        let again = send(&http, &s, "POST", path, Some(key), body.clone()).await;
        assert_eq!(
            (again.status, &again.location, &again.text),
            (first.status, &first.location, &first.text),
            "{path}: the same response after the restart"
        );
        assert!(again.replayed, "{path}: answered from the record, not run again");
    }
    assert_eq!(sink.on("send").len(), 1, "the webhook was called once");
    let list = send(&http, &s, "GET", "/v1/transactions", None, Value::Null).await;
    assert_eq!(json_of(&list)["data"].as_array().map(Vec::len), Some(2), "no second transaction: {}", list.text);
    // The key still refuses another request.
    let other =
        send(&http, &s, "POST", "/v1/calls", Some("call-1"), json!({"tool": "send", "args": {"id": "b"}})).await;
    assert_eq!(other.status, 409, "{}", other.text);
    let _ = s;
}

/// A worker task leased before the crash is still known after it: its worker's heartbeat and
/// report are accepted, the compensation dispatched again adopts the task (same id) and its
/// result, and the timeline still shows the attempt from before the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_leased_before_a_sigkill_takes_its_workers_report_after_it() {
    let Some(bin) = binary() else {
        eprintln!("skipped: no tidegate binary (set TIDEGATE_BIN or `cargo build -p tidegate`)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let s = start(&bin, dir.path(), "127.0.0.1:0").await;
    let sink = Sink::start().await;
    let cap = json!({"kind": "webhook", "url": format!("{}/book", sink.url())});
    assert!(send(&http, &s, "PUT", "/v1/capabilities/book", None, cap).await.status < 300);
    let undo = json!({"kind": "worker", "task_lease_ms": 600000});
    assert!(send(&http, &s, "PUT", "/v1/capabilities/unbook", None, undo).await.status < 300);
    let tool = json!({"class": "reversible", "scopes": ["kv:b:{id}"], "call": "book", "compensate": "unbook"});
    assert!(send(&http, &s, "PUT", "/v1/tools/book", None, tool).await.status < 300);
    let tx = json_of(&send(&http, &s, "POST", "/v1/transactions", None, json!({"may_touch": ["kv:b:*"]})).await)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let effect = json!({"tool": "book", "args": {"id": "1"}, "key": "bk-1"});
    let r = send(&http, &s, "POST", &format!("/v1/transactions/{tx}/effects"), None, effect).await;
    assert_eq!(json_of(&r)["ack"], "executed", "{}", r.text);
    let r = send(&http, &s, "POST", &format!("/v1/transactions/{tx}/abort"), None, json!({"wait_ms": 50})).await;
    assert_eq!(r.status, 202, "the compensation waits for a worker: {}", r.text);
    let poll = json!({"worker": "w", "capabilities": ["unbook"], "wait_ms": 10000});
    let tasks = json_of(&send(&http, &s, "POST", "/v1/tasks/poll", None, poll).await)["tasks"].clone();
    assert_eq!(tasks.as_array().map(Vec::len), Some(1), "{tasks}");
    let id = tasks[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(tasks[0]["key"], "bk-1#compensate");

    let s = kill_and_restart(&bin, dir.path(), s).await;
    // The worker did the work and reports it to the new process, under the task it leased.
    let hb = send(&http, &s, "POST", &format!("/v1/tasks/{id}/heartbeat"), None, json!({"worker": "w"})).await;
    assert_eq!(hb.status, 200, "the lease is still known: {}", hb.text);
    let report = json!({"worker": "w", "result": {"status": "done", "output": "unbooked"}});
    let r = send(&http, &s, "POST", &format!("/v1/tasks/{id}/report"), None, report).await;
    assert_eq!(r.status, 200, "the report is accepted: {}", r.text);
    // The kill may have cut the abort before its record was durable (the transaction is open
    // again): the client aborts again. Either way the compensation's dispatch adopts the task
    // and takes the worker's result, without a second task.
    send(&http, &s, "POST", &format!("/v1/transactions/{tx}/abort"), None, json!({"wait_ms": 5000})).await;
    let r = send(&http, &s, "GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=10000"), None, Value::Null).await;
    let out = json_of(&r);
    assert_eq!((r.status, out["state"].as_str()), (200, Some("aborted")), "{}", r.text);
    assert_eq!(out["effects"][0]["disposition"], "compensated", "{}", r.text);
    let q = send(&http, &s, "GET", "/v1/tasks", None, Value::Null).await;
    assert_eq!(json_of(&q)["data"], json!([]), "no second task for the same compensation: {}", q.text);
    let t = send(&http, &s, "GET", &format!("/v1/transactions/{tx}/timeline"), None, Value::Null).await;
    let results: Vec<String> = json_of(&t)["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["key"] == "bk-1#compensate")
        .map(|a| a["result"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(results, vec!["leased", "done"], "the lease from before the crash and the report after it");
    assert_eq!(sink.on("book").len(), 1, "the forward call never ran again");
}

/// A damaged state file stops its tenant from opening with a problem document that names the
/// file and what to do; nothing is reset, the other tenants serve, and moving the file aside
/// opens the tenant with empty state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_state_file_keeps_its_tenant_closed_with_a_clear_error() {
    let quick = |c: &mut tidegate_server::config::Config| c.server.shutdown_drain_ms = 300;
    let h = crate::common::Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (_, acme) = h.tenant("acme");
    let (_, other) = h.tenant("other");
    let r = h.req("POST", "/v1/transactions", Some(&acme.agent), Some(json!({}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let dir = h.stop().await.unwrap();
    let file = dir.path().join("tenants/acme/state.db");
    std::fs::write(&file, vec![0x5a; 8192]).unwrap();

    let h = crate::common::Harness::durable(dir, quick).await;
    let r = h.req("GET", "/v1/transactions", Some(&acme.agent), None).await;
    // Requests for a tenant that cannot be opened are `tenant_unavailable`; the detail says why.
    assert_eq!((r.status, r.body["code"].as_str()), (503, Some("tenant_unavailable")), "{r:?}");
    let detail = r.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("state.db") && detail.contains("move it aside"), "{detail}");
    let ready = h.req("GET", "/readyz", None, None).await;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(ready.text.contains(r#"\"failed\":1"#), "the tenant counts as failed: {ready:?}");
    let r = h.req("GET", "/v1/transactions", Some(&other.agent), None).await;
    assert_eq!(r.status, 200, "the other tenant serves: {r:?}");
    assert_eq!(std::fs::read(&file).unwrap(), vec![0x5a; 8192], "the file is left as it was");
    let dir = h.stop().await.unwrap();

    std::fs::rename(&file, dir.path().join("tenants/acme/state.db.damaged")).unwrap();
    let h = crate::common::Harness::durable(dir, quick).await;
    let r = h.req("GET", "/v1/transactions", Some(&acme.agent), None).await;
    assert_eq!(r.status, 200, "moved aside: the tenant opens with empty state: {r:?}");
    assert_eq!(r.body["data"].as_array().map(Vec::len), Some(1), "its ledger is untouched: {r:?}");
    h.stop().await;
}
