//! The decision log: the append-only record from which a manager is rebuilt.
//!
//! Format (version 2): one [`Entry`] per record, `{"v":2,"record":{"type":...}}`. New optional
//! fields may be added to records with `#[serde(default)]`; anything else bumps `v`, and a
//! reader refuses a version newer than its own. History: 1, the first; 2 adds the `templates`
//! record (templates registered while the manager runs, e.g. over HTTP). A version-1 log is
//! read as is.
//!
//! Where the records are kept is the [`DecisionLog`]'s business: in memory, a JSON Lines file
//! ([`FileLog`]), or any store of JSON values through [`encode_entry`] and [`decode_entry`]
//! (the server keeps them in the tenant's Tidegate ledger as extension records).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::deps::{EdgeKind, Touch};
use crate::error::{Error, Result};
use crate::exec::Compensation;
use crate::template::{Strategy, TemplateSet};

/// The log format version this crate writes (and the newest it reads).
pub const FORMAT_VERSION: u32 = 2;

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
    /// Templates (with their tables and invariants) were added to the manager's set, after
    /// `schema` (SQL, if any) ran on the database. Added in format 2.
    Templates {
        /// What was added (merged into the set in log order).
        set: TemplateSet,
        /// The SQL batch run on the database before (not run again on rebuild).
        #[serde(default)]
        schema: Option<String>,
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

/// `record` as a versioned JSON value (`{"v":..,"record":..}`), for a log kept in another store.
pub fn encode_entry(record: &Record) -> Result<serde_json::Value> {
    serde_json::to_value(Entry { v: FORMAT_VERSION, record: record.clone() })
        .map_err(|e| Error::Log { message: format!("encode: {e}"), retryable: false })
}

/// The record of a value written by [`encode_entry`]; refuses a newer format version.
pub fn decode_entry(value: &serde_json::Value) -> Result<Record> {
    let entry =
        Entry::deserialize(value).map_err(|e| Error::Log { message: format!("decode: {e}"), retryable: false })?;
    check_version(entry.v)?;
    Ok(entry.record)
}

fn check_version(v: u32) -> Result<()> {
    if v == 0 || v > FORMAT_VERSION {
        return Err(Error::Log {
            message: format!("format version {v} (this build reads 1 to {FORMAT_VERSION})"),
            retryable: false,
        });
    }
    Ok(())
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
        let mut line = serde_json::to_vec(&encode_entry(record)?)
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
            if let Err(Error::Log { message, .. }) = check_version(entry.v) {
                return Err(Error::Log { message: format!("line {}: {message}", i + 1), retryable: false });
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
        assert_eq!(decode_entry(&serde_json::from_str(&line).unwrap()).unwrap(), r, "a version-1 entry still reads");
        assert_eq!(decode_entry(&encode_entry(&r).unwrap()).unwrap(), r);
    }

    #[test]
    fn a_newer_format_version_is_refused_naming_both() {
        let newer = serde_json::json!({"v": FORMAT_VERSION + 1, "record": {"type": "compensated", "id": 1}});
        let err = decode_entry(&newer).unwrap_err().to_string();
        assert!(err.contains(&format!("format version {}", FORMAT_VERSION + 1)) && err.contains("1 to 2"), "{err}");
    }
}
