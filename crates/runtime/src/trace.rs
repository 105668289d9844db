//! Where the engine's operation records go when tracing is on ([`crate::Builder::trace`]).
//!
//! One record per finished transaction, in the JSON Lines trace format of
//! docs/trace-format.md, so `tidegate check` can prove from the engine's own runs which
//! anomalies happened (docs/levels.md). The format is owned by `tidegate-detect`: the engine's
//! [`TraceRecord`] is converted into its [`RecordLine`] here, when written ([`trace_line`]).

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
pub use tidegate_core::trace::{TraceRead, TraceRecord, TraceTool};
use tidegate_detect::wire::{Effect, Id, Read, RecordLine, SchemaVersion, Str, Tool, Value};

/// The engine's record in the trace format's types (borrowing its strings).
pub fn trace_line(r: &TraceRecord) -> RecordLine<'_> {
    fn s(a: &std::sync::Arc<str>) -> Str<'_> {
        Str(Cow::Borrowed(&**a))
    }
    fn tool(t: &TraceTool) -> Tool<'_> {
        Tool { name: s(&t.name), signature: Some(Value::UInt(t.signature)) }
    }
    fn effect((cell, what): &(std::sync::Arc<str>, String)) -> Effect<'_> {
        Effect { cell: s(cell), value: Some(Value::Str(Cow::Borrowed(what.as_str()))) }
    }
    RecordLine {
        schema_version: Some(SchemaVersion::CURRENT),
        tx: Some(Id(Cow::Owned(r.tx.to_string()))),
        agent: Some(s(&r.agent)),
        level: Some(Str(Cow::Owned(r.level.to_string()))),
        read_time: Some(r.read_time),
        reads: Some(
            r.reads
                .iter()
                .map(|rd| Read {
                    cell: s(&rd.cell),
                    value: Some(Value::UInt(rd.value)),
                    time: Some(rd.time),
                    replica: None,
                })
                .collect(),
        ),
        registry_at_read: Some(r.registry_at_read.iter().map(tool).collect()),
        planned_tools: Some(r.planned_tools.iter().map(|t| Tool { name: s(t), signature: None }).collect()),
        writes: Some(
            r.writes.iter().map(|(cell, stamp)| Effect { cell: s(cell), value: Some(Value::UInt(*stamp)) }).collect(),
        ),
        write_time: r.write_time,
        registry_at_commit: Some(r.registry_at_commit.iter().map(tool).collect()),
        io: Some(r.io.iter().map(effect).collect()),
        co: Some(r.co.iter().map(effect).collect()),
        aborted: Some(r.aborted),
        predecessors: Some(r.predecessors.iter().map(|p| Id(Cow::Owned(p.to_string()))).collect()),
        ..RecordLine::default()
    }
}

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
        let line = trace_line(record).to_line();
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
            s.push_str(&trace_line(r).to_line());
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tidegate_core::Level;
    use tidegate_detect::wire::RecordLine;

    use super::*;

    /// The engine's record is written in the detectors' format and reads back as written.
    #[test]
    fn an_engine_record_is_written_in_the_format_the_detectors_read() {
        let r = TraceRecord {
            schema_version: tidegate_core::trace::TRACE_SCHEMA_VERSION,
            tx: 7,
            agent: "ana".into(),
            level: Level::L4,
            read_time: 2,
            reads: vec![TraceRead { cell: "b:1".into(), value: 2, time: 2 }],
            registry_at_read: vec![TraceTool { name: "book".into(), signature: 1 }],
            planned_tools: vec!["book".into()],
            writes: vec![(Arc::from("b:1"), 3)],
            write_time: Some(3),
            registry_at_commit: vec![TraceTool { name: "book".into(), signature: 1 }],
            io: vec![(Arc::from("b:1"), "7/0:book".into())],
            co: vec![(Arc::from("b:1"), "7/0:book".into())],
            aborted: false,
            predecessors: vec![5],
        };
        let line = trace_line(&r).to_line();
        assert!(line.starts_with(r#"{"schema_version":"1.1","tx":"7","agent":"ana""#), "{line}");
        let back = RecordLine::parse(line.as_bytes()).unwrap();
        assert_eq!(back, trace_line(&r));
        let trace = tidegate_detect::read_str(&line, &tidegate_detect::ReadOptions::strict()).unwrap();
        assert_eq!(trace.len(), 1);
    }
}
