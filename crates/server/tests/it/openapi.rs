//! The committed OpenAPI document equals what the handlers generate, names each schema once,
//! and documents request bodies the server takes.

use serde_json::{Value, json};

use crate::common::Harness;

/// Set `TIDEGATE_BLESS=1` to rewrite docs/openapi.json from the code.
#[test]
fn the_committed_openapi_document_matches_the_handlers() {
    let generated = tidegate_server::api::openapi_json();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    if std::env::var_os("TIDEGATE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write docs/openapi.json");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is out of date; regenerate it with `TIDEGATE_BLESS=1 cargo test -p tidegate-server --test it openapi`"
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "OpenAPI 3.1");
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    assert!(doc["components"]["schemas"]["Problem"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_the_same_document() {
    let h = Harness::memory(|_| {}).await;
    let r = h.req("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text, tidegate_server::api::openapi_json());
    h.stop().await;
}

/// Regression (issue 26, item 5): two request types named `ResolveIn` (the attention list's
/// and the plans') shared one component, so one route was documented with the other's body.
#[test]
fn issue_26_item_5_no_two_schemas_share_a_component_name() {
    let collisions = tidegate_server::api::schema_name_collisions();
    assert!(collisions.is_empty(), "{}", collisions.join("\n"));
}

/// Regression (issue 26, item 5): the body of resolving an attention entry was documented as
/// the plans' `{choice}`, which the server refuses (`unknown_field`); the server takes
/// `{action, note}`. Checked against a real attention entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_26_item_5_the_attention_resolution_is_documented_with_the_body_the_server_takes() {
    let h = Harness::memory(|_| {}).await;
    let sink = crate::common::Sink::start().await;
    let (_, k) = h.tenant("acme");
    // A reversible tool without a compensation: its effect settles `unresolved` on abort.
    h.webhook_tool(&k.admin, &sink, "charge", "reversible", false, false).await;
    let r = h.req("POST", "/v1/transactions", Some(&k.agent), Some(json!({"may_touch": ["kv:charge:*"]}))).await;
    let tx = r.body["id"].as_str().unwrap().to_owned();
    let r = h
        .req(
            "POST",
            &format!("/v1/transactions/{tx}/effects"),
            Some(&k.agent),
            Some(json!({"tool": "charge", "args": {"id": "1"}})),
        )
        .await;
    assert_eq!(r.body["ack"], "executed", "{r:?}");
    let r = h.req("POST", &format!("/v1/transactions/{tx}/abort"), Some(&k.agent), Some(json!({}))).await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = h.req("GET", "/v1/ledger/attention", Some(&k.operator), None).await;
    assert_eq!(r.body["data"][0]["tag"], "unresolved", "{r:?}");

    let doc = h.req("GET", "/v1/openapi.json", None, None).await.body;
    let path = "/v1/ledger/attention/{tx}/{effect}/resolve";
    let media = &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"];
    let schema = resolve(&doc, &media["schema"]);
    assert_eq!(schema["required"], json!(["action", "note"]), "{schema}");
    let plans = &doc["paths"]["/v1/plans/{plan}/resolve"]["post"]["requestBody"]["content"]["application/json"];
    assert_eq!(resolve(&doc, &plans["schema"])["required"], json!(["choice"]));
    let url = path.replace("{tx}", &tx).replace("{effect}", "0");
    let r = h.req("POST", &url, Some(&k.operator), Some(json!({"choice": "accept"}))).await;
    assert_eq!((r.status, r.body["code"].as_str()), (400, Some("unknown_field")), "{r:?}");
    let examples = examples_of(&doc, media);
    assert!(!examples.is_empty(), "the body has an example");
    for example in examples {
        let r = h.req("POST", &url, Some(&k.operator), Some(example.clone())).await;
        assert_eq!(r.status, 200, "the documented example {example} is taken: {r:?}");
        assert_eq!(r.body["resolution"]["action"], example["action"], "{r:?}");
    }
    h.stop().await;
}

/// Issue 26, item 5: a browser pointed at the server's root is sent to the console (it got a
/// JSON 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_26_item_5_a_browser_at_the_root_is_sent_to_the_console() {
    let h = Harness::memory(|_| {}).await;
    let direct = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
        let r = direct.request(method.clone(), format!("{}/", h.base)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 303, "{method}");
        assert_eq!(r.headers().get("location").and_then(|v| v.to_str().ok()), Some("/console"), "{method}");
    }
    // Followed (as a browser does), it ends on the console page.
    let r = h.http.get(format!("{}/", h.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.url().path() == "/console", "{}", r.url());
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    assert!(ct.starts_with("text/html"), "{ct}");
    // Other paths still answer a problem document, and the root takes only GET and HEAD.
    let r = h.req("GET", "/nothing-here", None, None).await;
    assert_eq!((r.status, r.body["code"].as_str()), (404, Some("not_found")), "{r:?}");
    let r = h.req("POST", "/", None, Some(json!({}))).await;
    assert_eq!((r.status, r.body["code"].as_str()), (405, Some("method_not_allowed")), "{r:?}");
    h.stop().await;
}

/// The schema a `$ref` (or a chain of them) names.
fn resolve<'a>(doc: &'a Value, mut s: &'a Value) -> &'a Value {
    while let Some(r) = s.get("$ref").and_then(Value::as_str) {
        s = &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")];
    }
    s
}

/// Every example a request body documents: the media type's `example` and `examples`, and the
/// schema's `examples` and `example`.
fn examples_of(doc: &Value, media: &Value) -> Vec<Value> {
    let schema = resolve(doc, &media["schema"]);
    let mut out: Vec<Value> = Vec::new();
    out.extend(media.get("example").cloned());
    if let Some(m) = media.get("examples").and_then(Value::as_object) {
        out.extend(m.values().filter_map(|e| e.get("value").cloned()));
    }
    out.extend(schema.get("examples").and_then(Value::as_array).into_iter().flatten().cloned());
    out.extend(schema.get("example").cloned());
    out
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    }
}

