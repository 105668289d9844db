//! A2 phantom tool: the detector against Definition 2 (plus the signature check of §4.16),
//! and hand-written witnesses with their near misses.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::{CheckOptions, ToolChange, detectors::a2::phantom_tool};

type Key = (u64, String, String);

fn brute(records: &[Value]) -> Vec<Key> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if aborted(r) {
            continue;
        }
        let (Some(plan), Some(at_read), Some(at_commit)) = (
            tool_entries(r, "planned_tools"),
            tool_entries(r, "registry_at_read"),
            tool_entries(r, "registry_at_commit"),
        ) else {
            continue;
        };
        let mut seen: Vec<&String> = Vec::new();
        for (name, _) in &plan {
            if seen.contains(&name) {
                continue;
            }
            seen.push(name);
            let Some((_, sig_read)) = at_read.iter().find(|(n, _)| n == name) else { continue };
            match at_commit.iter().find(|(n, _)| n == name) {
                None => out.push((i as u64 + 1, name.clone(), "removed".to_owned())),
                Some((_, sig_commit)) => {
                    if let (Some(a), Some(b)) = (sig_read, sig_commit)
                        && a != b
                    {
                        out.push((i as u64 + 1, name.clone(), format!("{a}->{b}")));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

fn detected(records: &[Value]) -> Vec<Key> {
    let trace = read(records);
    let mut out: Vec<Key> = phantom_tool(&trace, &CheckOptions::default())
        .witnesses
        .iter()
        .map(|w| {
            let change = match w.change {
                ToolChange::Removed => "removed".to_owned(),
                ToolChange::SignatureChanged { at_read, at_commit } => {
                    format!("{}->{}", trace.value_json(at_read), trace.value_json(at_commit))
                }
            };
            (trace.record(w.record).line, trace.tool_name(w.tool).to_owned(), change)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn detector_matches_definition_2_on_random_traces() {
    let mut found = 0;
    for_seeds(3, 1500, |seed| {
        let records = trace(&mut Rng(seed), 6, 10);
        let expected = brute(&records);
        found += expected.len();
        assert_eq!(detected(&records), expected, "records: {}", jsonl(&records));
    });
    assert!(found > 300, "the random traces should exercise the predicate ({found} witnesses)");
}

fn op(planned: Value, at_read: Value, at_commit: Value) -> Value {
    json!({"planned_tools": planned, "registry_at_read": at_read, "registry_at_commit": at_commit})
}

fn count(records: &[Value]) -> u64 {
    phantom_tool(&read(records), &CheckOptions::default()).count
}

#[test]
fn planned_tool_removed_during_generation_is_a_witness() {
    // The paper's witness: registry {t1, t2} at read, t1 planned, {t2} at commit.
    assert_eq!(count(&[op(json!(["t1"]), json!(["t1", "t2"]), json!(["t2"]))]), 1);
}

#[test]
fn changed_signature_of_a_pinned_tool_is_a_witness() {
    let records = [op(
        json!(["book"]),
        json!([{"name": "book", "signature": "(date)"}]),
        json!([{"name": "book", "signature": "(date, seat)"}]),
    )];
    let trace = read(&records);
    let d = phantom_tool(&trace, &CheckOptions::default());
    assert_eq!(d.count, 1);
    assert!(matches!(d.witnesses[0].change, ToolChange::SignatureChanged { .. }));
}

#[test]
fn tool_still_present_unchanged_or_never_visible_is_not_a_witness() {
    assert_eq!(count(&[op(json!(["t1"]), json!(["t1"]), json!(["t1", "t9"]))]), 0);
    // Not in the registry at read time: Definition 2 requires it there.
    assert_eq!(count(&[op(json!(["t1"]), json!(["t2"]), json!([]))]), 0);
    // A signature recorded on one side only is not a change.
    assert_eq!(count(&[op(json!(["t"]), json!([{"name": "t", "signature": 1}]), json!(["t"]))]), 0);
}

#[test]
fn no_planned_tool_means_no_phantom() {
    assert_eq!(count(&[op(json!([]), json!(["t1"]), json!([]))]), 0);
    let reference = json!({"planned_tool": null, "tools_visible_at_read": ["t1"], "tools_used": []});
    assert_eq!(count(&[reference]), 0);
}

#[test]
fn a_tool_planned_twice_is_one_witness() {
    assert_eq!(count(&[op(json!(["t1", "t1"]), json!(["t1"]), json!([]))]), 1);
}

#[test]
fn aborted_operations_dispatch_nothing() {
    let mut r = op(json!(["t1"]), json!(["t1"]), json!([]));
    r["aborted"] = json!(true);
    assert_eq!(count(std::slice::from_ref(&r)), 0);
    let literal = CheckOptions { include_aborted: true, ..Default::default() };
    assert_eq!(phantom_tool(&read(&[r]), &literal).count, 1);
}

#[test]
fn unknown_registry_skips_the_record() {
    let d =
        phantom_tool(&read(&[json!({"planned_tools": ["t1"], "registry_at_read": ["t1"]})]), &CheckOptions::default());
    assert_eq!((d.count, d.skipped), (0, 1));
}

#[test]
fn large_registries_give_the_same_answer_as_small_ones() {
    let registry: Vec<String> = (0..300).map(|k| format!("tool{k}")).collect();
    let mut after = registry.clone();
    after.retain(|t| t != "tool7" && t != "tool250");
    let planned: Vec<String> = (0..40).map(|k| format!("tool{}", k * 7)).collect();
    let d = phantom_tool(&read(&[op(json!(planned), json!(registry), json!(after))]), &CheckOptions::default());
    assert_eq!(d.count, 1, "only tool7 is planned and removed");
}
