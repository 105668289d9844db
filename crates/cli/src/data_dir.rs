//! Where the embedded ledger lives.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tidegate_sqlite::SqliteStore;

/// `--data-dir`, shared by every command that opens the embedded ledger.
#[derive(Debug, Clone, clap::Args)]
pub struct DataDir {
    /// The data directory of the embedded ledger. Default: `$TIDEGATE_DATA_DIR`, else
    /// `$XDG_DATA_HOME/tidegate`, else `~/.local/share/tidegate`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

impl DataDir {
    /// The directory to use.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.data_dir {
            return Ok(p.clone());
        }
        if let Some(p) = std::env::var_os("TIDEGATE_DATA_DIR") {
            return Ok(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os("XDG_DATA_HOME").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p).join("tidegate"));
        }
        let home = std::env::var_os("HOME")
            .context("no --data-dir given and neither TIDEGATE_DATA_DIR, XDG_DATA_HOME nor HOME is set")?;
        Ok(PathBuf::from(home).join(".local/share/tidegate"))
    }

    /// Opens the embedded ledger.
    pub fn open(&self) -> anyhow::Result<Arc<SqliteStore>> {
        let dir = self.path()?;
        let store = SqliteStore::open(&dir).with_context(|| format!("opening the ledger in {}", dir.display()))?;
        Ok(Arc::new(store))
    }
}
