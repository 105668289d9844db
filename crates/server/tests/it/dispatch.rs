//! Capability dispatch: webhook classification, probes, and pull workers with leases.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Harness, Sink};

async fn begin(h: &Harness, key: &str, scopes: &[&str]) -> String {
    let r = h.req("POST", "/v1/transactions", Some(key), Some(json!({"may_touch": scopes}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_from_an_eager_call_aborts_the_transaction_with_409_and_its_outcome() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "charge", "reversible", true, false).await;
    sink.script("charge/call", &[422]);
    let tx = begin(&h, &k.agent, &["kv:charge:*"]).await;
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "charge", "args": {"id": "c1"}})),
        )
        .await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.body["code"], "transaction_aborted");
    assert_eq!(r.body["transaction"]["state"], "aborted");
    assert_eq!(r.body["transaction"]["outcome"]["reason"]["kind"], "tool_failed");
    assert_eq!(sink.on("charge/call").len(), 1, "a 4xx is not retried");
    assert!(sink.on("charge/undo").is_empty(), "a call that did not happen is not compensated");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_answer_is_confirmed_by_the_probe_and_applied_once() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "wire", "gated", false, true).await;
    // Both attempts land at the provider, but their answers are lost (500).
    sink.script("wire/call", &[599, 599]);
    let tx = begin(&h, &k.agent, &["kv:wire:*"]).await;
    h.req(
        "POST",
        &format!("/v1/transactions/{tx}/effects"),
        Some(&k.agent),
        Some(json!({"tool": "wire", "args": {"id": "p1"}})),
    )
    .await;
    let r = h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["state"], "committed", "{r:?}");
    let d = sink.on("wire/call");
    assert_eq!(d.len(), 2, "two attempts: {d:?}");
    assert!(d.iter().all(|x| x.key == d[0].key), "every attempt carries the same key");
    assert_eq!(d.iter().filter(|x| x.applied).count(), 1, "applied once");
    let p = sink.on("probe");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].key, d[0].key);
    assert_eq!(p[0].operation, "probe");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_unknown_outcome_without_a_probe_is_unresolved_and_listed() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "fax", "gated", false, false).await;
    sink.script("fax/call", &[503, 503]);
    let tx = begin(&h, &k.agent, &["kv:fax:*"]).await;
    h.req(
        "POST",
        &format!("/v1/transactions/{tx}/effects"),
        Some(&k.agent),
        Some(json!({"tool": "fax", "args": {"id": "f1"}})),
    )
    .await;
    let r = h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["effects"][0]["tag"], "unresolved", "{r:?}");
    assert_eq!(r.body["effects"][0]["outcome_unknown"], true, "{r:?}");
    let a = h.req("GET", "/v1/ledger/attention?tag=unresolved", Some(&k.operator), None).await;
    assert_eq!(a.status, 200, "{a:?}");
    let items = a.body["data"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{a:?}");
    assert_eq!(items[0]["transaction"], tx.as_str());
    assert_eq!(items[0]["effect"]["tool"], "fax");
    let none = h.req("GET", "/v1/ledger/attention?tag=leaked", Some(&k.operator), None).await;
    assert!(none.body["data"].as_array().unwrap().is_empty());
    h.stop().await;
}

