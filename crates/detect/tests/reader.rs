//! Reading traces: malformed lines (line, column, field), strict and lenient modes, versions,
//! the reference runtime's field names, and parallel reading of large files.
#![allow(clippy::unwrap_used)]

mod common;

use tidegate_detect::{Error, ReadOptions, check, read_path, read_str, read_trace};

const GOOD: &str =
    r#"{"tx":"a","agent":"x","reads":[{"cell":"c","value":1}],"read_time":0,"writes":[["c",2]],"write_time":1}"#;

#[test]
fn lenient_reading_skips_and_counts_malformed_lines() {
    let text = format!("{GOOD}\n{{\"tx\": \n{GOOD}\nnot json\n\n{GOOD}\n");
    let trace = read_str(&text, &ReadOptions::lenient()).unwrap();
    assert_eq!(trace.len(), 3);
    let stats = trace.stats();
    assert_eq!((stats.lines, stats.malformed, stats.blank), (6, 2, 1));
    let lines: Vec<u64> = stats.errors.iter().map(Error::line).collect();
    assert_eq!(lines, vec![2, 4]);
    assert_eq!(trace.records()[2].line, 6, "records keep their own line numbers");
    assert_eq!(check(&trace).malformed, 2);
}

#[test]
fn strict_reading_stops_at_the_first_malformed_line_with_its_position() {
    let text = format!("{GOOD}\n{GOOD}\n{{\"tx\":\"b\",,}}\n{{oops\n");
    match read_str(&text, &ReadOptions::strict()) {
        Err(Error::Syntax { line, column, message }) => {
            assert_eq!(line, 3);
            assert_eq!(column, 11, "the second comma");
            assert!(message.contains("key must be a string"), "{message}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn wrong_field_type_names_the_field_path_column_and_value() {
    let text = r#"{"tx":"a","reads":[{"cell":"c","value":1,"time":3},{"cell":"d","time":"soon"}]}"#;
    let err = read_str(text, &ReadOptions::strict()).unwrap_err();
    match &err {
        Error::Field { line, column, field, message } => {
            assert_eq!(*line, 1);
            assert_eq!(field, "reads[1].time");
            assert_eq!(*column, text.find("\"soon\"").unwrap() + "\"soon\"".len());
            assert!(message.contains("soon") && message.contains("u64"), "{message}");
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(shown.contains("line 1") && shown.contains("reads[1].time"), "{shown}");
    assert!(!err.retryable());
}

#[test]
fn negative_times_and_non_objects_are_malformed() {
    let trace = read_str("{\"write_time\":-1}\n[1,2]\n42\n", &ReadOptions::lenient()).unwrap();
    assert_eq!(trace.stats().malformed, 3);
    let fields: Vec<String> = trace
        .stats()
        .errors
        .iter()
        .map(|e| match e {
            Error::Field { field, .. } => field.clone(),
            other => format!("{other}"),
        })
        .collect();
    assert_eq!(fields[0], "write_time");
    assert_eq!(fields[1], "(record)");
}

#[test]
fn invalid_utf8_is_a_syntax_error_with_its_column() {
    let mut bytes = br#"{"tx":"a","agent":""#.to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe]);
    bytes.extend_from_slice(b"\"}\n");
    let err = tidegate_detect::read_trace(&bytes[..], &ReadOptions::strict()).unwrap_err();
    assert!(matches!(err, Error::Syntax { line: 1, .. }), "{err}");
    assert!(err.column().is_some());
}

#[test]
fn newer_minor_versions_and_unknown_fields_are_read() {
    let text = r#"{"schema_version":"1.9","tx":"a","some_future_field":{"x":[1]},"agent":"x"}"#;
    let trace = read_str(text, &ReadOptions::strict()).unwrap();
    assert_eq!(trace.len(), 1);
}

#[test]
fn unknown_major_version_is_refused_with_its_column() {
    let text = r#"{"tx":"a","schema_version":"2.0"}"#;
    match read_str(text, &ReadOptions::strict()) {
        Err(Error::UnsupportedVersion { line: 1, column, found, supported: 1 }) => {
            assert_eq!(found, "2.0");
            assert_eq!(column, text.find("\"schema_version\"").unwrap() + 1);
        }
        other => panic!("expected an unsupported version, got {other:?}"),
    }
    let bad = read_str(r#"{"schema_version":"one"}"#, &ReadOptions::strict()).unwrap_err();
    assert!(matches!(bad, Error::Field { ref field, .. } if field == "schema_version"), "{bad}");
}

#[test]
fn reference_runtime_field_names_are_accepted() {
    // The shape the paper's reference runtime writes: read_set/read_values maps, planned_tool,
    // tools_visible_at_read/tools_used, agent plus agent_id, "NULL" strings.
    let stale = r#"{"agent":"tri","agent_id":"tri","read_set":["t"],"read_values":{"t":"v0"},"read_time":1,"write_set":[],"write_values":{},"write_time":3,"planned_tool":"search","tools_visible_at_read":["search"],"tools_used":[],"io":[],"co":[]}"#;
    let writer = r#"{"agent":"rep","agent_id":"rep","read_set":["u"],"read_values":{"u":"NULL"},"read_time":0,"write_set":["t"],"write_values":{"t":"v1"},"write_time":2,"planned_tool":null,"tools_used":[],"tools_visible_at_read":[],"io":[["t","v1"]],"co":[["t","v1"]]}"#;
    let text = format!("{stale}\n{writer}\n");
    let opts = ReadOptions { null_string: Some("NULL".into()), ..ReadOptions::strict() };
    let trace = read_str(&text, &opts).unwrap();
    let report = check(&trace);
    assert_eq!(report.anomalies.a1, 1, "the triager's read of t is stale");
    assert_eq!(report.anomalies.a2, 1, "search was visible at read and is not in tools_used");
    assert_eq!(report.a3_form, tidegate_detect::A3Form::Residue);
    // "v0" was never written by a logged operation; "NULL" reads as null, so no residue for u.
    assert_eq!(report.anomalies.a3, 1);
    let r = &trace.records()[0];
    assert_eq!(trace.agent_name(r.agent().unwrap()), "tri");
}

#[test]
fn write_set_and_paper_registry_names_are_accepted() {
    let text = r#"{"write_set":["a","b"],"write_values":[["b",2]],"read_registry":["t"],"write_registry":[],"planned_tools":["t"],"io_seq":[["a",1],["b",2]],"co_seq":[["b",2],["a",1]]}"#;
    let trace = read_str(text, &ReadOptions::strict()).unwrap();
    let r = &trace.records()[0];
    let writes = trace.writes(r).unwrap();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0].value(), None, "a is in write_set without a value: unknown");
    assert_eq!(trace.value_json(writes[1].value().unwrap()), serde_json::json!(2));
    let report = check(&trace);
    assert_eq!((report.anomalies.a2, report.anomalies.a6), (1, 1));
}

#[test]
fn numeric_and_string_transaction_ids_are_the_same_id() {
    let text = "{\"tx\":7,\"aborted\":true}\n{\"tx\":\"j\",\"predecessors\":[\"7\"],\"aborted\":false}\n";
    let report = check(&read_str(text, &ReadOptions::strict()).unwrap());
    assert_eq!(report.anomalies.a3, 1);
}

#[test]
fn a_file_read_in_two_halves_equals_one_read_sequentially() {
    let dir = std::env::temp_dir().join(format!("tidegate-detect-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let mut text: String = tidegate_detect::generate_trace(3000, 5).map(|l| l + "\n").collect();
    text.push_str("{broken\n");
    text.push_str(&tidegate_detect::generate_trace(50, 6).map(|l| l + "\n").collect::<String>());
    std::fs::write(&path, &text).unwrap();
    let split = ReadOptions { split_threshold: 0, ..ReadOptions::lenient() };
    let whole = ReadOptions { split_threshold: u64::MAX, ..ReadOptions::lenient() };
    let (a, b) = (read_path(&path, &split).unwrap(), read_path(&path, &whole).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(a.len(), b.len());
    assert_eq!(a.stats().errors[0].line(), 3001);
    let lines = |t: &tidegate_detect::Trace| t.records().iter().map(|r| r.line).collect::<Vec<_>>();
    assert_eq!(lines(&a), lines(&b));
    assert_eq!(check(&a), check(&b));
}

#[test]
fn missing_file_is_an_io_error() {
    let err = read_path("/nonexistent/trace.jsonl", &ReadOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }));
    assert!(!err.is_malformed_line());
}

/// Regression (issue 11): `reads[0].value: missing field cell` named the last field the object
/// had, one step too deep; the path names the object that lacks the field.
#[test]
fn a_missing_field_names_the_object_that_lacks_it() {
    let err = read_str(r#"{"tx":"a","reads":[{"cell":"c"},{"value":1}]}"#, &ReadOptions::strict()).unwrap_err();
    match err {
        Error::Field { field, message, .. } => {
            assert_eq!(field, "reads[1]");
            assert!(message.contains("missing field `cell`"), "{message}");
        }
        other => panic!("expected a field error, got {other:?}"),
    }
}

/// Regression (issue 11): a UTF-8 byte-order mark made line 1 malformed.
#[test]
fn a_utf8_byte_order_mark_is_accepted() {
    let text = "\u{feff}{\"tx\":\"a\",\"reads\":[{\"cell\":\"c\",\"value\":1}]}\n{\"tx\":\"b\"}\n";
    let trace = read_str(text, &ReadOptions::strict()).unwrap();
    assert_eq!((trace.len(), trace.stats().malformed), (2, 0));
    // Only at the start: a mark on a later line is malformed.
    let later = "{\"tx\":\"a\"}\n\u{feff}{\"tx\":\"b\"}\n";
    assert_eq!(read_str(later, &ReadOptions::lenient()).unwrap().stats().malformed, 1);
}

/// Regression (issue 11): `check /dev/zero` grew one line without bound. A line over the limit
/// is malformed and skipped without being held; one with no end in sight stops the read.
#[test]
fn a_line_over_the_limit_is_malformed_and_never_held() {
    let opts = ReadOptions { max_line_bytes: 64, ..ReadOptions::lenient() };
    let long = format!("{{\"tx\":\"{}\"}}", "x".repeat(100));
    let text = format!("{{\"tx\":\"a\"}}\n{long}\n{{\"tx\":\"b\"}}\n");
    let trace = read_str(&text, &opts).unwrap();
    assert_eq!((trace.len(), trace.stats().malformed), (2, 1));
    assert!(matches!(trace.stats().errors[0], Error::LineTooLong { line: 2, limit: 64, ended: true }));
    let strict = ReadOptions { max_line_bytes: 64, ..ReadOptions::strict() };
    assert!(matches!(read_str(&text, &strict), Err(Error::LineTooLong { line: 2, .. })));
    // Exactly at the limit is fine.
    let exact = format!("{{\"tx\":\"{}\"}}", "y".repeat(64 - 9));
    assert_eq!(exact.len(), 64);
    assert_eq!(read_str(&exact, &opts).unwrap().len(), 1);
    // No end within twice the limit: the reader stops instead of skipping forever.
    let endless = std::io::Read::take(std::io::repeat(b'0'), 1 << 20);
    let err = read_trace(std::io::BufReader::new(endless), &opts).unwrap_err();
    assert!(matches!(err, Error::LineTooLong { ended: false, .. }), "{err:?}");
    assert!(!err.is_malformed_line());
}

/// Lenient reading of something that is not a trace gives up instead of skipping forever.
#[test]
fn lenient_reading_gives_up_when_nothing_is_readable() {
    let opts = ReadOptions { give_up_after_malformed: 50, ..ReadOptions::lenient() };
    let garbage = "not json\n".repeat(1000);
    let err = read_str(&garbage, &opts).unwrap_err();
    assert!(matches!(err, Error::NothingReadable { lines: 50, malformed: 50 }), "{err:?}");
    // Once a record was read, malformed lines are skipped however many follow.
    let mixed = format!("{{\"tx\":\"a\"}}\n{garbage}");
    let trace = read_str(&mixed, &opts).unwrap();
    assert_eq!((trace.len(), trace.stats().malformed), (1, 1000));
}
