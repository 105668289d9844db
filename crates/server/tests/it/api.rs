//! Transactions, waiting, idempotency, groups, roles and metrics over HTTP.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Harness, Sink};

fn id(r: &crate::common::Resp) -> String {
    r.body["id"].as_str().expect("an id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_release_reaches_the_webhook_once_with_the_effects_key_at_commit() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "send_email", "gated", false, false).await;

    let r = h
        .req(
            "POST",
            "/v1/transactions",
            Some(&k.agent),
            Some(json!({"agent": "support", "may_touch": ["kv:send_email:ann"]})),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body["state"], "open");
    let tx = id(&r);
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "send_email", "args": {"id": "ann", "body": "refunded"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["ack"], "queued");
    let key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    assert_eq!(r.body["effect"]["args"], json!({"id": "ann", "body": "refunded"}), "the API shows the client's args");
    assert!(sink.deliveries().is_empty(), "a gated effect must not leave before commit");

    let r = h.req("POST", &format!("/v1/transactions/{tx}/seal"), Some(&k.agent), None).await;
    assert_eq!(r.body["state"], "sealed", "{r:?}");
    let r =
        h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"wait_ms": 10000}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["state"], "committed");
    assert_eq!(r.body["outcome"]["committed"], true);
    assert_eq!(r.body["effects"][0]["disposition"], "fired");

    let d = sink.on("send_email/call");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].key, key);
    assert_eq!(d[0].operation, "release");
    assert_eq!(d[0].body["args"]["body"], "refunded");
    // The whole body, byte for byte: these fields in this order (a release carries no output).
    assert_eq!(
        d[0].raw,
        format!(
            r#"{{"args":{{"body":"refunded","id":"ann"}},"capability":"send_email-call","key":"{key}","operation":"release","tool":"send_email"}}"#
        )
    );

    // Asking again answers the settled transaction and sends nothing more.
    let r = h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("committed")));
    assert_eq!(sink.on("send_email/call").len(), 1);

    let r = h.req("GET", &format!("/v1/transactions/{tx}/timeline"), Some(&k.agent), None).await;
    assert_eq!(r.status, 200, "{r:?}");
    let kinds: Vec<&str> = r.body["events"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    for k in ["begin", "effect_recorded", "sealed", "decided", "release_started", "settled"] {
        assert!(kinds.contains(&k), "{kinds:?} lacks {k}");
    }
    let attempts = r.body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["result"], "done");
    assert_eq!(attempts[0]["key"], key.as_str());
    for t in h.state.tenants() {
        t.engine.check_integrity().unwrap();
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensation_after_an_abort_reaches_the_webhook_once_with_a_derived_key() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "book", "reversible", true, false).await;
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:book:T1"]}))).await;
    let tx = id(&r);
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "book", "args": {"id": "T1"}, "key": "trip-T1"})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["ack"], "executed");
    assert_eq!(r.body["output"], json!({"receipt": "trip-T1"}));
    assert_eq!(sink.on("book/call").len(), 1);

    let r = h
        .req("POST", &format!("/v1/transactions/{tx}/abort"), Some(&k.agent), Some(json!({"reason": "visa refused"})))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["state"], "aborted");
    assert_eq!(r.body["outcome"]["reason"]["kind"], "explicit");
    assert_eq!(r.body["effects"][0]["disposition"], "compensated");
    let undo = sink.on("book/undo");
    assert_eq!(undo.len(), 1, "{undo:?}");
    assert_eq!(undo[0].key, "trip-T1#compensate");
    assert_eq!(undo[0].operation, "compensate");
    assert_eq!(undo[0].body["output"], json!({"receipt": "trip-T1"}), "the forward output travels with the undo");
    assert_eq!(
        undo[0].body,
        json!({"args": {"id": "T1"}, "capability": "book-undo", "key": "trip-T1#compensate",
            "operation": "compensate", "output": {"receipt": "trip-T1"}, "tool": "book"})
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_and_sse_follow_a_commit_that_waits_for_an_earlier_transaction() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    // The earlier transaction declares nothing, so it blocks every scope until it ends.
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"agent": "slow"}))).await;
    let early = id(&r);
    let r = h
        .req(
            "POST",
            "/v1/transactions",
            Some(&k.agent),
            Some(json!({"agent": "quick", "may_touch": ["retail:order:W1"]})),
        )
        .await;
    let late = id(&r);
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{late}/reads"),
            Some(&k.agent),
            Some(json!({"scope": "retail:order:W1"})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["version"], 0);

    // SSE from the start.
    let url = format!("{}/v1/transactions/{late}/events", h.base);
    let client = h.http.clone();
    let key = k.agent.clone();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let sse = tokio::spawn(async move {
        let mut resp = client.get(url).bearer_auth(key).send().await.unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let mut text = String::new();
        let mut first = Some(first_tx);
        while let Some(chunk) = resp.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(f) = first.take() {
                let _ = f.send(());
            }
        }
        text
    });
    first_rx.await.expect("the stream sends the current state at once");

    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{late}/commit"),
            Some(&k.agent),
            Some(json!({"seal": true, "wait_ms": 100})),
        )
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(r.body["state"], "waiting");
    let r = h.req("GET", &format!("/v1/transactions/{late}/outcome?timeout_ms=100"), Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (202, Some("waiting")), "{r:?}");

    let poll = {
        let h2 = h.http.clone();
        let url = format!("{}/v1/transactions/{late}/outcome?timeout_ms=10000", h.base);
        let key = k.reviewer.clone();
        tokio::spawn(async move { h2.get(url).bearer_auth(key).send().await.unwrap().json::<Value>().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = h.req("POST", &format!("/v1/transactions/{early}/abort"), Some(&k.operator), None).await;
    assert_eq!(r.body["state"], "aborted", "{r:?}");
    let settled = poll.await.unwrap();
    assert_eq!(settled["state"], "committed", "{settled}");

    let text = tokio::time::timeout(Duration::from_secs(10), sse).await.expect("the stream ends").unwrap();
    let states: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str::<Value>(d.trim()).unwrap()["state"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(states.first().map(String::as_str), Some("open"), "{states:?}");
    assert!(states.iter().any(|s| s == "waiting"), "{states:?}");
    assert_eq!(states.last().map(String::as_str), Some("committed"), "{states:?}");
    assert!(text.contains("event: state"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_replays_the_first_response_and_refuses_other_parameters() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let hdr = [("Idempotency-Key", "begin-1")];
    let a = h.req_with("POST", "/v1/transactions", Some(&k.agent), Some(json!({"agent": "a"})), &hdr).await;
    assert_eq!(a.status, 201, "{a:?}");
    let b = h.req_with("POST", "/v1/transactions", Some(&k.agent), Some(json!({"agent": "a"})), &hdr).await;
    assert_eq!(b.status, 201);
    assert_eq!(a.body["id"], b.body["id"], "a retry must not begin a second transaction");
    assert_eq!(b.headers.get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
    let list = h.req("GET", "/v1/transactions", Some(&k.agent), None).await;
    assert_eq!(list.body["data"].as_array().unwrap().len(), 1);

    let c = h.req_with("POST", "/v1/transactions", Some(&k.agent), Some(json!({"agent": "b"})), &hdr).await;
    assert_eq!(c.status, 409, "{c:?}");
    assert_eq!(c.body["code"], "idempotency_key_reused");
    assert!(c.body["detail"].as_str().unwrap().contains("`body.agent` was \"a\" and is now \"b\""), "{c:?}");
    let tx = id(&a);
    let d = h.req_with("POST", &format!("/v1/transactions/{tx}/seal"), Some(&k.agent), None, &hdr).await;
    assert_eq!(d.status, 409);
    assert!(d.body["detail"].as_str().unwrap().contains("first used for POST /v1/transactions"), "{d:?}");
    // A refused request leaves the key free.
    let bad = [("Idempotency-Key", "bad-1")];
    let e = h.req_with("POST", "/v1/transactions", Some(&k.agent), Some(json!({"lease_ms": 0})), &bad).await;
    assert_eq!(e.status, 400);
    let f = h.req_with("POST", "/v1/transactions", Some(&k.agent), Some(json!({"lease_ms": 1000})), &bad).await;
    assert_eq!(f.status, 201, "{f:?}");
    // Keys are per tenant: another tenant's identical key is its own.
    let (_, k2) = h.tenant("other");
    let g = h.req_with("POST", "/v1/transactions", Some(&k2.agent), Some(json!({"agent": "a"})), &hdr).await;
    assert_eq!(g.status, 201);
    assert_ne!(g.body["id"], a.body["id"]);
    assert!(g.headers.get("idempotent-replayed").is_none());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_call_transaction_commits_in_one_request() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "notify", "gated", false, false).await;
    let r = h
        .req("POST", "/v1/calls", Some(&k.agent), Some(json!({"tool": "notify", "args": {"id": "u1"}, "key": "n-u1"})))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["ack"], "queued");
    assert_eq!(r.body["transaction"]["state"], "committed");
    assert_eq!(r.body["transaction"]["may_touch"], json!(["kv:notify:u1"]));
    let d = sink.on("notify/call");
    assert_eq!((d.len(), d[0].key.as_str()), (1, "n-u1"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_its_reads_and_effects_in_order_and_commits_in_one_request() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "reserve", "reversible", true, false).await;
    h.webhook_tool(&k.admin, &sink, "notify", "gated", false, false).await;
    let body = json!({"reads": ["kv:stock:7"], "agent": "shop",
        "effects": [{"tool": "reserve", "args": {"id": "r1"}}, {"tool": "notify", "args": {"id": "n1"}, "key": "n-1"}]});
    let r = h.req("POST", "/v1/batches", Some(&k.agent), Some(body)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["transaction"]["state"], "committed", "{r:?}");
    assert_eq!(r.body["transaction"]["agent"], "shop");
    assert_eq!(r.body["transaction"]["may_touch"], json!(["kv:stock:7", "kv:reserve:r1", "kv:notify:n1"]));
    assert_eq!(r.body["reads"], json!([{"scope": "kv:stock:7", "version": 0}]));
    let acks: Vec<&str> = r.body["effects"].as_array().unwrap().iter().map(|e| e["ack"].as_str().unwrap()).collect();
    assert_eq!(acks, ["executed", "queued"]);
    assert_eq!(r.body["effects"][1]["effect"]["key"], "n-1");
    assert_eq!(sink.on("reserve/call").len(), 1);
    assert_eq!(sink.on("notify/call").len(), 1);
    // A later batch reads the version the first one committed on a scope it wrote.
    let r = h
        .req(
            "POST",
            "/v1/batches",
            Some(&k.agent),
            Some(json!({"reads": ["kv:reserve:r1"], "effects": [{"tool": "notify", "args": {"id": "n2"}}]})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body["reads"][0]["version"].as_u64().unwrap() > 0, "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_anywhere_begins_nothing_and_names_the_step() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "notify", "gated", false, false).await;
    let ok = json!({"tool": "notify", "args": {"id": "a"}});
    let refused = [
        (json!({"effects": []}), "effects"),
        (json!({"effects": vec![ok.clone(); 65]}), "effects"),
        (json!({"effects": [ok, {"tool": "nope"}]}), "effects[1].tool"),
        (json!({"effects": [{"tool": "notify", "args": {}}]}), "effects[0].scopes[0] of tool `notify`"),
        (json!({"effects": [{"tool": "notify", "args": {"id": "b"}, "key": ""}]}), "effects[0].key"),
        (json!({"effects": [{"tool": "notify", "args": {"id": "b"}, "execute": "client"}]}), ""),
        (json!({"effects": [{"tool": "notify", "args": {"id": "b"}}], "reads": ["x".repeat(2000)]}), "reads[0]"),
        (json!({"effects": [{"tool": "notify", "args": {"id": "b"}}], "reads": ["kv:a", "no-type"]}), "reads[1]"),
        (json!({"effects": [{"tool": "notify", "args": {"id": "b"}}], "reads": vec!["kv:r"; 65]}), "reads"),
        (json!({"effects": [{"tool": "notify", "args": {"id": "b"}}], "lease_ms": 0}), "lease_ms"),
    ];
    for (body, field) in refused {
        let r = h.req("POST", "/v1/batches", Some(&k.agent), Some(body.clone())).await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        if !field.is_empty() {
            assert_eq!(r.body["field"], field, "{body}: {r:?}");
        }
    }
    // Nothing began and nothing was sent.
    let r = h.req("GET", "/v1/transactions", Some(&k.reviewer), None).await;
    assert_eq!(r.body["data"], json!([]), "{r:?}");
    assert!(sink.on("notify/call").is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_client_goes_away_mid_way_still_runs_to_its_settlement() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "reserve", "reversible", true, false).await;
    h.webhook_tool(&k.admin, &sink, "notify", "gated", false, false).await;
    sink.delay("reserve/call", Duration::from_millis(800));
    // A lease far longer than the test: only the batch's own task can settle it in time.
    let body = json!({"lease_ms": 600000, "effects": [
        {"tool": "reserve", "args": {"id": "r1"}}, {"tool": "notify", "args": {"id": "n1"}}]});
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), h.req("POST", "/v1/batches", Some(&k.agent), Some(body)));
    assert!(dropped.await.is_err(), "the request was cut off while its first effect ran");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let state = loop {
        let r = h.req("GET", "/v1/transactions", Some(&k.reviewer), None).await;
        let state = r.body["data"][0]["state"].as_str().unwrap_or("none").to_owned();
        if state == "committed" || tokio::time::Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(state, "committed");
    assert_eq!(sink.on("notify/call").len(), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_effect_fails_aborts_and_compensates_what_ran_before_it() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "reserve", "reversible", true, false).await;
    h.webhook_tool(&k.admin, &sink, "charge", "reversible", true, false).await;
    h.webhook_tool(&k.admin, &sink, "notify", "gated", false, false).await;
    // The charge is refused (both attempts).
    sink.script("charge/call", &[400, 400]);
    let body = json!({"effects": [
        {"tool": "reserve", "args": {"id": "r1"}},
        {"tool": "charge", "args": {"id": "c1"}},
        {"tool": "notify", "args": {"id": "n1"}}]});
    let r = h.req("POST", "/v1/batches", Some(&k.agent), Some(body)).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("transaction_aborted")), "{r:?}");
    assert_eq!(r.body["field"], "effects[1]", "{r:?}");
    let tx = r.body["transaction"]["id"].as_str().expect("the aborted transaction is attached").to_owned();
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!(r.body["state"], "aborted", "{r:?}");
    // The reservation that ran was undone; the held notification never left.
    assert_eq!(sink.on("reserve/undo").len(), 1);
    assert!(sink.on("notify/call").is_empty());
    // A step outside the declared may-touch set: the engine refuses it after the begin, and
    // the field still names the step.
    let body = json!({"may_touch": ["kv:reserve:r2"], "effects": [
        {"tool": "reserve", "args": {"id": "r2"}}, {"tool": "notify", "args": {"id": "elsewhere"}}]});
    let r = h.req("POST", "/v1/batches", Some(&k.agent), Some(body)).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("transaction_aborted")), "{r:?}");
    assert!(r.body["field"].as_str().unwrap().starts_with("effects[1]"), "{r:?}");
    assert_eq!(r.body["transaction"]["state"], "aborted", "{r:?}");
    assert_eq!(sink.on("reserve/undo").len(), 2);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculation_group_fires_only_the_winners_held_effect() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "pay", "gated", false, false).await;
    let r = h.req("POST", "/v1/groups", Some(&k.agent), Some(json!({"branches": 3, "may_touch": ["kv:pay:*"]}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let g = id(&r);
    let branches: Vec<String> =
        r.body["branches"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(branches.len(), 3);
    for (i, b) in branches.iter().enumerate() {
        let r = h
            .req(
                "POST",
                &format!("/v1/transactions/{b}/effects"),
                Some(&k.agent),
                Some(json!({"tool": "pay", "args": {"id": format!("v{i}")}})),
            )
            .await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    let r = h.req("POST", &format!("/v1/transactions/{}/commit", branches[1]), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("branch_of_group")), "{r:?}");
    let r =
        h.req("POST", &format!("/v1/groups/{g}/commit"), Some(&k.agent), Some(json!({"winner": branches[1]}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["state"], "settled");
    assert_eq!(r.body["winner"], branches[1].as_str());
    let d = sink.on("pay/call");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].body["args"]["id"], "v1");
    let r = h.req("GET", &format!("/v1/groups/{g}"), Some(&k.reviewer), None).await;
    let reasons: Vec<Value> =
        r.body["branches"].as_array().unwrap().iter().map(|b| b["outcome"]["reason"]["kind"].clone()).collect();
    assert_eq!(reasons.iter().filter(|r| *r == "lost_branch").count(), 2, "{reasons:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_are_enforced_and_a_revoked_key_stops_working_at_once() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let r = h.req("POST", "/v1/transactions", None, None).await;
    assert_eq!((r.status, r.body["code"].as_str()), (401, Some("unauthenticated")));
    let r = h
        .req("POST", "/v1/transactions", Some("tgk_0000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), None)
        .await;
    assert_eq!(r.status, 401);
    let r = h.req("POST", "/v1/transactions", Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["code"].as_str()), (403, Some("forbidden")), "{r:?}");
    assert!(r.body["detail"].as_str().unwrap().contains("tx.write"));
    let r = h.req("PUT", "/v1/capabilities/x", Some(&k.agent), Some(json!({"kind": "worker"}))).await;
    assert_eq!(r.status, 403);
    let r = h.req("GET", "/v1/ledger/events", Some(&k.agent), None).await;
    assert_eq!(r.status, 403);
    let r = h.req("GET", "/v1/ledger/events", Some(&k.reviewer), None).await;
    assert_eq!(r.status, 200);
    let r = h.req("GET", "/v1/keys", Some(&k.operator), None).await;
    assert_eq!(r.status, 403);

    let r = h.req("POST", "/v1/keys", Some(&k.admin), Some(json!({"role": "agent", "label": "ci"}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let new_key = r.body["key"].as_str().unwrap().to_owned();
    let new_id = r.body["id"].as_str().unwrap().to_owned();
    assert_eq!(h.req("GET", "/v1/whoami", Some(&new_key), None).await.body["role"], "agent");
    let list = h.req("GET", "/v1/keys", Some(&k.admin), None).await;
    assert!(!list.text.contains(&new_key), "a listing never shows a secret");
    let r = h.req("DELETE", &format!("/v1/keys/{new_id}"), Some(&k.admin), None).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", "/v1/whoami", Some(&new_key), None).await;
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.body["detail"].as_str().unwrap().contains("revoked"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_request_ids_are_served() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let r = h.req("POST", "/v1/calls", Some(&k.agent), Some(json!({"tool": "nope"}))).await;
    assert_eq!(r.status, 400);
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:m:1"]}))).await;
    let tx = id(&r);
    h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    let r = h.req("GET", "/healthz", None, None).await;
    assert_eq!((r.status, r.text.as_str()), (200, "ok\n"));
    let r = h.req("GET", "/readyz", None, None).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["tenants"], 1);
    // The commit's latency is recorded just after its settlement becomes visible: poll.
    let mut m = h.req("GET", "/metrics", None, None).await;
    for _ in 0..100 {
        if m.text.contains("tidegate_commits_total 1") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        m = h.req("GET", "/metrics", None, None).await;
    }
    for name in [
        "tidegate_http_requests_total",
        "tidegate_commit_latency_seconds_bucket",
        "tidegate_commits_total 1",
        "tidegate_engine_unfinished_transactions",
        "tidegate_worker_queue_queued",
        "tidegate_ledger_durable_wait_seconds",
    ] {
        assert!(m.text.contains(name), "metrics lack {name}:\n{}", m.text);
    }
    assert!(!m.text.contains("acme"), "metrics carry no tenant names");
    let r = h.req_with("GET", "/v1/whoami", Some(&k.agent), None, &[("X-Request-Id", "trace-42")]).await;
    assert_eq!(r.headers["x-request-id"], "trace-42");
    let r = h.req_with("GET", "/v1/nope", None, None, &[("X-Request-Id", "trace-43")]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body["request_id"], "trace-43");
    let r = h.req("DELETE", "/v1/transactions", Some(&k.agent), None).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.content_type(), "application/problem+json");
    assert!(r.body["request_id"].is_string());
    h.stop().await;
}

async fn one_slow_request_then(
    global: usize,
    per_tenant: usize,
) -> (Harness, crate::common::Keys, Sink, tokio::task::JoinHandle<u16>) {
    let h = Harness::memory(|c| {
        c.limits.max_concurrent_per_tenant = per_tenant;
        c.limits.max_concurrent_requests = global;
    })
    .await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    sink.delay("slow/call", Duration::from_millis(800));
    h.webhook_tool(&k.admin, &sink, "slow", "reversible", false, false).await;
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:slow:*"]}))).await;
    let tx = id(&r);
    let slow = {
        let (c, url, key) = (h.http.clone(), format!("{}/v1/transactions/{tx}/effects", h.base), k.agent.clone());
        tokio::spawn(async move {
            c.post(url)
                .bearer_auth(key)
                .json(&json!({"tool": "slow", "args": {"id": "1"}}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    (h, k, sink, slow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_429_when_the_tenant_is_at_its_limit() {
    let (h, k, _sink, slow) = one_slow_request_then(100, 1).await;
    let r = h.req("GET", "/v1/whoami", Some(&k.agent), None).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.body["code"], "too_many_requests");
    assert_eq!(slow.await.unwrap(), 200);
    let r = h.req("GET", "/v1/whoami", Some(&k.agent), None).await;
    assert_eq!(r.status, 200, "the slot is given back");
    let m = h.req("GET", "/metrics", None, None).await;
    assert!(m.text.contains("tidegate_overload_rejections_total{limit=\"tenant\"} 1"), "{}", m.text);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_503_when_the_server_is_at_its_limit_but_health_still_answers() {
    let (h, k, _sink, slow) = one_slow_request_then(1, 100).await;
    let r = h.req("GET", "/v1/whoami", Some(&k.agent), None).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.body["code"], "overloaded");
    assert_eq!(h.req("GET", "/healthz", None, None).await.status, 200);
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(h.req("GET", "/v1/whoami", Some(&k.agent), None).await.status, 200);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_does_not_cancel_its_effect_and_its_key_replays_the_result() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    sink.delay("slow/call", Duration::from_millis(500));
    h.webhook_tool(&k.admin, &sink, "slow", "reversible", false, false).await;
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:slow:*"]}))).await;
    let tx = id(&r);
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(100)).build().unwrap();
    let url = format!("{}/v1/transactions/{tx}/effects", h.base);
    let body = json!({"tool": "slow", "args": {"id": "1"}});
    let gone = impatient.post(&url).bearer_auth(&k.agent).header("Idempotency-Key", "e-1").json(&body).send().await;
    assert!(gone.is_err(), "the client gave up");
    // A retry while it runs is told to wait; after it finished, it gets the recorded answer.
    let r = h
        .req_with(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(body.clone()),
            &[("Idempotency-Key", "e-1")],
        )
        .await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("idempotency_key_in_progress")), "{r:?}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = h
        .req_with(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(body),
            &[("Idempotency-Key", "e-1")],
        )
        .await;
    assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("executed")), "{r:?}");
    assert_eq!(r.headers["idempotent-replayed"], "true");
    assert_eq!(sink.on("slow/call").len(), 1, "the call ran once");
    let r = h.req("GET", &format!("/v1/transactions/{tx}"), Some(&k.agent), None).await;
    assert_eq!(r.body["effects"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["effects"][0]["status"], "executed");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_whose_lease_ends_is_aborted_and_its_effects_compensated() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    let r = h
        .req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:hold:*"], "lease_ms": 300})))
        .await;
    let tx = id(&r);
    h.req(
        "POST",
        &format!("/v1/transactions/{tx}/effects"),
        Some(&k.agent),
        Some(json!({"tool": "hold", "args": {"id": "1"}})),
    )
    .await;
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("aborted")), "{r:?}");
    assert_eq!(r.body["outcome"]["reason"]["kind"], "lease_expired");
    assert_eq!(sink.on("hold/undo").len(), 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_transactions_beyond_the_retained_ones_are_read_back_from_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::durable(dir, |c| c.limits.retain_settled = 2).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "n", "gated", false, false).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let r = h.req("POST", "/v1/calls", Some(&k.agent), Some(json!({"tool": "n", "args": {"id": i}}))).await;
        assert_eq!(r.body["transaction"]["state"], "committed", "{r:?}");
        ids.push(r.body["transaction"]["id"].as_str().unwrap().to_owned());
    }
    assert!(h.state.tenants()[0].index.resident() <= 2, "only the retained settled ones stay in memory");
    let r = h.req("GET", &format!("/v1/transactions/{}", ids[0]), Some(&k.agent), None).await;
    assert_eq!(r.body["state"], "committed", "{r:?}");
    assert_eq!(r.body["effects"][0]["disposition"], "fired");
    assert_eq!(r.body["effects"][0]["args"], json!({"id": 0}));
    let r = h.req("GET", &format!("/v1/transactions/{}/outcome?timeout_ms=10", ids[0]), Some(&k.agent), None).await;
    assert_eq!(r.status, 200);
    let r = h.req("GET", "/v1/transactions?state=committed&limit=4", Some(&k.agent), None).await;
    assert_eq!(r.body["data"].as_array().unwrap().len(), 4);
    assert_eq!(r.body["has_more"], true);
    let next = r.body["next_cursor"].as_str().unwrap().to_owned();
    let r =
        h.req("GET", &format!("/v1/transactions?state=committed&limit=4&cursor={next}"), Some(&k.agent), None).await;
    let rest: Vec<&str> = r.body["data"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(rest, [ids[4].as_str(), ids[5].as_str()]);
    assert_eq!(r.body["has_more"], false);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_a_request_in_flight_and_refuses_new_ones() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    sink.delay("slow/call", Duration::from_millis(500));
    h.webhook_tool(&k.admin, &sink, "slow", "reversible", false, false).await;
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:slow:*"]}))).await;
    let tx = id(&r);
    let (c, base, key) = (h.http.clone(), h.base.clone(), k.agent.clone());
    let in_flight = tokio::spawn(async move {
        let r = c
            .post(format!("{base}/v1/transactions/{tx}/effects"))
            .bearer_auth(&key)
            .json(&json!({"tool": "slow", "args": {"id": "1"}}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let state = h.state.clone();
    let (fresh, base) = (reqwest::Client::new(), h.base.clone());
    let stopping = tokio::spawn(h.stop());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(state.shutdown_token().is_cancelled());
    let late = fresh.get(format!("{base}/v1/whoami")).bearer_auth(&k.agent).send().await;
    assert!(late.as_ref().map_or(true, |r| r.status() == 503), "a new request during the drain: {late:?}");
    let (status, body) = in_flight.await.unwrap();
    assert_eq!((status, body["ack"].as_str()), (200, Some("executed")), "{body}");
    stopping.await.unwrap();
    assert_eq!(sink.on("slow/call").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_drives_a_server_running_elsewhere_for_a_fixed_count() {
    use tidegate_server::bench::{Form, against};
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("bench");
    for (form, clients, each) in [(Form::Batch, 2, 3), (Form::Steps, 1, 2)] {
        let m = against(form, &h.base, &k.admin, clients, each).await.unwrap();
        assert_eq!((m.committed, m.failed, m.store), (clients as u64 * each, 0, "external"), "{m:?}");
        for path in ["/v1/tools/reserve", "/v1/capabilities/bench-notify"] {
            let r = h.req("GET", path, Some(&k.admin), None).await;
            assert_eq!(r.status, 404, "the run removes what it defined: {path} {r:?}");
        }
    }
    let refused = against(Form::Batch, &h.base, &k.agent, 1, 1).await;
    assert!(
        matches!(&refused, Err(tidegate_server::bench::BenchError::Http { step: "defining a capability", .. })),
        "an agent key cannot define the benchmark's capabilities: {refused:?}"
    );
    h.stop().await;
}
