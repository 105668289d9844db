//! A real `tidegate` process killed with SIGKILL at seeded moments: every reopen verifies, and
//! the interrupted runs are finished by the next start.

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_tidegate");

#[test]
fn sigkill_at_seeded_moments_never_corrupts_the_ledger() {
    let dir = std::env::temp_dir().join(format!("tidegate-sigkill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..12 {
        // xorshift: a seeded delay between 0 and 120 ms.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let delay = Duration::from_millis(state % 120);
        let mut child = Command::new(BIN)
            .args(["demo", "--data-dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let verify = Command::new(BIN).args(["ledger", "verify", "--data-dir"]).arg(&dir).output().unwrap();
        assert!(
            verify.status.success(),
            "round {round} (killed after {delay:?}): verify failed: {}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
    }
    // A clean run recovers whatever the last kill left and finishes.
    let run = Command::new(BIN).args(["demo", "--data-dir"]).arg(&dir).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let verify = Command::new(BIN).args(["ledger", "verify", "--data-dir"]).arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(text.contains("0 unfinished transaction(s)"), "after a clean run nothing is left unfinished: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}
