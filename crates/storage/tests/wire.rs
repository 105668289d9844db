//! The record format (`tidegate_storage::wire`): golden bytes for every event kind, class,
//! disposition, tag and abort reason (the exact text format version 2 stores, unchanged in 3), and
//! round trips.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::sync::Arc;

use serde_json::json;
use tidegate_core::{
    AbortReason, Disposition, EffectClass, EffectId, Epoch, Event, GroupId, Tag, Timestamp, TxId, Version,
};
use tidegate_storage::wire;

fn samples() -> Vec<Event> {
    let t = TxId(7);
    let mut v = vec![
        Event::Begin {
            tx: t,
            epoch: Epoch(3),
            agent: "ana".into(),
            group: Some(GroupId(2)),
            may_touch: Some(vec!["travel:hotel:T1".into()]),
            lease_until: Timestamp(30_000_000_000),
        },
        Event::Begin {
            tx: t,
            epoch: Epoch(3),
            agent: "b\"o\\b".into(),
            group: None,
            may_touch: None,
            lease_until: Timestamp(1),
        },
        Event::Read { tx: t, scope: "fs:/a/b".into(), version: Version(4) },
        Event::EffectExecuted { tx: t, effect: EffectId(1), output: Arc::new(json!({"k": [1, 2.5, null, "ü"]})) },
        Event::EffectFailed { tx: t, effect: EffectId(1), error: "down\nhard".into(), unknown: true },
        Event::Sealed { tx: t },
        Event::Decided { tx: t, commit: true, stamp: Some(9), reason: None, at: None },
        Event::ReleaseStarted { tx: t, effect: EffectId(0) },
        Event::Released {
            tx: t,
            effect: EffectId(0),
            output: Some(Arc::new(json!("sent"))),
            error: None,
            unknown: false,
        },
        Event::Released { tx: t, effect: EffectId(0), output: None, error: Some("timeout".into()), unknown: true },
        Event::Compensated { tx: t, effect: EffectId(2), residue: Some("fee 3".into()), error: None },
        Event::Compensated { tx: t, effect: EffectId(2), residue: None, error: Some("refused".into()) },
        Event::ToolChanged { tool: "book".into(), version: 5, present: false },
    ];
    for (i, class) in [
        EffectClass::Reversible,
        EffectClass::ReversibleWithCost,
        EffectClass::Bufferable,
        EffectClass::Gated,
        EffectClass::Idempotent,
    ]
    .into_iter()
    .enumerate()
    {
        v.push(Event::EffectRecorded {
            tx: t,
            effect: EffectId(i as u32),
            tool: "book".into(),
            class,
            scopes: vec!["travel:hotel:T1".into(), "mail:a@b".into()],
            key: "k-1".into(),
            args: Arc::new(json!({"trip": "T1"})),
            compensable: i % 2 == 0,
            adapter_key: i == 4,
            compensation: None,
        });
    }
    let reasons = [
        AbortReason::ToolFailed { tool: "x".into(), message: "m".into() },
        AbortReason::ReleaseFailed { tool: "x".into(), message: "m".into() },
        AbortReason::Vetoed { hook: "h".into(), reason: "r".into() },
        AbortReason::LostBranch { winner: TxId(8) },
        AbortReason::StaleRead { scope: "s:a".into(), read: 1, current: 2 },
        AbortReason::LeaseExpired,
        AbortReason::WaitTimeout,
        AbortReason::ProtocolViolation { what: "w".into() },
        AbortReason::Explicit { reason: "r".into() },
        AbortReason::WriteConflict { scope: "s:a".into(), snapshot: 3, current: 4 },
        AbortReason::LockConflict { scope: "s:a".into() },
        AbortReason::CascadingAbort { predecessor: TxId(6) },
        AbortReason::PhantomTool { tool: "t".into(), pinned: 1, current: Some(2) },
        AbortReason::PhantomTool { tool: "t".into(), pinned: 1, current: None },
    ];
    for r in reasons {
        v.push(Event::Decided { tx: t, commit: false, stamp: None, reason: Some(r), at: None });
    }
    let dispositions = [
        Disposition::Accepted,
        Disposition::Applied,
        Disposition::Fired,
        Disposition::Discarded,
        Disposition::Compensated,
        Disposition::CompensationFailed,
        Disposition::NotCompensable,
        Disposition::ReleaseFailed,
        Disposition::NotReleased,
        Disposition::Unknown,
        Disposition::Replayed,
    ];
    let tags = [Tag::Clean, Tag::Leaked, Tag::Unresolved, Tag::PartialCommit];
    v.push(Event::Settled {
        tx: t,
        committed: true,
        effects: dispositions.into_iter().enumerate().map(|(i, d)| (EffectId(i as u32), d, tags[i % 4])).collect(),
    });
    v
}

