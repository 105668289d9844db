//! The decision log: the append-only record from which a manager is rebuilt.
//!
//! Format (version 1): one [`Entry`] per record, `{"v":1,"record":{"type":...}}`. New optional
//! fields may be added to records with `#[serde(default)]`; anything else bumps `v`, and a
//! reader refuses a version it does not know.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::deps::{EdgeKind, Touch};
use crate::error::{Error, Result};
use crate::exec::Compensation;
use crate::template::Strategy;

/// The log format version this crate writes.
pub const FORMAT_VERSION: u32 = 1;

/// A reviewer's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Keep the transaction.
    Accept,
    /// Take it out of history.
    Remove,
}

/// One fact of the manager's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A request entered the manager with the edges computed for it.
    Request {
        /// Transaction id.
        id: u64,
        /// Template name.
        template: String,
        /// Parameters.
        params: serde_json::Value,
        /// Who sent it.
        sender: String,
        /// Whether it needs review.
        suspicious: bool,
        /// The strategy in force for it.
        strategy: Strategy,
        /// Its touches as known at request time.
        touches: Vec<Touch>,
        /// The buffered transactions it depends on, with the kind of each edge.
        waits_on: Vec<(u64, EdgeKind)>,
    },
    /// A reviewer decided.
    Review {
        /// Transaction id.
        id: u64,
        /// The decision.
        decision: Decision,
        /// Who decided.
        reviewer: String,
    },
    /// An execution finished (committed in the database, or refused and rolled back).
    Executed {
        /// Transaction id.
        id: u64,
        /// The database's refusal, if any.
        #[serde(default)]
        error: Option<String>,
        /// The compensation held for it.
        #[serde(default)]
        compensation: Option<Compensation>,
    },
    /// A compensation finished.
    Compensated {
        /// Transaction id.
        id: u64,
        /// The database's refusal, if any (a refused removal).
        #[serde(default)]
        error: Option<String>,
    },
}

/// A record with its format version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Format version ([`FORMAT_VERSION`]).
    pub v: u32,
    /// The record.
    pub record: Record,
}

/// Where decisions are kept. Contract: `append` MUST make the record visible to every later
/// `read_all` (of this or a reopened log) in append order once it returns `Ok`; an `Err` means
/// the record may or may not be kept. `read_all` returns records in append order.
pub trait DecisionLog: Send {
    /// Appends one record.
    fn append(&mut self, record: &Record) -> Result<()>;
    /// All records so far, in order.
    fn read_all(&self) -> Result<Vec<Record>>;
}

/// An in-memory log; clones share the same records (a "restart" in tests).
#[derive(Debug, Clone, Default)]
pub struct MemoryLog {
    records: Arc<Mutex<Vec<Record>>>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> MemoryLog {
        MemoryLog::default()
    }
}

impl DecisionLog for MemoryLog {
    fn append(&mut self, record: &Record) -> Result<()> {
        self.records
            .lock()
            .map_err(|_| Error::Log { message: "poisoned".into(), retryable: false })?
            .push(record.clone());
        Ok(())
    }

    fn read_all(&self) -> Result<Vec<Record>> {
        Ok(self.records.lock().map_err(|_| Error::Log { message: "poisoned".into(), retryable: false })?.clone())
    }
}

/// A JSON Lines file; each append is written and flushed (and synced when `sync` is set).
#[derive(Debug)]
pub struct FileLog {
    path: PathBuf,
    file: std::fs::File,
    sync: bool,
}

impl FileLog {
    /// Opens (or creates) the log at `path`.
    pub fn open(path: &Path, sync: bool) -> Result<FileLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::Log { message: format!("open {}: {e}", path.display()), retryable: false })?;
        Ok(FileLog { path: path.to_owned(), file, sync })
    }
}

impl DecisionLog for FileLog {
    fn append(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_vec(&Entry { v: FORMAT_VERSION, record: record.clone() })
            .map_err(|e| Error::Log { message: e.to_string(), retryable: false })?;
        line.push(b'\n');
        let io =
            |e: std::io::Error| Error::Log { message: format!("append {}: {e}", self.path.display()), retryable: true };
        self.file.write_all(&line).map_err(io)?;
        self.file.flush().map_err(io)?;
        if self.sync {
            self.file.sync_data().map_err(io)?;
        }
        Ok(())
    }

    fn read_all(&self) -> Result<Vec<Record>> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| Error::Log { message: format!("read {}: {e}", self.path.display()), retryable: true })?;
        let mut out = Vec::new();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let entry: Entry = match serde_json::from_str(line) {
                Ok(e) => e,
                // A torn last line (a crash mid-append: no final newline) is cut; anything
                // else is damage.
                Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => break,
                Err(e) => return Err(Error::Log { message: format!("line {}: {e}", i + 1), retryable: false }),
            };
            if entry.v != FORMAT_VERSION {
                return Err(Error::Log {
                    message: format!("line {}: format version {} (expected {FORMAT_VERSION})", i + 1, entry.v),
                    retryable: false,
                });
            }
            out.push(entry.record);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_record_round_trips() {
        let r = Record::Request {
            id: 3,
            template: "t".into(),
            params: serde_json::json!({"a": 1}),
            sender: "s".into(),
            suspicious: false,
            strategy: Strategy::BufferSuspicious,
            touches: vec![],
            waits_on: vec![(1, EdgeKind::Waits)],
        };
        let line = serde_json::to_string(&Entry { v: 1, record: r.clone() }).unwrap();
        let back: Entry = serde_json::from_str(&line).unwrap();
        assert_eq!(back.record, r);
    }
}
