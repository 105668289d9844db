//! Where a ledger lives, named by one string that every front door reads the same way: the
//! server (`tidegate serve --store`, `server.store`), the CLI (`--store`, `--data-dir`,
//! `--memory`) and the Python package (`tidegate.open(...)`).
//!
//! | text | store |
//! | --- | --- |
//! | `memory:` | the in-memory store (nothing survives the process) |
//! | `sqlite:DIR`, or a plain path `DIR` | the embedded SQLite ledger in `DIR` (feature `sqlite`) |
//! | `postgres://…`, `postgresql://…` | a ledger stream in PostgreSQL (feature `postgres`; `tidegate-postgres`, docs/postgres.md): stream `default`, or the tenant's name |
//!
//! Any other `scheme:` (a `:` before any `/`, and not a one-letter drive) is refused naming
//! the field and the schemes known. A tenant's ledger is [`StoreUrl::for_tenant`]: the
//! directory `tenants/<name>` below a SQLite directory, the stream `<name>` of a PostgreSQL
//! database, its own in-memory store otherwise.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use tidegate_storage::{LedgerStore, MemoryStore};

use crate::error::{Error, Result};

/// Where a ledger lives (see the module docs for the text form).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// In memory.
    Memory,
    /// The embedded SQLite ledger in this directory.
    Sqlite(PathBuf),
    /// A ledger stream in a PostgreSQL database.
    Postgres {
        /// The database's URL (it may carry a password: `Display` leaves it out).
        url: String,
        /// The stream (`default`, or a tenant's name).
        stream: String,
    },
}

/// A store [`StoreUrl::open`] opened: the contract every engine writes to, and the SQLite
/// handle when it is one (for syncs, stats, backups).
#[derive(Debug, Clone)]
pub struct OpenedStore {
    /// The store.
    pub store: Arc<dyn LedgerStore>,
    /// The same store as the SQLite backend, when it is one.
    #[cfg(feature = "sqlite")]
    pub sqlite: Option<Arc<tidegate_sqlite::SqliteStore>>,
}

const EXPECTED: &str = "`memory:`, `sqlite:DIR`, a directory, or a `postgres://` URL";

impl FromStr for StoreUrl {
    type Err = Error;

    fn from_str(text: &str) -> Result<StoreUrl> {
        let invalid =
            |expected: &'static str| Error::InvalidArgument { field: "store", value: format!("{text:?}"), expected };
        if text.is_empty() {
            return Err(invalid(EXPECTED));
        }
        if text == "memory:" || text == "memory" {
            return Ok(StoreUrl::Memory);
        }
        if let Some(dir) = text.strip_prefix("sqlite://").or_else(|| text.strip_prefix("sqlite:")) {
            if dir.is_empty() {
                return Err(invalid("a directory after `sqlite:` (e.g. `sqlite:/var/lib/tidegate`)"));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(dir)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres { url: text.to_owned(), stream: "default".into() });
        }
        // `scheme:rest` with a scheme of letters, before any path separator: an unknown
        // scheme, not a directory (a one-letter scheme is a Windows drive).
        if let Some((scheme, _)) = text.split_once(':')
            && scheme.len() > 1
            && !scheme.contains(['/', '\\', '.'])
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-')
        {
            return Err(invalid(EXPECTED));
        }
        Ok(StoreUrl::Sqlite(PathBuf::from(text)))
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(dir) => write!(f, "sqlite:{}", dir.display()),
            // The URL may carry a password: show only where it goes.
            StoreUrl::Postgres { url, stream } => {
                let host = url.split_once('@').map_or(url.as_str(), |(_, h)| h);
                let host =
                    host.strip_prefix("postgres://").or_else(|| host.strip_prefix("postgresql://")).unwrap_or(host);
                write!(f, "postgres://…@{host} (stream {stream})")
            }
        }
    }
}

impl StoreUrl {
    /// The embedded SQLite ledger in `dir`.
    pub fn sqlite(dir: impl Into<PathBuf>) -> StoreUrl {
        StoreUrl::Sqlite(dir.into())
    }

    /// Whether what it holds survives the process.
    pub fn is_durable(&self) -> bool {
        !matches!(self, StoreUrl::Memory)
    }

