//! A3 causal cascade: the precise form against Definition 3, the residue form against the
//! paper's flat-trace predicate, and hand-written witnesses with their near misses.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::detectors::a3::{causal_cascade, precise, residue};
use tidegate_detect::{A3Form, A3Witness, CheckOptions};

fn brute_precise(records: &[Value]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (j, rj) in records.iter().enumerate() {
        if aborted(rj) {
            continue;
        }
        let Some(preds) = list(rj, "predecessors") else { continue };
        let mut distinct: Vec<&Value> = Vec::new();
        for p in preds {
            if !distinct.contains(&p) {
                distinct.push(p);
            }
        }
        for p in distinct {
            for (q, rq) in records.iter().enumerate() {
                if rq.get("tx") == Some(p) && aborted(rq) {
                    out.push((j as u64 + 1, q as u64 + 1));
                }
            }
        }
    }
    out.sort();
    out
}

fn brute_residue(records: &[Value]) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    for (j, rj) in records.iter().enumerate() {
        if aborted(rj) {
            continue;
        }
        for (cell, value, rt) in first_reads(rj).unwrap_or_default() {
            let (Some(v), Some(rt)) = (value, rt) else { continue };
            if v.is_null() {
                continue;
            }
            let produced = records.iter().enumerate().any(|(k, rk)| {
                k != j
                    && !aborted(rk)
                    && time(rk, "write_time").is_some_and(|wt| wt <= rt)
                    && first_write(rk, &cell) == Some(Some(v.clone()))
            });
            if !produced {
                out.push((j as u64 + 1, cell, v.to_string()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn precise_form_matches_definition_3_on_random_traces() {
    let mut found = 0;
    for_seeds(5, 1500, |seed| {
        let records = trace(&mut Rng(seed), 8, 10);
        let t = read(&records);
        let mut got: Vec<(u64, u64)> = precise(&t, &CheckOptions::default())
            .witnesses
            .iter()
            .map(|w| match *w {
                A3Witness::Cascade { record, predecessor } => (t.record(record).line, t.record(predecessor).line),
                A3Witness::Residue { .. } => panic!("precise form returned a residue witness"),
            })
            .collect();
        got.sort();
        let expected = brute_precise(&records);
        found += expected.len();
        assert_eq!(got, expected, "records: {}", jsonl(&records));
    });
    assert!(found > 300, "the random traces should exercise the predicate ({found} witnesses)");
}

#[test]
fn residue_form_matches_the_flat_trace_predicate_on_random_traces() {
    let mut found = 0;
    for_seeds(6, 1500, |seed| {
        let records = trace(&mut Rng(seed), 8, 10);
        let t = read(&records);
        let mut got: Vec<(u64, String, String)> = residue(&t, &CheckOptions::default())
            .witnesses
            .iter()
            .map(|w| match *w {
                A3Witness::Residue { record, cell, value, .. } => {
                    (t.record(record).line, t.cell_name(cell).to_owned(), t.value_json(value).to_string())
                }
                A3Witness::Cascade { .. } => panic!("residue form returned a cascade witness"),
            })
            .collect();
        got.sort();
        let expected = brute_residue(&records);
        found += expected.len();
        assert_eq!(got, expected, "records: {}", jsonl(&records));
    });
    assert!(found > 300, "the random traces should exercise the predicate ({found} witnesses)");
}

fn cascade_trace(dependent_aborted: bool) -> Vec<Value> {
    // p commits c1 = v1 and is later aborted; j read c1 = v1 with p among its predecessors.
    vec![
        json!({"tx": "p", "reads": [], "read_time": 0, "writes": [["c1", "v1"]], "write_time": 1, "aborted": true, "predecessors": []}),
        json!({"tx": "j", "reads": [{"cell": "c1", "value": "v1"}], "read_time": 1, "writes": [], "write_time": 2,
               "aborted": dependent_aborted, "predecessors": ["p"]}),
    ]
}

#[test]
fn surviving_dependent_of_an_aborted_predecessor_is_a_witness() {
    let trace = read(&cascade_trace(false));
    let (form, d) = causal_cascade(&trace, &CheckOptions::default());
    assert_eq!(form, A3Form::Precise);
    assert_eq!(d.witnesses, vec![A3Witness::Cascade { record: 1, predecessor: 0 }]);
}

#[test]
fn dependent_aborted_by_the_cascade_is_not_a_witness() {
    let (_, d) = causal_cascade(&read(&cascade_trace(true)), &CheckOptions::default());
    assert_eq!(d.count, 0);
}

#[test]
fn committed_predecessors_and_unknown_ids_are_not_witnesses() {
    let mut records = cascade_trace(false);
    records[0]["aborted"] = json!(false);
    records[1]["predecessors"] = json!(["p", "nobody"]);
    assert_eq!(causal_cascade(&read(&records), &CheckOptions::default()).1.count, 0);
}

#[test]
fn every_aborted_record_sharing_a_predecessor_id_is_a_witness() {
    let mut records = cascade_trace(false);
    records.push(json!({"tx": "p", "aborted": true}));
    assert_eq!(causal_cascade(&read(&records), &CheckOptions::default()).1.count, 2);
}

#[test]
fn residue_fires_on_the_cascade_once_the_retracted_writer_is_gone() {
    // Without predecessors the residue form is used; the aborted writer does not count.
    let mut records = cascade_trace(false);
    for r in &mut records {
        r.as_object_mut().unwrap().remove("predecessors");
    }
    let trace = read(&records);
    let (form, d) = causal_cascade(&trace, &CheckOptions::default());
    assert_eq!(form, A3Form::Residue);
    assert_eq!(d.count, 1);
}

#[test]
fn residue_also_fires_on_unlogged_initial_values_but_not_on_null() {
    // The over-approximation the paper names: a read of a value no logged write produced.
    let seeded = json!({"reads": [{"cell": "c", "value": "seed"}], "read_time": 0, "writes": [], "write_time": 1});
    let fresh = json!({"reads": [{"cell": "c", "value": null}], "read_time": 0, "writes": [], "write_time": 1});
    let opts = CheckOptions { a3_form: A3Form::Residue, ..Default::default() };
    assert_eq!(causal_cascade(&read(&[seeded]), &opts).1.count, 1);
    assert_eq!(causal_cascade(&read(&[fresh]), &opts).1.count, 0);
}

#[test]
fn residue_accepts_a_write_committed_at_the_read_time_but_not_later() {
    let writer = json!({"writes": [["c", 5]], "write_time": 1});
    let at = json!({"reads": [{"cell": "c", "value": 5}], "read_time": 1, "writes": [], "write_time": 2});
    let before = json!({"reads": [{"cell": "c", "value": 5}], "read_time": 0, "writes": [], "write_time": 2});
    let opts = CheckOptions { a3_form: A3Form::Residue, ..Default::default() };
    assert_eq!(causal_cascade(&read(&[writer.clone(), at]), &opts).1.count, 0);
    assert_eq!(causal_cascade(&read(&[writer, before]), &opts).1.count, 1);
}

#[test]
fn residue_ignores_the_readers_own_write() {
    let own = json!({"reads": [{"cell": "c", "value": 5}], "read_time": 3, "writes": [["c", 5]], "write_time": 1});
    let opts = CheckOptions { a3_form: A3Form::Residue, ..Default::default() };
    assert_eq!(causal_cascade(&read(&[own]), &opts).1.count, 1);
}

#[test]
fn predecessors_without_any_aborted_flag_fall_back_to_the_residue() {
    // Definition 3 needs aborted flags; a trace that never records them gets the residue.
    let records = [
        json!({"tx": "p", "writes": [["c", 1]], "write_time": 1}),
        json!({"tx": "j", "reads": [{"cell": "c", "value": 2}], "read_time": 1, "predecessors": ["p"]}),
    ];
    let trace = read(&records);
    let (form, d) = causal_cascade(&trace, &CheckOptions::default());
    assert_eq!((form, d.count), (A3Form::Residue, 1));
    let forced = CheckOptions { a3_form: A3Form::Precise, ..Default::default() };
    assert_eq!(causal_cascade(&trace, &forced), (A3Form::Precise, precise(&trace, &forced)));
    assert_eq!(precise(&trace, &forced).count, 0);
}