fn fits(doc: &Value, schema: &Value, v: &Value) -> bool {
    let mut errors = Vec::new();
    validate(doc, schema, v, "body", &mut errors);
    errors.is_empty()
}

/// Checks `v` against the subset of JSON Schema the document uses (`$ref`, `oneOf`, `allOf`,
/// `anyOf`, `type`, `enum`, `minimum`, `required`, `properties`, `additionalProperties`,
/// `items`); each mismatch is pushed with its path.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = resolve(doc, schema);
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let n = alts.iter().filter(|a| fits(doc, a, v)).count();
        if n != 1 {
            errors.push(format!("{at}: {v} fits {n} of the {} `oneOf` alternatives", alts.len()));
        }
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for a in all {
            validate(doc, a, v, at, errors);
        }
    }
    if let Some(any) = s.get("anyOf").and_then(Value::as_array)
        && !any.iter().any(|a| fits(doc, a, v))
    {
        errors.push(format!("{at}: {v} fits none of the `anyOf` alternatives"));
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(x) => vec![x.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.iter().any(|t| type_matches(t, v)) {
            errors.push(format!("{at}: {v} is not of type {t}"));
            return;
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        errors.push(format!("{at}: {v} is not one of {}", Value::Array(e.clone())));
    }
    if let (Some(min), Some(x)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64())
        && x < min
    {
        errors.push(format!("{at}: {v} is below the minimum {min}"));
    }
    if let Some(o) = v.as_object() {
        for r in s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            if !o.contains_key(r) {
                errors.push(format!("{at}: the required property `{r}` is missing"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in o {
            let here = format!("{at}.{k}");
            match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                (Some(p), _) => validate(doc, p, x, &here, errors),
                (None, Some(Value::Bool(false))) => errors.push(format!("{here}: not a documented property")),
                (None, Some(extra @ Value::Object(_))) => validate(doc, extra, x, &here, errors),
                (None, _) => {}
            }
        }
    }
    if let (Some(a), Some(items)) = (v.as_array(), s.get("items")) {
        for (i, x) in a.iter().enumerate() {
            validate(doc, items, x, &format!("{at}[{i}]"), errors);
        }
    }
}

/// Whether a schema admits `null`.
fn nullable(doc: &Value, s: &Value) -> bool {
    let s = resolve(doc, s);
    match s.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(a)) => a.iter().any(|t| t == "null"),
        _ => s.get("oneOf").and_then(Value::as_array).is_some_and(|alts| alts.iter().any(|a| nullable(doc, a))),
    }
}

/// A value of the schema: `null` where it admits one, else its first enum value or example,
/// else a value of its type (an object with its required properties).
fn generate(doc: &Value, schema: &Value) -> Value {
    let s = resolve(doc, schema);
    if nullable(doc, s) {
        return Value::Null;
    }
    if let Some(v) = s.get("enum").and_then(|e| e.get(0)) {
        return v.clone();
    }
    if let Some(v) = s.get("examples").and_then(|e| e.get(0)) {
        return v.clone();
    }
    if let Some(first) = s.get("oneOf").and_then(|a| a.get(0)) {
        return generate(doc, first);
    }
    let t = match s.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("object"),
        _ => "object",
    };
    match t {
        "boolean" => json!(false),
        "integer" | "number" => json!(s.get("minimum").and_then(Value::as_u64).unwrap_or(0)),
        "string" => json!("x"),
        "array" => json!([]),
        _ => {
            let mut o = serde_json::Map::new();
            for r in s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
                o.insert(r.to_owned(), generate(doc, &s["properties"][r]));
            }
            Value::Object(o)
        }
    }
}

