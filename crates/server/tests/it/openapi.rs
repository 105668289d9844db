//! The committed OpenAPI document equals what the handlers generate.

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
    let h = crate::common::Harness::memory(|_| {}).await;
    let r = h.req("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text, tidegate_server::api::openapi_json());
    h.stop().await;
}
