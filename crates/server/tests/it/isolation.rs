//! Tenant isolation: every operation of the OpenAPI document is called with a second
//! tenant's key and the first tenant's ids; every answer must be exactly what an id never
//! issued gets, and no answer may carry anything of the first tenant. A new endpoint without
//! an entry in `body_for` fails this test, so none can be forgotten. Issue 26, item 6: the same
//! holds for ids in queries and bodies (a ledger filter, a plan verdict, a group's winner, tool,
//! capability and template names): a foreign id is answered exactly as a never-issued one.

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
        "batch_transaction" => Some(json!({"effects": [{"tool": ids.tool, "args": {"id": "1"}}], "wait_ms": 0})),
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
        | "cluster"
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

/// A plan of the tenant with one committed step whose client-executed reversible effect 0
/// carries a compensation: `(plan, step)`.
async fn plan_with_step(h: &Harness, k: &crate::common::Keys, prefix: &str) -> (String, String) {
    let cap = format!("{prefix}-queue");
    let r = h.req("PUT", &format!("/v1/capabilities/{cap}"), Some(&k.admin), Some(json!({"kind": "worker"}))).await;
    assert!(r.status < 300, "{r:?}");
    let def = json!({"class": "reversible", "scopes": [format!("kv:{prefix}:{{id}}")], "call": cap});
    let r = h.req("PUT", &format!("/v1/tools/{prefix}-book"), Some(&k.admin), Some(def)).await;
    assert!(r.status < 300, "{r:?}");
    let r = h.req("POST", "/v1/plans", Some(&k.agent), Some(json!({"owner": "owner"}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let plan = r.body["id"].as_str().unwrap().to_owned();
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"plan": plan}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let step = r.body["id"].as_str().unwrap().to_owned();
    let effect = json!({"tool": format!("{prefix}-book"), "args": {"id": "1"}, "execute": "client",
        "compensate": {"capability": cap, "args": {"id": "1"}}});
    let r = h.req("POST", &format!("/v1/transactions/{step}/effects"), Some(&k.agent), Some(effect)).await;
    assert_eq!(r.body["ack"], "execute", "{r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{step}/effects/0/result"),
            Some(&k.agent),
            Some(json!({"status": "done"})),
        )
        .await;
    assert_eq!(r.body["ack"], "executed", "{r:?}");
    let r =
        h.req("POST", &format!("/v1/transactions/{step}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    assert_eq!(r.body["outcome"]["committed"], true, "{r:?}");
    (plan, step)
}

/// The answer with the request id, and the named ids, taken out.
fn shape(r: &crate::common::Resp, ids: &[&str]) -> String {
    let mut b = r.body.clone();
    if let Some(o) = b.as_object_mut() {
        o.remove("request_id");
        o.remove("signature");
    }
    let mut s = format!("{} {}", r.status, if b.is_null() { Value::String(r.text.clone()) } else { b });
    for id in ids {
        s = s.replace(id, "<ID>");
    }
    s
}

/// Regression (issue 26, item 6): a ledger filter naming another tenant's transaction answered
/// 400 where a never-issued id of the caller's tenant answers 200 with an empty list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_26_item_6_a_ledger_filter_naming_another_tenants_transaction_answers_as_a_never_issued_one() {
    let h = Harness::memory(|_| {}).await;
    let (_, a) = h.tenant("acme");
    let (b_tag, b) = h.tenant("other");
    // Both tenants have transaction 1, and engine-wide events (tool definitions).
    let (_, a_step) = plan_with_step(&h, &a, "acme").await;
    let (_, b_step) = plan_with_step(&h, &b, "other").await;
    assert_eq!(a_step.rsplit('_').next(), b_step.rsplit('_').next(), "the same number in both tenants");
    let never = format!("tx_{b_tag}_99999");
    for route in ["/v1/ledger/events", "/v1/ledger/export"] {
        let foreign = h.req("GET", &format!("{route}?transaction={a_step}"), Some(&b.operator), None).await;
        let control = h.req("GET", &format!("{route}?transaction={never}"), Some(&b.operator), None).await;
        assert_eq!(foreign.status, 200, "{route}: {foreign:?}");
        assert_eq!(shape(&foreign, &[&a_step]), shape(&control, &[&never]), "{route}");
        assert!(!foreign.text.contains("acme"), "{route}: {foreign:?}");
        // Transaction 0 is never issued either: engine-wide events do not pass its filter.
        let zero = format!("tx_{b_tag}_0");
        let r = h.req("GET", &format!("{route}?transaction={zero}"), Some(&b.operator), None).await;
        assert_eq!(shape(&r, &[&zero]), shape(&control, &[&never]), "{route}");
    }
    let r = h.req("GET", &format!("/v1/ledger/events?transaction={never}"), Some(&b.operator), None).await;
    assert_eq!(r.body, json!({"data": [], "has_more": false, "next_cursor": null}), "{r:?}");
    // The caller's own transaction still filters, and a malformed id is still a 400.
    let r = h.req("GET", &format!("/v1/ledger/events?transaction={b_step}"), Some(&b.operator), None).await;
    let events = r.body["data"].as_array().unwrap();
    assert!(!events.is_empty() && events.iter().all(|e| e["transaction"] == b_step.as_str()), "{r:?}");
    let r = h.req("GET", "/v1/ledger/events?transaction=tx_nope", Some(&b.operator), None).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("transaction")), "{r:?}");
    h.stop().await;
}

