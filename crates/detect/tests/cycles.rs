//! Conflict-graph serialisability: the reduced graph's components against the full
//! precedence graph computed pair by pair, and classic anomalies by hand.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::{CheckOptions, EdgeKind, cycles::conflict_cycles};

/// (cell, time, is_read, record) for every access the definition counts.
fn events(records: &[Value]) -> Vec<(String, u64, bool, usize)> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if aborted(r) {
            continue;
        }
        for (cell, _, t) in first_reads(r).unwrap_or_default() {
            if let Some(t) = t {
                out.push((cell, t, true, i));
            }
        }
        if let (Some(wt), Some(ws)) = (time(r, "write_time"), writes(r)) {
            let mut seen: Vec<String> = Vec::new();
            for (cell, _) in ws {
                if !seen.contains(&cell) {
                    seen.push(cell.clone());
                    out.push((cell, wt, false, i));
                }
            }
        }
    }
    out
}

/// Every conflicting pair, as (from, to, kind, cell).
fn full_edges(records: &[Value]) -> Vec<(usize, usize, EdgeKind, String)> {
    let ev = events(records);
    let mut out = Vec::new();
    for x in &ev {
        for y in &ev {
            let (cx, tx, rx, ix) = x;
            let (cy, ty, ry, iy) = y;
            if cx != cy || ix == iy || (*rx && *ry) || (tx, rx, ix) >= (ty, ry, iy) {
                continue;
            }
            let kind = match (rx, ry) {
                (false, false) => EdgeKind::WriteWrite,
                (false, true) => EdgeKind::WriteRead,
                _ => EdgeKind::ReadWrite,
            };
            out.push((*ix, *iy, kind, cx.clone()));
        }
    }
    out
}

/// Non-trivial strongly connected components by transitive closure.
fn components(n: usize, edges: &[(usize, usize, EdgeKind, String)]) -> Vec<Vec<usize>> {
    let mut reach = vec![vec![false; n]; n];
    for (a, b, _, _) in edges {
        reach[*a][*b] = true;
    }
    for k in 0..n {
        let via_k = reach[k].clone();
        for row in reach.iter_mut() {
            if row[k] {
                for (j, &kj) in via_k.iter().enumerate() {
                    row[j] |= kj;
                }
            }
        }
    }
    let mut comps: Vec<Vec<usize>> = Vec::new();
    for (i, row) in reach.iter().enumerate() {
        let comp: Vec<usize> = (0..n).filter(|&j| j == i || (row[j] && reach[j][i])).collect();
        if comp.len() >= 2 && !comps.contains(&comp) {
            comps.push(comp);
        }
    }
    comps
}

#[test]
fn cycles_match_the_full_precedence_graph_on_random_traces() {
    let mut found = 0;
    for_seeds(9, 1500, |seed| {
        let records = trace(&mut Rng(seed), 8, 5);
        let full = full_edges(&records);
        let comps = components(records.len(), &full);
        found += comps.len();
        let d = conflict_cycles(&read(&records), &CheckOptions::default());
        let ctx = || format!("records: {}", jsonl(&records));
        assert_eq!(d.count, comps.len() as u64, "{}", ctx());
        assert_eq!(d.witnesses.len(), comps.len(), "{}", ctx());
        let mut covered = Vec::new();
        for c in &d.witnesses {
            let n = c.edges.len();
            assert!(n >= 2, "{}", ctx());
            for k in 0..n {
                let (e, next) = (c.edges[k], c.edges[(k + 1) % n]);
                assert_eq!(e.to, next.from, "cycle must be closed: {}", ctx());
                let cell = read(&records).cell_name(e.cell).to_owned();
                let genuine = (e.from as usize, e.to as usize, e.kind, cell);
                assert!(full.contains(&genuine), "edge {genuine:?} is not a conflict: {}", ctx());
            }
            let comp = comps.iter().position(|comp| comp.contains(&(c.edges[0].from as usize))).unwrap();
            assert!(c.records().all(|r| comps[comp].contains(&(r as usize))), "{}", ctx());
            assert_eq!(c.component_size as usize, comps[comp].len(), "{}", ctx());
            assert!(!covered.contains(&comp), "one witness per component: {}", ctx());
            covered.push(comp);
        }
    });
    assert!(found > 200, "the random traces should contain cycles ({found} components)");
}

fn op(reads: &[(&str, i64)], read_time: u64, writes: &[(&str, i64)], write_time: u64) -> Value {
    json!({
        "reads": reads.iter().map(|(c, v)| json!({"cell": c, "value": v})).collect::<Vec<_>>(),
        "read_time": read_time,
        "writes": writes.iter().map(|(c, v)| json!([c, v])).collect::<Vec<_>>(),
        "write_time": write_time,
    })
}

#[test]
fn lost_update_is_a_two_record_cycle() {
    let records = [op(&[("x", 0)], 0, &[("x", 1)], 1), op(&[("x", 0)], 0, &[("x", 2)], 2)];
    let d = conflict_cycles(&read(&records), &CheckOptions::default());
    assert_eq!(d.count, 1);
    let kinds: Vec<EdgeKind> = d.witnesses[0].edges.iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&EdgeKind::ReadWrite), "{kinds:?}");
}

#[test]
fn write_skew_is_a_cycle_of_anti_dependencies() {
    let records = [op(&[("x", 0), ("y", 0)], 0, &[("x", 1)], 1), op(&[("x", 0), ("y", 0)], 0, &[("y", 1)], 2)];
    let d = conflict_cycles(&read(&records), &CheckOptions::default());
    assert_eq!(d.count, 1);
    assert!(d.witnesses[0].edges.iter().all(|e| e.kind == EdgeKind::ReadWrite));
}

#[test]
fn serial_history_has_no_cycle() {
    let records = [op(&[("x", 0)], 0, &[("x", 1)], 1), op(&[("x", 1)], 1, &[("x", 2)], 2), op(&[("x", 2)], 2, &[], 3)];
    assert_eq!(conflict_cycles(&read(&records), &CheckOptions::default()).count, 0);
}

#[test]
fn aborted_records_are_not_in_the_graph() {
    let mut loser = op(&[("x", 0)], 0, &[("x", 2)], 2);
    loser["aborted"] = json!(true);
    let records = [op(&[("x", 0)], 0, &[("x", 1)], 1), loser];
    assert_eq!(conflict_cycles(&read(&records), &CheckOptions::default()).count, 0);
}

#[test]
fn long_chains_do_not_exhaust_the_stack() {
    // A ring of 200_000 lost updates in sequence: one component, found iteratively.
    let n = 200_000;
    let mut text = String::new();
    for k in 0..n {
        let (a, b) = (format!("c{k}"), format!("c{}", (k + 1) % n));
        let r =
            json!({"reads": [{"cell": a, "value": 0}], "read_time": 0, "writes": [[b, 1]], "write_time": 1 + k as u64});
        text.push_str(&r.to_string());
        text.push('\n');
    }
    let trace = tidegate_detect::read_str(&text, &tidegate_detect::ReadOptions::strict()).unwrap();
    let d = conflict_cycles(&trace, &CheckOptions::default());
    assert_eq!(d.count, 1);
    assert_eq!(d.witnesses[0].component_size as usize, n);
}
