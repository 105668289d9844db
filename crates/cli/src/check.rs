//! `tidegate check TRACE.jsonl`: the anomaly detectors over a trace file or standard input.
//!
//! Exit status: 0 when the check ran on at least one record (whatever it found); 2 when the
//! input is unusable (it cannot be read, strict mode met a malformed line, or a line has no end
//! within twice `--max-line-bytes`); 3 when nothing in it is readable (no record at all: an
//! empty input, or only blank or malformed lines).

use std::path::PathBuf;
use std::process::ExitCode;

use tidegate_detect::{Error, ReadOptions, check, read_path, read_trace};

/// Exit status: the input could not be used.
const UNUSABLE: u8 = 2;
/// Exit status: the input held no readable record.
const NOTHING_READABLE: u8 = 3;

/// Arguments of `tidegate check`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit status: 0 the check ran (whatever it found); 2 unusable input (unreadable, \
                        strict mode met a malformed line, or a line without end); 3 nothing readable (no record: \
                        empty, or only blank or malformed lines).")]
pub struct Args {
    /// The trace (JSON Lines, one operation record per line); `-` reads standard input.
    trace: PathBuf,
    /// Print one JSON object instead of the readable report.
    #[arg(long)]
    json: bool,
    /// Stop at the first malformed line instead of skipping and counting it.
    #[arg(long)]
    strict: bool,
    /// The longest line accepted, in bytes; a longer one is malformed (and never held in
    /// memory).
    #[arg(long, value_name = "BYTES", default_value_t = ReadOptions::default().max_line_bytes)]
    max_line_bytes: usize,
}

/// Runs the check; see the module docs for the exit status.
pub fn run(args: Args) -> ExitCode {
    let base = if args.strict { ReadOptions::strict() } else { ReadOptions::lenient() };
    if args.max_line_bytes == 0 {
        eprintln!("error: invalid `--max-line-bytes` = 0: expected at least 1 byte");
        return ExitCode::from(UNUSABLE);
    }
    let opts = ReadOptions { max_line_bytes: args.max_line_bytes, ..base };
    let stdin = args.trace.as_os_str() == "-";
    let name = if stdin { "standard input".to_owned() } else { args.trace.display().to_string() };
    let read = if stdin {
        read_trace(std::io::BufReader::with_capacity(1 << 20, std::io::stdin().lock()), &opts)
    } else {
        read_path(&args.trace, &opts)
    };
    let trace = match read {
        Ok(t) => t,
        Err(e @ Error::NothingReadable { .. }) => {
            eprintln!("error: {name}: {e}");
            return ExitCode::from(NOTHING_READABLE);
        }
        Err(e) => {
            eprintln!("error: cannot use {name}: {e}");
            return ExitCode::from(UNUSABLE);
        }
    };
    if trace.is_empty() {
        let stats = trace.stats();
        eprintln!(
            "error: nothing readable in {name}: no operation record in {} lines ({} blank, {} malformed){}",
            stats.lines,
            stats.blank,
            stats.malformed,
            stats.errors.first().map(|e| format!("; first: {e}")).unwrap_or_default()
        );
        return ExitCode::from(NOTHING_READABLE);
    }
    let report = check(&trace);
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    ExitCode::SUCCESS
}