/// Regression (issue 26, item 6): a plan verdict naming another tenant's transaction answered
/// 400 `transaction` where a never-issued id of the caller's tenant got the executor's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_26_item_6_a_plan_verdict_naming_another_tenants_transaction_answers_as_a_never_issued_one() {
    let h = Harness::memory(|_| {}).await;
    let (_, a) = h.tenant("acme");
    let (b_tag, b) = h.tenant("other");
    let (_, a_step) = plan_with_step(&h, &a, "acme").await;
    let (b_plan, b_step) = plan_with_step(&h, &b, "other").await;
    // The other tenant's step has the same number as the caller's own step.
    assert_eq!(a_step.replace(a_step.split('_').nth(1).unwrap(), &b_tag), b_step);
    let never = format!("tx_{b_tag}_99999");
    let verdict = |tx: &str| json!({"transaction": tx, "effect": 0, "verdict": "block"});
    let url = format!("/v1/plans/{b_plan}/verdict");
    let foreign = h.req("POST", &url, Some(&b.agent), Some(verdict(&a_step))).await;
    let control = h.req("POST", &url, Some(&b.agent), Some(verdict(&never))).await;
    assert_eq!(shape(&foreign, &[&a_step]), shape(&control, &[&never]));
    assert_eq!((control.status, control.body["field"].as_str()), (400, Some("effect")), "{control:?}");
    // The caller's own step takes the verdict (the id is not refused for its form).
    let r = h
        .req("POST", &url, Some(&b.agent), Some(json!({"transaction": b_step, "effect": 0, "verdict": "allow"})))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    // After the plan ended, both are refused for the plan's state, alike.
    let r = h.req("POST", &format!("/v1/plans/{b_plan}/commit"), Some(&b.agent), Some(json!({}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    let foreign = h.req("POST", &url, Some(&b.agent), Some(verdict(&a_step))).await;
    let control = h.req("POST", &url, Some(&b.agent), Some(verdict(&never))).await;
    assert_eq!(shape(&foreign, &[&a_step]), shape(&control, &[&never]));
    assert_eq!(control.status, 409, "{control:?}");
    h.stop().await;
}

/// One tenant's resources. Two tenants built by [`world`] number them alike, so an id whose
/// tag were ignored would name a real resource of the caller.
struct World {
    name: String,
    tag: String,
    k: crate::common::Keys,
    /// Open, with a read and an open client ticket (effect 0).
    tx: String,
    /// Committing; its release is `task`, leased.
    committing: String,
    task: String,
    group: String,
    branch: String,
    key: String,
    review: String,
    /// Open.
    plan: String,
    /// Gated, and reversible (client-executed), both on the worker queue `capability`.
    tool: String,
    rev: String,
    capability: String,
    template: String,
    /// The idempotency keys of `tx`'s effect 0 and of `committing`'s.
    effect_key: String,
    release_key: String,
    /// The key of the effect of a batch transaction.
    batch_key: String,
}

async fn world(h: &Harness, name: &str) -> World {
    let (tag, k) = h.tenant(name);
    let ok = |r: &crate::common::Resp| assert!(r.status < 300, "{r:?}");
    let capability = format!("{name}-queue");
    ok(&h.req("PUT", &format!("/v1/capabilities/{capability}"), Some(&k.admin), Some(json!({"kind": "worker"}))).await);
    let (tool, rev) = (format!("{name}-tool"), format!("{name}-rev"));
    for (t, class) in [(&tool, "gated"), (&rev, "reversible")] {
        let def = json!({"class": class, "scopes": [format!("kv:{name}:{{id}}")], "call": capability});
        ok(&h.req("PUT", &format!("/v1/tools/{t}"), Some(&k.admin), Some(def)).await);
    }
    let r =
        h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": [format!("kv:{name}:1")]}))).await;
    let committing = r.body["id"].as_str().unwrap().to_owned();
    let effect = json!({"tool": tool, "args": {"id": "1"}});
    let r = h.req("POST", &format!("/v1/transactions/{committing}/effects"), Some(&k.agent), Some(effect)).await;
    let release_key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    let batch_key = format!("{name}-batch-key");
    let batch = json!({"effects": [{"tool": tool, "args": {"id": "b"}, "key": batch_key}], "wait_ms": 0});
    let r = h.req("POST", "/v1/batches", Some(&k.agent), Some(batch)).await;
    assert_eq!(r.status, 202, "{r:?}");
    let body = json!({"seal": true, "wait_ms": 0});
    let r = h.req("POST", &format!("/v1/transactions/{committing}/commit"), Some(&k.agent), Some(body)).await;
    assert_eq!(r.status, 202, "{r:?}");
    let poll = json!({"worker": format!("{name}-w"), "capabilities": [capability], "wait_ms": 5000});
    let r = h.req("POST", "/v1/tasks/poll", Some(&k.agent), Some(poll)).await;
    let task = r.body["tasks"][0]["id"].as_str().unwrap().to_owned();
    let r =
        h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": [format!("kv:{name}:2")]}))).await;
    let tx = r.body["id"].as_str().unwrap().to_owned();
    ok(&h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/reads"),
            Some(&k.agent),
            Some(json!({"scope": format!("kv:{name}:2")})),
        )
        .await);
    let effect = json!({"tool": rev, "args": {"id": "2"}, "execute": "client"});
    let r = h.req("POST", &format!("/v1/transactions/{tx}/effects"), Some(&k.agent), Some(effect)).await;
    assert_eq!(r.body["ack"], "execute", "{r:?}");
    let effect_key = r.body["effect"]["key"].as_str().unwrap().to_owned();
    let r = h
        .req("POST", "/v1/groups", Some(&k.agent), Some(json!({"branches": 2, "may_touch": [format!("kv:{name}:g")]})))
        .await;
    let group = r.body["id"].as_str().unwrap().to_owned();
    let branch = r.body["branches"][0]["id"].as_str().unwrap().to_owned();
    let r = h.req("POST", "/v1/keys", Some(&k.admin), Some(json!({"role": "agent"}))).await;
    let key = r.body["id"].as_str().unwrap().to_owned();
    let template = format!("{name}-template");
    let set = json!({"templates": [{"name": template, "params": ["v"],
        "steps": [{"statements": [{"sql": format!("INSERT INTO {name}_rows (v) VALUES (:v)")}]}],
        "writes": [{"table": format!("{name}_rows"), "kind": "insert", "row": {"v": "v"}}]}]});
    let schema = format!("CREATE TABLE {name}_rows (v TEXT PRIMARY KEY)");
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": set, "schema": schema}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    let request = json!({"template": template, "params": {"v": "row"}, "suspicious": true});
    let r = h.req("POST", "/v1/review/transactions", Some(&k.agent), Some(request)).await;
    let review = r.body["id"].as_str().unwrap().to_owned();
    let r = h.req("POST", "/v1/plans", Some(&k.agent), Some(json!({"owner": name, "deadline_in_ms": 3600000}))).await;
    let plan = r.body["id"].as_str().unwrap().to_owned();
    World {
        name: name.to_owned(),
        tag,
        k,
        tx,
        committing,
        task,
        group,
        branch,
        key,
        review,
        plan,
        tool,
        rev,
        capability,
        template,
        effect_key,
        release_key,
        batch_key,
    }
}

/// What an id slot names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdKind {
    Tx,
    Group,
    Task,
    Key,
    Review,
    Plan,
    Tool,
    Capability,
    Template,
    Tenant,
    EffectKey,
}

