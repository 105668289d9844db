//! The catalog: tenants, API keys, and each tenant's tool and capability definitions, in one
//! SQLite file (`DATA/catalog.db`, WAL) shared by the server and the `tidegate tenant|key`
//! commands, or in memory.
//!
//! ```text
//!   tenants(name PK, tag UNIQUE, created_at_ms)
//!   keys(id PK, tenant → tenants, role, hash BLOB(32), label, created_at_ms, revoked_at_ms?)
//!   tools(tenant, name, def JSON, removed, updated_at_ms)        PK (tenant, name)
//!   capabilities(tenant, name, spec JSON, updated_at_ms)         PK (tenant, name)
//! ```
//!
//! Schema version: `PRAGMA user_version` = [`SCHEMA_VERSION`]; a newer one is refused. The
//! same catalog in PostgreSQL, shared by the nodes of a deployment, is
//! [`crate::catalog_postgres::PgCatalog`].

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rand::RngCore;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::auth::{NewKey, Role, generate_key};
use crate::error::{Result, ServiceError};
use crate::registry::{CapabilitySpec, ToolDef};

/// The catalog schema version this build writes.
pub const SCHEMA_VERSION: i64 = 1;

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantRecord {
    /// The name.
    pub name: String,
    /// The tag every public id of the tenant carries.
    pub tag: String,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: i64,
}

/// An API key as the catalog keeps it (no secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRecord {
    /// The lookup id (16 hex digits).
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its role.
    pub role: Role,
    /// `SHA-256(secret)`.
    #[serde(skip)]
    pub hash: Vec<u8>,
    /// A label for people.
    pub label: Option<String>,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: i64,
    /// Revocation time, if revoked.
    pub revoked_at_ms: Option<i64>,
}

/// A tool definition with its catalog state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTool {
    /// Its name.
    pub name: String,
    /// Its definition.
    pub def: ToolDef,
    /// Removed from the registry (kept so that its recorded effects can still settle after
    /// a restart).
    pub removed: bool,
}

/// The catalog of a node: tenants, API keys (hashed), and each tenant's tool and capability
/// definitions. What must outlive the process and be shared by every node that may serve a
/// tenant lives here.
///
/// Contract (every implementation):
/// * Tenant names are `[a-z0-9][a-z0-9_-]{0,62}` ([`valid_tenant_name`]); a tenant's tag is 8
///   random hex digits, fixed at creation and unique.
/// * A key's secret is never stored: only its SHA-256; [`Catalog::create_key`] returns the
///   whole key once.
/// * Writes are atomic and durable when the call returns; a busy store answers a retryable
///   [`ServiceError`] (`Catalog` with a busy or locked cause).
/// * Reads return what the last returned write left (one catalog, many readers).
pub trait Catalog: Send + Sync + std::fmt::Debug {
    /// Where it lives (a file, `:memory:`), for messages.
    fn path(&self) -> &Path;
    /// Answers a trivial query (readiness).
    fn ping(&self) -> Result<()>;
    /// Creates a tenant with a fresh random tag.
    fn create_tenant(&self, name: &str) -> Result<TenantRecord>;
    /// Every tenant, by name.
    fn tenants(&self) -> Result<Vec<TenantRecord>>;
    /// One tenant.
    fn tenant(&self, name: &str) -> Result<Option<TenantRecord>>;
    /// Creates a key for `tenant` with `role`; the whole key is returned only here.
    fn create_key(&self, tenant: &str, role: Role, label: Option<&str>) -> Result<(NewKey, KeyRecord)>;
    /// A key by id (revoked ones too).
    fn key(&self, id: &str) -> Result<Option<KeyRecord>>;
    /// Every key, or a tenant's.
    fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>>;
    /// Revokes a key (of `tenant`, if given); revoking twice keeps the first time.
    fn revoke_key(&self, id: &str, tenant: Option<&str>) -> Result<KeyRecord>;
    /// Defines or redefines a tool of `tenant`.
    fn put_tool(&self, tenant: &str, name: &str, def: &ToolDef) -> Result<()>;
    /// Marks a tool removed (kept for its recorded effects). Returns whether it was there.
    fn remove_tool(&self, tenant: &str, name: &str) -> Result<bool>;
    /// A tenant's tools, removed ones included.
    fn tools(&self, tenant: &str) -> Result<Vec<StoredTool>>;
    /// Adds or replaces a capability of `tenant`.
    fn put_capability(&self, tenant: &str, name: &str, spec: &CapabilitySpec) -> Result<()>;
    /// Deletes a capability. Returns whether it was there.
    fn delete_capability(&self, tenant: &str, name: &str) -> Result<bool>;
    /// A tenant's capabilities, by name.
    fn capabilities(&self, tenant: &str) -> Result<Vec<(String, CapabilitySpec)>>;
}

