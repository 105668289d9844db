//! Errors of the trace reader.

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while reading a trace.
///
/// Every variant names the 1-based line of the trace it concerns; variants about a line's
/// content also name the 1-based byte column reported by the JSON parser and, where one can be
/// located, the field (as a path such as `reads[1].time`). In lenient mode (the default) the
/// reader records these errors and skips the line; in strict mode it stops at the first one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The line is not well-formed JSON (or not valid UTF-8, or ends early).
    #[error("line {line}, column {column}: malformed JSON: {message}")]
    Syntax {
        /// 1-based line number in the trace.
        line: u64,
        /// 1-based byte column where the parser gave up.
        column: usize,
        /// What the parser expected, e.g. "expected `,` or `}`".
        message: String,
    },
    /// The line is JSON, but a field has a value of the wrong shape or type.
    #[error("line {line}, column {column}: field `{field}`: {message}")]
    Field {
        /// 1-based line number in the trace.
        line: u64,
        /// 1-based byte column where the offending value ends.
        column: usize,
        /// Path of the offending field, e.g. `reads[0].time`; `(record)` for the line itself.
        field: String,
        /// The value found and what was expected, e.g. `invalid type: string "x", expected u64`.
        message: String,
    },
    /// The record declares a `schema_version` whose major version this reader does not know.
    #[error(
        "line {line}, column {column}: field `schema_version` is {found}, \
         expected major version {supported} (e.g. \"{supported}.0\")"
    )]
    UnsupportedVersion {
        /// 1-based line number in the trace.
        line: u64,
        /// 1-based byte column of the `schema_version` key (0 if it could not be located).
        column: usize,
        /// The version found, as written.
        found: String,
        /// The major version this reader supports.
        supported: u32,
    },
    /// The line is longer than [`crate::ReadOptions::max_line_bytes`]. It was not held in
    /// memory: the reader skipped it to its end (`ended`, a malformed line lenient reading
    /// counts and passes), or found no end within as many bytes again and stopped.
    #[error(
        "line {line} is longer than {limit} bytes (max_line_bytes){}",
        if *ended { "; skipped" } else { ", with no end within as many bytes again: stopped reading (not a JSON Lines trace?)" }
    )]
    LineTooLong {
        /// 1-based line number in the trace.
        line: u64,
        /// The limit in bytes.
        limit: usize,
        /// Whether the line's end was found (so reading could go on after it).
        ended: bool,
    },
    /// Lenient reading gave up: the first lines of the input held no record at all.
    #[error(
        "nothing readable: the first {lines} lines hold no operation record ({malformed} malformed); \
         this does not look like a JSON Lines trace"
    )]
    NothingReadable {
        /// Lines read before giving up.
        lines: u64,
        /// How many of them were malformed.
        malformed: u64,
    },
    /// Reading from the underlying file or stream failed.
    #[error("reading the trace failed after line {line}: {source}")]
    Io {
        /// Number of complete lines read before the failure.
        line: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The 1-based line number the error concerns.
    pub fn line(&self) -> u64 {
        match self {
            Error::Syntax { line, .. }
            | Error::Field { line, .. }
            | Error::UnsupportedVersion { line, .. }
            | Error::LineTooLong { line, .. }
            | Error::Io { line, .. } => *line,
            Error::NothingReadable { lines, .. } => *lines,
        }
    }

    /// The 1-based byte column, for errors about a line's content.
    pub fn column(&self) -> Option<usize> {
        match self {
            Error::Syntax { column, .. } | Error::Field { column, .. } | Error::UnsupportedVersion { column, .. } => {
                Some(*column)
            }
            Error::Io { .. } | Error::LineTooLong { .. } | Error::NothingReadable { .. } => None,
        }
    }

    /// Whether retrying the same read could succeed.
    ///
    /// Malformed content is terminal: the same bytes fail the same way. Only transient I/O
    /// failures (interrupted, timed out, would block) are retryable.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }

    /// Whether the error is about one line's content (so lenient reading may skip the line).
    pub fn is_malformed_line(&self) -> bool {
        match self {
            Error::Io { .. } | Error::NothingReadable { .. } => false,
            Error::LineTooLong { ended, .. } => *ended,
            _ => true,
        }
    }
}
