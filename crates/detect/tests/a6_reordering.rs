//! A6 tool-effect reordering: the detector against Definition 4, and near misses.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::{CheckOptions, detectors::a6::reordering};

/// Whether `co` is a permutation of `io`, by striking out matches one at a time.
fn is_permutation(io: &[(String, Option<Value>)], co: &[(String, Option<Value>)]) -> bool {
    let mut left: Vec<&(String, Option<Value>)> = io.iter().collect();
    for e in co {
        match left.iter().position(|x| *x == e) {
            Some(i) => {
                left.remove(i);
            }
            None => return false,
        }
    }
    left.is_empty()
}

fn brute(records: &[Value]) -> Vec<u64> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if aborted(r) {
            continue;
        }
        let (Some(io), Some(co)) = (effect_list(r, "io"), effect_list(r, "co")) else { continue };
        if io.iter().chain(&co).any(|(_, v)| v.is_none()) {
            continue;
        }
        if io.len() >= 2 && co != io && is_permutation(&io, &co) {
            out.push(i as u64 + 1);
        }
    }
    out
}

fn detected(records: &[Value]) -> Vec<u64> {
    let trace = read(records);
    reordering(&trace, &CheckOptions::default()).witnesses.iter().map(|w| trace.record(w.record).line).collect()
}

#[test]
fn detector_matches_definition_4_on_random_traces() {
    let mut found = 0;
    for_seeds(4, 1500, |seed| {
        let records = trace(&mut Rng(seed), 6, 10);
        let expected = brute(&records);
        found += expected.len();
        assert_eq!(detected(&records), expected, "records: {}", jsonl(&records));
    });
    assert!(found > 300, "the random traces should exercise the predicate ({found} witnesses)");
}

fn count(io: Value, co: Value) -> u64 {
    reordering(&read(&[json!({"io": io, "co": co})]), &CheckOptions::default()).count
}

#[test]
fn reversed_commit_of_two_effects_is_a_witness() {
    // The paper's witness: io = <(c1,v1),(c2,v1)>, co = <(c2,v1),(c1,v1)>.
    assert_eq!(count(json!([["c1", "v1"], ["c2", "v1"]]), json!([["c2", "v1"], ["c1", "v1"]])), 1);
}

#[test]
fn first_difference_points_at_the_first_reordered_effect() {
    let trace = read(&[json!({"io": [["a", 1], ["b", 2], ["c", 3]], "co": [["a", 1], ["c", 3], ["b", 2]]})]);
    assert_eq!(reordering(&trace, &CheckOptions::default()).witnesses[0].first_difference, 1);
}

#[test]
fn single_effect_or_same_order_is_not_reordering() {
    assert_eq!(count(json!([["c1", 1]]), json!([["c1", 1]])), 0);
    assert_eq!(count(json!([["c1", 1], ["c2", 1]]), json!([["c1", 1], ["c2", 1]])), 0);
}

#[test]
fn commit_order_that_is_not_a_permutation_is_not_reordering() {
    // Missing, extra, or changed effects are other failures, not Definition 4.
    assert_eq!(count(json!([["c1", 1], ["c2", 1]]), json!([["c2", 1]])), 0);
    assert_eq!(count(json!([["c1", 1], ["c2", 1]]), json!([["c2", 1], ["c1", 2]])), 0);
    assert_eq!(count(json!([["c1", 1], ["c1", 1], ["c2", 1]]), json!([["c2", 1], ["c2", 1], ["c1", 1]])), 0);
}

#[test]
fn duplicate_effects_are_a_multiset() {
    assert_eq!(count(json!([["c", 1], ["c", 1], ["d", 2]]), json!([["c", 1], ["d", 2], ["c", 1]])), 1);
}

#[test]
fn aborted_records_and_unknown_orders_are_not_witnesses() {
    let aborted = json!({"aborted": true, "io": [["a", 1], ["b", 1]], "co": [["b", 1], ["a", 1]]});
    assert_eq!(reordering(&read(&[aborted]), &CheckOptions::default()).count, 0);
    let d = reordering(&read(&[json!({"io": [["a", 1], ["b", 1]]})]), &CheckOptions::default());
    assert_eq!((d.count, d.skipped), (0, 1));
}