/// The catalog on SQLite (`catalog.db` in the data directory, WAL), or in memory.
#[derive(Debug)]
pub struct SqliteCatalog {
    conn: Mutex<Connection>,
    path: PathBuf,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether `name` is a valid tenant name: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn valid_tenant_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

impl SqliteCatalog {
    /// Opens (creating if needed) `dir/catalog.db`.
    pub fn open(dir: &Path) -> Result<SqliteCatalog> {
        std::fs::create_dir_all(dir)
            .map_err(|source| ServiceError::io(format!("create the data directory {}", dir.display()), source))?;
        let path = dir.join("catalog.db");
        let conn = Connection::open(&path).map_err(|source| ServiceError::catalog(path.clone(), "open", source))?;
        SqliteCatalog::init(conn, path)
    }

    /// A catalog in memory (nothing survives the process).
    pub fn in_memory() -> Result<SqliteCatalog> {
        let path = PathBuf::from(":memory:");
        let conn =
            Connection::open_in_memory().map_err(|source| ServiceError::catalog(path.clone(), "open", source))?;
        SqliteCatalog::init(conn, path)
    }

    fn init(conn: Connection, path: PathBuf) -> Result<SqliteCatalog> {
        let err = |op| {
            let path = path.clone();
            move |source| ServiceError::catalog(path, op, source)
        };
        conn.busy_timeout(Duration::from_secs(5)).map_err(err("set busy_timeout"))?;
        if path.as_os_str() != ":memory:" {
            conn.pragma_update(None, "journal_mode", "WAL").map_err(err("enable WAL"))?;
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(err("set synchronous"))?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(err("enable foreign keys"))?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(err("read user_version"))?;
        if version > SCHEMA_VERSION {
            return Err(ServiceError::CatalogVersion { path, found: version, supported: SCHEMA_VERSION });
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS tenants(
                 name TEXT PRIMARY KEY, tag TEXT NOT NULL UNIQUE, created_at_ms INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS keys(
                 id TEXT PRIMARY KEY, tenant TEXT NOT NULL REFERENCES tenants(name), role TEXT NOT NULL,
                 hash BLOB NOT NULL, label TEXT, created_at_ms INTEGER NOT NULL, revoked_at_ms INTEGER);
             CREATE INDEX IF NOT EXISTS keys_tenant ON keys(tenant);
             CREATE TABLE IF NOT EXISTS tools(
                 tenant TEXT NOT NULL REFERENCES tenants(name), name TEXT NOT NULL, def TEXT NOT NULL,
                 removed INTEGER NOT NULL DEFAULT 0, updated_at_ms INTEGER NOT NULL, PRIMARY KEY(tenant, name));
             CREATE TABLE IF NOT EXISTS capabilities(
                 tenant TEXT NOT NULL REFERENCES tenants(name), name TEXT NOT NULL, spec TEXT NOT NULL,
                 updated_at_ms INTEGER NOT NULL, PRIMARY KEY(tenant, name));
             PRAGMA user_version = 1;",
        )
        .map_err(err("create the schema"))?;
        Ok(SqliteCatalog { conn: Mutex::new(conn), path })
    }
    fn err(&self, op: &'static str) -> impl FnOnce(rusqlite::Error) -> ServiceError + '_ {
        move |source| ServiceError::catalog(self.path.clone(), op, source)
    }
}

impl Catalog for SqliteCatalog {
    /// The database file (`:memory:` in memory).
    fn path(&self) -> &Path {
        &self.path
    }

    /// Answers a trivial query (readiness).
    fn ping(&self) -> Result<()> {
        self.conn.lock().query_row("SELECT 1", [], |_| Ok(())).map_err(self.err("ping"))
    }

    /// Creates a tenant with a fresh random tag.
    fn create_tenant(&self, name: &str) -> Result<TenantRecord> {
        if !valid_tenant_name(name) {
            return Err(ServiceError::invalid(
                "tenant name",
                name.to_owned(),
                "1-63 of a-z 0-9 _ -, starting with a letter or digit",
            ));
        }
        let conn = self.conn.lock();
        let exists: Option<String> = conn
            .query_row("SELECT name FROM tenants WHERE name = ?1", [name], |r| r.get(0))
            .optional()
            .map_err(self.err("look up a tenant"))?;
        if exists.is_some() {
            return Err(ServiceError::TenantExists { name: name.to_owned() });
        }
        let created_at_ms = now_ms();
        for _ in 0..16 {
            let mut b = [0u8; 4];
            rand::rngs::OsRng.fill_bytes(&mut b);
            let tag = hex::encode(b);
            match conn.execute(
                "INSERT INTO tenants(name, tag, created_at_ms) VALUES (?1, ?2, ?3)",
                params![name, tag, created_at_ms],
            ) {
                Ok(_) => return Ok(TenantRecord { name: name.to_owned(), tag, created_at_ms }),
                Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) => continue,
                Err(e) => return Err(self.err("create a tenant")(e)),
            }
        }
        Err(ServiceError::invalid("tenant tag", "(16 collisions)", "a free random tag"))
    }

    /// Every tenant, by name.
    fn tenants(&self) -> Result<Vec<TenantRecord>> {
        let conn = self.conn.lock();
        let mut stmt = conn
            .prepare("SELECT name, tag, created_at_ms FROM tenants ORDER BY name")
            .map_err(self.err("list tenants"))?;
        let rows = stmt
            .query_map([], |r| Ok(TenantRecord { name: r.get(0)?, tag: r.get(1)?, created_at_ms: r.get(2)? }))
            .map_err(self.err("list tenants"))?;
        rows.collect::<std::result::Result<Vec<_>, _>>().map_err(self.err("list tenants"))
    }

    /// One tenant.
    fn tenant(&self, name: &str) -> Result<Option<TenantRecord>> {
        self.conn
            .lock()
            .query_row("SELECT name, tag, created_at_ms FROM tenants WHERE name = ?1", [name], |r| {
                Ok(TenantRecord { name: r.get(0)?, tag: r.get(1)?, created_at_ms: r.get(2)? })
            })
            .optional()
            .map_err(self.err("look up a tenant"))
    }

    /// Creates a key for `tenant`. The returned [`NewKey::key`] is the only time the secret
    /// exists outside the caller.
    fn create_key(&self, tenant: &str, role: Role, label: Option<&str>) -> Result<(NewKey, KeyRecord)> {
        if self.tenant(tenant)?.is_none() {
            return Err(ServiceError::NotFound { what: "tenant", name: tenant.to_owned() });
        }
        if label.is_some_and(|l| l.len() > 256) {
            return Err(ServiceError::invalid("label", "(too long)", "at most 256 bytes"));
        }
        let new = generate_key();
        let created_at_ms = now_ms();
        self.conn
            .lock()
            .execute(
                "INSERT INTO keys(id, tenant, role, hash, label, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![new.id, tenant, role.as_str(), &new.hash[..], label, created_at_ms],
            )
            .map_err(self.err("create a key"))?;
        let rec = KeyRecord {
            id: new.id.clone(),
            tenant: tenant.to_owned(),
            role,
            hash: new.hash.to_vec(),
            label: label.map(str::to_owned),
            created_at_ms,
            revoked_at_ms: None,
        };
        Ok((new, rec))
    }

    /// Looks a key up by id (revoked ones included).
    fn key(&self, id: &str) -> Result<Option<KeyRecord>> {
        self.conn
            .lock()
            .query_row(
                "SELECT id, tenant, role, hash, label, created_at_ms, revoked_at_ms FROM keys WHERE id = ?1",
                [id],
                key_row,
            )
            .optional()
            .map_err(self.err("look up a key"))
    }

    /// Keys of a tenant (all tenants with `None`), oldest first.
    fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>> {
        let conn = self.conn.lock();
        let sql = "SELECT id, tenant, role, hash, label, created_at_ms, revoked_at_ms FROM keys
                   WHERE (?1 IS NULL OR tenant = ?1) ORDER BY created_at_ms, id";
        let mut stmt = conn.prepare(sql).map_err(self.err("list keys"))?;
        let rows = stmt.query_map([tenant], key_row).map_err(self.err("list keys"))?;
        rows.collect::<std::result::Result<Vec<_>, _>>().map_err(self.err("list keys"))
    }

    /// Revokes a key (of `tenant`, if given). Returns the record; revoking twice keeps the
    /// first revocation time.
    fn revoke_key(&self, id: &str, tenant: Option<&str>) -> Result<KeyRecord> {
        let found = self.key(id)?.filter(|k| tenant.is_none_or(|t| t == k.tenant));
        let Some(mut rec) = found else { return Err(ServiceError::NotFound { what: "key", name: id.to_owned() }) };
        if rec.revoked_at_ms.is_none() {
            let at = now_ms();
            self.conn
                .lock()
                .execute("UPDATE keys SET revoked_at_ms = ?2 WHERE id = ?1 AND revoked_at_ms IS NULL", params![id, at])
                .map_err(self.err("revoke a key"))?;
            rec.revoked_at_ms = Some(at);
        }
        Ok(rec)
    }

    /// Stores a tool definition (a removed one is brought back).
    fn put_tool(&self, tenant: &str, name: &str, def: &ToolDef) -> Result<()> {
        let json = serde_json::to_string(def).unwrap_or_default();
        self.conn
            .lock()
            .execute(
                "INSERT INTO tools(tenant, name, def, removed, updated_at_ms) VALUES (?1, ?2, ?3, 0, ?4)
                 ON CONFLICT(tenant, name) DO UPDATE SET def = excluded.def, removed = 0, updated_at_ms = excluded.updated_at_ms",
                params![tenant, name, json, now_ms()],
            )
            .map_err(self.err("store a tool"))?;
        Ok(())
    }

    /// Marks a tool removed (its definition stays for settling recorded effects).
    fn remove_tool(&self, tenant: &str, name: &str) -> Result<bool> {
        let n = self
            .conn
            .lock()
            .execute(
                "UPDATE tools SET removed = 1, updated_at_ms = ?3 WHERE tenant = ?1 AND name = ?2 AND removed = 0",
                params![tenant, name, now_ms()],
            )
            .map_err(self.err("remove a tool"))?;
        Ok(n > 0)
    }

    /// Every tool of a tenant, removed ones included, by name.
    fn tools(&self, tenant: &str) -> Result<Vec<StoredTool>> {
        let conn = self.conn.lock();
        let mut stmt = conn
            .prepare("SELECT name, def, removed FROM tools WHERE tenant = ?1 ORDER BY name")
            .map_err(self.err("list tools"))?;
        let rows = stmt
            .query_map([tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, bool>(2)?)))
            .map_err(self.err("list tools"))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, def, removed) = row.map_err(self.err("list tools"))?;
            // A definition this build cannot read is skipped rather than stopping the tenant.
            if let Ok(def) = serde_json::from_str::<ToolDef>(&def) {
                out.push(StoredTool { name, def, removed });
            }
        }
        Ok(out)
    }

