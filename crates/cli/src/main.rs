//! The `tidegate` command.

mod bench;
mod check;
mod demo;

use clap::{Parser, Subcommand};

/// Tidegate: transactions for the side effects of AI agents.
#[derive(Debug, Parser)]
#[command(name = "tidegate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the travel-booking story: a commit, an abort, and two agents racing.
    Demo,
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
    /// Check a JSON Lines operation-record trace for anomalies A1-A6 and conflict cycles.
    Check(check::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => demo::run(),
        Command::Bench { which } => bench::run(which),
        Command::Check(args) => return check::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
