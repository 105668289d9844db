//! The failure rule (docs/engine.md, "Failures"): only an explicit "did not happen" counts as
//! such; every other failure is an unknown outcome that is probed, never re-executed blind,
//! and never tagged `clean`. Regression tests for issue 10 items 4, 8 and 9, on every path
//! (eager call, release at commit, compensation).
#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tidegate_runtime::{
    AbortReason, Ack, Compensation, Disposition, EffectClass, Error, Outcome, Probe, Tag, Tidegate, Tool, ToolError,
};

/// What one invocation of the scripted tool does.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Takes effect and returns its output.
    Ok,
    /// Fails this way without taking effect.
    FailBefore(Kind),
    /// Takes effect, then fails this way (the F2 fault: the reply is lost).
    FailAfter(Kind),
    /// Takes effect, then the handler panics.
    PanicAfter,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// `ToolError::failed`.
    Refused,
    /// `ToolError::transient`.
    Transient,
    /// `ToolError::unknown`.
    Unknown,
    /// A plain error (`"...".into()`), as an adapter that does not classify produces.
    Plain,
}

impl Kind {
    fn error(self, msg: &str) -> ToolError {
        match self {
            Kind::Refused => ToolError::failed(msg),
            Kind::Transient => ToolError::transient(msg),
            Kind::Unknown => ToolError::unknown(msg),
            Kind::Plain => msg.into(),
        }
    }
}

/// A provider that counts what reached it; its tool follows a script of steps (then `Ok`).
#[derive(Default)]
struct Provider {
    script: Mutex<VecDeque<Step>>,
    invocations: Mutex<u32>,
    applied: Mutex<Vec<String>>,
    undone: Mutex<Vec<String>>,
    probes: Mutex<u32>,
}

impl Provider {
    fn new(script: impl IntoIterator<Item = Step>) -> Arc<Provider> {
        Arc::new(Provider { script: Mutex::new(script.into_iter().collect()), ..Provider::default() })
    }

    fn applied(&self) -> usize {
        self.applied.lock().len()
    }

    fn undone(&self) -> usize {
        self.undone.lock().len()
    }

    fn invocations(&self) -> u32 {
        *self.invocations.lock()
    }

    fn tool(self: &Arc<Self>, class: EffectClass, compensable: bool, probe: bool) -> Tool {
        let (p1, p2, p3) = (self.clone(), self.clone(), self.clone());
        let mut b = Tool::builder("subject", class).scope(|a: &Value| format!("retail:order:{}", a["id"])).call(
            move |a: Arc<Value>| {
                let p = p1.clone();
                async move {
                    *p.invocations.lock() += 1;
                    let step = p.script.lock().pop_front().unwrap_or(Step::Ok);
                    let id = a["id"].to_string();
                    match step {
                        Step::FailBefore(k) => return Err(k.error("connection refused")),
                        Step::Ok | Step::FailAfter(_) | Step::PanicAfter => p.applied.lock().push(id.clone()),
                    }
                    match step {
                        Step::FailAfter(k) => Err(k.error("timed out waiting for the reply")),
                        Step::PanicAfter => panic!("the adapter crashed after the provider acted"),
                        _ => Ok(json!({"done": id})),
                    }
                }
            },
        );
        if compensable {
            b = b.compensate(move |a: Arc<Value>, _out| {
                let p = p2.clone();
                async move {
                    let id = a["id"].to_string();
                    // Undoing something that did not happen is a no-op, as the contract asks.
                    p.applied.lock().retain(|x| *x != id);
                    p.undone.lock().push(id);
                    Ok(Compensation::clean())
                }
            });
        } else if class == EffectClass::Reversible {
            // Leaves aborted effects `unresolved` on purpose: what the tests look at.
            b = b.without_compensation();
        }
        if probe {
            b = b.probe(move |a: Arc<Value>| {
                let p = p3.clone();
                async move {
                    *p.probes.lock() += 1;
                    let id = a["id"].to_string();
                    if p.applied.lock().contains(&id) {
                        Probe::Happened(json!({"done": id, "probed": true}))
                    } else {
                        Probe::DidNotHappen
                    }
                }
            });
        }
        b.build().unwrap()
    }
}

fn aborted(e: Error) -> Outcome {
    match e {
        Error::Aborted(o) => *o,
        other => panic!("expected an abort, got {other}"),
    }
}

fn engine() -> Tidegate {
    Tidegate::in_memory().unwrap()
}