    /// Stores a capability.
    fn put_capability(&self, tenant: &str, name: &str, spec: &CapabilitySpec) -> Result<()> {
        let json = serde_json::to_string(spec).unwrap_or_default();
        self.conn
            .lock()
            .execute(
                "INSERT INTO capabilities(tenant, name, spec, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(tenant, name) DO UPDATE SET spec = excluded.spec, updated_at_ms = excluded.updated_at_ms",
                params![tenant, name, json, now_ms()],
            )
            .map_err(self.err("store a capability"))?;
        Ok(())
    }

    /// Deletes a capability.
    fn delete_capability(&self, tenant: &str, name: &str) -> Result<bool> {
        let n = self
            .conn
            .lock()
            .execute("DELETE FROM capabilities WHERE tenant = ?1 AND name = ?2", params![tenant, name])
            .map_err(self.err("delete a capability"))?;
        Ok(n > 0)
    }

    /// Every capability of a tenant, by name.
    fn capabilities(&self, tenant: &str) -> Result<Vec<(String, CapabilitySpec)>> {
        let conn = self.conn.lock();
        let mut stmt = conn
            .prepare("SELECT name, spec FROM capabilities WHERE tenant = ?1 ORDER BY name")
            .map_err(self.err("list capabilities"))?;
        let rows = stmt
            .query_map([tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(self.err("list capabilities"))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, spec) = row.map_err(self.err("list capabilities"))?;
            if let Ok(spec) = serde_json::from_str::<CapabilitySpec>(&spec) {
                out.push((name, spec));
            }
        }
        Ok(out)
    }
}

