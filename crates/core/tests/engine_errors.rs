//! The state machine refuses bad input with precise errors and stays consistent.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;

use serde_json::json;
use tidegate_core::engine::{BeginRequest, Decision, Recorded};
use tidegate_core::{AbortReason, Core, CoreConfig, EffectClass, EffectDecl, EngineError, Timestamp, TxId, TxState};

fn decl(core: &Core, tool: &str, class: EffectClass, scope: &str) -> EffectDecl {
    EffectDecl {
        tool: tool.into(),
        class,
        scopes: vec![core.scopes().parse(scope).unwrap()],
        key: None,
        call_id: None,
        args: Arc::new(json!({"s": scope})),
        compensable: true,
    }
}

#[test]
fn unknown_and_settled_transaction_ids_are_told_apart() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest { agent: "a".into(), ..Default::default() }, now).unwrap().tx;
    assert_eq!(c.seal(TxId(99), now), Err(EngineError::UnknownTx { tx: TxId(99) }));
    assert_eq!(c.seal(TxId(0), now), Err(EngineError::UnknownTx { tx: TxId(0) }));
    let plan = c.abort(t, AbortReason::Explicit { reason: "x".into() }).unwrap();
    assert!(plan.compensations.is_empty());
    c.finish_abort(t).unwrap();
    assert_eq!(c.seal(t, now), Err(EngineError::Settled { tx: t }));
    assert!(EngineError::UnknownTx { tx: TxId(99) }.to_string().contains("tx-99"));
    c.check_integrity().unwrap();
}

#[test]
fn an_effect_with_no_scope_is_refused_and_records_nothing() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    let mut d = decl(&c, "hotel", EffectClass::Reversible, "travel:hotel:H");
    d.scopes.clear();
    let err = c.record_effect(t, d, now).unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument { field: "scopes", .. }), "{err}");
    c.seal(t, now).unwrap();
    assert_eq!(c.view(t).unwrap().effects.len(), 0);
}

#[test]
fn seal_is_refused_while_a_call_is_in_flight() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    let Recorded::Execute(e) =
        c.record_effect(t, decl(&c, "hotel", EffectClass::Reversible, "travel:hotel:H"), now).unwrap()
    else {
        panic!("a reversible effect executes");
    };
    assert!(matches!(c.seal(t, now), Err(EngineError::InFlight { .. })));
    assert_eq!(c.state(t).unwrap(), TxState::Open);
    c.executed(t, e, tidegate_core::CallOutcome::done(json!("ok"))).unwrap();
    c.seal(t, now).unwrap();
    c.request_commit(t).unwrap();
    assert!(matches!(c.try_commit(t, now).unwrap(), Decision::Commit(_)));
    assert!(matches!(c.abort(t, AbortReason::Explicit { reason: "late".into() }), Err(EngineError::WrongState { .. })));
}

#[test]
fn versions_advance_on_committed_writes_only() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let scope = c.scopes().parse("retail:order:W1").unwrap();
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    c.record_effect(t, decl(&c, "modify", EffectClass::Bufferable, "retail:order:W1"), now).unwrap();
    c.seal(t, now).unwrap();
    c.abort(t, AbortReason::Explicit { reason: "no".into() }).unwrap();
    c.finish_abort(t).unwrap();
    assert_eq!(c.version(&scope).0, 0, "an aborted write leaves the version alone");
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    c.record_effect(t, decl(&c, "modify", EffectClass::Bufferable, "retail:order:W1"), now).unwrap();
    c.seal(t, now).unwrap();
    c.request_commit(t).unwrap();
    let Decision::Commit(plan) = c.try_commit(t, now).unwrap() else { panic!("nothing earlier blocks it") };
    for r in plan.releases {
        c.release_done(t, r.effect, tidegate_core::CallOutcome::done(json!(null))).unwrap();
    }
    c.finish_commit(t).unwrap();
    assert!(c.version(&scope).0 > 0);
    assert_eq!(c.stats().unfinished, 0);
    c.check_integrity().unwrap();
}

/// Regression (issue 10 item 6): 8 MiB of arguments were accepted with no limit (DESIGN §10
/// asks for oversized requests to be refused). Refused before anything is recorded, naming
/// the tool, the size and the limit; the transaction goes on.
#[test]
fn eight_mebibyte_arguments_are_refused() {
    use tidegate_core::engine::MAX_ARGS_BYTES;
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest::default(), now).unwrap().tx;
    c.take_events().count();
    let scope = c.scopes().parse("kv:a").unwrap();
    let big = serde_json::json!({"blob": "x".repeat(8 << 20)});
    let decl = |args: serde_json::Value| EffectDecl {
        tool: "upload".into(),
        class: EffectClass::Reversible,
        scopes: vec![scope.clone()],
        key: None,
        args: Arc::new(args),
        compensable: true,
        call_id: None,
    };
    let err = c.record_effect(t, decl(big.clone()), now).unwrap_err();
    let size = serde_json::to_string(&big).unwrap().len();
    assert_eq!(err, EngineError::ArgsTooLarge { tool: "upload".into(), bytes: size, limit: MAX_ARGS_BYTES });
    let msg = err.to_string();
    assert!(msg.contains("`upload`") && msg.contains(&size.to_string()) && msg.contains("1048576"), "{msg}");
    assert!(!err.retryable());
    assert!(!c.has_events(), "nothing recorded");
    assert_eq!(c.state(t).unwrap(), tidegate_core::TxState::Open, "the transaction goes on");
    // Exactly at the limit: accepted; one byte over: refused (strings escape, so the size is
    // the JSON's, not the string's).
    let fits = serde_json::json!("y".repeat(MAX_ARGS_BYTES - 2));
    assert!(c.record_effect(t, decl(fits), now).is_ok());
    let over = serde_json::json!("y".repeat(MAX_ARGS_BYTES - 1));
    assert!(
        matches!(c.record_effect(t, decl(over), now), Err(EngineError::ArgsTooLarge { bytes, .. }) if bytes == MAX_ARGS_BYTES + 1)
    );
    let escaped = serde_json::json!("\u{1}".repeat(MAX_ARGS_BYTES / 6 + 1));
    assert!(matches!(c.record_effect(t, decl(escaped), now), Err(EngineError::ArgsTooLarge { .. })));
    // The limit is a setting.
    let mut small = Core::new(CoreConfig { max_args_bytes: 16, ..CoreConfig::default() });
    let t = small.begin(BeginRequest::default(), now).unwrap().tx;
    assert!(small.record_effect(t, decl(serde_json::json!([1, 2])), now).is_ok());
    assert!(matches!(
        small.record_effect(t, decl(serde_json::json!({"k": "0123456789abcdef"})), now),
        Err(EngineError::ArgsTooLarge { limit: 16, .. })
    ));
}