/// Issue 10 item 8: a plain error after the effect took the call as "did not happen": no
/// compensation, tagged `clean`, a wrong world reported clean.
#[tokio::test(start_paused = true)]
async fn ordinary_error_after_effect_is_never_clean() {
    for kind in [Kind::Plain, Kind::Unknown] {
        // With a compensation: the abort undoes it blind and still tags it unresolved.
        let (tg, p) = (engine(), Provider::new([Step::FailAfter(kind)]));
        let tool = p.tool(EffectClass::Reversible, true, false);
        let tx = tg.begin("a").unwrap();
        let out = aborted(tx.call(&tool, json!({"id": "W1"})).await.unwrap_err());
        assert!(!out.is_clean(), "{kind:?}: {out:?}");
        assert_eq!(
            (out.effects[0].disposition.clone(), out.effects[0].tag),
            (Disposition::Compensated, Tag::Unresolved)
        );
        assert!(out.effects[0].detail.as_deref().unwrap().contains("outcome was unknown"), "{out:?}");
        assert!(matches!(&out.reason, Some(AbortReason::ToolFailed { message, .. }) if message.contains("timed out")));
        assert_eq!((p.invocations(), p.undone(), p.applied()), (1, 1, 0), "{kind:?}: called once, undone once");
        tg.check_integrity().unwrap();

        // Without one: unknown, unresolved.
        let (tg, p) = (engine(), Provider::new([Step::FailAfter(kind)]));
        let tool = p.tool(EffectClass::Reversible, false, false);
        let tx = tg.begin("a").unwrap();
        let out = aborted(tx.call(&tool, json!({"id": "W1"})).await.unwrap_err());
        assert_eq!((out.effects[0].disposition.clone(), out.effects[0].tag), (Disposition::Unknown, Tag::Unresolved));
        assert_eq!(p.invocations(), 1);
        tg.check_integrity().unwrap();
    }
}

/// With a probe, an ordinary error after the effect is resolved: the call happened, its
/// output is the probe's, and the transaction goes on.
#[tokio::test(start_paused = true)]
async fn ordinary_error_after_effect_is_resolved_by_the_probe() {
    let (tg, p) = (engine(), Provider::new([Step::FailAfter(Kind::Plain)]));
    let tool = p.tool(EffectClass::Reversible, true, true);
    let tx = tg.begin("a").unwrap();
    let ack = tx.call(&tool, json!({"id": "W1"})).await.unwrap();
    assert_eq!(ack.output().unwrap()["probed"], true);
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.committed && out.is_clean());
    assert_eq!((p.invocations(), p.applied()), (1, 1));
}

/// Issue 10 item 4: an unknown outcome was called again (the provider applied it three times).
#[tokio::test(start_paused = true)]
async fn outcome_unknown_is_never_retried_without_probe() {
    let (tg, p) = (engine(), Provider::new([Step::FailAfter(Kind::Unknown), Step::FailAfter(Kind::Unknown)]));
    let tool = p.tool(EffectClass::Idempotent, false, false);
    let tx = tg.begin("a").unwrap();
    let out = aborted(tx.call(&tool, json!({"id": "W1"})).await.unwrap_err());
    assert_eq!(p.invocations(), 1, "an unknown outcome must not be re-executed without a probe");
    assert_eq!(out.effects[0].tag, Tag::Unresolved);
    assert!(!out.reason.as_ref().unwrap().retryable());
}

/// Issue 10 item 9: a probe answering "did not happen" aborted the transaction non-retryably;
/// the call is retried in place under the policy instead.
#[tokio::test(start_paused = true)]
async fn probe_did_not_happen_retries_in_place() {
    let (tg, p) = (engine(), Provider::new([Step::FailBefore(Kind::Plain)]));
    let tool = p.tool(EffectClass::Reversible, true, true);
    let tx = tg.begin("a").unwrap();
    let ack = tx.call(&tool, json!({"id": "W1"})).await.unwrap();
    assert!(matches!(ack, Ack::Executed { .. }), "{ack:?}");
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().is_clean());
    assert_eq!((p.invocations(), p.applied(), *p.probes.lock()), (2, 1, 1));
}