fn key_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRecord> {
    let role: String = r.get(2)?;
    Ok(KeyRecord {
        id: r.get(0)?,
        tenant: r.get(1)?,
        // An unknown role (a newer build's) is read as the least privileged one.
        role: role.parse().unwrap_or(Role::Reviewer),
        hash: r.get(3)?,
        label: r.get(4)?,
        created_at_ms: r.get(5)?,
        revoked_at_ms: r.get(6)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{parse_key, secret_matches};

    #[test]
    fn keys_are_stored_hashed_and_revocable() {
        let dir = tempfile::tempdir().unwrap();
        let cat = SqliteCatalog::open(dir.path()).unwrap();
        let t = cat.create_tenant("acme").unwrap();
        assert_eq!(t.tag.len(), 8);
        assert!(matches!(cat.create_tenant("acme"), Err(ServiceError::TenantExists { .. })));
        assert!(matches!(cat.create_tenant("Bad Name"), Err(ServiceError::Invalid { .. })));
        let (new, rec) = cat.create_key("acme", Role::Agent, Some("ci")).unwrap();
        let (_, secret) = parse_key(&new.key).unwrap();
        let stored = cat.key(&rec.id).unwrap().unwrap();
        assert!(secret_matches(secret, &stored.hash));
        // The secret appears nowhere in the database file.
        drop(cat);
        let bytes = std::fs::read(dir.path().join("catalog.db")).unwrap();
        let wal = std::fs::read(dir.path().join("catalog.db-wal")).unwrap_or_default();
        let hay = [bytes, wal].concat();
        assert!(!hay.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let cat = SqliteCatalog::open(dir.path()).unwrap();
        assert!(cat.revoke_key(&rec.id, Some("other")).is_err());
        let r = cat.revoke_key(&rec.id, Some("acme")).unwrap();
        assert!(r.revoked_at_ms.is_some());
        assert_eq!(cat.keys(Some("acme")).unwrap().len(), 1);
        assert!(matches!(cat.create_key("nope", Role::Admin, None), Err(ServiceError::NotFound { .. })));
    }
}
