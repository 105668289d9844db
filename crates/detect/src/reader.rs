//! Streaming reader: one line at a time from any `BufRead`, straight into a [`TraceBuilder`].
//!
//! Memory stays proportional to the interned trace, never to the file: each line is parsed
//! from a reused buffer and its strings are interned before the next line is read.

use crate::build::TraceBuilder;
use crate::error::{Error, Result};
use crate::trace::Trace;
use crate::wire::{RecordLine, SchemaVersion};
use std::io::BufRead;
use std::path::Path;

/// How to read a trace.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Stop at the first malformed line with its error (default `false`: skip malformed
    /// lines, count them and keep the first [`ReadOptions::max_errors_kept`] errors).
    pub strict: bool,
    /// Read string values equal to this as `null` (default `None`). The paper's reference
    /// runtime writes its sentinel as `"NULL"`; pass `Some("NULL".into())` for its traces.
    pub null_string: Option<String>,
    /// How many malformed-line errors to keep in [`crate::ReadStats::errors`] (default 100);
    /// all of them are counted regardless.
    pub max_errors_kept: usize,
    /// [`read_path`] reads files at least this large as two halves on two threads
    /// (default 16 MiB; `u64::MAX` disables it). The result does not depend on it.
    pub split_threshold: u64,
    /// The longest line accepted, in bytes (default 64 MiB). A longer line is malformed
    /// ([`Error::LineTooLong`]) and is never held in memory: the reader skips it to its end, and
    /// stops with an error if no end comes within as many bytes again.
    pub max_line_bytes: usize,
    /// Lenient reading gives up with [`Error::NothingReadable`] when this many lines from the
    /// start of the input were malformed before any record was read (default 10 000), so an
    /// input that is not a trace at all (`/dev/urandom`) ends instead of being skipped forever.
    pub give_up_after_malformed: u64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            strict: false,
            null_string: None,
            max_errors_kept: 100,
            split_threshold: 16 << 20,
            max_line_bytes: 64 << 20,
            give_up_after_malformed: 10_000,
        }
    }
}

impl ReadOptions {
    /// Lenient reading (the default): malformed lines are skipped and counted.
    pub fn lenient() -> Self {
        Self::default()
    }
    /// Strict reading: the first malformed line is an error.
    pub fn strict() -> Self {
        ReadOptions { strict: true, ..Self::default() }
    }
}

/// Reads a whole trace from a buffered reader. A UTF-8 byte-order mark at the start is
/// skipped.
///
/// Errors: in strict mode the first malformed line ([`Error::Syntax`], [`Error::Field`],
/// [`Error::UnsupportedVersion`], [`Error::LineTooLong`]); in any mode an I/O failure
/// ([`Error::Io`]), a line with no end in sight ([`Error::LineTooLong`] with `ended: false`),
/// and, leniently, an input whose first lines hold no record ([`Error::NothingReadable`]).
pub fn read_trace<R: BufRead>(input: R, opts: &ReadOptions) -> Result<Trace> {
    read_from(input, opts, true)
}

/// What [`next_line`] found.
enum Line {
    Eof,
    /// A line (possibly without its final newline) is in the buffer.
    Read,
    /// A line longer than the limit, skipped; `ended` says whether its end was found.
    TooLong {
        ended: bool,
    },
}

/// Reads the next line into `buf` (cleared first), holding at most `max` bytes of it: a longer
/// line is consumed in chunks without being kept, up to `max` more bytes.
fn next_line<R: BufRead>(input: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Line> {
    buf.clear();
    let mut skipped: Option<usize> = None;
    let mut any = false;
    loop {
        let available = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(match (skipped, any) {
                (Some(_), _) => Line::TooLong { ended: true },
                (None, false) => Line::Eof,
                (None, true) => Line::Read,
            });
        }
        any = true;
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        match &mut skipped {
            None if buf.len() + chunk <= max.saturating_add(1) => buf.extend_from_slice(&available[..chunk]),
            None => {
                skipped = Some(buf.len() + chunk);
                *buf = Vec::new();
            }
            Some(n) => *n += chunk,
        }
        input.consume(chunk);
        if done {
            return Ok(if skipped.is_some() { Line::TooLong { ended: true } } else { Line::Read });
        }
        if skipped.is_some_and(|n| n > max.saturating_mul(2)) {
            return Ok(Line::TooLong { ended: false });
        }
    }
}