    /// The directory of a SQLite ledger.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            StoreUrl::Sqlite(d) => Some(d),
            _ => None,
        }
    }

    /// Where tenant `name`'s ledger lives: `DIR/tenants/<name>` for a SQLite directory, the
    /// stream `<name>` in PostgreSQL, its own in-memory store in memory.
    pub fn for_tenant(&self, name: &str) -> StoreUrl {
        match self {
            StoreUrl::Memory => StoreUrl::Memory,
            StoreUrl::Sqlite(dir) => StoreUrl::Sqlite(dir.join("tenants").join(name)),
            StoreUrl::Postgres { url, .. } => StoreUrl::Postgres { url: url.clone(), stream: name.to_owned() },
        }
    }

    /// Opens the ledger, creating it (and its directory) if there is none.
    pub fn open(&self) -> Result<OpenedStore> {
        self.open_owned(None)
    }

    /// Opens the ledger for `owner` (a node id and the lease it holds a PostgreSQL stream
    /// under: `PgStore::open_leased`, refused with `StoreError::Leased` while another node's
    /// lease runs). Stores without leases ignore `owner` (the SQLite directory lock already
    /// admits one owner).
    pub fn open_owned(&self, owner: Option<(&str, std::time::Duration)>) -> Result<OpenedStore> {
        #[cfg(not(feature = "postgres"))]
        let _ = owner;
        match self {
            StoreUrl::Memory => Ok(OpenedStore {
                store: Arc::new(MemoryStore::new()),
                #[cfg(feature = "sqlite")]
                sqlite: None,
            }),
            #[cfg(feature = "sqlite")]
            StoreUrl::Sqlite(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| {
                    Error::Store(tidegate_storage::StoreError::Io { op: "create the ledger directory", source })
                })?;
                let s = Arc::new(tidegate_sqlite::SqliteStore::open(dir).map_err(Error::Store)?);
                Ok(OpenedStore { store: s.clone(), sqlite: Some(s) })
            }
            #[cfg(not(feature = "sqlite"))]
            StoreUrl::Sqlite(dir) => Err(Error::InvalidArgument {
                field: "store",
                value: format!("sqlite:{}", dir.display()),
                expected: "a store this build has (the runtime was built without its `sqlite` feature)",
            }),
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres { url, stream } => {
                let store = match owner {
                    Some((node, lease)) => tidegate_postgres::PgStore::open_leased(url, stream, node, lease),
                    None => tidegate_postgres::PgStore::open(url, stream),
                };
                Ok(OpenedStore {
                    store: Arc::new(store.map_err(Error::Store)?),
                    #[cfg(feature = "sqlite")]
                    sqlite: None,
                })
            }
            #[cfg(not(feature = "postgres"))]
            StoreUrl::Postgres { .. } => Err(Error::InvalidArgument {
                field: "store",
                value: self.to_string(),
                expected: "a store this build has (the runtime was built without its `postgres` feature)",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_front_door_reads_a_store_the_same_way() {
        let p = |s: &str| s.parse::<StoreUrl>();
        assert_eq!(p("memory:").ok(), Some(StoreUrl::Memory));
        assert_eq!(p("sqlite:/var/lib/tg").ok(), Some(StoreUrl::sqlite("/var/lib/tg")));
        assert_eq!(p("sqlite:///var/lib/tg").ok(), Some(StoreUrl::sqlite("/var/lib/tg")));
        assert_eq!(p("data/ledgers").ok(), Some(StoreUrl::sqlite("data/ledgers")));
        assert_eq!(p("./a:b").ok(), Some(StoreUrl::sqlite("./a:b")));
        assert_eq!(p("C:/tg").ok(), Some(StoreUrl::sqlite("C:/tg")));
        assert!(
            matches!(p("postgres://u:secret@db:5432/tg"), Ok(StoreUrl::Postgres { stream, .. }) if stream == "default")
        );
        for bad in ["", "sqlite:", "mysql://x", "redis:6379"] {
            match p(bad) {
                Err(Error::InvalidArgument { field: "store", .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_postgres_url_is_shown_without_its_password() {
        let u: StoreUrl = "postgres://tidegate:secret@db.internal:5432/tg".parse().unwrap_or(StoreUrl::Memory);
        assert_eq!(u.to_string(), "postgres://…@db.internal:5432/tg (stream default)");
        assert_eq!(u.for_tenant("acme").to_string(), "postgres://…@db.internal:5432/tg (stream acme)");
        // An unreachable database: the error names the place, never the password.
        let u: StoreUrl =
            "postgres://tidegate:secret@127.0.0.1:1/tg?connect_timeout=2".parse().unwrap_or(StoreUrl::Memory);
        match u.open() {
            Err(e) => assert!(!e.to_string().contains("secret"), "{e}"),
            Ok(_) => panic!("opened a database on port 1"),
        }
    }

    #[test]
    fn a_tenants_ledger_is_below_the_directory() {
        assert_eq!(StoreUrl::sqlite("/d").for_tenant("acme"), StoreUrl::sqlite("/d/tenants/acme"));
        assert_eq!(StoreUrl::Memory.for_tenant("acme"), StoreUrl::Memory);
    }
}
