//! `tidegate check`: standard input, exit statuses, hostile inputs under a memory limit.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::io::Write;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");
const RECORD: &str = r#"{"tx":"a","reads":[{"cell":"c","value":1}],"read_time":0,"writes":[["c",2]],"write_time":1}"#;

fn check_stdin(input: &[u8], args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .arg("check")
        .arg("-")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that refuses its arguments exits without reading: a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

#[test]
fn a_dash_reads_the_trace_from_standard_input() {
    let out = check_stdin(format!("{RECORD}\n").as_bytes(), &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["records"], 1);
}

/// Regression (issue 11): lenient mode exited 0 when every line was malformed. Nothing
/// readable is its own status (3); unusable input is 2.
#[test]
fn exit_status_says_whether_anything_was_readable() {
    let cases: [(&[u8], &[&str], i32); 6] = [
        (b"", &[], 3),
        (b"\n\n", &[], 3),
        (b"not json\n{\"tx\": 1,\n", &[], 3),
        (b"not json\n{\"tx\":\"a\"}\n", &[], 0),
        (b"not json\n{\"tx\":\"a\"}\n", &["--strict"], 2),
        (b"{\"tx\":\"a\"}\n", &["--max-line-bytes", "0"], 2),
    ];
    for (input, args, want) in cases {
        let out = check_stdin(input, args);
        assert_eq!(
            out.status.code(),
            Some(want),
            "{:?} {args:?}: {}",
            String::from_utf8_lossy(input),
            String::from_utf8_lossy(&out.stderr)
        );
        if want == 3 {
            assert!(String::from_utf8_lossy(&out.stderr).contains("nothing readable"));
        }
    }
    let out = Command::new(BIN).args(["check", "/nonexistent/trace.jsonl"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.jsonl"));
}

/// Regression (issue 11): `check /dev/zero` grew a line without bound until the allocator
/// aborted. Under a 512 MiB address-space limit both endless inputs end with a clear error.
#[test]
fn check_on_dev_zero_and_dev_urandom_ends_with_a_clear_error_under_a_memory_limit() {
    for (input, status, says) in [("/dev/zero", 2, "longer than"), ("/dev/urandom", 3, "nothing readable")] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -v 524288 && exec timeout 300 {BIN} check {input}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{input}: {err}");
        assert!(err.contains(says) && !err.contains("memory allocation"), "{input}: {err}");
    }
}
