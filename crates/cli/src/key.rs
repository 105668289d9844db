//! `tidegate key create|revoke|list`: API keys in the server's catalog (works while it runs;
//! the server sees a revocation within `auth.cache_ttl_ms`).

use anyhow::Context;
use tidegate_service::auth::Role;
use tidegate_service::catalog::{Catalog, SqliteCatalog};

use crate::data_dir::DataDir;

/// Key subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Create a key; it is printed this once (only its hash is stored).
    Create {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// agent, reviewer, operator or admin.
        #[arg(long)]
        role: String,
        /// A label for people.
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        dir: DataDir,
    },
    /// Revoke a key (`key_<id>` or `<id>`).
    Revoke {
        /// The key's id.
        id: String,
        #[command(flatten)]
        dir: DataDir,
    },
    /// List keys (ids, roles, labels; never secrets).
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        dir: DataDir,
        /// JSON Lines instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create { tenant, role, label, dir } => {
            let role: Role = role.parse().map_err(anyhow::Error::msg).context("--role")?;
            let cat = SqliteCatalog::open(&dir.path()?)?;
            let (key, rec) = cat.create_key(&tenant, role, label.as_deref())?;
            eprintln!("created key_{} ({} of tenant {}); it is shown only now:", rec.id, rec.role, rec.tenant);
            println!("{}", key.key);
        }
        Cmd::Revoke { id, dir } => {
            let raw = id.strip_prefix("key_").unwrap_or(&id);
            let cat = SqliteCatalog::open(&dir.path()?)?;
            let rec = cat.revoke_key(raw, None)?;
            println!("revoked key_{} ({} of tenant {})", rec.id, rec.role, rec.tenant);
        }
        Cmd::List { tenant, dir, json } => {
            let cat = SqliteCatalog::open(&dir.path()?)?;
            for k in cat.keys(tenant.as_deref())? {
                if json {
                    println!("{}", serde_json::to_string(&k)?);
                } else {
                    let state = if k.revoked_at_ms.is_some() { "revoked" } else { "active" };
                    println!(
                        "key_{}  {:<8} {:<24} {:<7} {}",
                        k.id,
                        k.role,
                        k.tenant,
                        state,
                        k.label.as_deref().unwrap_or("")
                    );
                }
            }
        }
    }
    Ok(())
}
