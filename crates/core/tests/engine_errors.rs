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
        args: Arc::new(json!({"s": scope})),
        compensable: true,
    }
}

#[test]
fn unknown_and_settled_transaction_ids_are_told_apart() {
    let mut c = Core::new(CoreConfig::default());
    let now = Timestamp(0);
    let t = c.begin(BeginRequest { agent: "a".into(), ..Default::default() }, now).tx;
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
    let t = c.begin(BeginRequest::default(), now).tx;
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
    let t = c.begin(BeginRequest::default(), now).tx;
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
    let t = c.begin(BeginRequest::default(), now).tx;
    c.record_effect(t, decl(&c, "modify", EffectClass::Bufferable, "retail:order:W1"), now).unwrap();
    c.seal(t, now).unwrap();
    c.abort(t, AbortReason::Explicit { reason: "no".into() }).unwrap();
    c.finish_abort(t).unwrap();
    assert_eq!(c.version(&scope).0, 0, "an aborted write leaves the version alone");
    let t = c.begin(BeginRequest::default(), now).tx;
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
