//! The disk's physical limit: how many append+sync rounds per second it sustains.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::StoreError;

/// Appends a small record (64 bytes) to a scratch file in `dir` and syncs it (`fsync`, as
/// SQLite's `synchronous=FULL` commit does), in a loop for about
/// `duration`, and returns the rounds per second: the ceiling for one client waiting on
/// every commit, and the unit `tidegate bench durable` compares group commit against.
/// The scratch file (`<dir>/fsync-bench-<pid>.tmp`) is removed afterwards. `dir` is created
/// if missing; measure in the data directory, since disks differ.
pub fn fsync_per_s(dir: impl AsRef<Path>, duration: Duration) -> Result<f64, StoreError> {
    let dir = dir.as_ref();
    if duration.is_zero() {
        return Err(StoreError::InvalidArgument {
            field: "duration",
            value: format!("{duration:?}"),
            expected: "a positive duration",
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| StoreError::file("create the benchmark directory", dir, e))?;
    let path = dir.join(format!("fsync-bench-{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| StoreError::file("create the benchmark file", &path, e))?;
        let record = [b'x'; 64];
        let start = Instant::now();
        let mut rounds = 0u64;
        loop {
            file.write_all(&record)
                .and_then(|()| file.sync_all())
                .map_err(|e| StoreError::file("append and sync", &path, e))?;
            rounds += 1;
            let elapsed = start.elapsed();
            if elapsed >= duration {
                return Ok(rounds as f64 / elapsed.as_secs_f64());
            }
        }
    })();
    let removed = std::fs::remove_file(&path).map_err(|e| StoreError::file("remove the benchmark file", &path, e));
    let rate = result?;
    removed?;
    Ok(rate)
}
