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

/// Found by scripts/fuzz-api.sh: serde reads a struct from a JSON array, so `[]` began a
/// transaction, and a body sent without any Content-Type was read as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_finding_non_object_bodies_and_bodies_without_a_content_type_are_refused() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let key = Some(k.agent.as_str());
    let json_ct = Some("application/json");
    for (body, what) in
        [("[]", "a JSON array"), ("\"x\"", "a JSON string"), ("7", "a JSON number"), ("null", "JSON null")]
    {
        let r = h.raw("POST", "/v1/transactions", key, body.as_bytes().to_vec(), json_ct).await;
        problem(&r, 400, "invalid_field");
        assert_eq!((r.body["field"].as_str(), r.body["value"].as_str()), (Some("body"), Some(what)), "{r:?}");
        assert_eq!(r.body["expected"], "a JSON object", "{r:?}");
    }
    let r = h.raw("POST", "/v1/transactions", key, b"not json".to_vec(), json_ct).await;
    problem(&r, 400, "invalid_json");
    let r = h.raw("POST", "/v1/transactions", key, b"{}".to_vec(), None).await;
    problem(&r, 415, "unsupported_media_type");
    assert_eq!(r.body["field"], "Content-Type", "{r:?}");
    // An empty body needs no Content-Type; nothing above began a transaction.
    let r = h.raw("POST", "/v1/transactions", key, Vec::new(), None).await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = h.req("GET", "/v1/transactions", key, None).await;
    assert_eq!(r.body["data"].as_array().map(Vec::len), Some(1), "{r:?}");
    h.stop().await;
}

/// Found by scripts/fuzz-api.sh: a request without a key but with an empty
/// `Idempotency-Key` answered 400 instead of 401, and `after_lsn` beyond the document's
/// `int64` was accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_finding_authentication_answers_before_header_checks_and_lsns_stay_in_int64() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let r = h.req_with("POST", "/v1/transactions", None, None, &[("Idempotency-Key", "")]).await;
    problem(&r, 401, "unauthenticated");
    let r =
        h.req_with("POST", "/v1/transactions/tx_0_1/seal", Some("tgk_nope"), None, &[("Idempotency-Key", "")]).await;
    problem(&r, 401, "unauthenticated");
    let key = Some(k.reviewer.as_str());
    let r = h.req("GET", "/v1/ledger/events?after_lsn=9223372036854775808", key, None).await;
    problem(&r, 400, "invalid_field");
    assert_eq!(r.body["field"], "after_lsn", "{r:?}");
    let r = h.req("GET", "/v1/ledger/events?after_lsn=9223372036854775806", key, None).await;
    assert_eq!(r.status, 200, "{r:?}");
    h.stop().await;
}

/// Found by scripts/fuzz-api.sh: the derived schema of a capability put each variant's
/// `additionalProperties: false` and the `kind` tag in an `allOf`, which no value satisfies.
#[test]
fn fuzz_finding_the_capability_schema_admits_both_kinds() {
    let doc: serde_json::Value = serde_json::from_str(&tidegate_server::api::openapi_json()).unwrap();
    let spec = &doc["components"]["schemas"]["CapabilitySpec"];
    let variants = spec["oneOf"].as_array().expect("oneOf");
    let kinds: Vec<_> = variants.iter().map(|v| v["properties"]["kind"]["enum"][0].as_str().unwrap()).collect();
    assert_eq!(kinds, ["webhook", "worker"]);
    for v in variants {
        assert_eq!(v["additionalProperties"], false, "{v}");
        assert!(v.get("allOf").is_none(), "{v}");
        assert!(v["required"].as_array().unwrap().contains(&json!("kind")), "{v}");
    }
    assert_eq!(variants[0]["required"], json!(["kind", "url"]));
    assert!(variants[1]["properties"]["deadline_ms"].is_object());
}

/// Found by scripts/fuzz-api.sh (seed 1, on the document with request body examples, issue
/// 26): a worker capability's `deadline_ms` beyond the document's `int64`
/// (9223372036854775808) was accepted; a deadline is now 1 ms to 365 days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_finding_a_worker_deadline_beyond_int64_is_refused() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let key = Some(k.admin.as_str());
    for deadline in [json!(9223372036854775808_u64), json!(31536000001_u64), json!(0)] {
        let r = h.req("PUT", "/v1/capabilities/q", key, Some(json!({"kind": "worker", "deadline_ms": deadline}))).await;
        problem(&r, 400, "invalid_field");
        assert_eq!(
            (r.body["field"].as_str(), r.body["value"].as_str()),
            (Some("deadline_ms"), Some(deadline.to_string().as_str())),
            "{r:?}"
        );
    }
    let r = h.req("GET", "/v1/capabilities/q", key, None).await;
    assert_eq!(r.status, 404, "nothing was defined: {r:?}");
    let r =
        h.req("PUT", "/v1/capabilities/q", key, Some(json!({"kind": "worker", "deadline_ms": 31536000000_u64}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    h.stop().await;
}
