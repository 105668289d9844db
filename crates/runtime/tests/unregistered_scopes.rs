//! Scopes of types nobody registered, through the engine (issue 13 item 2): they are accepted,
//! overlap segment-wise (so they order commits and bound may-touch sets), and registering a
//! type changes only how its scopes are canonicalised. Size limits refuse oversized scopes
//! before anything is recorded (issue 10 item 6).

use std::time::Duration;

use serde_json::json;
use tidegate_runtime::{
    CaseRule, CommitOptions, EffectClass, Error, PathStyle, ScopeRegistry, ScopeRule, Tidegate, Tool, TxOptions,
};

fn charge() -> Tool {
    Tool::builder("charge", EffectClass::Gated)
        .scope(|a| format!("stripe:charge:{}", a["id"].as_str().unwrap_or_default()))
        .call(|_| async { Ok(json!("charged")) })
        .build()
        .expect("a valid tool")
}

fn aborted_kind(err: &Error) -> Option<&'static str> {
    err.outcome().and_then(|o| o.reason.as_ref()).map(|r| r.kind())
}

#[tokio::test]
async fn unregistered_types_are_accepted_and_order_overlapping_commits() {
    let tg = Tidegate::in_memory().unwrap();
    let earlier = tg.begin_with(TxOptions::agent("earlier").may_touch(["stripe:charge"])).unwrap();
    // stripe:charge is a segment prefix of stripe:charge:ch_1: the later commit must wait.
    let later = tg.begin_with(TxOptions::agent("later").may_touch(["stripe:charge:ch_1"])).unwrap();
    later.read("stripe:charge:ch_1").unwrap();
    later.seal().unwrap();
    let err = later.commit_with(CommitOptions { wait_timeout: Some(Duration::from_millis(100)) }).await.unwrap_err();
    assert_eq!(aborted_kind(&err), Some("wait_timeout"), "{err}");
    // Scopes that share only a string prefix, or name another type, do not wait.
    for scope in ["stripe:charges:ch_1", "stripe-test:charge:ch_1", "github:repo:org/name"] {
        let tx = tg.begin_with(TxOptions::agent("disjoint").may_touch([scope])).unwrap();
        tx.read(scope).unwrap();
        tx.seal().unwrap();
        let out = tx.commit_with(CommitOptions { wait_timeout: Some(Duration::from_millis(100)) }).await.unwrap();
        assert!(out.committed, "{scope}");
    }
    earlier.abort("done").await.unwrap();
}

#[tokio::test]
async fn may_touch_sets_of_unregistered_types_are_enforced_by_segments() {
    let tg = Tidegate::in_memory().unwrap();
    let tool = charge();
    let tx = tg.begin_with(TxOptions::agent("a").may_touch(["stripe:charge"])).unwrap();
    tx.call(&tool, json!({"id": "ch_1"})).await.unwrap();
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().committed);
    // `stripe:char` is a string prefix of `stripe:charge:…`, not a segment prefix.
    let tx = tg.begin_with(TxOptions::agent("b").may_touch(["stripe:char"])).unwrap();
    let err = tx.call(&tool, json!({"id": "ch_2"})).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("protocol violation") && msg.contains("outside the declared may-touch set"), "{msg}");
}

#[tokio::test]
async fn registering_a_type_changes_only_its_canonicalisation() {
    let mut scopes = ScopeRegistry::default();
    scopes.register("github", ScopeRule { style: PathStyle::Colon, case: CaseRule::Insensitive }).unwrap();
    let tg = Tidegate::builder().scopes(scopes).build().unwrap();
    let earlier = tg.begin_with(TxOptions::agent("earlier").may_touch(["github:repo:org"])).unwrap();
    // Case folds before overlap: GitHub:REPO:ORG:x is under github:repo:org.
    let later = tg.begin_with(TxOptions::agent("later").may_touch(["GitHub:REPO:ORG:x"])).unwrap();
    later.read("github:Repo:Org:x").unwrap();
    later.seal().unwrap();
    let err = later.commit_with(CommitOptions { wait_timeout: Some(Duration::from_millis(100)) }).await.unwrap_err();
    assert_eq!(aborted_kind(&err), Some("wait_timeout"), "{err}");
    // An unregistered type keeps the default rule: Stripe paths stay case-sensitive.
    let a = tg.begin_with(TxOptions::agent("a").may_touch(["stripe:Charge"])).unwrap();
    let b = tg.begin_with(TxOptions::agent("b").may_touch(["stripe:charge"])).unwrap();
    b.seal().unwrap();
    let out = b.commit_with(CommitOptions { wait_timeout: Some(Duration::from_millis(100)) }).await.unwrap();
    assert!(out.committed, "Charge and charge are different resources");
    a.abort("done").await.unwrap();
    earlier.abort("done").await.unwrap();
}

/// Regression (issue 10 item 6): a 20,000-segment scope crashed the process at seal. It is
/// refused when named, and the transaction is left as it was.
#[tokio::test]
async fn oversized_scopes_are_refused_before_anything_is_recorded() {
    let tg = Tidegate::in_memory().unwrap();
    let deep = format!("fs:/{}", vec!["a"; 20_000].join("/"));
    let err = tg.begin_with(TxOptions::agent("a").may_touch([deep.as_str()])).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&format!("{} bytes", deep.len())) && msg.contains("4096") && msg.len() < 400, "{msg}");
    let tx = tg.begin("b").unwrap();
    let huge = format!("stripe:charge:{}", "x".repeat(1 << 20));
    let msg = tx.read(&huge).unwrap_err().to_string();
    assert!(msg.contains(&format!("{} bytes", huge.len())) && msg.len() < 400, "{msg}");
    let deep_colon = format!("kv:{}", vec!["s"; 300].join(":"));
    let msg = tx.read(&deep_colon).unwrap_err().to_string();
    assert!(msg.contains("300 segments") && msg.contains("limit is 256"), "{msg}");
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed && out.effects.is_empty());
    tg.check_integrity().unwrap();
}
