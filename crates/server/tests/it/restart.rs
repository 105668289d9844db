//! Restarts on a data directory: acknowledged work survives, open transactions are kept for
//! their leases, and pending releases and compensations are dispatched again by recovery.

use serde_json::{Value, json};

use crate::common::{Harness, Sink};

fn quick(c: &mut tidegate_server::config::Config) {
    c.server.shutdown_drain_ms = 300;
}

async fn poll(h: &Harness, key: &str, caps: &[&str]) -> Vec<Value> {
    let r = h
        .req("POST", "/v1/tasks/poll", Some(key), Some(json!({"worker": "w", "capabilities": caps, "wait_ms": 10000})))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body["tasks"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_commits_and_open_transactions_survive_a_graceful_restart() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "send", "gated", false, false).await;
    let r = h.req("POST", "/v1/calls", Some(&k.agent), Some(json!({"tool": "send", "args": {"id": "a"}}))).await;
    assert_eq!(r.body["transaction"]["state"], "committed", "{r:?}");
    let done = r.body["transaction"]["id"].as_str().unwrap().to_owned();
    let r = h
        .req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:send:b"], "lease_ms": 600000})))
        .await;
    let open = r.body["id"].as_str().unwrap().to_owned();
    let dir = h.stop().await.unwrap();

    let h = Harness::durable(dir, quick).await;
    let r = h.req("GET", &format!("/v1/transactions/{done}"), Some(&k.agent), None).await;
    assert_eq!(r.body["state"], "committed", "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{open}"), Some(&k.agent), None).await;
    assert_eq!((r.body["state"].as_str(), r.body["resumable"].as_bool()), (Some("open"), Some(true)), "{r:?}");
    assert_eq!(sink.on("send/call").len(), 1, "nothing was sent again");
    // The open transaction is resumed by id: it takes effects and commits.
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{open}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "send", "args": {"id": "b"}})),
        )
        .await;
    assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("queued")), "{r:?}");
    let r =
        h.req("POST", &format!("/v1/transactions/{open}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("committed")), "{r:?}");
    assert_eq!(sink.on("send/call").len(), 2, "the resumed transaction's release");
    // New transactions continue the numbering and tools are still registered.
    let r = h.req("POST", "/v1/calls", Some(&k.agent), Some(json!({"tool": "send", "args": {"id": "c"}}))).await;
    assert_eq!(r.body["transaction"]["state"], "committed", "{r:?}");
    assert_ne!(r.body["transaction"]["id"], done.as_str());
    let dir = h.stop().await.unwrap();
    let store = tidegate_sqlite::SqliteStore::open(dir.path().join("tenants/acme")).unwrap();
    assert!(store.verify().unwrap().rows > 0, "the ledger verifies clean");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_pending_at_shutdown_is_dispatched_again_after_restart_with_the_same_key() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.req(
        "PUT",
        "/v1/capabilities/book",
        Some(&k.operator),
        Some(json!({"kind": "webhook", "url": format!("{}/book", sink.url())})),
    )
    .await;
    h.req("PUT", "/v1/capabilities/unbook", Some(&k.operator), Some(json!({"kind": "worker"}))).await;
    h.req(
        "PUT",
        "/v1/tools/book",
        Some(&k.operator),
        Some(json!({"class": "reversible", "scopes": ["kv:b:{id}"], "call": "book", "compensate": "unbook"})),
    )
    .await;
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:b:*"]}))).await;
    let tx = r.body["id"].as_str().unwrap().to_owned();
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "book", "args": {"id": "1"}, "key": "bk-1"})),
        )
        .await;
    assert_eq!(r.body["ack"], "executed", "{r:?}");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/abort"), Some(&k.agent), Some(json!({"wait_ms": 50}))).await;
    assert_eq!(r.status, 202, "the compensation waits for a worker: {r:?}");
    let dir = h.stop().await.unwrap();

    let h = Harness::durable(dir, quick).await;
    let tasks = poll(&h, &k.agent, &["unbook"]).await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0]["key"], "bk-1#compensate");
    assert_eq!(tasks[0]["output"], json!({"receipt": "bk-1"}));
    let id = tasks[0]["id"].as_str().unwrap();
    let r = h
        .req(
            "POST",
            &format!("/v1/tasks/{id}/report"),
            Some(&k.agent),
            Some(json!({"worker": "w", "result": {"status": "done"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("aborted")), "{r:?}");
    assert_eq!(r.body["effects"][0]["disposition"], "compensated");
    assert_eq!(sink.on("book").len(), 1, "the forward call never ran again");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_doubt_at_shutdown_is_settled_by_the_probe_never_by_a_second_release() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (_, k) = h.tenant("acme");
    h.req("PUT", "/v1/capabilities/mailer", Some(&k.operator), Some(json!({"kind": "worker"}))).await;
    h.req("PUT", "/v1/capabilities/mailer-probe", Some(&k.operator), Some(json!({"kind": "worker"}))).await;
    let r = h
        .req(
            "PUT",
            "/v1/tools/send",
            Some(&k.operator),
            Some(json!({"class": "gated", "scopes": ["mail:{to}"], "call": "mailer", "probe": "mailer-probe"})),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["mail:*"]}))).await;
    let tx = r.body["id"].as_str().unwrap().to_owned();
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "send", "args": {"to": "ann"}})),
        )
        .await;
    let key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/commit"),
            Some(&k.agent),
            Some(json!({"seal": true, "wait_ms": 50})),
        )
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    // The worker takes the release (and sends the mail), but the server stops before the report.
    let t = poll(&h, &k.agent, &["mailer"]).await;
    assert_eq!((t[0]["operation"].as_str(), t[0]["key"].as_str()), (Some("release"), Some(key.as_str())));
    let dir = h.stop().await.unwrap();

    let h = Harness::durable(dir, quick).await;
    let t = poll(&h, &k.agent, &["mailer", "mailer-probe"]).await;
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0]["operation"], "probe", "a started release is asked about, never sent again: {t:?}");
    assert_eq!(t[0]["key"], key.as_str());
    let id = t[0]["id"].as_str().unwrap();
    h.req(
        "POST",
        &format!("/v1/tasks/{id}/report"),
        Some(&k.agent),
        Some(json!({"worker": "w", "result": {"status": "done", "output": "sent"}})),
    )
    .await;
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("committed")), "{r:?}");
    assert_eq!(r.body["effects"][0]["tag"], "clean", "{r:?}");
    let q = h.req("GET", "/v1/tasks", Some(&k.operator), None).await;
    assert!(q.body["data"].as_array().unwrap().is_empty(), "no release task was created again: {q:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculation_group_kept_open_across_a_restart_is_resumed_and_settled() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    let body = json!({"branches": 2, "may_touch": ["kv:hold:*"], "lease_ms": 600000});
    let r = h.req("POST", "/v1/groups", Some(&k.agent), Some(body)).await;
    assert_eq!(r.status, 201, "{r:?}");
    let group = r.body["id"].as_str().unwrap().to_owned();
    let branches: Vec<String> =
        r.body["branches"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap().to_owned()).collect();
    for (b, id) in branches.iter().zip(["a", "b"]) {
        let effect = json!({"tool": "hold", "args": {"id": id}});
        let r = h.req("POST", &format!("/v1/transactions/{b}/effects"), Some(&k.agent), Some(effect)).await;
        assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("executed")), "{r:?}");
    }
    let dir = h.stop().await.unwrap();

    let h = Harness::durable(dir, quick).await;
    let r = h.req("GET", &format!("/v1/groups/{group}"), Some(&k.agent), None).await;
    assert_eq!((r.body["state"].as_str(), r.body["resumable"].as_bool()), (Some("open"), Some(true)), "{r:?}");
    let commit = json!({"winner": branches[1]});
    let r = h.req("POST", &format!("/v1/groups/{group}/commit"), Some(&k.agent), Some(commit)).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("settled")), "{r:?}");
    assert_eq!(r.body["winner"], branches[1].as_str());
    assert_eq!(r.body["resumable"], false);
    let undo = sink.on("hold/undo");
    assert_eq!(undo.len(), 1, "the losing branch is undone once: {undo:?}");
    assert!(undo[0].body.to_string().contains("\"a\""), "{:?}", undo[0]);
    // Settled: the group takes no more decisions (a conflict, not a 404 for a group that exists).
    let r = h.req("POST", &format!("/v1/groups/{group}/abort"), Some(&k.agent), Some(json!({}))).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("wrong_state")), "{r:?}");
    h.stop().await;
}

