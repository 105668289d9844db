//! The operator console's endpoints (docs/console.md): what a waiting transaction waits for,
//! the tenant-wide stream, resolving an attention entry in the ledger, the per-minute series,
//! the ledger's filters and export, and the page itself; each limited to the caller's tenant.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Harness, Sink};

async fn begin(h: &Harness, key: &str, agent: &str, scopes: &[&str]) -> String {
    let r = h.req("POST", "/v1/transactions", Some(key), Some(json!({"agent": agent, "may_touch": scopes}))).await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body["id"].as_str().unwrap().to_owned()
}

async fn open_stream(h: &Harness, key: &str) -> (reqwest::Response, String) {
    let r = h.http.get(format!("{}/v1/transactions/stream", h.base)).bearer_auth(key).send().await.unwrap();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (r, ct)
}

/// The next event `(name, data)` of a stream, within `wait`.
async fn next_event(body: &mut reqwest::Response, buf: &mut String, wait: Duration) -> Option<(String, Value)> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            let mut name = "message".to_owned();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event:") {
                    name = n.trim().to_owned();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            if data.is_empty() {
                continue;
            }
            return Some((name, serde_json::from_str(&data).unwrap()));
        }
        match tokio::time::timeout_at(deadline, body.chunk()).await {
            Ok(Ok(Some(chunk))) => buf.push_str(&String::from_utf8_lossy(&chunk)),
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_transaction_names_the_earlier_one_and_the_overlapping_scope() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let early = begin(&h, &k.agent, "planner", &["kv:hotel:*"]).await;
    let late = begin(&h, &k.agent, "booker", &["kv:hotel:7"]).await;
    let r = h
        .req("POST", &format!("/v1/transactions/{late}/reads"), Some(&k.agent), Some(json!({"scope": "kv:hotel:7"})))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{late}/commit"),
            Some(&k.agent),
            Some(json!({"seal": true, "wait_ms": 0})),
        )
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{late}"), Some(&k.reviewer), None).await;
    assert_eq!(r.body["state"], "waiting", "{r:?}");
    let w = r.body["waits_for"].as_array().unwrap();
    assert_eq!(w.len(), 1, "{r:?}");
    assert_eq!(w[0]["transaction"], early.as_str());
    assert_eq!(w[0]["agent"], "planner");
    assert_eq!(w[0]["state"], "open");
    assert_eq!(w[0]["cause"], "overlap");
    assert_eq!(w[0]["scope"], "kv:hotel:7");
    assert!(w[0]["theirs"].as_str().unwrap().starts_with("kv:hotel"), "{r:?}");
    // The earlier one waits for nothing; the list shows the same answer.
    let r = h.req("GET", &format!("/v1/transactions/{early}"), Some(&k.agent), None).await;
    assert!(r.body.get("waits_for").is_none(), "{r:?}");
    let r = h.req("GET", "/v1/transactions?state=waiting", Some(&k.agent), None).await;
    assert_eq!(r.body["data"][0]["waits_for"][0]["transaction"], early.as_str(), "{r:?}");
    // Once the earlier one aborts, the waiting one commits and waits for nothing.
    let r = h.req("POST", &format!("/v1/transactions/{early}/abort"), Some(&k.operator), Some(json!({}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", &format!("/v1/transactions/{late}/outcome?timeout_ms=5000"), Some(&k.agent), None).await;
    assert_eq!((r.status, r.body["state"].as_str()), (200, Some("committed")), "{r:?}");
    assert!(r.body.get("waits_for").is_none(), "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_stream_sends_a_snapshot_then_changes_of_its_own_tenant_only() {
    let h = Harness::memory(|_| {}).await;
    let (_, a) = h.tenant("acme");
    let (_, b) = h.tenant("other");
    let before = begin(&h, &a.agent, "a1", &["kv:s:1"]).await;
    let (resp, ct) = open_stream(&h, &a.reviewer).await;
    assert_eq!(resp.status(), 200);
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let mut body = resp;
    let mut buf = String::new();
    let (name, snap) = next_event(&mut body, &mut buf, Duration::from_secs(5)).await.expect("a snapshot");
    assert_eq!(name, "snapshot");
    let ids: Vec<&str> = snap["data"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![before.as_str()]);
    assert_eq!(snap["truncated"], false);

    let (b_resp, _) = open_stream(&h, &b.agent).await;
    let mut b_body = b_resp;
    let mut b_buf = String::new();
    let (_, b_snap) = next_event(&mut b_body, &mut b_buf, Duration::from_secs(5)).await.unwrap();
    assert!(b_snap["data"].as_array().unwrap().is_empty(), "the other tenant's snapshot: {b_snap}");

    // A change: a new transaction, then the first one sealed and committed.
    let new = begin(&h, &a.agent, "a2", &["kv:s:2"]).await;
    let mut seen_new = false;
    while !seen_new {
        let (name, ev) = next_event(&mut body, &mut buf, Duration::from_secs(5)).await.expect("a change");
        assert_eq!(name, "changes");
        seen_new = ev["data"].as_array().unwrap().iter().any(|t| t["id"] == new.as_str());
    }
    let r =
        h.req("POST", &format!("/v1/transactions/{before}/commit"), Some(&a.agent), Some(json!({"seal": true}))).await;
    assert_eq!(r.body["state"], "committed", "{r:?}");
    let mut settled = false;
    while !settled {
        let (_, ev) = next_event(&mut body, &mut buf, Duration::from_secs(5)).await.expect("the commit");
        settled =
            ev["data"].as_array().unwrap().iter().any(|t| t["id"] == before.as_str() && t["state"] == "committed");
    }
    // The other tenant's stream carried none of it; its own begin arrives.
    let own = begin(&h, &b.agent, "b1", &["kv:s:1"]).await;
    let (name, ev) = next_event(&mut b_body, &mut b_buf, Duration::from_secs(5)).await.expect("b's change");
    assert_eq!(name, "changes");
    let got: Vec<&str> = ev["data"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(got, vec![own.as_str()], "{ev}");
    assert!(!b_buf.contains("acme") && !b_buf.contains("a1"), "{b_buf}");
    // Without a key, nothing.
    let r = h.req("GET", "/v1/transactions/stream", None, None).await;
    assert_eq!(r.status, 401);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_an_unresolved_effect_and_the_ledger_records_who() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let (_, other) = h.tenant("other");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "fax", "gated", false, false).await;
    sink.script("fax/call", &[503, 503]);
    let tx = begin(&h, &k.agent, "faxer", &["kv:fax:*"]).await;
    h.req(
        "POST",
        &format!("/v1/transactions/{tx}/effects"),
        Some(&k.agent),
        Some(json!({"tool": "fax", "args": {"id": "f1"}})),
    )
    .await;
    let r = h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    assert_eq!(r.body["effects"][0]["tag"], "unresolved", "{r:?}");
    let a = h.req("GET", "/v1/ledger/attention?resolved=false", Some(&k.operator), None).await;
    assert_eq!(a.body["data"].as_array().unwrap().len(), 1, "{a:?}");
    assert!(a.body["data"][0]["resolution"].is_null(), "{a:?}");

    let path = format!("/v1/ledger/attention/{tx}/0/resolve");
    let body = json!({"action": "resolved", "note": "faxed by hand, confirmed by phone"});
    // Roles without the permission, another tenant, bad input.
    for key in [&k.reviewer, &k.agent] {
        assert_eq!(h.req("POST", &path, Some(key), Some(body.clone())).await.status, 403);
    }
    let r = h.req("POST", &path, Some(&other.operator), Some(body.clone())).await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = h.req("POST", &path, Some(&k.operator), Some(json!({"action": "resolved", "note": "  "}))).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("note")), "{r:?}");
    let r = h.req("POST", &path, Some(&k.operator), Some(json!({"action": "retried", "note": "x"}))).await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = h.req("POST", &format!("/v1/ledger/attention/{tx}/5/resolve"), Some(&k.operator), Some(body.clone())).await;
    assert_eq!((r.status, r.body["code"].as_str()), (409, Some("not_in_attention")), "{r:?}");
    let r = h.req("POST", &format!("/v1/ledger/attention/{tx}/x/resolve"), Some(&k.operator), Some(body.clone())).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("effect")), "{r:?}");

    let r = h.req("POST", &path, Some(&k.operator), Some(body)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["resolution"]["action"], "resolved");
    let by = r.body["resolution"]["by"].as_str().unwrap().to_owned();
    assert!(by.starts_with("key_") && by.ends_with("(operator)"), "{by}");
    let lsn = r.body["resolution"]["lsn"].as_u64().unwrap();
    assert!(lsn > 0);

    // The attention list shows it resolved; the open-only filter no longer lists it.
    let a = h.req("GET", "/v1/ledger/attention", Some(&k.reviewer), None).await;
    assert_eq!(a.body["data"][0]["resolution"]["note"], "faxed by hand, confirmed by phone", "{a:?}");
    let open = h.req("GET", "/v1/ledger/attention?resolved=false", Some(&k.operator), None).await;
    assert!(open.body["data"].as_array().unwrap().is_empty(), "{open:?}");
    let done = h.req("GET", "/v1/ledger/attention?resolved=true", Some(&k.operator), None).await;
    assert_eq!(done.body["data"].as_array().unwrap().len(), 1, "{done:?}");
    // The ledger holds the record on the stream `operator`, with who did it.
    let ev = h.req("GET", &format!("/v1/ledger/events?after_lsn={}&limit=1", lsn - 1), Some(&k.operator), None).await;
    let rec = &ev.body["data"][0];
    assert_eq!(rec["event"], "extension", "{ev:?}");
    assert_eq!(rec["data"]["stream"], "operator", "{ev:?}");
    assert_eq!(rec["data"]["body"]["by"], by.as_str(), "{ev:?}");
    assert_eq!(rec["data"]["body"]["action"], "resolved", "{ev:?}");
    // The other tenant's attention list and ledger show none of it.
    let o = h.req("GET", "/v1/ledger/attention", Some(&other.operator), None).await;
    assert!(o.body["data"].as_array().unwrap().is_empty(), "{o:?}");
    let o = h.req("GET", "/v1/ledger/events", Some(&other.operator), None).await;
    assert!(!o.text.contains("faxed by hand"), "{o:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::durable(dir, |_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "fax", "gated", false, false).await;
    sink.script("fax/call", &[503, 503]);
    let tx = begin(&h, &k.agent, "faxer", &["kv:fax:*"]).await;
    h.req(
        "POST",
        &format!("/v1/transactions/{tx}/effects"),
        Some(&k.agent),
        Some(json!({"tool": "fax", "args": {"id": "f1"}})),
    )
    .await;
    h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    let r = h
        .req(
            "POST",
            &format!("/v1/ledger/attention/{tx}/0/resolve"),
            Some(&k.admin),
            Some(json!({"action": "accepted", "note": "the fax may stand"})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let dir = h.stop().await.unwrap();
    let h = Harness::durable(dir, |_| {}).await;
    let a = h.req("GET", "/v1/ledger/attention", Some(&k.operator), None).await;
    assert_eq!(a.body["data"][0]["resolution"]["action"], "accepted", "{a:?}");
    assert_eq!(a.body["data"][0]["resolution"]["note"], "the fax may stand", "{a:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_counts_this_tenants_commits_and_aborts_by_reason() {
    let h = Harness::memory(|_| {}).await;
    let (_, a) = h.tenant("acme");
    let (_, b) = h.tenant("other");
    for i in 0..3 {
        let tx = begin(&h, &a.agent, "c", &[&format!("kv:c:{i}")]).await;
        let r =
            h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&a.agent), Some(json!({"seal": true}))).await;
        assert_eq!(r.body["state"], "committed", "{r:?}");
    }
    let tx = begin(&h, &a.agent, "c", &["kv:c:9"]).await;
    h.req("POST", &format!("/v1/transactions/{tx}/abort"), Some(&a.agent), Some(json!({"reason": "no"}))).await;
    let s = h.req("GET", "/v1/console/series", Some(&a.agent), None).await;
    assert_eq!(s.status, 200, "{s:?}");
    let m = s.body["minutes"].as_array().unwrap();
    assert_eq!(m.len(), 60);
    let commits: u64 = m.iter().map(|x| x["commits"].as_u64().unwrap()).sum();
    let explicit: u64 = m.iter().map(|x| x["aborts"]["explicit"].as_u64().unwrap_or(0)).sum();
    assert_eq!((commits, explicit), (3, 1), "{s:?}");
    let starts: Vec<u64> = m.iter().map(|x| x["start_ms"].as_u64().unwrap()).collect();
    assert!(starts.windows(2).all(|w| w[1] == w[0] + 60_000), "one entry per minute");
    // The other tenant's figures are its own.
    let s = h.req("GET", "/v1/console/series", Some(&b.agent), None).await;
    let commits: u64 = s.body["minutes"].as_array().unwrap().iter().map(|x| x["commits"].as_u64().unwrap()).sum();
    assert_eq!(commits, 0, "{s:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_filters_select_transactions_and_the_export_is_json_lines() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let t1 = begin(&h, &k.agent, "alice", &["kv:shop:1"]).await;
    h.req("POST", &format!("/v1/transactions/{t1}/reads"), Some(&k.agent), Some(json!({"scope": "kv:shop:1"}))).await;
    h.req("POST", &format!("/v1/transactions/{t1}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    let t2 = begin(&h, &k.agent, "bob", &["kv:bank:1"]).await;
    h.req("POST", &format!("/v1/transactions/{t2}/abort"), Some(&k.agent), Some(json!({}))).await;
    let t3 = begin(&h, &k.agent, "bob", &["kv:shop:2"]).await;

    let txs = |r: &crate::common::Resp| -> Vec<String> {
        let mut v: Vec<String> = r.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["transaction"].as_str().map(str::to_owned))
            .collect();
        v.dedup();
        v
    };
    let q = |s: &str| format!("/v1/ledger/events?limit=500&{s}");
    let r = h.req("GET", &q("agent=bob"), Some(&k.operator), None).await;
    assert_eq!(txs(&r), vec![t2.clone(), t3.clone()], "{r:?}");
    let r = h.req("GET", &q("scope=kv:shop"), Some(&k.operator), None).await;
    assert_eq!(txs(&r), vec![t1.clone(), t3.clone()], "{r:?}");
    let r = h.req("GET", &q("outcome=aborted"), Some(&k.operator), None).await;
    assert_eq!(txs(&r), vec![t2.clone()], "{r:?}");
    let r = h.req("GET", &q("outcome=unfinished&agent=bob"), Some(&k.operator), None).await;
    assert_eq!(txs(&r), vec![t3.clone()], "{r:?}");
    let r = h.req("GET", &q(&format!("transaction={t1}&event=read")), Some(&k.operator), None).await;
    let d = r.body["data"].as_array().unwrap();
    assert_eq!((d.len(), d[0]["data"]["scope"].as_str()), (1, Some("kv:shop:1")), "{r:?}");
    let far = 4_000_000_000_000u64;
    let r = h.req("GET", &q(&format!("from_ms={far}")), Some(&k.operator), None).await;
    assert!(r.body["data"].as_array().unwrap().is_empty(), "{r:?}");
    let r = h.req("GET", &q("from_ms=0&to_ms=4000000000000"), Some(&k.operator), None).await;
    assert_eq!(txs(&r), vec![t1.clone(), t2.clone(), t3.clone()], "{r:?}");
    for (bad, field) in [
        ("outcome=maybe", "outcome"),
        ("from_ms=5&to_ms=1", "to_ms"),
        ("scope=", "scope"),
        ("transaction=tx_zz_1", "transaction"),
    ] {
        let r = h.req("GET", &q(bad), Some(&k.operator), None).await;
        assert_eq!((r.status, r.body["field"].as_str()), (400, Some(field)), "{bad}: {r:?}");
    }
    assert_eq!(h.req("GET", &q("agent=bob"), Some(&k.agent), None).await.status, 403, "agents do not read the ledger");

    // The export: one event per line, the same events as the page.
    let page = h.req("GET", &q("agent=bob"), Some(&k.operator), None).await;
    let r = h.req("GET", "/v1/ledger/export?agent=bob", Some(&k.reviewer), None).await;
    assert_eq!(r.status, 200);
    assert!(r.content_type().starts_with("application/x-ndjson"), "{}", r.content_type());
    let lines: Vec<Value> = r.text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(Value::Array(lines), page.body["data"]);
    let r = h.req("GET", "/v1/ledger/export?limit=0", Some(&k.reviewer), None).await;
    assert_eq!((r.status, r.body["field"].as_str()), (400, Some("limit")), "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_page_is_served_with_its_assets_and_no_external_resource() {
    let h = Harness::memory(|_| {}).await;
    let r = h.req("GET", "/console", None, None).await;
    assert_eq!(r.status, 200);
    assert!(r.content_type().starts_with("text/html"), "{}", r.content_type());
    let csp = r.headers.get("content-security-policy").unwrap().to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    for asset in ["/console/console.js", "/console/console.css"] {
        assert!(r.text.contains(asset), "the page loads {asset}");
        let a = h.req("GET", asset, None, None).await;
        assert_eq!(a.status, 200, "{asset}");
        for external in ["http://", "https://", "//cdn", "fonts.googleapis"] {
            let stripped = a.text.replace("http://www.w3.org/2000/svg", "");
            assert!(!stripped.contains(external), "{asset} refers to {external}");
        }
    }
    assert!(!r.text.contains("https://"), "the page refers to nothing outside the server");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_redelivers_with_the_same_key_is_recorded_and_resolves_only_when_done() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let sink = Sink::start().await;
    h.webhook_tool(&k.admin, &sink, "fax", "gated", false, false).await;
    sink.script("fax/call", &[503, 503]);
    let tx = begin(&h, &k.agent, "faxer", &["kv:fax:*"]).await;
    h.req(
        "POST",
        &format!("/v1/transactions/{tx}/effects"),
        Some(&k.agent),
        Some(json!({"tool": "fax", "args": {"id": "f1"}})),
    )
    .await;
    let r = h.req("POST", &format!("/v1/transactions/{tx}/commit"), Some(&k.agent), Some(json!({"seal": true}))).await;
    assert_eq!(r.body["effects"][0]["tag"], "unresolved", "{r:?}");
    let first_key = sink.on("fax/call")[0].key.clone();
    let path = format!("/v1/ledger/attention/{tx}/0/retry");
    assert_eq!(h.req("POST", &path, Some(&k.reviewer), Some(json!({}))).await.status, 403);

    // The far side still fails: recorded, not resolved.
    sink.script("fax/call", &[503, 503]);
    let r = h.req("POST", &path, Some(&k.operator), Some(json!({"note": "first try"}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["operation"], "release");
    assert_ne!(r.body["outcome"], "done", "{r:?}");
    assert!(r.body["entry"]["resolution"].is_null(), "{r:?}");
    // Now it answers: done, resolved as retried, with the same idempotency key every time.
    let r = h.req("POST", &path, Some(&k.operator), Some(json!({}))).await;
    assert_eq!((r.status, r.body["outcome"].as_str()), (200, Some("done")), "{r:?}");
    assert_eq!(r.body["entry"]["resolution"]["action"], "retried", "{r:?}");
    let calls = sink.on("fax/call");
    assert!(calls.len() >= 5, "{calls:?}");
    assert!(calls.iter().all(|d| d.key == first_key), "every retry carries the effect's key");
    assert_eq!(calls.iter().filter(|d| d.applied).count(), 1, "applied once");
    // Both retries are in the ledger with who did them.
    let ev = h.req("GET", "/v1/ledger/events?event=extension", Some(&k.operator), None).await;
    let kinds: Vec<(&str, &str)> = ev.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"]["stream"] == "operator")
        .map(|e| (e["data"]["body"]["kind"].as_str().unwrap(), e["data"]["body"]["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds.len(), 2, "{ev:?}");
    assert!(kinds.iter().all(|(k, _)| *k == "retry_effect"));
    assert_eq!(kinds[1].1, "done");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_resends_a_waiting_transaction_when_what_it_waits_for_changes() {
    let h = Harness::memory(|_| {}).await;
    let (_, k) = h.tenant("acme");
    let a1 = begin(&h, &k.agent, "a1", &["kv:w:*"]).await;
    let a2 = begin(&h, &k.agent, "a2", &["kv:w:1"]).await;
    let b = begin(&h, &k.agent, "b", &["kv:w:1"]).await;
    h.req("POST", &format!("/v1/transactions/{b}/reads"), Some(&k.agent), Some(json!({"scope": "kv:w:1"}))).await;
    let r = h
        .req("POST", &format!("/v1/transactions/{b}/commit"), Some(&k.agent), Some(json!({"seal": true, "wait_ms": 0})))
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    let (mut body, _) = open_stream(&h, &k.reviewer).await;
    let mut buf = String::new();
    let (_, snap) = next_event(&mut body, &mut buf, Duration::from_secs(5)).await.unwrap();
    let sb = snap["data"].as_array().unwrap().iter().find(|t| t["id"] == b.as_str()).unwrap().clone();
    let waits: Vec<&str> =
        sb["waits_for"].as_array().unwrap().iter().map(|w| w["transaction"].as_str().unwrap()).collect();
    assert_eq!(waits, vec![a1.as_str(), a2.as_str()], "{sb}");
    // The first blocker aborts: `b` itself has no new ledger event, but what it waits for moved.
    h.req("POST", &format!("/v1/transactions/{a1}/abort"), Some(&k.agent), Some(json!({}))).await;
    let mut resent = None;
    while resent.is_none() {
        let (_, ev) = next_event(&mut body, &mut buf, Duration::from_secs(5)).await.expect("a change of b");
        resent = ev["data"].as_array().unwrap().iter().find(|t| t["id"] == b.as_str()).cloned();
    }
    let resent = resent.unwrap();
    assert_eq!(resent["state"], "waiting", "{resent}");
    let waits: Vec<&str> =
        resent["waits_for"].as_array().unwrap().iter().map(|w| w["transaction"].as_str().unwrap()).collect();
    assert_eq!(waits, vec![a2.as_str()], "{resent}");
    h.stop().await;
}