const GOLDEN: &str = include_str!("data/golden-records-v2.jsonl");

/// Every sample encodes to exactly the bytes format version 2 stores (written by the build
/// before the record types were split from the engine's `Event`, whose serde form they were),
/// and decodes back to the same event.
#[test]
fn every_event_kind_encodes_to_the_golden_bytes_and_back() {
    let golden: Vec<&str> = GOLDEN.lines().collect();
    let samples = samples();
    assert_eq!(golden.len(), samples.len());
    for (event, want) in samples.iter().zip(golden) {
        assert_eq!(wire::encode(0, event).unwrap(), want);
        assert_eq!(&wire::decode(want).unwrap(), event, "{want}");
        assert_eq!(wire::to_value(event).unwrap(), serde_json::from_str::<serde_json::Value>(want).unwrap());
    }
}

/// Rule for adding fields: a record without an optional field reads it as absent, and a record
/// with a field this build does not know still reads.
#[test]
fn optional_fields_may_be_absent_and_unknown_fields_are_ignored() {
    let old = r#"{"event":"effect_recorded","tx":1,"effect":0,"tool":"t","class":"gated","scopes":[],"key":"k","args":null,"compensable":false}"#;
    match wire::decode(old).unwrap() {
        Event::EffectRecorded { adapter_key, .. } => assert!(!adapter_key),
        other => panic!("{other:?}"),
    }
    let newer = r#"{"event":"sealed","tx":1,"added_later":{"x":1}}"#;
    assert_eq!(wire::decode(newer).unwrap(), Event::Sealed { tx: TxId(1) });
}

