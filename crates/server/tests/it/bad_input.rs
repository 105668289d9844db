//! Anything a client can send is a 4xx problem document naming the field, never a 5xx.

use serde_json::json;

use crate::common::Harness;

fn problem(r: &crate::common::Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.content_type(), "application/problem+json", "{r:?}");
    assert_eq!(r.body["code"], code, "{r:?}");
    assert_eq!(r.body["status"], status);
    assert_eq!(r.body["type"], format!("urn:tidegate:problem:{code}"));
    assert!(r.body["request_id"].is_string(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_are_refused_naming_the_field() {
    let h = Harness::memory(|c| c.limits.max_body_bytes = 4096).await;
    let (_, k) = h.tenant("acme");
    let key = Some(k.agent.as_str());
    let json_ct = Some("application/json");

    let r = h.raw("POST", "/v1/transactions", key, b"{\"agent\": ".to_vec(), json_ct).await;
    problem(&r, 400, "invalid_json");
    assert!(r.body["detail"].as_str().unwrap().contains("line 1"), "{r:?}");
    let r = h.raw("POST", "/v1/transactions", key, b"{} {}".to_vec(), json_ct).await;
    problem(&r, 400, "invalid_json");
    let r = h.raw("POST", "/v1/transactions", key, b"[1, 2]".to_vec(), json_ct).await;
    problem(&r, 400, "invalid_field");

    let r = h.req("POST", "/v1/transactions", key, Some(json!({"agent": "a", "agnet": "b"}))).await;
    problem(&r, 400, "unknown_field");
    assert_eq!(r.body["field"], "agnet");
    let r = h.req("POST", "/v1/transactions", key, Some(json!({"lease_ms": "soon"}))).await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "lease_ms");
    assert!(r.body["expected"].as_str().unwrap().contains("u64"), "{r:?}");
    let r = h.req("POST", "/v1/transactions", key, Some(json!({"may_touch": ["kv:ok:1", 7]}))).await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "may_touch[1]");
    let r = h.req("POST", "/v1/transactions", key, Some(json!({"lease_ms": -1}))).await;
    problem(&r, 400, "invalid_field");
    let r = h.req("POST", "/v1/transactions", key, Some(json!({"may_touch": ["no-type-here"]}))).await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "may_touch[0]", "{r:?}");
    let r = h.req("POST", "/v1/transactions", key, Some(json!({"lease_ms": 0}))).await;
    problem(&r, 400, "invalid_field");
    let r = h.req("POST", "/v1/calls", key, Some(json!({"args": {}}))).await;
    problem(&r, 400, "missing_field");
    assert_eq!(r.body["field"], "tool");
    let r = h
        .req("PUT", "/v1/tools/t", Some(&k.admin), Some(json!({"class": "magic", "scopes": ["a:b"], "call": "c"})))
        .await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "class");
    let r = h
        .req("PUT", "/v1/tools/t", Some(&k.admin), Some(json!({"class": "gated", "scopes": ["a:{"], "call": "c"})))
        .await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "scopes[0]");
    let r =
        h.req("PUT", "/v1/capabilities/c", Some(&k.admin), Some(json!({"kind": "webhook", "url": "not a url"}))).await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "url");
    let r = h.req("PUT", "/v1/capabilities/bad%20name", Some(&k.admin), Some(json!({"kind": "worker"}))).await;
    problem(&r, 400, "invalid_field");

    let big = format!("{{\"agent\": \"{}\"}}", "x".repeat(5000));
    let r = h.raw("POST", "/v1/transactions", key, big.into_bytes(), json_ct).await;
    problem(&r, 413, "body_too_large");
    let r =
        h.raw("POST", "/v1/transactions", key, b"agent=a".to_vec(), Some("application/x-www-form-urlencoded")).await;
    problem(&r, 415, "unsupported_media_type");
    let r = h.raw("POST", "/v1/transactions", key, vec![0xff, 0xfe, 0x00], json_ct).await;
    problem(&r, 400, "invalid_json");

    let r = h.req("GET", "/v1/transactions?limit=0", key, None).await;
    problem(&r, 400, "invalid_field");
    let r = h.req("GET", "/v1/transactions?limit=abc", key, None).await;
    problem(&r, 400, "invalid_query");
    let r = h.req("GET", "/v1/transactions?bogus=1", key, None).await;
    problem(&r, 400, "invalid_query");
    assert_eq!(r.body["field"], "bogus");
    let r = h.req("GET", "/v1/transactions/tx_nope", key, None).await;
    problem(&r, 404, "not_found");
    let r = h.req("GET", "/v1/transactions/tx_%F0%9F%92%A5_1", key, None).await;
    problem(&r, 404, "not_found");
    let r = h.req("GET", &format!("/v1/transactions/{}", "9".repeat(300)), key, None).await;
    problem(&r, 404, "not_found");
    let r = h.req_with("POST", "/v1/transactions", key, None, &[("Idempotency-Key", "")]).await;
    problem(&r, 400, "invalid_field");
    let r = h.req_with("GET", "/v1/whoami", None, None, &[("Authorization", "Basic abc")]).await;
    problem(&r, 401, "unauthenticated");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_are_409_and_lose_nothing_accepted() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let key = Some(k.agent.as_str());
    let r = h.req("POST", "/v1/transactions", key, Some(json!({"may_touch": ["kv:pv:1"]}))).await;
    let tx = r.body["id"].as_str().unwrap().to_owned();
    // Commit before seal.
    let r = h.req("POST", &format!("/v1/transactions/{tx}/commit"), key, None).await;
    problem(&r, 409, "wrong_state");
    // A read outside the declared may-touch set aborts the transaction.
    let r = h.req("POST", &format!("/v1/transactions/{tx}/reads"), key, Some(json!({"scope": "kv:pv:2"}))).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.body["code"], "protocol_violation");
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=5000"), key, None).await;
    assert_eq!(r.body["state"], "aborted", "{r:?}");
    assert_eq!(r.body["outcome"]["reason"]["kind"], "protocol_violation");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/seal"), key, None).await;
    problem(&r, 409, "wrong_state");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/effects"), key, Some(json!({"tool": "nope"}))).await;
    problem(&r, 409, "wrong_state");
    h.stop().await;
}