/// `example` with every property its schema documents and the example leaves out filled in
/// ([`generate`]), at every depth, following the `oneOf` alternative the example is of.
fn fill(doc: &Value, schema: &Value, example: &Value) -> Value {
    let s = resolve(doc, schema);
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        return match alts.iter().find(|a| fits(doc, a, example)) {
            Some(a) => fill(doc, a, example),
            None => example.clone(),
        };
    }
    match example {
        Value::Object(o) => {
            let mut o = o.clone();
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, p) in props {
                    let v = match o.get(k) {
                        Some(x) => fill(doc, p, x),
                        None => generate(doc, p),
                    };
                    o.insert(k.clone(), v);
                }
            }
            Value::Object(o)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| fill(doc, &s["items"], x)).collect()),
        other => other.clone(),
    }
}

/// The names the documented examples use for a capability and a tool: the check defines them
/// with the documented `PUT` examples first.
const EXAMPLE_CAPABILITY: &str = "billing";
const EXAMPLE_TOOL: &str = "send_invoice";

/// Issue 26, item 5: every request body the document shows is taken by the server. For each
/// operation with a body: its examples (there must be one) fit its own schema, and each
/// example, and each example with every other documented property added (`null` or a value
/// of its type), sent to a real server with ids never issued in the path, is answered 2xx,
/// 404 `not_found` (the path's id) or 409 (a state refusal): never a 400 (an unknown or
/// missing field, a wrong type, a value the server refuses), 415 or 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_request_body_is_accepted_by_the_server() {
    let h = Harness::memory(|_| {}).await;
    let (tag, k) = h.tenant("docs");
    let doc = h.req("GET", "/v1/openapi.json", None, None).await.body;
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if op.get("requestBody").is_some() {
                let id = op["operationId"].as_str().unwrap_or("?").to_owned();
                // What later examples name is defined first.
                let rank = match id.as_str() {
                    "put_capability" => 0,
                    "put_tool" => 1,
                    "review_register_templates" => 2,
                    _ => 3,
                };
                ops.push((rank, id, path.clone(), method.to_uppercase(), op.clone()));
            }
        }
    }
    ops.sort_by_key(|o| o.0);
    assert!(ops.len() >= 26, "only {} operations with a body", ops.len());
    let never = |kind: &str| format!("{kind}_{tag}_999999");
    let mut failures = Vec::new();
    let mut sent = 0;
    for (_, id, path, method, op) in &ops {
        let media = &op["requestBody"]["content"]["application/json"];
        let schema = &media["schema"];
        let name = if path.starts_with("/v1/tools/") { EXAMPLE_TOOL } else { EXAMPLE_CAPABILITY };
        let url = path
            .replace("{tx}", &never("tx"))
            .replace("{group}", &never("grp"))
            .replace("{task}", &never("task"))
            .replace("{plan}", &never("plan"))
            .replace("{id}", &never("rv"))
            .replace("{key}", "key_0123456789abcdef")
            .replace("{effect}", "0")
            .replace("{name}", name);
        assert!(!url.contains('{'), "{path}: a path parameter the check does not fill");
        let examples = examples_of(&doc, media);
        if examples.is_empty() {
            failures.push(format!("{method} {path} ({id}): its request body has no example"));
        }
        for example in examples {
            let mut errors = Vec::new();
            validate(&doc, schema, &example, "body", &mut errors);
            if !errors.is_empty() {
                failures.push(format!("{id}: the example {example} does not fit its schema: {}", errors.join("; ")));
            }
            let filled = fill(&doc, schema, &example);
            let mut errors = Vec::new();
            validate(&doc, schema, &filled, "body", &mut errors);
            assert!(errors.is_empty(), "{id}: the filled-in {filled} does not fit its schema: {errors:?}");
            for body in [example, filled] {
                let r = h.req(method, &url, Some(&k.admin), Some(body.clone())).await;
                sent += 1;
                let ok = match r.status {
                    200..=202 => true,
                    404 => r.body["code"] == "not_found",
                    409 => true,
                    _ => false,
                };
                if !ok {
                    failures.push(format!("{method} {url} ({id}) refused {body}: {r:?}"));
                }
            }
        }
    }
    assert!(sent >= 2 * ops.len(), "only {sent} requests");
    assert!(failures.is_empty(), "{} refusals:\n{}", failures.len(), failures.join("\n"));
    h.stop().await;
}
