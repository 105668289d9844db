//! Tenant isolation: every operation of the OpenAPI document is called with a second
//! tenant's key and the first tenant's ids; every answer must be exactly what an id never
//! issued gets, and no answer may carry anything of the first tenant. A new endpoint without
//! an entry in `body_for` fails this test, so none can be forgotten.

use serde_json::{Value, json};

use crate::common::Harness;

struct Ids {
    tx: String,
    branch: String,
    group: String,
    task: String,
    tool: String,
    capability: String,
    key: String,
    review: String,
    plan: String,
}

fn body_for(operation: &str, ids: &Ids) -> Option<Option<Value>> {
    Some(match operation {
        "begin_transaction" => Some(json!({"agent": "b"})),
        "read_scope" => Some(json!({"scope": "kv:iso:1"})),
        "call_effect" => Some(json!({"tool": ids.tool, "args": {"id": "1"}})),
        "report_effect_result" => Some(json!({"status": "done", "output": {}})),
        "commit_transaction" | "abort_transaction" | "abort_group" => Some(json!({"wait_ms": 0})),
        "one_call_transaction" => Some(json!({"tool": ids.tool, "args": {"id": "1"}, "wait_ms": 0})),
        "begin_group" => Some(json!({"branches": 2})),
        "commit_group" => Some(json!({"winner": ids.branch, "wait_ms": 0})),
        "put_tool" => Some(json!({"class": "gated", "scopes": ["kv:iso:x"], "call": ids.capability})),
        "put_capability" => Some(json!({"kind": "worker"})),
        "poll_tasks" => Some(json!({"worker": "b", "capabilities": [ids.capability], "wait_ms": 0})),
        "heartbeat_task" => Some(json!({"worker": "w"})),
        "report_task" => Some(json!({"worker": "w", "result": {"status": "done"}})),
        "create_key" => Some(json!({"role": "reviewer"})),
        "review_register_templates" => Some(json!({"set": {"templates": []}})),
        "review_request" => Some(json!({"template": "acme-only-template", "params": {}, "suspicious": true})),
        "review_accept" | "review_remove" => Some(json!({})),
        "resolve_attention" => Some(json!({"action": "resolved", "note": "checked"})),
        "retry_attention" => Some(json!({})),
        "review_list_templates" | "review_get" | "review_queue" => None,
        "open_plan" => Some(json!({"owner": "b"})),
        "fail_plan" | "signal_plan" => Some(json!({"reason": "x"})),
        "plan_verdict" => Some(json!({"transaction": ids.tx, "effect": 0, "verdict": "block"})),
        "arm_plan_trigger" => Some(json!({"predicate": {"tagged": {"tx": 1, "effect": 0, "tag": "leaked"}}})),
        "resolve_plan" => Some(json!({"choice": "accept"})),
        "list_plans" | "list_stuck_plans" | "get_plan" | "commit_plan" => None,
        "seal_transaction"
        | "get_transaction"
        | "list_transactions"
        | "wait_outcome"
        | "stream_transaction"
        | "transaction_timeline"
        | "get_group"
        | "get_tool"
        | "delete_tool"
        | "list_tools"
        | "get_capability"
        | "delete_capability"
        | "list_capabilities"
        | "list_tasks"
        | "ledger_events"
        | "ledger_attention"
        | "ledger_export"
        | "console_series"
        | "stream_transactions"
        | "list_keys"
        | "revoke_key"
        | "whoami"
        | "openapi"
        | "healthz"
        | "readyz"
        | "metrics" => None,
        _ => return None,
    })
}

/// Fills the path's parameters: `own` with the first tenant's ids, else never-issued ones of
/// the caller's tenant (the control).
fn fill(path: &str, ids: &Ids, control: &Ids) -> (String, String) {
    let sub = |ids: &Ids| {
        let name = if path.starts_with("/v1/tools") { &ids.tool } else { &ids.capability };
        path.replace("{tx}", &ids.tx)
            .replace("{group}", &ids.group)
            .replace("{task}", &ids.task)
            .replace("{key}", &ids.key)
            .replace("{name}", name)
            .replace("{id}", &ids.review)
            .replace("{plan}", &ids.plan)
            // Effect 0 of the first tenant's `tx` is an open client-executed ticket.
            .replace("{effect}", "0")
    };
    (sub(ids), sub(control))
}

