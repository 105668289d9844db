//! A1 stale generation: the detector against a brute-force reading of Definition 1, and
//! hand-written witnesses with their near misses.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::{CheckOptions, detectors::a1::stale_generation};

type Key = (u64, u64, String, String, String);

/// Definition 1, quantifier by quantifier, over the records in `history`.
fn brute(records: &[Value], include_aborted: bool) -> Vec<Key> {
    let mut out = Vec::new();
    for (i, ri) in records.iter().enumerate() {
        for (j, rj) in records.iter().enumerate() {
            if i == j || (!include_aborted && (aborted(ri) || aborted(rj))) {
                continue;
            }
            let (Some(ai), Some(aj)) = (str_field(ri, "agent"), str_field(rj, "agent")) else { continue };
            let (Some(wti), Some(wtj)) = (time(ri, "write_time"), time(rj, "write_time")) else { continue };
            if ai == aj {
                continue;
            }
            for (cell, rv, rt) in first_reads(ri).unwrap_or_default() {
                let (Some(rv), Some(rt)) = (rv, rt) else { continue };
                let Some(Some(wv)) = first_write(rj, &cell) else { continue };
                if rt < wtj && wtj < wti && rv != wv {
                    out.push((i as u64 + 1, j as u64 + 1, cell.clone(), rv.to_string(), wv.to_string()));
                }
            }
        }
    }
    out.sort();
    out
}