/// The other tenant's id of this kind (issued there).
fn foreign(kind: IdKind, a: &World) -> String {
    match kind {
        IdKind::Tx => a.tx.clone(),
        IdKind::Group => a.group.clone(),
        IdKind::Task => a.task.clone(),
        IdKind::Key => a.key.clone(),
        IdKind::Review => a.review.clone(),
        IdKind::Plan => a.plan.clone(),
        IdKind::Tool => a.tool.clone(),
        IdKind::Capability => a.capability.clone(),
        IdKind::Template => a.template.clone(),
        IdKind::Tenant => a.name.clone(),
        IdKind::EffectKey => a.effect_key.clone(),
    }
}

/// An id of this kind the caller's tenant never issued.
fn never_issued(kind: IdKind, b: &World) -> String {
    let tag = &b.tag;
    match kind {
        IdKind::Tx => format!("tx_{tag}_99999"),
        IdKind::Group => format!("grp_{tag}_99999"),
        IdKind::Task => format!("task_{tag}_99999"),
        IdKind::Key => "key_0123456789abcdef".into(),
        IdKind::Review => format!("rv_{tag}_99999"),
        IdKind::Plan => format!("plan_{tag}_99999"),
        IdKind::Tool => "never-defined-tool".into(),
        IdKind::Capability => "never-defined-queue".into(),
        IdKind::Template => "never-registered-template".into(),
        IdKind::Tenant => "no-such-tenant".into(),
        IdKind::EffectKey => "never-used-key".into(),
    }
}