fn read_from<R: BufRead>(mut input: R, opts: &ReadOptions, at_start: bool) -> Result<Trace> {
    let mut builder = TraceBuilder::new().null_string(opts.null_string.clone());
    let mut buf = Vec::with_capacity(4096);
    let mut line_no: u64 = 0;
    let max = opts.max_line_bytes.max(1);
    loop {
        let got = next_line(&mut input, &mut buf, max).map_err(|source| Error::Io { line: line_no, source })?;
        let outcome = match got {
            Line::Eof => break,
            Line::Read => {
                line_no += 1;
                builder.stats_mut().lines += 1;
                let mut line = &buf[..];
                if at_start && line_no == 1 {
                    line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
                }
                // The newline is not part of the line; a line that still exceeds the limit
                // (it ended exactly at the buffer's edge) is too long.
                let content = line.strip_suffix(b"\n").unwrap_or(line);
                if content.len() > max {
                    Err(Error::LineTooLong { line: line_no, limit: max, ended: true })
                } else {
                    push_line(&mut builder, line_no, line)
                }
            }
            Line::TooLong { ended } => {
                line_no += 1;
                builder.stats_mut().lines += 1;
                let e = Error::LineTooLong { line: line_no, limit: max, ended };
                if !ended {
                    return Err(e); // no end in sight: nothing after it can be read
                }
                Err(e)
            }
        };
        if let Err(err) = outcome {
            if opts.strict {
                return Err(err);
            }
            let stats = builder.stats_mut();
            stats.malformed += 1;
            if stats.errors.len() < opts.max_errors_kept {
                stats.errors.push(err);
            }
            if at_start && builder.is_empty() && builder.stats_mut().malformed >= opts.give_up_after_malformed.max(1) {
                let stats = builder.stats_mut();
                return Err(Error::NothingReadable { lines: stats.lines, malformed: stats.malformed });
            }
        }
    }
    Ok(builder.finish())
}

/// Reads a trace file (see [`read_trace`]).
///
/// Files of [`ReadOptions::split_threshold`] bytes or more are read as two halves on two
/// threads (split at a line boundary) whose traces are then merged; the result is the same
/// as reading sequentially.
pub fn read_path(path: impl AsRef<Path>, opts: &ReadOptions) -> Result<Trace> {
    let path = path.as_ref();
    let io = |source| Error::Io { line: 0, source };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if size < opts.split_threshold || size == 0 || threads < 2 {
        return read_trace(std::io::BufReader::with_capacity(1 << 20, file), opts);
    }
    let split = line_boundary_after(&mut file, size / 2).map_err(io)?;
    let open_at = |at: u64| -> std::io::Result<std::io::BufReader<std::fs::File>> {
        use std::io::{Seek, SeekFrom};
        let mut f = std::fs::File::open(path)?;
        f.seek(SeekFrom::Start(at))?;
        Ok(std::io::BufReader::with_capacity(1 << 20, f))
    };
    let first = open_at(0).map_err(io)?;
    let second = open_at(split).map_err(io)?;
    let (a, b) = std::thread::scope(|s| {
        let tail = s.spawn(|| read_from(second, opts, false));
        let head = read_trace(std::io::Read::take(first, split), opts);
        (head, tail.join())
    });
    let mut head = a?;
    let tail = match b {
        Ok(result) => result.map_err(|e| e.shift_line(head.stats.lines))?,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    head.append(tail, opts.max_errors_kept);
    Ok(head)
}

/// The offset just past the first newline at or after `at` (or the end of the file).
fn line_boundary_after(file: &mut std::fs::File, at: u64) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(at))?;
    let mut reader = std::io::BufReader::new(file);
    let mut skipped = Vec::new();
    let n = reader.read_until(b'\n', &mut skipped)?;
    Ok(at + n as u64)
}

/// Reads a trace held in memory (see [`read_trace`]).
pub fn read_str(text: &str, opts: &ReadOptions) -> Result<Trace> {
    read_trace(text.as_bytes(), opts)
}

