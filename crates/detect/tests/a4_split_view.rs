//! A4 split view: the detector against the pairwise predicate, and near misses.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::{CheckOptions, detectors::a4::split_view};

type Side = (u64, u32);

fn brute(records: &[Value]) -> Vec<(Side, Side)> {
    let mut reads = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if aborted(r) {
            continue;
        }
        for (k, e) in read_entries(r).unwrap_or_default().into_iter().enumerate() {
            reads.push(((i as u64 + 1, k as u32), e));
        }
    }
    let mut out = Vec::new();
    for (x, (sx, ex)) in reads.iter().enumerate() {
        for (sy, ey) in &reads[x + 1..] {
            let (cx, vx, tx, rx) = ex;
            let (cy, vy, ty, ry) = ey;
            let known = vx.is_some() && vy.is_some() && tx.is_some() && rx.is_some() && ry.is_some();
            if known && cx == cy && tx == ty && rx != ry && vx != vy {
                out.push((*sx, *sy));
            }
        }
    }
    out.sort();
    out
}

fn detected(records: &[Value], limit: Option<usize>) -> (Vec<(Side, Side)>, u64) {
    let trace = read(records);
    let d = split_view(&trace, &CheckOptions { witness_limit: limit, ..Default::default() });
    let mut got: Vec<(Side, Side)> = d
        .witnesses
        .iter()
        .map(|w| {
            ((trace.record(w.first.record).line, w.first.entry), (trace.record(w.second.record).line, w.second.entry))
        })
        .collect();
    got.sort();
    (got, d.count)
}

#[test]
fn detector_matches_the_split_view_predicate_on_random_traces() {
    let mut found = 0;
    for_seeds(7, 1500, |seed| {
        let records = trace(&mut Rng(seed), 8, 10);
        let expected = brute(&records);
        found += expected.len();
        let (got, count) = detected(&records, None);
        assert_eq!(count, expected.len() as u64, "records: {}", jsonl(&records));
        assert_eq!(got, expected, "records: {}", jsonl(&records));
    });
    assert!(found > 300, "the random traces should exercise the predicate ({found} witnesses)");
}

#[test]
fn counts_stay_exact_when_the_witness_list_is_limited() {
    for_seeds(8, 1000, |seed| {
        let records = trace(&mut Rng(seed), 10, 5);
        let expected = brute(&records);
        let (got, count) = detected(&records, Some(2));
        assert_eq!(count, expected.len() as u64, "records: {}", jsonl(&records));
        assert_eq!(got.len(), expected.len().min(2));
    });
}

fn reader(replica: &str, value: Value, time: u64) -> Value {
    json!({"reads": [{"cell": "c", "value": value, "replica": replica}], "read_time": time})
}

fn count(records: &[Value]) -> u64 {
    split_view(&read(records), &CheckOptions::default()).count
}

#[test]
fn lagging_secondary_disagreeing_with_the_primary_at_one_time_is_a_witness() {
    // The paper's witness: the secondary serves NULL while the primary serves 10.
    assert_eq!(count(&[reader("primary", json!(10), 1), reader("secondary", Value::Null, 1)]), 1);
}

#[test]
fn one_record_can_see_both_sides() {
    let r = json!({"reads": [{"cell": "c", "value": 1, "replica": "p"}, {"cell": "c", "value": 2, "replica": "s"}], "read_time": 0});
    assert_eq!(count(&[r]), 1);
}

#[test]
fn same_replica_equal_values_or_different_times_are_not_split_views() {
    assert_eq!(count(&[reader("p", json!(1), 1), reader("p", json!(2), 1)]), 0);
    assert_eq!(count(&[reader("p", json!(1), 1), reader("s", json!(1), 1)]), 0);
    assert_eq!(count(&[reader("p", json!(1), 1), reader("s", json!(2), 2)]), 0);
}

#[test]
fn reads_without_a_replica_are_skipped() {
    let unknown = json!({"reads": [{"cell": "c", "value": 2}], "read_time": 1});
    let d = split_view(&read(&[reader("p", json!(1), 1), unknown]), &CheckOptions::default());
    assert_eq!((d.count, d.skipped), (0, 1));
}

#[test]
fn record_level_replica_applies_to_its_reads() {
    let r = json!({"replica": "s", "reads": [{"cell": "c", "value": 2}], "read_time": 1});
    assert_eq!(count(&[reader("p", json!(1), 1), r]), 1);
}