/// Ids inside request bodies: (operation, JSON pointer, kind).
const BODY_IDS: &[(&str, &str, IdKind)] = &[
    ("begin_transaction", "/plan", IdKind::Plan),
    ("one_call_transaction", "/tool", IdKind::Tool),
    ("one_call_transaction", "/key", IdKind::EffectKey),
    ("batch_transaction", "/effects/0/tool", IdKind::Tool),
    ("batch_transaction", "/effects/0/key", IdKind::EffectKey),
    ("call_effect", "/tool", IdKind::Tool),
    ("call_effect", "/key", IdKind::EffectKey),
    ("call_effect", "/compensate/capability", IdKind::Capability),
    ("call_effect", "/compensate/probe", IdKind::Capability),
    ("call_effect", "/compensate/forward_probe", IdKind::Capability),
    ("commit_group", "/winner", IdKind::Tx),
    ("plan_verdict", "/transaction", IdKind::Tx),
    ("arm_plan_trigger", "/predicate/tagged/tenant", IdKind::Tenant),
    ("open_plan", "/triggers/0/tagged/tenant", IdKind::Tenant),
    ("put_tool", "/call", IdKind::Capability),
    ("put_tool", "/compensate", IdKind::Capability),
    ("put_tool", "/probe", IdKind::Capability),
    ("poll_tasks", "/capabilities/0", IdKind::Capability),
    ("review_request", "/template", IdKind::Template),
];

/// Request-body properties that name something of a tenant; each must be in `BODY_IDS` for
/// every operation whose body has it (as a segment of a pointer), except as listed.
const ID_PROPERTIES: &[&str] = &[
    "plan",
    "tool",
    "key",
    "capability",
    "capabilities",
    "call",
    "compensate",
    "probe",
    "forward_probe",
    "winner",
    "transaction",
    "template",
];
/// (operation, property) pairs of `ID_PROPERTIES` that are no id there.
const NOT_IDS_THERE: &[(&str, &str)] = &[
    // A key template, rendered per call in the caller's tenant.
    ("put_tool", "key"),
];
/// Request-body properties that name nothing of a tenant (free text, numbers, scopes, shapes).
const NOT_ID_PROPERTIES: &[&str] = &[
    "action",
    "agent",
    "args",
    "attempts",
    "backoff_ms",
    "branches",
    "cascade_limit",
    "choice",
    "class",
    "commit_timeout_ms",
    "deadline_in_ms",
    "deadline_ms",
    "description",
    "effect",
    "effects",
    "error",
    "execute",
    "kind",
    "label",
    "lease_ms",
    "max_tasks",
    "may_touch",
    "note",
    "output",
    "owner",
    "params",
    "predicate",
    "reads",
    "reason",
    "residue",
    "result",
    "retry",
    "role",
    "schema",
    "scope",
    "scopes",
    "seal",
    "sender",
    "set",
    "status",
    "suspicious",
    "task_lease_ms",
    "timeout_ms",
    "triggers",
    "url",
    "verdict",
    "wait_ms",
    "worker",
];
/// Query parameters that name something of a tenant, and those that do not.
const ID_QUERY: &[&str] = &["transaction"];
const NOT_ID_QUERY: &[&str] = &[
    "after_lsn",
    "agent",
    "cursor",
    "event",
    "from_ms",
    "limit",
    "outcome",
    "resolved",
    "scope",
    "state",
    "tag",
    "timeout_ms",
    "to_ms",
];

