//! `tidegate tenant create|list`: tenants in the server's catalog (works while it runs).

use tidegate_service::catalog::{Catalog, SqliteCatalog};

use crate::data_dir::DataDir;

/// Tenant subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Create a tenant (its ledger is created when the server first opens it).
    Create {
        /// The name: 1-63 of a-z 0-9 _ -, starting with a letter or digit.
        name: String,
        #[command(flatten)]
        dir: DataDir,
    },
    /// List tenants.
    List {
        #[command(flatten)]
        dir: DataDir,
        /// JSON Lines instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create { name, dir } => {
            let cat = SqliteCatalog::open(&dir.path()?)?;
            let t = cat.create_tenant(&name)?;
            println!("created tenant {} (id tag {})", t.name, t.tag);
            println!("next: tidegate key create --tenant {} --role admin", t.name);
        }
        Cmd::List { dir, json } => {
            let cat = SqliteCatalog::open(&dir.path()?)?;
            for t in cat.tenants()? {
                if json {
                    println!("{}", serde_json::to_string(&t)?);
                } else {
                    println!("{:<32} tag {}  created {}", t.name, t.tag, t.created_at_ms);
                }
            }
        }
    }
    Ok(())
}
