//! Client-executed effects: a ticket (`execute: client`), the client's own call, its result
//! (docs/server.md, "Client-executed effects").

use serde_json::{Value, json};

use crate::common::{Harness, Sink};

async fn begin(h: &Harness, key: &str, scopes: &[&str]) -> String {
    let r = h.req("POST", "/v1/transactions", Some(key), Some(json!({"may_touch": scopes}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body["id"].as_str().unwrap().to_owned()
}

async fn ticket(h: &Harness, key: &str, tx: &str, tool: &str, id: &str) -> Value {
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(key),
            Some(json!({"tool": tool, "args": {"id": id}, "execute": "client"})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_and_its_result_execute_the_effect_and_the_compensation_gets_the_output() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    let tx = begin(&h, &k.agent, &["kv:hold:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "hold", "h1").await;
    assert_eq!(t["ack"], "execute");
    assert_eq!(t["effect"]["status"], "in_flight");
    let key = t["effect"]["key"].as_str().unwrap();
    assert!(key.contains(":hold:"), "the effect key the client runs under: {key}");
    let url = t["result_url"].as_str().unwrap().to_owned();
    assert_eq!(url, format!("/v1/transactions/{tx}/effects/0/result"));
    assert!(sink.on("hold/call").is_empty(), "the server does not run a client-executed call");

    let result = json!({"status": "done", "output": {"hold": "H-1"}});
    let r = h.req("POST", &url, Some(&k.agent), Some(result.clone())).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!((r.body["ack"].as_str(), &r.body["output"]), (Some("executed"), &json!({"hold": "H-1"})));
    assert_eq!(r.body["effect"]["status"], "executed");
    // The same result again: the same answer; another one: a conflict.
    let again = h.req("POST", &url, Some(&k.agent), Some(result)).await;
    assert_eq!((again.status, &again.body), (200, &r.body));
    let other = h.req("POST", &url, Some(&k.agent), Some(json!({"status": "unknown", "error": "x"}))).await;
    assert_eq!((other.status, other.body["code"].as_str()), (409, Some("result_conflict")), "{other:?}");

    let r = h.req("POST", &format!("/v1/transactions/{tx}/abort"), Some(&k.agent), Some(json!({}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    let undo = sink.on("hold/undo");
    assert_eq!(undo.len(), 1, "{undo:?}");
    assert_eq!(undo[0].key, format!("{key}#compensate"));
    assert!(undo[0].body.to_string().contains("H-1"), "the compensation gets the reported output: {:?}", undo[0]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_result_goes_to_the_probe_capability() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "pay", "reversible", true, true).await;
    let tx = begin(&h, &k.agent, &["kv:pay:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "pay", "p1").await;
    let key = t["effect"]["key"].as_str().unwrap().to_owned();
    // The client's own call reaches the provider under the effect key, but its answer is lost.
    sink.script("pay/client", &[599]);
    let r = h.http.post(format!("{}/pay/client", sink.url())).header("Idempotency-Key", &key).body("{}").send().await;
    assert_eq!(r.unwrap().status(), 500);
    let url = t["result_url"].as_str().unwrap().to_owned();
    let r = h.req("POST", &url, Some(&k.agent), Some(json!({"status": "unknown", "error": "timed out"}))).await;
    assert_eq!(r.status, 200, "the probe capability says it happened: {r:?}");
    assert_eq!((r.body["ack"].as_str(), &r.body["output"]), (Some("executed"), &json!({"probed": true})));
    assert_eq!(sink.on("probe").iter().map(|d| d.key.clone()).collect::<Vec<_>>(), vec![key]);

    // A call that never reached the provider: the probe says so, the transaction aborts
    // retryably and there is nothing to undo.
    let tx = begin(&h, &k.agent, &["kv:pay:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "pay", "p2").await;
    let url = t["result_url"].as_str().unwrap().to_owned();
    let r = h.req("POST", &url, Some(&k.agent), Some(json!({"status": "unknown", "error": "reset"}))).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("transaction_aborted")), "{r:?}");
    assert_eq!(r.body["transaction"]["outcome"]["reason"]["kind"], "tool_unavailable");
    assert_eq!(r.body["retryable"], true);
    assert_eq!(r.body["transaction"]["effects"][0]["tag"], "clean");
    assert!(sink.on("pay/undo").is_empty());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_result_aborts_with_409_and_is_answered_the_same_way_again() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    let tx = begin(&h, &k.agent, &["kv:hold:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "hold", "h1").await;
    let url = t["result_url"].as_str().unwrap().to_owned();
    let failed = json!({"status": "not_applied", "error": "card declined"});
    let r = h.req("POST", &url, Some(&k.agent), Some(failed.clone())).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("transaction_aborted")), "{r:?}");
    assert_eq!(r.body["transaction"]["outcome"]["reason"]["kind"], "tool_failed");
    assert!(r.body["detail"].as_str().unwrap().contains("card declined"), "{r:?}");
    let again = h.req("POST", &url, Some(&k.agent), Some(failed)).await;
    assert_eq!((again.status, again.body["code"].as_str()), (409, Some("transaction_aborted")), "{again:?}");
    assert!(sink.on("hold/undo").is_empty(), "nothing happened, nothing to undo");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_for_effects_that_are_not_tickets_are_refused() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    h.webhook_tool(&k.admin, &sink, "mail", "gated", false, false).await;
    let tx = begin(&h, &k.agent, &["kv:hold:*", "kv:mail:*"]).await;
    // A held effect in client form is queued as usual: nothing to report.
    let t = ticket(&h, &k.agent, &tx, "mail", "m1").await;
    assert_eq!(t["ack"], "queued");
    assert!(t.get("result_url").is_none(), "{t}");
    let done = json!({"status": "done"});
    let r = h.req("POST", &format!("/v1/transactions/{tx}/effects/0/result"), Some(&k.agent), Some(done.clone())).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("not_client_executed")), "{r:?}");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/effects/7/result"), Some(&k.agent), Some(done.clone())).await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/effects/x/result"), Some(&k.agent), Some(done.clone())).await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects/0/result"),
            Some(&k.agent),
            Some(json!({"status": "nope"})),
        )
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    // A server-executed eager effect is not a ticket either.
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "hold", "args": {"id": "h1"}})),
        )
        .await;
    assert_eq!(r.body["ack"], "executed", "{r:?}");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/effects/1/result"), Some(&k.agent), Some(done)).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("not_client_executed")), "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_without_result_expires_with_the_lease_and_is_compensated_blind() {
    let h = Harness::memory(|c| c.engine.lease_ms = 300).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    let tx = begin(&h, &k.agent, &["kv:hold:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "hold", "h1").await;
    let url = t["result_url"].as_str().unwrap().to_owned();
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=10000"), Some(&k.agent), None).await;
    assert_eq!(r.status, 200, "settled by the server, not stuck: {r:?}");
    assert_eq!(r.body["state"], "aborted");
    assert_eq!(r.body["effects"][0]["tag"], "unresolved", "{r:?}");
    assert_eq!(sink.on("hold/undo").len(), 1, "compensated blind");
    let late = h.req("POST", &url, Some(&k.agent), Some(json!({"status": "done"}))).await;
    assert_eq!(late.status, 409, "{late:?}");
    h.stop().await;
}

/// The value of the metric line `name` (with its labels) in `/metrics`, 0 if absent.
async fn metric(h: &Harness, name: &str) -> f64 {
    let m = h.req("GET", "/metrics", None, None).await;
    m.text
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_results_and_expiries_are_counted_in_metrics() {
    let h = Harness::memory(|c| c.engine.lease_ms = 300).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "hold", "reversible", true, false).await;
    assert_eq!(metric(&h, "tidegate_client_tickets_total").await, 0.0);

    let tx = begin(&h, &k.agent, &["kv:hold:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "hold", "h1").await;
    let url = t["result_url"].as_str().unwrap().to_owned();
    let done = json!({"status": "done", "output": 1});
    assert_eq!(h.req("POST", &url, Some(&k.agent), Some(done.clone())).await.status, 200);
    // A repeated result is the same report, not a second one.
    assert_eq!(h.req("POST", &url, Some(&k.agent), Some(done)).await.status, 200);
    let t = ticket(&h, &k.agent, &tx, "hold", "h2").await;
    let url = t["result_url"].as_str().unwrap().to_owned();
    let r = h.req("POST", &url, Some(&k.agent), Some(json!({"status": "unknown", "error": "timed out"}))).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(metric(&h, "tidegate_client_tickets_total").await, 2.0);
    assert_eq!(metric(&h, "tidegate_client_results_total{result=\"done\"}").await, 1.0);
    assert_eq!(metric(&h, "tidegate_client_results_total{result=\"unknown\"}").await, 1.0);
    assert_eq!(metric(&h, "tidegate_client_tickets_expired_total").await, 0.0);

    // A ticket left without a result expires with the lease.
    let tx = begin(&h, &k.agent, &["kv:hold:*"]).await;
    let t = ticket(&h, &k.agent, &tx, "hold", "h3").await;
    let url = t["result_url"].as_str().unwrap().to_owned();
    let r = h.req("GET", &format!("/v1/transactions/{tx}/outcome?timeout_ms=10000"), Some(&k.agent), None).await;
    assert_eq!(r.body["state"], "aborted", "{r:?}");
    assert_eq!(metric(&h, "tidegate_client_tickets_total").await, 3.0);
    assert_eq!(metric(&h, "tidegate_client_tickets_expired_total").await, 1.0);
    let late = h.req("POST", &url, Some(&k.agent), Some(json!({"status": "done"}))).await;
    assert_eq!((late.status, late.body["code"].as_str()), (409, Some("ticket_expired")), "{late:?}");
    h.stop().await;
}