/// Every property name a schema has, at any depth.
fn property_names(doc: &Value, s: &Value, seen: &mut Vec<String>, out: &mut std::collections::BTreeSet<String>) {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        if seen.iter().any(|x| x == r) {
            return;
        }
        seen.push(r.to_owned());
        let name = r.trim_start_matches("#/components/schemas/");
        property_names(doc, &doc["components"]["schemas"][name], seen, out);
    }
    for (k, v) in s.get("properties").and_then(Value::as_object).into_iter().flatten() {
        out.insert(k.clone());
        property_names(doc, v, seen, out);
    }
    for alts in ["oneOf", "allOf", "anyOf"] {
        for a in s.get(alts).and_then(Value::as_array).into_iter().flatten() {
            property_names(doc, a, seen, out);
        }
    }
    if let Some(items) = s.get("items") {
        property_names(doc, items, seen, out);
    }
}

/// Where a check puts the id.
#[derive(Debug, Clone)]
enum Place {
    Path(String),
    Query(String),
    Body(&'static str),
}

/// A 2xx JSON body's shape: its keys and the types of its values (arrays by their first item).
fn skeleton(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), skeleton(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().take(1).map(skeleton).collect()),
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => Value::Null,
    }
}

/// What a check compares: the status, and a refusal's whole problem document (its request id
/// out) or an answer's shape, with the id the request named as `<ID>` and the caller's own
/// ids' numbers (fresh resources of each request) as `N`.
fn answer(r: &crate::common::Resp, id: &str, b_tag: &str) -> String {
    let body = if r.status >= 400 || r.body.is_null() {
        let mut b = r.body.clone();
        if let Some(o) = b.as_object_mut() {
            o.remove("request_id");
        }
        if b.is_null() { r.text.clone() } else { b.to_string() }
    } else {
        skeleton(&r.body).to_string()
    };
    let mut s = format!("{} {}", r.status, body.replace(id, "<ID>"));
    let own = format!("_{b_tag}_");
    while let Some(i) = s.find(&own) {
        let end = i + own.len();
        let digits = s[end..].bytes().take_while(u8::is_ascii_digit).count();
        s.replace_range(i..end + digits, "_<own>_N");
    }
    s
}

