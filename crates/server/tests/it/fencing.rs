//! A tenant whose ledger store fences this node out (another node took it over) answers 503
//! `tenant_unavailable` with `Retry-After` and a problem document naming the tenant and why,
//! for the request that met the fence and every later one; another tenant keeps working.

use serde_json::json;

use crate::common::{Harness, Resp, Sink};

/// Another node takes `tenant`'s ledger stream: a larger owner token in its `meta` table,
/// which the store's writer checks in every commit.
fn take_over(h: &Harness, tenant: &str) {
    let db = h.dir.as_ref().unwrap().path().join("tenants").join(tenant).join("ledger.db");
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let n = conn
        .execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'owner_token'", [])
        .unwrap();
    assert_eq!(n, 1);
}

fn assert_not_served(r: &Resp, tenant: &str) {
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.content_type(), "application/problem+json");
    assert_eq!(r.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("5"), "{r:?}");
    assert_eq!(r.body["code"], "tenant_unavailable", "{r:?}");
    assert_eq!(r.body["type"], "urn:tidegate:problem:tenant_unavailable");
    assert_eq!(r.body["retryable"], true);
    let detail = r.body["detail"].as_str().unwrap();
    assert!(detail.contains(&format!("tenant `{tenant}` is not served by this node")), "{detail}");
    assert!(detail.contains("fenced out") && detail.contains("owned by token"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_tenant_answers_503_with_a_problem_and_the_other_tenant_is_served() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), |c| c.server.shutdown_drain_ms = 300).await;
    let (_, acme) = h.tenant("acme");
    let (_, globex) = h.tenant("globex");
    let begin = |key: String| {
        let h = &h;
        async move {
            let r = h.req("POST", "/v1/transactions", Some(&key), Some(json!({"may_touch": ["kv:x"]}))).await;
            assert_eq!(r.status, 201, "{r:?}");
            r.body["id"].as_str().unwrap().to_owned()
        }
    };
    let sink = Sink::start().await;
    h.webhook_tool(&acme.admin, &sink, "refund", "reversible", true, false).await;
    let r = h.req("POST", "/v1/transactions", Some(&acme.agent), Some(json!({}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let tx = r.body["id"].as_str().unwrap().to_owned();
    take_over(&h, "acme");

    // The effect's pending record cannot become durable: the request that met the fence says
    // so, and the call never reached the webhook.
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&acme.agent),
            Some(json!({"tool": "refund", "args": {"id": "a"}})),
        )
        .await;
    assert_not_served(&r, "acme");
    assert!(sink.on("refund/call").is_empty(), "the call never ran");
    // Every later request of the tenant, with any of its keys, gets the same answer.
    assert_not_served(&h.req("GET", &format!("/v1/transactions/{tx}"), Some(&acme.agent), None).await, "acme");
    assert_not_served(&h.req("POST", "/v1/transactions", Some(&acme.agent), Some(json!({}))).await, "acme");
    assert_not_served(&h.req("GET", "/v1/tools", Some(&acme.admin), None).await, "acme");

    // The other tenant is served as before.
    let other = begin(globex.agent.clone()).await;
    let r = h
        .req("POST", &format!("/v1/transactions/{other}/commit"), Some(&globex.agent), Some(json!({"seal": true})))
        .await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("committed")), "{r:?}");
    // Readiness is about this node: a tenant another node serves does not make it unready.
    let r = h.req("GET", "/readyz", None, None).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", "/metrics", None, None).await;
    assert!(r.text.contains("tidegate_tenants_fenced_total 1"), "{}", r.text);
    h.stop().await;
}

/// A commit whose decision cannot become durable is never answered `committed`: the request
/// answers from its own settlement (which waits for durability), not from the ledger index,
/// which sees the decision when it is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_meets_the_fence_is_not_answered_committed() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), |c| c.server.shutdown_drain_ms = 300).await;
    let (_, acme) = h.tenant("acme");
    let r = h.req("POST", "/v1/transactions", Some(&acme.agent), Some(json!({"may_touch": ["kv:x"]}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let tx = r.body["id"].as_str().unwrap().to_owned();
    take_over(&h, "acme");
    let r =
        h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&acme.agent), Some(json!({"seal": true}))).await;
    assert_not_served(&r, "acme");
    h.stop().await;
}
