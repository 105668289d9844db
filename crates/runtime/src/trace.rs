//! Where the engine's operation records go when tracing is on ([`crate::Builder::trace`]).
//!
//! One record per finished transaction, in the JSON Lines trace format of
//! docs/trace-format.md, so `tidegate check` can prove from the engine's own runs which
//! anomalies happened (docs/levels.md).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
pub use tidegate_core::trace::{TraceRead, TraceRecord, TraceTool};

use crate::error::{Error, Result};

/// A destination for operation records. Called outside the engine's lock, from whichever
/// task finished the transaction; implementations serialise their own writes.
pub trait TraceSink: Send + Sync + std::fmt::Debug {
    /// Takes one record.
    fn record(&self, record: &TraceRecord);
    /// Makes everything recorded so far visible to readers (for files: flushes).
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes records to a file, one JSON line each. Buffered; flushed by [`TraceSink::flush`]
/// and when dropped. A write error is kept and reported by the next flush.
#[derive(Debug)]
pub struct FileTrace {
    path: PathBuf,
    out: Mutex<(BufWriter<File>, Option<std::io::Error>)>,
}

impl FileTrace {
    /// Creates (truncates) `path`.
    pub fn create(path: impl AsRef<Path>) -> Result<FileTrace> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|source| Error::Trace { path: path.clone(), source })?;
        Ok(FileTrace { path, out: Mutex::new((BufWriter::new(file), None)) })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl TraceSink for FileTrace {
    fn record(&self, record: &TraceRecord) {
        let line = record.to_json_line();
        let mut g = self.out.lock();
        if g.1.is_none()
            && let Err(e) = g.0.write_all(line.as_bytes()).and_then(|()| g.0.write_all(b"\n"))
        {
            g.1 = Some(e);
        }
    }

    fn flush(&self) -> std::io::Result<()> {
        let mut g = self.out.lock();
        if let Some(e) = g.1.take() {
            return Err(e);
        }
        g.0.flush()
    }
}

impl Drop for FileTrace {
    fn drop(&mut self) {
        let _ = self.out.get_mut().0.flush();
    }
}

/// Keeps records in memory (tests, embedding).
#[derive(Debug, Default)]
pub struct TraceBuffer {
    records: Mutex<Vec<TraceRecord>>,
}

impl TraceBuffer {
    /// An empty buffer.
    pub fn new() -> TraceBuffer {
        TraceBuffer::default()
    }

    /// The records so far, in finishing order.
    pub fn records(&self) -> Vec<TraceRecord> {
        self.records.lock().clone()
    }

    /// The records as JSON Lines text.
    pub fn to_jsonl(&self) -> String {
        let mut s = String::new();
        for r in self.records.lock().iter() {
            s.push_str(&r.to_json_line());
            s.push('\n');
        }
        s
    }
}

impl TraceSink for TraceBuffer {
    fn record(&self, record: &TraceRecord) {
        self.records.lock().push(record.clone());
    }
}