/// Issue 26, item 6: on every route that takes an id (in its path, its query or its body), an
/// id another tenant issued is answered exactly as an id the caller's tenant never issued:
/// the same status, the same problem document (code, field, detail with the id as given) or
/// the same shape of answer. The routes come from the OpenAPI document; a path parameter, a
/// query parameter or a body property not classified as an id or not fails the test, so none
/// is forgotten. Both tenants hold the same resources under the same numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_26_item_6_a_foreign_id_is_answered_as_a_never_issued_one_on_every_route() {
    let h = Harness::memory(|c| c.limits.max_sse_ms = 1_000).await;
    let a = world(&h, "acme").await;
    let b = world(&h, "other").await;
    for (x, y) in [(&a.tx, &b.tx), (&a.task, &b.task), (&a.group, &b.group), (&a.plan, &b.plan), (&a.review, &b.review)]
    {
        assert_eq!(x.rsplit('_').next(), y.rsplit('_').next(), "{x} and {y} have the same number");
    }
    let b_ids = Ids {
        tx: b.tx.clone(),
        branch: b.branch.clone(),
        group: b.group.clone(),
        task: b.task.clone(),
        tool: b.tool.clone(),
        capability: b.capability.clone(),
        key: b.key.clone(),
        review: b.review.clone(),
        plan: b.plan.clone(),
    };
    let doc = h.req("GET", "/v1/openapi.json", None, None).await.body;

    // Every query parameter and body property is classified; every id property has its check.
    let mut unclassified = Vec::new();
    let mut checks: Vec<(String, String, String, Place, IdKind)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let operation = op["operationId"].as_str().unwrap().to_owned();
            let m = method.to_uppercase();
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap();
                match p["in"].as_str() {
                    Some("path") => {
                        let kind = match name {
                            "tx" => IdKind::Tx,
                            "group" => IdKind::Group,
                            "task" => IdKind::Task,
                            "key" => IdKind::Key,
                            "id" => IdKind::Review,
                            "plan" => IdKind::Plan,
                            "name" if path.starts_with("/v1/tools/") => IdKind::Tool,
                            "name" => IdKind::Capability,
                            "effect" => continue,
                            other => {
                                unclassified.push(format!("path parameter `{other}` of {operation}"));
                                continue;
                            }
                        };
                        checks.push((operation.clone(), m.clone(), path.clone(), Place::Path(name.to_owned()), kind));
                    }
                    Some("query") if ID_QUERY.contains(&name) => {
                        checks.push((operation.clone(), m.clone(), path.clone(), Place::Query(name.into()), IdKind::Tx))
                    }
                    Some("query") if NOT_ID_QUERY.contains(&name) => {}
                    Some("query") => unclassified.push(format!("query parameter `{name}` of {operation}")),
                    _ => {}
                }
            }
            if let Some(schema) = op["requestBody"]["content"]["application/json"].get("schema") {
                let mut names = std::collections::BTreeSet::new();
                property_names(&doc, schema, &mut Vec::new(), &mut names);
                for n in names {
                    if ID_PROPERTIES.contains(&n.as_str()) {
                        let covered = BODY_IDS.iter().any(|(o, p, _)| *o == operation && p.split('/').any(|s| s == n))
                            || NOT_IDS_THERE.contains(&(operation.as_str(), n.as_str()));
                        if !covered {
                            unclassified.push(format!("body property `{n}` of {operation} has no entry in BODY_IDS"));
                        }
                    } else if !NOT_ID_PROPERTIES.contains(&n.as_str()) {
                        unclassified.push(format!("body property `{n}` of {operation}"));
                    }
                }
            }
            for (o, pointer, kind) in BODY_IDS {
                if *o == operation {
                    checks.push((operation.clone(), m.clone(), path.clone(), Place::Body(pointer), *kind));
                }
            }
        }
    }
    assert!(unclassified.is_empty(), "classify these as ids (with a check) or not:\n{}", unclassified.join("\n"));
    for (o, _, _) in BODY_IDS {
        assert!(checks.iter().any(|c| &c.0 == o), "BODY_IDS names `{o}`, which the document does not have");
    }
    // Defining a tool or capability under the other tenant's name comes last (it would give
    // the caller one of that name), and removing it after.
    let rank = |c: &(String, String, String, Place, IdKind)| match (c.1.as_str(), &c.3) {
        ("PUT", Place::Path(p)) if p == "name" => 1,
        ("DELETE", Place::Path(p)) if p == "name" => 2,
        _ => 0,
    };
    checks.sort_by_key(rank);

    let mut differences = Vec::new();
    let mut fresh = 0;
    let mut by_route = std::collections::BTreeSet::new();
    for (operation, method, path, place, kind) in &checks {
        let mut results = Vec::new();
        let (mut never, mut theirs) = (never_issued(*kind, &b), foreign(*kind, &a));
        if *kind == IdKind::EffectKey && operation == "one_call_transaction" {
            // A key is used once per tenant: each operation gets its own.
            (never, theirs) = (format!("{never}-{operation}"), a.release_key.clone());
        }
        if *kind == IdKind::EffectKey && operation == "batch_transaction" {
            (never, theirs) = (format!("{never}-{operation}"), a.batch_key.clone());
        }
        for id in [never, theirs] {
            // Scopes and keys no earlier request used.
            fresh += 1;
            // The id under test in its slot, the caller's own resources everywhere else.
            let mut url = match place {
                Place::Path(p) => path.replace(&format!("{{{p}}}"), &id),
                _ => path.clone(),
            };
            url = url
                .replace("{tx}", &b.tx)
                .replace("{group}", &b.group)
                .replace("{task}", &b.task)
                .replace("{key}", &b.key)
                .replace("{id}", &b.review)
                .replace("{plan}", &b.plan)
                .replace("{effect}", "0")
                .replace("{name}", if path.starts_with("/v1/tools/") { "other-slot-tool" } else { "other-slot-queue" });
            let mut body = body_for(operation, &b_ids).flatten();
            match place {
                Place::Path(_) => {}
                Place::Query(q) => url = format!("{url}?{q}={id}"),
                Place::Body(pointer) => {
                    let mut base = match operation.as_str() {
                        "begin_transaction" => json!({"plan": b.plan}),
                        "one_call_transaction" => json!({
                            "tool": b.tool, "args": {"id": format!("oc{fresh}")}, "key": format!("own-{fresh}"),
                            "wait_ms": 0
                        }),
                        "batch_transaction" => json!({
                            "effects": [{"tool": b.tool, "args": {"id": format!("bt{fresh}")}, "key": format!("own-{fresh}")}],
                            "wait_ms": 0
                        }),
                        "call_effect" => {
                            // A fresh step of the caller's plan for each request.
                            let r = h
                                .req("POST", "/v1/transactions", Some(&b.k.agent), Some(json!({"plan": b.plan})))
                                .await;
                            assert_eq!(r.status, 201, "{r:?}");
                            url = format!("/v1/transactions/{}/effects", r.body["id"].as_str().unwrap());
                            let cap = &b.capability;
                            json!({"tool": b.rev, "args": {"id": format!("ce{fresh}")}, "key": format!("own-{fresh}"),
                                "execute": "client",
                                "compensate": {"capability": cap, "probe": cap, "forward_probe": cap}})
                        }
                        "commit_group" => json!({"winner": b.branch, "wait_ms": 0}),
                        "plan_verdict" => json!({"transaction": b.tx, "effect": 0, "verdict": "block"}),
                        "arm_plan_trigger" => {
                            json!({"predicate": {"tagged": {"tenant": b.name, "tx": 1, "effect": 0, "tag": "leaked"}}})
                        }
                        "open_plan" => json!({
                            "owner": "o",
                            "triggers": [{"tagged": {"tenant": b.name, "tx": 1, "effect": 0, "tag": "leaked"}}]
                        }),
                        "put_tool" => json!({"class": "reversible", "scopes": ["kv:other:{id}"], "call": b.capability,
                            "compensate": b.capability, "probe": b.capability}),
                        "poll_tasks" => json!({"worker": "w", "capabilities": [b.capability], "wait_ms": 0}),
                        "review_request" => json!({"template": b.template, "params": {"v": "x"}, "suspicious": true}),
                        other => panic!("no base body for `{other}`"),
                    };
                    *base.pointer_mut(pointer).unwrap_or_else(|| panic!("{operation}: no {pointer}")) = json!(id);
                    body = Some(base);
                }
            }
            if operation == "wait_outcome" {
                url.push_str(if url.contains('?') { "&timeout_ms=0" } else { "?timeout_ms=0" });
            }
            let r = h.req(method, &url, Some(&b.k.admin), body).await;
            if r.text.replace(&id, "").contains(&a.tag) {
                differences.push(format!("{method} {url}: the answer shows the other tenant's tag: {}", r.text));
            }
            results.push((answer(&r, &id, &b.tag), url));
        }
        by_route.insert(format!("{method} {path}"));
        let (control, foreign) = (&results[0], &results[1]);
        if control.0 != foreign.0 {
            differences.push(format!(
                "{method} {path} ({operation}, {place:?}):\n  never issued ({}): {}\n  another tenant's ({}): {}",
                control.1, control.0, foreign.1, foreign.0
            ));
        }
    }
    eprintln!("{} ids compared on {} routes", checks.len(), by_route.len());
    assert!(by_route.len() >= 30, "only {} routes checked", by_route.len());
    assert!(differences.is_empty(), "{} differences:\n{}", differences.len(), differences.join("\n"));
    // The first tenant's resources are as they were.
    let r = h.req("GET", &format!("/v1/plans/{}", a.plan), Some(&a.k.agent), None).await;
    assert_eq!(r.body["state"], "open", "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{}", a.committing), Some(&a.k.agent), None).await;
    assert_eq!(r.body["state"], "committing", "{r:?}");
    h.stop().await;
}
