//! `Core::waits_for` names what the commit decision waits for, and agrees with it: a waiting
//! transaction's answer is empty exactly when `try_commit` stops answering `Wait`.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;

use serde_json::json;
use tidegate_core::engine::{BeginRequest, Decision, WaitCause};
use tidegate_core::{AbortReason, Core, CoreConfig, EffectClass, EffectDecl, Ordering, Timestamp, TxId, TxState};

fn decl(core: &Core, scope: &str) -> EffectDecl {
    EffectDecl {
        tool: "book".into(),
        class: EffectClass::Bufferable,
        scopes: vec![core.scopes().parse(scope).unwrap()],
        key: None,
        call_id: None,
        args: Arc::new(json!({"s": scope})),
        compensable: true,
    }
}

fn begin(c: &mut Core, may_touch: Option<&[&str]>) -> TxId {
    let may_touch = may_touch.map(|m| m.iter().map(|s| c.scopes().parse(s).unwrap()).collect());
    c.begin(BeginRequest { agent: "a".into(), may_touch, lease: None }, Timestamp(0)).unwrap().tx
}

fn waiting(c: &mut Core, t: TxId, scope: &str) -> Decision {
    c.record_effect(t, decl(c, scope), Timestamp(0)).unwrap();
    c.seal(t, Timestamp(0)).unwrap();
    c.request_commit(t).unwrap();
    c.try_commit(t, Timestamp(0)).unwrap()
}

#[test]
fn a_waiting_commit_names_the_earlier_overlapping_transaction_and_the_scope() {
    let mut c = Core::new(CoreConfig::default());
    let early = begin(&mut c, Some(&["travel:hotel"]));
    let unrelated = begin(&mut c, Some(&["travel:flight:F1"]));
    let late = begin(&mut c, Some(&["travel:hotel:H1"]));
    assert!(matches!(waiting(&mut c, late, "travel:hotel:H1"), Decision::Wait));
    let w = c.waits_for(late).unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].tx, early);
    assert_eq!(w[0].cause, WaitCause::Overlap);
    assert_eq!(w[0].state, TxState::Open);
    assert_eq!(w[0].scope.as_ref().unwrap().to_string(), "travel:hotel:H1");
    assert_eq!(w[0].theirs.as_ref().unwrap().to_string(), "travel:hotel");
    assert!(c.waits_for(early).unwrap().is_empty(), "the earliest waits for nothing");
    assert!(c.waits_for(unrelated).unwrap().is_empty(), "a disjoint scope waits for nothing");

    // Once the earlier one finishes, the answer is empty and the commit decides.
    c.abort(early, AbortReason::Explicit { reason: "done".into() }).unwrap();
    assert_eq!(c.waits_for(late).unwrap()[0].state, TxState::Aborting, "an aborting one still blocks");
    c.finish_abort(early).unwrap();
    assert!(c.waits_for(late).unwrap().is_empty());
    assert!(matches!(c.try_commit(late, Timestamp(0)).unwrap(), Decision::Commit(_)));
    assert!(c.waits_for(late).unwrap().is_empty(), "a decided commit waits for nothing");
}

#[test]
fn an_earlier_open_transaction_without_may_touch_blocks_every_scope_until_it_seals() {
    let mut c = Core::new(CoreConfig::default());
    let undeclared = begin(&mut c, None);
    let late = begin(&mut c, Some(&["retail:order:W1"]));
    assert!(matches!(waiting(&mut c, late, "retail:order:W1"), Decision::Wait));
    let w = c.waits_for(late).unwrap();
    assert_eq!((w.len(), w[0].tx, w[0].cause), (1, undeclared, WaitCause::Undeclared), "{w:?}");
    assert_eq!((w[0].scope.clone(), w[0].theirs.clone()), (None, None));
    // Sealed on another scope, it no longer blocks.
    c.record_effect(undeclared, decl(&c, "retail:order:W2"), Timestamp(0)).unwrap();
    c.seal(undeclared, Timestamp(0)).unwrap();
    assert!(c.waits_for(late).unwrap().is_empty());
    assert!(matches!(c.try_commit(late, Timestamp(0)).unwrap(), Decision::Commit(_)));
}

#[test]
fn several_blockers_come_oldest_first_and_agree_with_the_decision_throughout() {
    let mut c = Core::new(CoreConfig::default());
    let a = begin(&mut c, Some(&["db:t:1"]));
    let b = begin(&mut c, Some(&["db:t"]));
    let late = begin(&mut c, Some(&["db:t:1"]));
    assert!(matches!(waiting(&mut c, late, "db:t:1"), Decision::Wait));
    let ids: Vec<TxId> = c.waits_for(late).unwrap().iter().map(|w| w.tx).collect();
    assert_eq!(ids, vec![a, b]);
    for blocker in [b, a] {
        c.abort(blocker, AbortReason::Explicit { reason: "x".into() }).unwrap();
        c.finish_abort(blocker).unwrap();
        let left = c.waits_for(late).unwrap();
        let decision = c.try_commit(late, Timestamp(0)).unwrap();
        assert_eq!(left.is_empty(), !matches!(decision, Decision::Wait), "{left:?} vs {decision:?}");
    }
    assert_eq!(c.state(late).unwrap(), TxState::Committing);
}

#[test]
fn first_committer_wins_never_waits_for_unfinished_work() {
    let cfg = CoreConfig { ordering: Ordering::FirstCommitterWins, ..CoreConfig::default() };
    let mut c = Core::new(cfg);
    let _early = begin(&mut c, Some(&["db:t:1"]));
    let late = begin(&mut c, Some(&["db:t:1"]));
    assert!(matches!(waiting(&mut c, late, "db:t:1"), Decision::Commit(_)));
    assert!(c.waits_for(late).unwrap().is_empty());
}

#[test]
fn unknown_and_settled_ids_are_errors() {
    let mut c = Core::new(CoreConfig::default());
    assert!(c.waits_for(TxId(7)).is_err());
    let t = begin(&mut c, Some(&["db:t:1"]));
    c.abort(t, AbortReason::Explicit { reason: "x".into() }).unwrap();
    c.finish_abort(t).unwrap();
    assert!(c.waits_for(t).is_err());
}