/// Issue 26 item 4: the server derived an effect's key as `<tx>:<tool>:<n>` from a counter
/// kept only in memory, which restarted at 0 when a transaction was resumed after a restart,
/// so calling the same tool again reused the first call's key (the provider deduplicated it:
/// the call silently never happened). Keys now come from the ledger's effect numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_transaction_does_not_reuse_its_first_calls_key() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), quick).await;
    let (tag, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "book", "reversible", true, false).await;
    let r = h
        .req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:book"], "lease_ms": 600000})))
        .await;
    let open = r.body["id"].as_str().unwrap().to_owned();
    let call = |id: &'static str| json!({"tool": "book", "args": {"id": id}});
    let r = h.req("POST", &format!("/v1/transactions/{open}/effects"), Some(&k.agent), Some(call("a"))).await;
    assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("executed")), "{r:?}");
    let first_key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    assert_eq!(first_key, format!("tx_{tag}_{}:book:0", open.rsplit('_').next().unwrap()));
    let dir = h.stop().await.unwrap();

    let h = Harness::durable(dir, quick).await;
    let r = h.req("POST", &format!("/v1/transactions/{open}/effects"), Some(&k.agent), Some(call("b"))).await;
    assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("executed")), "{r:?}");
    let second_key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    assert_ne!(second_key, first_key, "a new call of the resumed transaction gets a new key");
    assert!(second_key.ends_with(":book:1"), "{second_key}");
    let calls = sink.on("book/call");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|d| d.applied), "both calls reached the provider as new calls: {calls:?}");
    assert_eq!(calls.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(), vec![first_key.as_str(), second_key.as_str()]);
    assert_eq!(calls[1].body["args"], json!({"id": "b"}), "the provider gets the client's arguments, no envelope");
    // An abort compensates both, each under its own key.
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{open}/abort"),
            Some(&k.agent),
            Some(json!({"reason": "test", "wait_ms": 5000})),
        )
        .await;
    assert_eq!(r.body["state"], "aborted", "{r:?}");
    let undo: Vec<String> = sink.on("book/undo").iter().map(|d| d.key.clone()).collect();
    assert_eq!(undo, vec![format!("{second_key}#compensate"), format!("{first_key}#compensate")]);
    h.stop().await.unwrap();
}
