//! `tidegate-mcp`: the MCP gateway's command (also reached as `tidegate mcp`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tidegate_mcp::policy::{Transport, UpstreamSpec};
use tidegate_mcp::{Gateway, Policy, serve};

#[derive(Parser)]
#[command(
    name = "tidegate-mcp",
    version,
    about = "Tidegate as an MCP gateway: transactions around any MCP server's tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serves the agent: over stdio (default), or Streamable HTTP at http://ADDR/mcp.
    Serve {
        /// The policy file (TOML; docs/mcp.md).
        #[arg(long)]
        policy: PathBuf,
        /// Serve Streamable HTTP on this address (127.0.0.1:PORT) instead of stdio.
        #[arg(long)]
        http: Option<String>,
    },
    /// Starts the upstreams, checks the policy against their tools, prints the report, exits.
    Check {
        /// The policy file.
        #[arg(long)]
        policy: PathBuf,
    },
    /// Prints a starter policy for an upstream started with COMMAND ARGS... over stdio.
    Init {
        /// The upstream's name in the policy.
        #[arg(long, default_value = "upstream")]
        name: String,
        /// The upstream's command and arguments (after `--`).
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // stdout is the protocol: everything else goes to stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TIDEGATE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn start(policy: &std::path::Path) -> anyhow::Result<std::sync::Arc<Gateway>> {
    let policy = Policy::load(policy)?;
    let gw = Gateway::start(policy).await?;
    for line in &gw.report {
        eprintln!("tidegate-mcp: {line}");
    }
    Ok(gw)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { policy, http } => {
            let gw = start(&policy).await?;
            match http {
                None => serve::stdio(gw).await?,
                Some(addr) => {
                    let listener = tokio::net::TcpListener::bind(&addr)
                        .await
                        .map_err(|e| anyhow::anyhow!("--http {addr:?}: cannot listen: {e}"))?;
                    let bound = listener.local_addr()?;
                    eprintln!("tidegate-mcp: serving http://{bound}/mcp");
                    serve::http(gw, listener, shutdown()).await?;
                }
            }
        }
        Command::Check { policy } => {
            let gw = Gateway::start_checking(Policy::load(&policy)?).await?;
            for line in &gw.report {
                eprintln!("tidegate-mcp: {line}");
            }
            for e in &gw.exposed().exposed {
                let what = match &e.kind {
                    tidegate_mcp::gateway::Kind::Read { .. } => "read".to_string(),
                    tidegate_mcp::gateway::Kind::Refused(_) => "refused".to_string(),
                    tidegate_mcp::gateway::Kind::Effect(t) => t.class.as_str().to_string(),
                };
                println!("{}\t{}\t{what}", gw.upstreams[e.upstream].name, e.name);
            }
            gw.shutdown().await;
        }
        Command::Init { name, command } => {
            let (program, args) = command.split_first().ok_or_else(|| anyhow::anyhow!("COMMAND is required"))?;
            let spec = UpstreamSpec {
                name,
                transport: Transport::Stdio {
                    command: program.clone(),
                    args: args.to_vec(),
                    env: Default::default(),
                    cwd: None,
                },
            };
            print!("{}", tidegate_mcp::init::starter(&spec).await?);
        }
    }
    Ok(())
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
