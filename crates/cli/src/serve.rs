//! `tidegate serve`: the server (crates/server, docs/server.md).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use tidegate_server::config::Config;
use tidegate_service::auth::Role;

use crate::data_dir::DataDir;

/// `tidegate serve` flags (they override the config file and the environment).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// TOML configuration file (every key: crates/server/tidegate.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:7878).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    #[command(flatten)]
    pub dir: DataDir,
    /// Keep the catalog and every ledger in memory (tests); nothing survives a restart.
    #[arg(long, conflicts_with = "data_dir")]
    pub memory: bool,
    /// Where the catalog and the ledgers live, as a store URL: `memory:`, `sqlite:DIR`, a
    /// directory, or `postgres://USER@HOST/DB` (the same text `server.store` and
    /// `tidegate.open(...)` take).
    #[arg(long, value_name = "URL", conflicts_with_all = ["data_dir", "memory"])]
    pub store: Option<String>,
    /// This node's id, named by its leases on tenants' PostgreSQL streams (`server.node_id`;
    /// default: the host's name).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Create this tenant with an admin key at start if it does not exist, and print the key
    /// on standard output (`tenant=<name> role=admin key=<key>`).
    #[arg(long, value_name = "TENANT")]
    pub bootstrap_tenant: Option<String>,
    /// Print the OpenAPI document and exit.
    #[arg(long)]
    pub print_openapi: bool,
}

/// Loads the configuration: defaults, file, `TIDEGATE_*` environment, flags.
pub fn config(args: &Args) -> anyhow::Result<Config> {
    let text = match &args.config {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let mut cfg = Config::from_toml_and_env(text.as_deref(), std::env::vars())?;
    if let Some(l) = args.listen {
        cfg.server.listen = l;
    }
    if args.memory {
        cfg.server.memory = true;
    }
    if args.dir.data_dir.is_some() {
        cfg.server.data_dir = args.dir.data_dir.clone();
    }
    if args.store.is_some() {
        cfg.server.store = args.store.clone();
    }
    if args.node_id.is_some() {
        cfg.server.node_id = args.node_id.clone();
    }
    if cfg.server.store.is_none() && !cfg.server.memory && cfg.server.data_dir.is_none() {
        cfg.server.data_dir = Some(args.dir.path()?);
    }
    cfg.validate()?;
    Ok(cfg)
}

/// Runs the server until SIGTERM or SIGINT.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.print_openapi {
        print!("{}", tidegate_server::api::openapi_json());
        return Ok(());
    }
    let cfg = config(&args)?;
    tidegate_server::init_tracing(&cfg.log);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let store = cfg.store_url()?;
        if !store.is_durable() {
            tracing::warn!("{store}: the catalog and every ledger live in memory; nothing survives a restart");
        }
        // Bound first: a node of a cluster registers the address it answers at.
        let listener = tokio::net::TcpListener::bind(cfg.server.listen)
            .await
            .with_context(|| format!("listening on {}", cfg.server.listen))?;
        let addr = listener.local_addr()?;
        let state = tidegate_server::AppState::open_at(cfg.clone(), addr).await?;
        if let Some(name) = &args.bootstrap_tenant
            && state.catalog().tenant(name)?.is_none()
        {
            state.catalog().create_tenant(name)?;
            let (key, _) = state.catalog().create_key(name, Role::Admin, Some("bootstrap"))?;
            println!("tenant={name} role=admin key={}", key.key);
        }
        tracing::info!(%addr, %store, "tidegate serve listening");
        // Tests and supervisors read the bound address from this line.
        println!("listening on {addr}");
        let app = tidegate_server::api::app(state.clone(), axum::Router::new());
        tidegate_server::serve(state, listener, app, shutdown_signal()).await?;
        anyhow::Ok(())
    })
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}
