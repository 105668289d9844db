//! Where the embedded ledger lives.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tidegate_sqlite::{Options, SqliteStore, Verify};

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

    /// Opens the embedded ledger for writing, creating it if there is none. Every row and the
    /// whole hash chain are verified first ([`Verify::Full`]), so a command that appends refuses
    /// a ledger `tidegate ledger verify` would reject.
    pub fn open(&self) -> anyhow::Result<Arc<SqliteStore>> {
        self.open_with(true)
    }

    /// Opens an existing ledger for writing; a missing directory or ledger is an error naming
    /// it.
    pub fn open_existing(&self) -> anyhow::Result<Arc<SqliteStore>> {
        self.open_with(false)
    }

    fn open_with(&self, create: bool) -> anyhow::Result<Arc<SqliteStore>> {
        let dir = self.path()?;
        let opts = Options { verify: Verify::Full, create, ..Options::default() };
        let store =
            SqliteStore::open_with(&dir, opts).with_context(|| format!("opening the ledger in {}", dir.display()))?;
        Ok(Arc::new(store))
    }

    /// Opens the ledger read-only (it changes nothing, works on a read-only directory and
    /// beside a running engine); a missing directory or ledger is an error naming it.
    pub fn open_read_only(&self) -> anyhow::Result<SqliteStore> {
        let dir = self.path()?;
        SqliteStore::open_read_only(&dir).with_context(|| format!("opening the ledger in {} read-only", dir.display()))
    }
}