async fn poll(h: &Harness, key: &str, worker: &str, caps: &[&str], wait_ms: u64) -> Vec<Value> {
    let r = h
        .req(
            "POST",
            "/v1/tasks/poll",
            Some(key),
            Some(json!({"worker": worker, "capabilities": caps, "wait_ms": wait_ms})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body["tasks"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_task_whose_lease_expires_returns_with_the_same_key_and_the_first_report_wins() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let r = h
        .req("PUT", "/v1/capabilities/mailer", Some(&k.operator), Some(json!({"kind": "worker", "task_lease_ms": 300})))
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = h
        .req(
            "PUT",
            "/v1/tools/send",
            Some(&k.operator),
            Some(json!({"class": "gated", "scopes": ["mail:{to}"], "key": "mail-{to}-{n}", "call": "mailer"})),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let tx = begin(&h, &k.agent, &["mail:*"]).await;
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "send", "args": {"to": "ann", "n": 1}})),
        )
        .await;
    assert_eq!(r.body["effect"]["key"], "mail-ann-1", "the key template: {r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/commit"),
            Some(&k.agent),
            Some(json!({"seal": true, "wait_ms": 50})),
        )
        .await;
    assert_eq!(r.status, 202, "the release waits for a worker: {r:?}");
    assert_eq!(r.body["state"], "committing");

    let first = poll(&h, &k.agent, "w1", &["mailer"], 5000).await;
    assert_eq!(first.len(), 1);
    let task = first[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(first[0]["operation"], "release");
    assert_eq!(first[0]["key"], "mail-ann-1");
    assert_eq!(first[0]["args"], json!({"to": "ann", "n": 1}));
    assert_eq!(first[0]["attempt"], 1);
    let q = h.req("GET", "/v1/tasks", Some(&k.operator), None).await;
    assert_eq!(q.body["data"][0]["state"], "leased");
    // w1 goes quiet; its lease ends and the task comes back with the same key.
    let again = poll(&h, &k.agent, "w2", &["mailer"], 5000).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["id"], task.as_str());
    assert_eq!(again[0]["key"], "mail-ann-1");
    assert_eq!(again[0]["attempt"], 2);
    let r = h.req("POST", &format!("/v1/tasks/{task}/heartbeat"), Some(&k.agent), Some(json!({"worker": "w1"}))).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("task_not_leased")), "{r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/tasks/{task}/heartbeat"),
            Some(&k.agent),
            Some(json!({"worker": "w2", "lease_ms": 5000})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/tasks/{task}/report"),
            Some(&k.agent),
            Some(json!({"worker": "w2", "result": {"status": "done", "output": {"id": "m-1"}}})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("committed")), "{r:?}");
    assert_eq!(r.body["effects"][0]["output"], json!({"id": "m-1"}));
    let r = h
        .req(
            "POST",
            &format!("/v1/tasks/{task}/report"),
            Some(&k.agent),
            Some(json!({"worker": "w1", "result": {"status": "done"}})),
        )
        .await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("task_settled")), "{r:?}");
    let t = h.req("GET", &format!("/v1/transactions/{tx}/timeline"), Some(&k.agent), None).await;
    let results: Vec<&str> =
        t.body["attempts"].as_array().unwrap().iter().map(|a| a["result"].as_str().unwrap()).collect();
    assert_eq!(results, ["leased", "expired", "leased", "done"], "{t:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_goes_to_a_worker_with_the_forward_output_and_a_distinct_key() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.req(
        "PUT",
        "/v1/capabilities/hotel",
        Some(&k.operator),
        Some(json!({"kind": "webhook", "url": format!("{}/hotel", sink.url())})),
    )
    .await;
    h.req("PUT", "/v1/capabilities/hotel-undo", Some(&k.operator), Some(json!({"kind": "worker"}))).await;
    let r = h.req("PUT", "/v1/tools/hold", Some(&k.operator), Some(json!({"class": "reversible_with_cost", "scopes": ["travel:hotel:{id}"], "call": "hotel", "compensate": "hotel-undo"}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let tx = begin(&h, &k.agent, &["travel:*"]).await;
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "hold", "args": {"id": "H1"}})),
        )
        .await;
    let key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    let r = h.req("POST", &format!("/v1/transactions/{tx}/abort"), Some(&k.agent), Some(json!({"wait_ms": 50}))).await;
    assert_eq!(r.status, 202, "{r:?}");
    let tasks = poll(&h, &k.agent, "w", &["hotel-undo"], 5000).await;
    assert_eq!(tasks[0]["operation"], "compensate");
    assert_eq!(tasks[0]["key"], format!("{key}#compensate"));
    assert_eq!(tasks[0]["output"], json!({"receipt": key}));
    let id = tasks[0]["id"].as_str().unwrap();
    let r = h
        .req(
            "POST",
            &format!("/v1/tasks/{id}/report"),
            Some(&k.agent),
            Some(json!({"worker": "w", "result": {"status": "done", "residue": "fee 10 EUR"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!(r.body["state"], "aborted", "{r:?}");
    assert_eq!(r.body["effects"][0]["disposition"], "compensated");
    assert_eq!(r.body["effects"][0]["residue"], "fee 10 EUR");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_with_no_task_ends_at_its_wait_and_a_capability_in_use_cannot_be_deleted() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let started = std::time::Instant::now();
    assert!(poll(&h, &k.agent, "w", &["nothing"], 200).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(190));
    h.req("PUT", "/v1/capabilities/c", Some(&k.operator), Some(json!({"kind": "worker"}))).await;
    h.req("PUT", "/v1/tools/t", Some(&k.operator), Some(json!({"class": "gated", "scopes": ["kv:t:x"], "call": "c"})))
        .await;
    let r = h.req("DELETE", "/v1/capabilities/c", Some(&k.operator), None).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("capability_in_use")), "{r:?}");
    let r = h
        .req(
            "PUT",
            "/v1/tools/u",
            Some(&k.operator),
            Some(json!({"class": "gated", "scopes": ["kv:t:x"], "call": "missing"})),
        )
        .await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("call")), "{r:?}");
    assert_eq!(h.req("DELETE", "/v1/tools/t", Some(&k.operator), None).await.status, 204);
    assert_eq!(h.req("DELETE", "/v1/capabilities/c", Some(&k.operator), None).await.status, 204);
    h.stop().await;
}

