//! The whole check: level classification, the JSON and human reports, witness limits and
//! the trace generator.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use tidegate_detect::{CheckOptions, Level, ReadOptions, analyze, check, check_with, generate_trace, read_str};

fn clean() -> Vec<Value> {
    vec![
        json!({"schema_version": "1.0", "tx": "t1", "agent": "a", "reads": [{"cell": "c", "value": null, "replica": "p"}], "read_time": 0,
               "registry_at_read": ["t"], "planned_tools": ["t"], "writes": [["c", 1], ["d", 1]], "write_time": 1,
               "registry_at_commit": ["t"], "io": [["c", 1], ["d", 1]], "co": [["c", 1], ["d", 1]], "aborted": false, "predecessors": []}),
        json!({"schema_version": "1.0", "tx": "t2", "agent": "b", "reads": [{"cell": "c", "value": 1, "replica": "p"}], "read_time": 1,
               "registry_at_read": ["t"], "planned_tools": [], "writes": [["c", 2]], "write_time": 2,
               "registry_at_commit": ["t"], "io": [["c", 2]], "co": [["c", 2]], "aborted": false, "predecessors": ["t1"]}),
    ]
}

fn level(records: &[Value]) -> Level {
    check(&read(records)).level
}

#[test]
fn clean_trace_is_l4_and_each_anomaly_caps_the_level_as_in_the_chain() {
    let base = clean();
    assert_eq!(level(&base), Level::L4);

    let mut phantom = base.clone();
    phantom[0]["registry_at_commit"] = json!([]);
    assert_eq!(level(&phantom), Level::L3, "A2 is the last anomaly the chain excludes");

    let mut reordered = phantom.clone();
    reordered[0]["co"] = json!([["d", 1], ["c", 1]]);
    assert_eq!(level(&reordered), Level::L2);

    let mut cascade = reordered.clone();
    cascade[0]["aborted"] = json!(true);
    assert_eq!(level(&cascade), Level::L1);

    let mut stale = clean();
    stale[1]["read_time"] = json!(0);
    stale[1]["reads"] = json!([{"cell": "c", "value": null}]);
    assert_eq!(level(&stale), Level::L0);
}

#[test]
fn split_view_is_reported_but_does_not_change_the_level() {
    let mut records = clean();
    records.push(json!({"agent": "c", "reads": [{"cell": "c", "value": 7, "replica": "lagging"}], "read_time": 0, "writes": [], "write_time": 1}));
    let report = check(&read(&records));
    assert_eq!(report.anomalies.a4, 1);
    assert_eq!(report.level, Level::L4);
}

#[test]
fn level_is_the_first_anomaly_of_the_chain_on_random_traces() {
    for_seeds(10, 300, |seed| {
        let records = trace(&mut Rng(seed), 8, 10);
        let f = analyze(&read(&records), &CheckOptions::default());
        let expected = Level::classify(f.a1.count > 0, f.a2.count > 0, f.a3.count > 0, f.a6.count > 0);
        assert_eq!(f.level(), expected);
        let report = check(&read(&records));
        assert_eq!(report.level, expected);
        let listed = report.witnesses.len() as u64;
        let a = report.anomalies;
        assert_eq!(listed, a.a1 + a.a2 + a.a3 + a.a4 + a.a6 + report.cycles, "every witness is listed by default");
    });
}

#[test]
fn json_report_has_the_documented_shape() {
    let mut records = clean();
    records[0]["registry_at_commit"] = json!([]);
    let text = format!("{}\nnot json\n", jsonl(&records));
    let report = check(&read_str(&text, &ReadOptions::lenient()).unwrap());
    let v: Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(v["records"], json!(2));
    assert_eq!(v["level"], json!("L3"));
    assert_eq!(v["anomalies"], json!({"A1": 0, "A2": 1, "A3": 0, "A4": 0, "A6": 0}));
    assert_eq!(v["cycles"], json!(0));
    assert_eq!(v["malformed"], json!(1));
    assert_eq!(v["a3_form"], json!("precise"));
    let w = &v["witnesses"][0];
    assert_eq!(w["anomaly"], json!("A2"));
    assert_eq!(w["record"], json!({"line": 1, "tx": "t1", "agent": "a"}));
    assert_eq!(w["tool"], json!("t"));
    assert_eq!(w["change"], json!("removed"));
    assert_eq!(v["errors"][0]["line"], json!(4));
}

#[test]
fn human_report_names_level_counts_and_witnesses() {
    let mut records = clean();
    records[1]["read_time"] = json!(0);
    records[1]["reads"] = json!([{"cell": "c", "value": null}]);
    let text = check(&read(&records)).to_string();
    assert!(text.contains("level:   L0 (prevents nothing)"), "{text}");
    assert!(text.contains("A1 stale generation 1"), "{text}");
    assert!(text.contains("line 2 (tx t2, agent b) read c = null at t=0"), "{text}");
}

#[test]
fn witness_limit_truncates_the_list_but_not_the_counts() {
    let records: Vec<Value> = (0..6)
        .map(|k| json!({"agent": format!("a{k}"), "reads": [{"cell": "c", "value": 0}], "read_time": 0, "writes": [["c", k + 1]], "write_time": k + 1}))
        .collect();
    let opts = CheckOptions { witness_limit: Some(2), ..Default::default() };
    let report = check_with(&read(&records), &opts);
    assert!(report.truncated);
    assert_eq!(report.anomalies.a1, 15, "each reader is overtaken by every later writer");
    let listed =
        report.witnesses.iter().filter(|w| matches!(w, tidegate_detect::Witness::StaleGeneration { .. })).count();
    assert_eq!(listed, 2);
}

#[test]
fn generated_traces_are_deterministic_parse_strictly_and_contain_anomalies() {
    let a: Vec<String> = generate_trace(20_000, 1).collect();
    let b: Vec<String> = generate_trace(20_000, 1).collect();
    let c: Vec<String> = generate_trace(20_000, 2).collect();
    assert_eq!(a.len(), 20_000);
    assert_eq!(a, b);
    assert_ne!(a, c);
    let text: String = a.iter().map(|l| format!("{l}\n")).collect();
    let report = check(&read_str(&text, &ReadOptions::strict()).unwrap());
    let n = report.anomalies;
    assert!(n.a1 > 0 && n.a2 > 0 && n.a3 > 0 && n.a4 > 0 && n.a6 > 0, "{n:?}");
    assert!(report.cycles > 0);
    assert_eq!(report.level, Level::L0);
    // Anomalies are the exception, not the rule.
    assert!(n.a1 + n.a2 + n.a3 + n.a6 < 2_000, "{n:?}");
}
