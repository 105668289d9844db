//! The `tidegate-mcp` command's own start-up errors. (The protocol tests are the Python suite
//! in `tests/py`, run by `scripts/mcp-test.sh`, which uses the binary this build made.)

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::process::Command;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidegate-mcp"))
}

#[test]
fn a_missing_policy_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere.toml");
    let out = gateway().args(["check", "--policy"]).arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nowhere.toml"), "{err}");
    assert!(out.stdout.is_empty(), "stdout is the protocol; nothing goes there on an error");
}

#[test]
fn a_bad_value_is_an_error_naming_the_file_the_line_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[gateway]\nserver = \"http://127.0.0.1:9\"\nserver_patience_ms = 5\n").unwrap();
    let out = gateway().args(["check", "--policy"]).arg(&policy).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("policy.toml") && err.contains(":3") && err.contains("gateway.server_patience_ms"), "{err}");
}
