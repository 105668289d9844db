//! The `tidegate` command.

mod bench;
mod bench_detect;
mod bench_plans;
mod bench_review;
mod check;
mod data_dir;
mod demo;
mod eval;
mod key;
mod ledger;
mod plans;
mod review;
mod serve;
mod tenant;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc (docs/performance.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    Demo {
        #[command(flatten)]
        dir: data_dir::DataDir,
        /// Keep the ledger in memory instead of the embedded store.
        #[arg(long, conflicts_with = "data_dir")]
        memory: bool,
        /// Where the ledger lives, as a store URL: `memory:`, `sqlite:DIR`, a directory, or
        /// `postgres://USER@HOST/DB` (its stream `default`; the text `tidegate serve --store`
        /// and `tidegate.open(...)` take).
        #[arg(long, value_name = "URL", conflicts_with_all = ["data_dir", "memory"])]
        store: Option<String>,
        /// Write one operation record per transaction to FILE (JSON Lines; `tidegate check
        /// FILE` reads it).
        #[arg(long, value_name = "FILE")]
        trace: Option<std::path::PathBuf>,
        /// Consistency level L0-L4 (default L4).
        #[arg(long)]
        level: Option<tidegate_runtime::Level>,
    },
    /// Inspect, verify, export or summarise the embedded ledger.
    Ledger {
        #[command(subcommand)]
        cmd: ledger::Cmd,
    },
    /// Benchmarks.
    #[cfg_attr(
        not(feature = "eval"),
        command(after_help = "The evaluation workloads (contention, speculation, irreversible, recovery, stress, \
                              annotations, all) need the evaluation harness: build with `cargo build --release -p \
                              tidegate --features eval`.")
    )]
    Bench {
        #[command(subcommand)]
        which: eval::BenchCmd,
    },
    /// Check a JSON Lines operation-record trace for anomalies A1-A6 and conflict cycles.
    Check(check::Args),
    /// Run the server: the HTTP API, tenants, workers (docs/server.md).
    Serve(serve::Args),
    /// Tenants in the server's catalog.
    Tenant {
        #[command(subcommand)]
        cmd: tenant::Cmd,
    },
    /// API keys in the server's catalog.
    Key {
        #[command(subcommand)]
        cmd: key::Cmd,
    },
    /// Plans on a running server: list, show, signal a failure, resolve a stuck plan
    /// (docs/plans.md).
    Plans {
        #[command(flatten)]
        conn: review::Conn,
        #[command(subcommand)]
        cmd: plans::Cmd,
    },
    /// The MCP gateway (docs/mcp.md): runs `tidegate-mcp` with these arguments. It is its own
    /// binary so that this one stays small: `cargo build --release -p tidegate-mcp`.
    #[command(disable_help_flag = true)]
    Mcp {
        /// Arguments for `tidegate-mcp` (`serve --policy FILE`, `check`, `init`, `--help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Review LLM-generated database transactions on a running server (docs/review.md).
    Review {
        #[command(flatten)]
        conn: review::Conn,
        #[command(subcommand)]
        cmd: review::Cmd,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { dir, memory, store, trace, level } => demo::store_url(&dir, memory, store.as_deref())
            .and_then(|url| demo::run(url, demo::DemoOptions { trace, level })),
        Command::Ledger { cmd } => ledger::run(cmd),
        Command::Bench { which } => eval::run(which),
        Command::Check(args) => return check::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Tenant { cmd } => tenant::run(cmd),
        Command::Key { cmd } => key::run(cmd),
        Command::Review { conn, cmd } => review::run(conn, cmd),
        Command::Plans { conn, cmd } => plans::run(conn, cmd),
        Command::Mcp { args } => return mcp(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", render_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `tidegate mcp ARGS`: runs `tidegate-mcp ARGS` (beside this binary, else on `PATH`) with
/// this process's stdin, stdout and stderr, and exits with its status.
fn mcp(args: &[String]) -> std::process::ExitCode {
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("tidegate-mcp")));
    let program =
        beside.filter(|p| p.is_file()).map(std::path::PathBuf::into_os_string).unwrap_or_else(|| "tidegate-mcp".into());
    match std::process::Command::new(&program).args(args).status() {
        Ok(status) => std::process::ExitCode::from(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1))),
        Err(e) => {
            eprintln!(
                "error: cannot run `tidegate-mcp` ({e}); the MCP gateway is its own binary: build it with \
                 `cargo build --release -p tidegate-mcp` (it is then found beside `tidegate`)"
            );
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each cause once: a library error whose message
/// already quotes its source is not followed by that source again.
fn render_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