/// When the probe keeps saying "did not happen" to the last attempt, nothing left: the abort
/// is clean and retryable (`tool_unavailable`), never a non-retryable failure.
#[tokio::test(start_paused = true)]
async fn probe_did_not_happen_at_every_attempt_aborts_retryably() {
    let (tg, p) = (engine(), Provider::new([Step::FailBefore(Kind::Unknown); 10]));
    let tool = p.tool(EffectClass::Reversible, true, true);
    let tx = tg.begin("a").unwrap();
    let err = tx.call(&tool, json!({"id": "W1"})).await.unwrap_err();
    assert!(err.retryable(), "{err}");
    let out = aborted(err);
    assert!(matches!(out.reason, Some(AbortReason::ToolUnavailable { .. })), "{out:?}");
    assert!(out.is_clean(), "the probe proved nothing happened: {out:?}");
    assert_eq!((p.invocations(), p.applied(), p.undone()), (4, 0, 0), "the default policy's 4 attempts");
}

/// Issue 10 item 8, at commit: the same ordinary error during a gated release was retried, so
/// the effect fired twice and was tagged clean.
#[tokio::test(start_paused = true)]
async fn release_error_is_not_fired_twice() {
    for kind in [Kind::Plain, Kind::Unknown] {
        let (tg, p) = (engine(), Provider::new([Step::FailAfter(kind)]));
        let tool = p.tool(EffectClass::Gated, false, false);
        let tx = tg.begin("a").unwrap();
        assert!(matches!(tx.call(&tool, json!({"id": "M1"})).await.unwrap(), Ack::Queued { .. }));
        tx.seal().unwrap();
        let out = tx.commit().await.unwrap();
        assert_eq!(p.invocations(), 1, "{kind:?}: fired once, never again");
        assert_eq!((out.effects[0].disposition.clone(), out.effects[0].tag), (Disposition::Unknown, Tag::Unresolved));
        assert!(out.effects[0].detail.as_deref().unwrap().contains("timed out"), "the tool's message is kept");
        tg.check_integrity().unwrap();
    }
    // With a probe: it fired; the commit is clean.
    let (tg, p) = (engine(), Provider::new([Step::FailAfter(Kind::Plain)]));
    let tool = p.tool(EffectClass::Gated, false, true);
    let tx = tg.begin("a").unwrap();
    tx.call(&tool, json!({"id": "M1"})).await.unwrap();
    tx.seal().unwrap();
    let out = tx.commit().await.unwrap();
    assert!(out.is_clean() && p.invocations() == 1, "{out:?}");
}

/// A refused release is final and not retried (the provider said no); a transient one is.
#[tokio::test(start_paused = true)]
async fn refused_release_is_not_retried_and_transient_release_is() {
    let (tg, p) = (engine(), Provider::new([Step::FailBefore(Kind::Refused)]));
    let tool = p.tool(EffectClass::Gated, false, false);
    let tx = tg.begin("a").unwrap();
    tx.call(&tool, json!({"id": "M1"})).await.unwrap();
    tx.seal().unwrap();
    let out = aborted(tx.commit().await.unwrap_err());
    assert!(matches!(out.reason, Some(AbortReason::ReleaseFailed { .. })));
    assert_eq!(p.invocations(), 1);

    let (tg, p) = (engine(), Provider::new([Step::FailBefore(Kind::Transient); 2]));
    let tool = p.tool(EffectClass::Gated, false, false);
    let tx = tg.begin("a").unwrap();
    tx.call(&tool, json!({"id": "M1"})).await.unwrap();
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().is_clean());
    assert_eq!((p.invocations(), p.applied()), (3, 1));
}

/// A panicking handler is a failed handler with an unknown outcome: probed, not propagated.
#[tokio::test(start_paused = true)]
async fn panicking_call_is_an_unknown_outcome() {
    let (tg, p) = (engine(), Provider::new([Step::PanicAfter]));
    let tool = p.tool(EffectClass::Reversible, true, true);
    let tx = tg.begin("a").unwrap();
    let ack = tx.call(&tool, json!({"id": "W1"})).await.unwrap();
    assert_eq!(ack.output().unwrap()["probed"], true);
    // Without a probe: compensated blind, unresolved, and the engine stays live.
    let (tg, p) = (engine(), Provider::new([Step::PanicAfter]));
    let tool = p.tool(EffectClass::Reversible, true, false);
    let tx = tg.begin("a").unwrap();
    let out = aborted(tx.call(&tool, json!({"id": "W1"})).await.unwrap_err());
    assert!(matches!(&out.reason, Some(AbortReason::ToolFailed { message, .. }) if message.contains("panicked")));
    assert_eq!(out.effects[0].tag, Tag::Unresolved);
    assert_eq!(p.applied(), 0, "undone");
    let tx = tg.begin("b").unwrap();
    tx.call(&tool, json!({"id": "W2"})).await.unwrap();
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().committed);
    tg.check_integrity().unwrap();
}