#[test]
fn undecodable_records_say_what_is_wrong() {
    for (text, says) in [
        (r#"{"event":"sealed"}"#, "missing field `tx`"),
        (r#"{"event":"teleported","tx":1}"#, "unknown variant `teleported`"),
        (r#"{"event":"read","tx":-1,"scope":"a","version":0}"#, "invalid value"),
        ("not json", "expected"),
    ] {
        let err = wire::decode(text).unwrap_err();
        assert!(err.contains(says) && err.contains("does not decode"), "{text}: {err}");
    }
}

/// `tool_unavailable` is stored as a `tool_failed` record with the optional `unavailable` flag
/// (a field added within format 2): it round-trips, and a reader that ignores the flag still
/// reads a plain `tool_failed`.
#[test]
fn tool_unavailable_is_a_tool_failed_record_with_an_optional_flag() {
    let event = Event::Decided {
        tx: TxId(3),
        commit: false,
        stamp: None,
        reason: Some(AbortReason::ToolUnavailable { tool: "x".into(), message: "m".into() }),
        at: None,
    };
    let text = wire::encode(0, &event).unwrap();
    assert!(text.contains(r#""kind":"tool_failed""#) && text.contains(r#""unavailable":true"#), "{text}");
    assert_eq!(wire::decode(&text).unwrap(), event);
    let old_reader = text.replace(r#","unavailable":true"#, "");
    match wire::decode(&old_reader).unwrap() {
        Event::Decided { reason: Some(AbortReason::ToolFailed { .. }), .. } => {}
        other => panic!("{other:?}"),
    }
}

/// Format 3 adds one event kind, `extension`, and moves none of format 2's bytes (the golden
/// file above is format 2's): its record is the stream name and the body (the JSON value as it
/// serialises), and it belongs to no transaction.
#[test]
fn an_extension_record_of_format_3_has_fixed_bytes_and_round_trips() {
    let event = Event::Extension { stream: "review".into(), body: Arc::new(json!({"v": 1, "record": ["ü", 2.5]})) };
    let text = wire::encode(0, &event).unwrap();
    assert_eq!(text, r#"{"event":"extension","stream":"review","body":{"record":["ü",2.5],"v":1}}"#);
    assert_eq!(wire::decode(&text).unwrap(), event);
    assert_eq!(event.tx(), TxId(0));
    let err = wire::decode(r#"{"event":"extension","body":1}"#).unwrap_err();
    assert!(err.contains("missing field `stream`"), "{err}");
}

/// Within format 3, `effect_recorded` gained the optional `compensation` (a plan's durable
/// compensation descriptor, docs/plans.md): written last and only when present, so every
/// record without one keeps its bytes (the golden file above), and an older record reads as
/// an effect without a descriptor.
#[test]
fn a_compensation_descriptor_rides_the_effect_record_and_old_records_read_without_one() {
    let event = Event::EffectRecorded {
        tx: TxId(4),
        effect: EffectId(1),
        tool: "book".into(),
        class: EffectClass::Reversible,
        scopes: vec!["travel:hotel:T1".into()],
        key: "k-9".into(),
        args: Arc::new(json!({"trip": "T1"})),
        compensable: true,
        adapter_key: true,
        compensation: Some(Arc::new(json!({"capability": "cancel", "args": {"id": {"$output": "/id"}}}))),
    };
    let text = wire::encode(0, &event).unwrap();
    assert_eq!(
        text,
        r#"{"event":"effect_recorded","tx":4,"effect":1,"tool":"book","class":"reversible","scopes":["travel:hotel:T1"],"key":"k-9","args":{"trip":"T1"},"compensable":true,"adapter_key":true,"compensation":{"args":{"id":{"$output":"/id"}},"capability":"cancel"}}"#
    );
    assert_eq!(wire::decode(&text).unwrap(), event);
    let old = text.replace(r#","compensation":{"args":{"id":{"$output":"/id"}},"capability":"cancel"}"#, "");
    match wire::decode(&old).unwrap() {
        Event::EffectRecorded { compensation, key, .. } => {
            assert_eq!(compensation, None);
            assert_eq!(&*key, "k-9");
        }
        other => panic!("{other:?}"),
    }
}

/// Within format 3, a commit's `decided` gained the optional `at` (the decision's time on the
/// engine clock, which the plan executor's `no_commit` predicates read after a rebuild):
/// written last and only when known, so records without it keep their bytes (the golden file
/// above), and an older record reads as a decision of unknown time.
#[test]
fn a_commit_decision_carries_its_time_and_old_records_read_without_one() {
    let event =
        Event::Decided { tx: TxId(5), commit: true, stamp: Some(12), reason: None, at: Some(Timestamp(7_000_000)) };
    let text = wire::encode(0, &event).unwrap();
    assert_eq!(text, r#"{"event":"decided","tx":5,"commit":true,"stamp":12,"at":7000000}"#);
    assert_eq!(wire::decode(&text).unwrap(), event);
    match wire::decode(r#"{"event":"decided","tx":5,"commit":true,"stamp":12}"#).unwrap() {
        Event::Decided { at, stamp, .. } => assert_eq!((at, stamp), (None, Some(12))),
        other => panic!("{other:?}"),
    }
    let err = wire::decode(r#"{"event":"decided","tx":5,"commit":true,"at":"noon"}"#).unwrap_err();
    assert!(err.contains("does not decode"), "{err}");
}