/// Parses one line and adds it to `builder`. Blank lines are counted and ignored.
pub(crate) fn push_line(builder: &mut TraceBuilder, line_no: u64, raw: &[u8]) -> Result<()> {
    let mut line = raw;
    while let Some((last, rest)) = line.split_last() {
        if matches!(last, b'\n' | b'\r') {
            line = rest;
        } else {
            break;
        }
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        builder.stats_mut().blank += 1;
        return Ok(());
    }
    // serde would also accept a JSON array as a struct (positionally); a record is an object.
    if let Some(pos) = line.iter().position(|b| !b.is_ascii_whitespace())
        && line[pos] != b'{'
    {
        let found = String::from_utf8_lossy(&line[pos..line.len().min(pos + 20)]).into_owned();
        return Err(Error::Field {
            line: line_no,
            column: pos + 1,
            field: "(record)".to_owned(),
            message: format!("expected a JSON object, found `{found}`"),
        });
    }
    let rec = RecordLine::parse(line).map_err(|e| json_error(line_no, line, &e))?;
    if let Some(v) = rec.schema_version
        && v.major != SchemaVersion::CURRENT.major
    {
        return Err(Error::UnsupportedVersion {
            line: line_no,
            column: find_key(line, "schema_version").map_or(0, |c| c + 1),
            found: v.to_string(),
            supported: SchemaVersion::CURRENT.major,
        });
    }
    builder.push(line_no, &rec);
    Ok(())
}

fn json_error(line_no: u64, line: &[u8], e: &serde_json::Error) -> Error {
    let column = e.column();
    let full = e.to_string();
    let message = match full.rfind(" at line ") {
        Some(i) => full[..i].to_owned(),
        None => full,
    };
    match e.classify() {
        serde_json::error::Category::Data => {
            // A missing field is reported where its object ends: name that object, not the
            // last field it does have. (Regression, issue 11: `reads[0].value: missing field
            // cell` pointed one step too deep.)
            let object = message.starts_with("missing field");
            let field = field_path_at(line, column.saturating_sub(1), object);
            let field = if field.is_empty() { "(record)".to_owned() } else { field };
            Error::Field { line: line_no, column, field, message }
        }
        _ => Error::Syntax { line: line_no, column, message },
    }
}

fn find_key(line: &[u8], key: &str) -> Option<usize> {
    let pat = format!("\"{key}\"");
    line.windows(pat.len()).position(|w| w == pat.as_bytes())
}

/// The JSON path (`reads[1].time`) of the value being parsed at byte offset `at` of `line`;
/// with `object`, the path of the innermost object open there (`reads[1]`).
///
/// A small scanner that tracks the stack of open objects (with their current key) and arrays
/// (with their current index); used only to name the field of an error.
pub(crate) fn field_path_at(line: &[u8], at: usize, object: bool) -> String {
    enum Frame {
        Obj { key: Option<String>, in_key: bool },
        Arr { index: usize },
    }
    let mut stack: Vec<Frame> = Vec::new();
    let end = at.min(line.len());
    let mut i = 0;
    while i < end {
        match line[i] {
            b'{' => stack.push(Frame::Obj { key: None, in_key: true }),
            b'[' => stack.push(Frame::Arr { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b':' => {
                if let Some(Frame::Obj { in_key, .. }) = stack.last_mut() {
                    *in_key = false;
                }
            }
            b',' => match stack.last_mut() {
                Some(Frame::Obj { key, in_key }) => {
                    *in_key = true;
                    *key = None;
                }
                Some(Frame::Arr { index }) => *index += 1,
                None => {}
            },
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < line.len() && line[j] != b'"' {
                    j += if line[j] == b'\\' { 2 } else { 1 };
                }
                if let Some(Frame::Obj { key, in_key: true }) = stack.last_mut() {
                    let raw = &line[start..j.min(line.len())];
                    *key = Some(String::from_utf8_lossy(raw).into_owned());
                }
                i = j;
            }
            _ => {}
        }
        i += 1;
    }
    if object && let Some(Frame::Obj { key, .. }) = stack.last_mut() {
        *key = None;
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Obj { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Obj { key: None, .. } => {}
            Frame::Arr { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::field_path_at;

    #[test]
    fn field_path_names_nested_array_fields() {
        let line = br#"{"tx":"a","reads":[{"cell":"c","time":1},{"cell":"d","time":"x"}]}"#;
        let at = line.windows(3).position(|w| w == b"\"x\"").unwrap_or(0) + 3;
        assert_eq!(field_path_at(line, at, false), "reads[1].time");
        assert_eq!(field_path_at(line, 7, false), "tx");
        assert_eq!(field_path_at(line, at, true), "reads[1]");
        assert_eq!(field_path_at(line, 7, true), "");
    }
}