/// A response with the ids and the request id taken out, for comparison.
fn normalise(r: &crate::common::Resp, ids: &Ids) -> String {
    let mut b = r.body.clone();
    if let Some(o) = b.as_object_mut() {
        o.remove("request_id");
        // The caller's own registry version counter (the control call runs first).
        o.remove("signature");
    }
    let mut s = format!("{} {}", r.status, b);
    for id in
        [&ids.tx, &ids.branch, &ids.group, &ids.task, &ids.tool, &ids.capability, &ids.key, &ids.review, &ids.plan]
    {
        s = s.replace(id.as_str(), "<ID>");
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_tenant_gets_nothing_of_the_first_on_any_endpoint() {
    // Streams end quickly, so that the tenant-wide stream's whole answer can be read.
    let h = Harness::memory(|c| c.limits.max_sse_ms = 1_000).await;
    let (a_tag, a) = h.tenant("acme");
    let (b_tag, b) = h.tenant("other");

    // The first tenant's resources.
    let capability = "acme-only-queue".to_owned();
    let tool = "acme-only-tool".to_owned();
    assert_eq!(
        h.req("PUT", &format!("/v1/capabilities/{capability}"), Some(&a.admin), Some(json!({"kind": "worker"})))
            .await
            .status,
        201
    );
    let def = json!({"class": "gated", "scopes": ["kv:acme:{id}"], "call": capability});
    assert_eq!(h.req("PUT", &format!("/v1/tools/{tool}"), Some(&a.admin), Some(def.clone())).await.status, 201);
    let r = h.req("POST", "/v1/transactions", Some(&a.agent), Some(json!({"may_touch": ["kv:acme:*"]}))).await;
    let committing = r.body["id"].as_str().unwrap().to_owned();
    h.req(
        "POST",
        &format!("/v1/transactions/{committing}/effects"),
        Some(&a.agent),
        Some(json!({"tool": tool, "args": {"id": "1"}})),
    )
    .await;
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{committing}/commit"),
            Some(&a.agent),
            Some(json!({"seal": true, "wait_ms": 0})),
        )
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    let r = h
        .req(
            "POST",
            "/v1/tasks/poll",
            Some(&a.agent),
            Some(json!({"worker": "aw", "capabilities": [capability], "wait_ms": 5000})),
        )
        .await;
    let task = r.body["tasks"][0]["id"].as_str().unwrap().to_owned();
    let r = h.req("POST", "/v1/transactions", Some(&a.agent), Some(json!({"may_touch": ["kv:acme:2"]}))).await;
    let tx = r.body["id"].as_str().unwrap().to_owned();
    h.req("POST", &format!("/v1/transactions/{tx}/reads"), Some(&a.agent), Some(json!({"scope": "kv:acme:2"}))).await;
    // A client-executed effect whose ticket stays open (its result endpoint is probed below).
    let rev = json!({"class": "reversible", "scopes": ["kv:acme:{id}"], "call": capability});
    assert_eq!(h.req("PUT", "/v1/tools/acme-rev", Some(&a.admin), Some(rev)).await.status, 201);
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&a.agent),
            Some(json!({"tool": "acme-rev", "args": {"id": "2"}, "execute": "client"})),
        )
        .await;
    assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("execute")), "{r:?}");
    let r = h.req("POST", "/v1/groups", Some(&a.agent), Some(json!({"branches": 2, "may_touch": ["kv:acme:g"]}))).await;
    let group = r.body["id"].as_str().unwrap().to_owned();
    let branch = r.body["branches"][0]["id"].as_str().unwrap().to_owned();
    let r = h.req("POST", "/v1/keys", Some(&a.admin), Some(json!({"role": "agent", "label": "acme-only"}))).await;
    let key = r.body["id"].as_str().unwrap().to_owned();
    let a_secret = r.body["key"].as_str().unwrap().to_owned();
    // A review transaction awaiting a reviewer, on a template of the first tenant.
    let set = json!({"templates": [{"name": "acme-only-template", "params": ["v"],
        "steps": [{"statements": [{"sql": "INSERT INTO acme_rows (v) VALUES (:v)"}]}],
        "writes": [{"table": "acme_rows", "kind": "insert", "row": {"v": "v"}}]}]});
    let r = h
        .req(
            "POST",
            "/v1/review/templates",
            Some(&a.operator),
            Some(json!({"set": set, "schema": "CREATE TABLE acme_rows (v TEXT PRIMARY KEY)"})),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = h
        .req(
            "POST",
            "/v1/review/transactions",
            Some(&a.agent),
            Some(json!({"template": "acme-only-template", "params": {"v": "acme-secret-row"}, "suspicious": true})),
        )
        .await;
    assert_eq!(r.body["status"], "awaiting_review", "{r:?}");
    let review = r.body["id"].as_str().unwrap().to_owned();
    // A plan of the first tenant, open, with a deadline.
    let r = h
        .req("POST", "/v1/plans", Some(&a.agent), Some(json!({"owner": "acme-owner", "deadline_in_ms": 3600000})))
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let plan = r.body["id"].as_str().unwrap().to_owned();
    let ids = Ids {
        plan: plan.clone(),
        review: review.clone(),
        tx: tx.clone(),
        branch,
        group: group.clone(),
        task: task.clone(),
        tool: tool.clone(),
        capability: capability.clone(),
        key: key.clone(),
    };
    let control = Ids {
        tx: format!("tx_{b_tag}_99999"),
        branch: format!("tx_{b_tag}_99998"),
        group: format!("grp_{b_tag}_99999"),
        task: format!("task_{b_tag}_99999"),
        tool: "never-defined-tool".into(),
        capability: "never-defined-queue".into(),
        key: "key_0123456789abcdef".into(),
        review: format!("rv_{b_tag}_99999"),
        plan: format!("plan_{b_tag}_99999"),
    };
    // Before the second tenant defines anything of its own, its listings show none of these names.
    for path in [
        "/v1/tools",
        "/v1/capabilities",
        "/v1/tasks",
        "/v1/transactions",
        "/v1/keys",
        "/v1/ledger/events",
        "/v1/review/queue",
        "/v1/review/templates",
        "/v1/plans",
        "/v1/plans/stuck",
    ] {
        let r = h.req("GET", path, Some(&b.admin), None).await;
        for s in [&tool, &capability, &a_tag, &"acme-only-template".to_owned(), &"acme-secret-row".to_owned()] {
            assert!(!r.text.contains(s.as_str()), "{path} shows {s}: {}", r.text);
        }
    }

    let doc = h.req("GET", "/v1/openapi.json", None, None).await.body;
    let mut leaks = Vec::new();
    let mut calls = 0;
    let paths = doc["paths"].as_object().expect("paths");
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            let operation = op["operationId"].as_str().unwrap_or("?");
            let Some(body) = body_for(operation, &ids) else {
                panic!("operation `{operation}` ({method} {path}) has no entry in the isolation test's body table");
            };
            let (own, ctrl) = fill(path, &ids, &control);
            let q = if operation == "wait_outcome" { "?timeout_ms=0" } else { "" };
            let m = method.to_uppercase();
            let ctl =
                h.req(&m, &format!("{ctrl}{q}"), Some(&b.admin), body.clone().map(|b| swap(b, &ids, &control))).await;
            let got = h.req(&m, &format!("{own}{q}"), Some(&b.admin), body).await;
            calls += 1;
            // Echoes of the ids the request itself named are taken out first.
            let echoed = normalise(&got, &ids);
            for secret in [a_tag.as_str(), key.trim_start_matches("key_"), a_secret.as_str()] {
                if echoed.contains(secret) {
                    leaks.push(format!("{m} {own}: the answer contains the first tenant's `{secret}`: {}", got.text));
                }
            }
            if path.contains('{') {
                let (g, c) = (normalise(&got, &ids), normalise(&ctl, &control));
                if g != c {
                    leaks.push(format!("{m} {path}: with the first tenant's id `{g}`, with a never-issued id `{c}`"));
                }
                if got.status / 100 == 2
                    && !(path.contains("{name}") && m == "PUT")
                    && !(path.contains("{name}") && m == "DELETE")
                {
                    leaks.push(format!("{m} {own}: answered {} with another tenant's id", got.status));
                }
            }
        }
    }
    assert!(calls >= 30, "only {calls} operations were called");
    assert!(leaks.is_empty(), "{} leaks:\n{}", leaks.len(), leaks.join("\n"));

    // The first tenant's state is untouched.
    let r = h.req("GET", &format!("/v1/transactions/{tx}"), Some(&a.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("open")), "{r:?}");
    assert_eq!(r.body["effects"][0]["status"], "in_flight", "the ticket is still open: {r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects/0/result"),
            Some(&a.agent),
            Some(json!({"status": "done"})),
        )
        .await;
    assert_eq!((r.status, r.body["ack"].as_str()), (200, Some("executed")), "its own tenant reports it: {r:?}");
    let r = h.req("GET", &format!("/v1/groups/{group}"), Some(&a.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("open")), "{r:?}");
    let r = h.req("GET", &format!("/v1/tools/{tool}"), Some(&a.agent), None).await;
    assert_eq!(r.body["definition"], def);
    let r = h.req("GET", &format!("/v1/capabilities/{capability}"), Some(&a.agent), None).await;
    assert_eq!(r.status, 200);
    let r = h.req("GET", "/v1/tasks", Some(&a.operator), None).await;
    assert_eq!(r.body["data"][0]["id"], task.as_str(), "{r:?}");
    assert_eq!(
        h.req("GET", "/v1/whoami", Some(&a_secret), None).await.status,
        200,
        "the first tenant's key still works"
    );
    let r = h.req("GET", &format!("/v1/transactions/{committing}"), Some(&a.agent), None).await;
    assert_eq!(r.body["state"], "committing");
    let r = h.req("GET", &format!("/v1/review/transactions/{review}"), Some(&a.agent), None).await;
    assert_eq!((r.status, r.body["status"].as_str()), (200, Some("awaiting_review")), "{r:?}");
    for t in h.state.tenants() {
        t.engine.check_integrity().unwrap();
    }
    h.stop().await;
}

/// The control request's body names the control ids.
fn swap(body: Value, ids: &Ids, control: &Ids) -> Value {
    let mut s = body.to_string();
    for (a, b) in [(&ids.branch, &control.branch), (&ids.tool, &control.tool), (&ids.capability, &control.capability)] {
        s = s.replace(a.as_str(), b.as_str());
    }
    serde_json::from_str(&s).unwrap_or(body)
}