/// Calls `push` (a worker-served reversible tool) in `tx` while a worker answers its tasks
/// with `results`, one per task; returns the effect's answer and each task's (key, attempt).
async fn push_served(
    h: &Harness,
    key: &str,
    tx: &str,
    id: &str,
    results: &[Value],
) -> (crate::common::Resp, Vec<(String, u64)>) {
    let path = format!("/v1/transactions/{tx}/effects");
    let effect = h.req("POST", &path, Some(key), Some(json!({"tool": "push", "args": {"id": id}})));
    let worker = async {
        let mut seen = Vec::new();
        for (n, result) in results.iter().enumerate() {
            let t = poll(h, key, "w", &["gw"], 5000).await;
            assert_eq!(t.len(), 1, "task {n}");
            seen.push((t[0]["key"].as_str().unwrap().to_owned(), t[0]["attempt"].as_u64().unwrap()));
            let task = t[0]["id"].as_str().unwrap();
            let body = json!({"worker": "w", "result": result});
            let r = h.req("POST", &format!("/v1/tasks/{task}/report"), Some(key), Some(body)).await;
            assert_eq!(r.status, 200, "{r:?}");
        }
        seen
    };
    tokio::join!(effect, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_applied_with_retry_queues_the_task_again_within_the_capability_attempts() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let cap = json!({"kind": "worker", "attempts": 3, "backoff_ms": 10});
    let r = h.req("PUT", "/v1/capabilities/gw", Some(&k.operator), Some(cap)).await;
    assert_eq!(r.status, 201, "{r:?}");
    let def = json!({"class": "reversible", "scopes": ["kv:gw:{id}"], "call": "gw"});
    assert_eq!(h.req("PUT", "/v1/tools/push", Some(&k.operator), Some(def)).await.status, 201);
    let bad = json!({"kind": "worker", "attempts": 0});
    let r = h.req("PUT", "/v1/capabilities/gw2", Some(&k.operator), Some(bad)).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("attempts")), "{r:?}");
    let busy = json!({"status": "not_applied", "error": "busy", "retry": true});

    // Busy twice, then done: the same key each time, the attempt counting up, one effect.
    let tx = begin(&h, &k.agent, &["kv:gw:*"]).await;
    let done = json!({"status": "done", "output": "ok"});
    let (r, seen) = push_served(&h, &k.agent, &tx, "a", &[busy.clone(), busy.clone(), done]).await;
    assert_eq!((r.status, r.body["ack"].as_str(), &r.body["output"]), (200, Some("executed"), &json!("ok")), "{r:?}");
    assert!(seen.iter().all(|(key, _)| *key == seen[0].0), "one key: {seen:?}");
    assert_eq!(seen.iter().map(|(_, a)| *a).collect::<Vec<_>>(), [1, 2, 3]);

    // Busy on every attempt: the transaction aborts retryably (tool_unavailable).
    let tx = begin(&h, &k.agent, &["kv:gw:*"]).await;
    let (r, _) = push_served(&h, &k.agent, &tx, "b", &[busy.clone(), busy.clone(), busy]).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("transaction_aborted")), "{r:?}");
    let reason = &r.body["transaction"]["outcome"]["reason"];
    assert_eq!(
        (reason["kind"].as_str(), reason["retryable"].as_bool()),
        (Some("tool_unavailable"), Some(true)),
        "{r:?}"
    );
    assert!(poll(&h, &k.agent, "w", &["gw"], 200).await.is_empty(), "no fourth task");

    // Without retry it is final at once.
    let tx = begin(&h, &k.agent, &["kv:gw:*"]).await;
    let (r, _) = push_served(&h, &k.agent, &tx, "c", &[json!({"status": "not_applied", "error": "declined"})]).await;
    let reason = &r.body["transaction"]["outcome"]["reason"];
    assert_eq!((reason["kind"].as_str(), reason["retryable"].as_bool()), (Some("tool_failed"), Some(false)), "{r:?}");
    h.stop().await;
}
