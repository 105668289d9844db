//! `tidegate check TRACE.jsonl`: the anomaly detectors over a trace file.

use std::path::PathBuf;
use std::process::ExitCode;

use tidegate_detect::{ReadOptions, check, read_path};

/// Arguments of `tidegate check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace (JSON Lines, one operation record per line).
    trace: PathBuf,
    /// Print one JSON object instead of the readable report.
    #[arg(long)]
    json: bool,
    /// Stop at the first malformed line instead of skipping and counting it.
    #[arg(long)]
    strict: bool,
}

/// Exit status 0 when the check ran (whatever it found), 2 on unusable input.
pub fn run(args: Args) -> ExitCode {
    let opts = if args.strict { ReadOptions::strict() } else { ReadOptions::lenient() };
    let trace = match read_path(&args.trace, &opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot use {}: {e}", args.trace.display());
            return ExitCode::from(2);
        }
    };
    let report = check(&trace);
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    ExitCode::SUCCESS
}