fn detected(records: &[Value], opts: &CheckOptions) -> Vec<Key> {
    let trace = read(records);
    let d = stale_generation(&trace, opts);
    assert_eq!(d.count, d.witnesses.len() as u64);
    let mut out: Vec<Key> = d
        .witnesses
        .iter()
        .map(|w| {
            (
                trace.record(w.reader).line,
                trace.record(w.writer).line,
                trace.cell_name(w.cell).to_owned(),
                trace.value_json(w.read_value).to_string(),
                trace.value_json(w.written_value).to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn detector_matches_definition_1_on_random_traces() {
    let mut found = 0;
    for_seeds(1, 1500, |seed| {
        let mut rng = Rng(seed);
        let records = trace(&mut rng, 8, 8);
        let include_aborted = seed % 4 == 0;
        let opts = CheckOptions { include_aborted, ..Default::default() };
        let expected = brute(&records, include_aborted);
        found += expected.len();
        assert_eq!(detected(&records, &opts), expected, "records: {}", jsonl(&records));
    });
    assert!(found > 150, "the random traces should exercise the predicate ({found} witnesses)");
}

#[test]
fn counts_stay_exact_when_the_witness_list_is_limited() {
    for_seeds(2, 1000, |seed| {
        let mut rng = Rng(seed);
        let records = trace(&mut rng, 10, 5);
        let all = brute(&records, false);
        let limit = rng.below(3) as usize;
        let d = stale_generation(&read(&records), &CheckOptions { witness_limit: Some(limit), ..Default::default() });
        assert_eq!(d.count, all.len() as u64, "records: {}", jsonl(&records));
        assert_eq!(d.witnesses.len(), all.len().min(limit));
    });
}

fn op(agent: &str, read: (&str, Value, u64), write: Option<(&str, Value)>, write_time: u64) -> Value {
    json!({
        "agent": agent,
        "reads": [{"cell": read.0, "value": read.1}],
        "read_time": read.2,
        "writes": write.map_or(json!([]), |(c, v)| json!([[c, v]])),
        "write_time": write_time,
    })
}

fn a1_count(records: &[Value]) -> u64 {
    stale_generation(&read(records), &CheckOptions::default()).count
}

#[test]
fn stale_read_overtaken_by_another_agents_write_is_a_witness() {
    // The paper's witness: a2 reads c1 = NULL at 0, a1 writes v1 at 1, a2 commits at 2.
    let records = [
        op("a2", ("c1", Value::Null, 0), Some(("c1", json!("v2"))), 2),
        op("a1", ("c0", Value::Null, 0), Some(("c1", json!("v1"))), 1),
    ];
    let trace = read(&records);
    let d = stale_generation(&trace, &CheckOptions::default());
    assert_eq!(d.witnesses.len(), 1);
    let w = d.witnesses[0];
    assert_eq!((trace.record(w.reader).line, trace.record(w.writer).line), (1, 2));
    assert_eq!(trace.cell_name(w.cell), "c1");
    assert_eq!(trace.value_json(w.read_value), Value::Null);
    assert_eq!(trace.value_json(w.written_value), json!("v1"));
}

#[test]
fn read_only_operation_committing_after_the_write_is_still_stale() {
    // The reader need not write the cell: Definition 1 only orders its commit.
    let records = [op("r", ("c", json!(0), 0), None, 3), op("w", ("d", json!(0), 0), Some(("c", json!(1))), 2)];
    assert_eq!(a1_count(&records), 1);
}

#[test]
fn every_interleaved_writer_is_a_separate_witness() {
    let records = [
        op("r", ("c", json!(0), 0), None, 9),
        op("w1", ("d", json!(0), 0), Some(("c", json!(1))), 2),
        op("w2", ("d", json!(0), 0), Some(("c", json!(2))), 3),
        op("w3", ("d", json!(0), 0), Some(("c", json!(3))), 4),
    ];
    assert_eq!(a1_count(&records), 3);
}

#[test]
fn same_agent_writes_are_not_stale_generation() {
    let records = [op("a", ("c", json!(0), 0), None, 3), op("a", ("d", json!(0), 0), Some(("c", json!(1))), 2)];
    assert_eq!(a1_count(&records), 0);
}

#[test]
fn write_of_the_value_already_read_is_not_stale_generation() {
    let records = [op("a", ("c", json!(1), 0), None, 3), op("b", ("d", json!(0), 0), Some(("c", json!(1))), 2)];
    assert_eq!(a1_count(&records), 0);
}

#[test]
fn write_visible_at_read_time_or_after_the_readers_commit_is_not_stale() {
    // write_time == read_time: the read saw it (strict <). write_time == reader's commit: not before it.
    let at_read = [op("a", ("c", json!(0), 2), None, 5), op("b", ("d", json!(0), 0), Some(("c", json!(1))), 2)];
    let at_commit = [op("a", ("c", json!(0), 0), None, 5), op("b", ("d", json!(0), 0), Some(("c", json!(1))), 5)];
    assert_eq!(a1_count(&at_read), 0);
    assert_eq!(a1_count(&at_commit), 0);
}

#[test]
fn aborted_records_are_outside_the_history_unless_asked() {
    let mut writer = op("b", ("d", json!(0), 0), Some(("c", json!(1))), 2);
    writer["aborted"] = json!(true);
    let records = [op("a", ("c", json!(0), 0), None, 3), writer];
    assert_eq!(a1_count(&records), 0);
    let literal = CheckOptions { include_aborted: true, ..Default::default() };
    assert_eq!(stale_generation(&read(&records), &literal).count, 1);
}

#[test]
fn records_missing_agent_or_times_are_skipped_and_counted() {
    let mut reader = op("a", ("c", json!(0), 0), None, 3);
    reader.as_object_mut().unwrap().remove("agent");
    let records = [reader, op("b", ("d", json!(0), 0), Some(("c", json!(1))), 2)];
    let d = stale_generation(&read(&records), &CheckOptions::default());
    assert_eq!((d.count, d.skipped), (0, 1));
}

#[test]
fn per_read_time_overrides_the_records_read_time() {
    let mut reader = op("a", ("c", json!(0), 5), None, 9);
    reader["reads"][0]["time"] = json!(1);
    let records = [reader, op("b", ("d", json!(0), 0), Some(("c", json!(1))), 3)];
    assert_eq!(a1_count(&records), 1);
}
