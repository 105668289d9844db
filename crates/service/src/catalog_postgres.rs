//! [`PgCatalog`]: the catalog in PostgreSQL, shared by every node of a deployment (issue 29
//! item 2): the same contract as [`crate::catalog::SqliteCatalog`], in the database that holds
//! the tenants' ledger streams and state.
//!
//! ```text
//!   tidegate_tenants(name PK, tag UNIQUE, created_at_ms)
//!   tidegate_keys(id PK, tenant → tidegate_tenants, role, hash bytea, label, created_at_ms, revoked_at_ms?)
//!   tidegate_tools(tenant, name, def JSON text, removed, updated_at_ms)     PK (tenant, name)
//!   tidegate_capabilities(tenant, name, spec JSON text, updated_at_ms)     PK (tenant, name)
//! ```
//!
//! Schema version: `tidegate_meta.catalog_schema_version` = [`PG_CATALOG_SCHEMA_VERSION`]; a
//! newer one is refused. Calls run on a thread of the catalog's own (the blocking client must
//! not run on an async task); a lost connection is reopened by the next call.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use parking_lot::Mutex;
use postgres::{Client, Config, NoTls};
use rand::RngCore;

use crate::auth::{NewKey, Role, generate_key};
use crate::catalog::{Catalog, KeyRecord, StoredTool, TenantRecord, now_ms, valid_tenant_name};
use crate::error::{Result, ServiceError};
use crate::registry::{CapabilitySpec, ToolDef};

/// The catalog schema version this build writes.
pub const PG_CATALOG_SCHEMA_VERSION: i64 = 1;

const MIGRATION_LOCK: i64 = 0x7467_6361_7461_6c31; // "tgcatal1"

const SCHEMA: &str = "
CREATE TABLE tidegate_tenants(
    name text PRIMARY KEY, tag text NOT NULL UNIQUE, created_at_ms bigint NOT NULL);
CREATE TABLE tidegate_keys(
    id text PRIMARY KEY, tenant text NOT NULL REFERENCES tidegate_tenants(name), role text NOT NULL,
    hash bytea NOT NULL, label text, created_at_ms bigint NOT NULL, revoked_at_ms bigint);
CREATE INDEX tidegate_keys_tenant ON tidegate_keys(tenant);
CREATE TABLE tidegate_tools(
    tenant text NOT NULL REFERENCES tidegate_tenants(name), name text NOT NULL, def text NOT NULL,
    removed boolean NOT NULL DEFAULT false, updated_at_ms bigint NOT NULL, PRIMARY KEY (tenant, name));
CREATE TABLE tidegate_capabilities(
    tenant text NOT NULL REFERENCES tidegate_tenants(name), name text NOT NULL, spec text NOT NULL,
    updated_at_ms bigint NOT NULL, PRIMARY KEY (tenant, name));
";

type Job = Box<dyn FnOnce(&mut Conn) + Send>;

/// The connection, reopened when lost.
struct Conn {
    config: Config,
    client: Option<Client>,
    path: PathBuf,
}

impl Conn {
    fn get(&mut self) -> Result<&mut Client> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let c = self.config.connect(NoTls).map_err(pg_err(&self.path, "connect"))?;
            self.client = Some(c);
        }
        self.client.as_mut().ok_or(ServiceError::ShuttingDown)
    }
}

fn pg_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(postgres::Error) -> ServiceError + 'a {
    move |e| ServiceError::CatalogPostgres {
        path: path.to_owned(),
        op,
        retryable: tidegate_postgres::is_transient(&e),
        source: Arc::new(e),
    }
}

/// The catalog in PostgreSQL.
pub struct PgCatalog {
    path: PathBuf,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PgCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCatalog").field("path", &self.path).finish_non_exhaustive()
    }
}

impl PgCatalog {
    /// Opens the catalog in the database at `url`, creating its tables if there are none.
    pub fn open(url: &str) -> Result<PgCatalog> {
        let config: Config = url.parse().map_err(|e: postgres::Error| {
            ServiceError::invalid("server.store", "(a postgres URL)".to_owned(), format!("a postgres URL ({e})"))
        })?;
        let path = PathBuf::from(tidegate_postgres::describe(&config));
        let mut conn = Conn { config, client: None, path: path.clone() };
        let (ready_tx, ready_rx) = mpsc::channel();
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("tidegate-pgcatalog".into())
            .spawn(move || {
                let ready = migrate(&mut conn);
                let ok = ready.is_ok();
                let _ = ready_tx.send(ready);
                if ok {
                    while let Ok(job) = rx.recv() {
                        job(&mut conn);
                    }
                }
            })
            .map_err(|e| ServiceError::io("start the catalog's thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => return Err(ServiceError::ShuttingDown),
        }
        Ok(PgCatalog { path, jobs: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)) })
    }

    /// Runs `f` on the catalog's thread and waits for it.
    fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut Conn) -> Result<T> + Send + 'static) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        if self.jobs.lock().as_ref().is_none_or(|s| s.send(job).is_err()) {
            return Err(ServiceError::ShuttingDown);
        }
        rx.recv().unwrap_or(Err(ServiceError::ShuttingDown))
    }
}

impl Drop for PgCatalog {
    fn drop(&mut self) {
        drop(self.jobs.lock().take());
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

fn migrate(conn: &mut Conn) -> Result<()> {
    let path = conn.path.clone();
    let e = |op| pg_err(&path, op);
    let client = conn.get()?;
    let mut tx = client.transaction().map_err(e("begin the catalog's setup"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(e("take the migration lock"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS tidegate_meta (key text PRIMARY KEY, value bigint NOT NULL)")
        .map_err(e("create tidegate_meta"))?;
    let found: i64 = tx
        .query_opt("SELECT value FROM tidegate_meta WHERE key = 'catalog_schema_version'", &[])
        .map_err(e("read the catalog schema version"))?
        .map_or(0, |r| r.get(0));
    if found > PG_CATALOG_SCHEMA_VERSION {
        return Err(ServiceError::CatalogVersion { path, found, supported: PG_CATALOG_SCHEMA_VERSION });
    }
    if found == 0 {
        tx.batch_execute(SCHEMA).map_err(e("create the catalog tables"))?;
        tx.execute(
            "INSERT INTO tidegate_meta (key, value) VALUES ('catalog_schema_version', $1)",
            &[&PG_CATALOG_SCHEMA_VERSION],
        )
        .map_err(e("record the catalog schema version"))?;
    }
    tx.commit().map_err(e("create the catalog tables"))
}

fn tenant_row(r: &postgres::Row) -> TenantRecord {
    TenantRecord { name: r.get(0), tag: r.get(1), created_at_ms: r.get(2) }
}

fn key_row(r: &postgres::Row) -> KeyRecord {
    let role: String = r.get(2);
    KeyRecord {
        id: r.get(0),
        tenant: r.get(1),
        // An unknown role (a newer build's) is read as the least privileged one.
        role: role.parse().unwrap_or(Role::Reviewer),
        hash: r.get(3),
        label: r.get(4),
        created_at_ms: r.get(5),
        revoked_at_ms: r.get(6),
    }
}

const KEY_COLUMNS: &str = "id, tenant, role, hash, label, created_at_ms, revoked_at_ms";

impl Catalog for PgCatalog {
    /// The database (without its password).
    fn path(&self) -> &Path {
        &self.path
    }

    fn ping(&self) -> Result<()> {
        self.run(|c| {
            let path = c.path.clone();
            c.get()?.query_one("SELECT 1", &[]).map_err(pg_err(&path, "ping"))?;
            Ok(())
        })
    }

    fn create_tenant(&self, name: &str) -> Result<TenantRecord> {
        if !valid_tenant_name(name) {
            return Err(ServiceError::invalid(
                "tenant name",
                name.to_owned(),
                "1-63 of a-z 0-9 _ -, starting with a letter or digit",
            ));
        }
        let name = name.to_owned();
        self.run(move |c| {
            let path = c.path.clone();
            let client = c.get()?;
            let created_at_ms = now_ms();
            for _ in 0..16 {
                let mut b = [0u8; 4];
                rand::rngs::OsRng.fill_bytes(&mut b);
                let tag = hex::encode(b);
                // The name's and the tag's uniqueness are the database's: of two nodes creating
                // the same tenant at once, one gets `TenantExists`.
                let r = client.query_opt(
                    "INSERT INTO tidegate_tenants(name, tag, created_at_ms) VALUES ($1, $2, $3) \
                     ON CONFLICT DO NOTHING RETURNING name",
                    &[&name, &tag, &created_at_ms],
                );
                match r.map_err(pg_err(&path, "create a tenant"))? {
                    Some(_) => return Ok(TenantRecord { name, tag, created_at_ms }),
                    None => {
                        let exists = client
                            .query_opt("SELECT 1 FROM tidegate_tenants WHERE name = $1", &[&name])
                            .map_err(pg_err(&path, "look up a tenant"))?;
                        if exists.is_some() {
                            return Err(ServiceError::TenantExists { name });
                        }
                    }
                }
            }
            Err(ServiceError::invalid("tenant tag", "(16 collisions)", "a free random tag"))
        })
    }

    fn tenants(&self) -> Result<Vec<TenantRecord>> {
        self.run(|c| {
            let path = c.path.clone();
            let rows = c
                .get()?
                .query("SELECT name, tag, created_at_ms FROM tidegate_tenants ORDER BY name", &[])
                .map_err(pg_err(&path, "list tenants"))?;
            Ok(rows.iter().map(tenant_row).collect())
        })
    }

    fn tenant(&self, name: &str) -> Result<Option<TenantRecord>> {
        let name = name.to_owned();
        self.run(move |c| {
            let path = c.path.clone();
            let row = c
                .get()?
                .query_opt("SELECT name, tag, created_at_ms FROM tidegate_tenants WHERE name = $1", &[&name])
                .map_err(pg_err(&path, "look up a tenant"))?;
            Ok(row.as_ref().map(tenant_row))
        })
    }

    fn create_key(&self, tenant: &str, role: Role, label: Option<&str>) -> Result<(NewKey, KeyRecord)> {
        if self.tenant(tenant)?.is_none() {
            return Err(ServiceError::NotFound { what: "tenant", name: tenant.to_owned() });
        }
        if label.is_some_and(|l| l.len() > 256) {
            return Err(ServiceError::invalid("label", "(too long)", "at most 256 bytes"));
        }
        let new = generate_key();
        let rec = KeyRecord {
            id: new.id.clone(),
            tenant: tenant.to_owned(),
            role,
            hash: new.hash.to_vec(),
            label: label.map(str::to_owned),
            created_at_ms: now_ms(),
            revoked_at_ms: None,
        };
        let row = rec.clone();
        self.run(move |c| {
            let path = c.path.clone();
            c.get()?
                .execute(
                    "INSERT INTO tidegate_keys(id, tenant, role, hash, label, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
                    &[&row.id, &row.tenant, &row.role.as_str(), &row.hash, &row.label, &row.created_at_ms],
                )
                .map_err(pg_err(&path, "create a key"))?;
            Ok(())
        })?;
        Ok((new, rec))
    }

    fn key(&self, id: &str) -> Result<Option<KeyRecord>> {
        let id = id.to_owned();
        self.run(move |c| {
            let path = c.path.clone();
            let row = c
                .get()?
                .query_opt(&format!("SELECT {KEY_COLUMNS} FROM tidegate_keys WHERE id = $1"), &[&id])
                .map_err(pg_err(&path, "look up a key"))?;
            Ok(row.as_ref().map(key_row))
        })
    }

    fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>> {
        let tenant = tenant.map(str::to_owned);
        self.run(move |c| {
            let path = c.path.clone();
            let rows = c
                .get()?
                .query(
                    &format!(
                        "SELECT {KEY_COLUMNS} FROM tidegate_keys WHERE ($1::text IS NULL OR tenant = $1) \
                         ORDER BY created_at_ms, id"
                    ),
                    &[&tenant],
                )
                .map_err(pg_err(&path, "list keys"))?;
            Ok(rows.iter().map(key_row).collect())
        })
    }

    fn revoke_key(&self, id: &str, tenant: Option<&str>) -> Result<KeyRecord> {
        let found = self.key(id)?.filter(|k| tenant.is_none_or(|t| t == k.tenant));
        let Some(mut rec) = found else { return Err(ServiceError::NotFound { what: "key", name: id.to_owned() }) };
        if rec.revoked_at_ms.is_none() {
            let (id, at) = (id.to_owned(), now_ms());
            // Revoking twice keeps the first time: the database's row decides.
            let first = self.run(move |c| {
                let path = c.path.clone();
                let row = c
                    .get()?
                    .query_one(
                        "UPDATE tidegate_keys SET revoked_at_ms = COALESCE(revoked_at_ms, $2) WHERE id = $1 \
                         RETURNING revoked_at_ms",
                        &[&id, &at],
                    )
                    .map_err(pg_err(&path, "revoke a key"))?;
                Ok(row.get::<_, Option<i64>>(0))
            })?;
            rec.revoked_at_ms = first;
        }
        Ok(rec)
    }

    fn put_tool(&self, tenant: &str, name: &str, def: &ToolDef) -> Result<()> {
        let json = serde_json::to_string(def).unwrap_or_default();
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            let path = c.path.clone();
            c.get()?
                .execute(
                    "INSERT INTO tidegate_tools(tenant, name, def, removed, updated_at_ms) VALUES ($1, $2, $3, false, $4) \
                     ON CONFLICT (tenant, name) DO UPDATE SET def = excluded.def, removed = false, \
                     updated_at_ms = excluded.updated_at_ms",
                    &[&tenant, &name, &json, &now_ms()],
                )
                .map_err(pg_err(&path, "store a tool"))?;
            Ok(())
        })
    }

    fn remove_tool(&self, tenant: &str, name: &str) -> Result<bool> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            let path = c.path.clone();
            let n = c
                .get()?
                .execute(
                    "UPDATE tidegate_tools SET removed = true, updated_at_ms = $3 WHERE tenant = $1 AND name = $2 \
                     AND NOT removed",
                    &[&tenant, &name, &now_ms()],
                )
                .map_err(pg_err(&path, "remove a tool"))?;
            Ok(n > 0)
        })
    }

    fn tools(&self, tenant: &str) -> Result<Vec<StoredTool>> {
        let tenant = tenant.to_owned();
        self.run(move |c| {
            let path = c.path.clone();
            let rows = c
                .get()?
                .query("SELECT name, def, removed FROM tidegate_tools WHERE tenant = $1 ORDER BY name", &[&tenant])
                .map_err(pg_err(&path, "list tools"))?;
            // A definition this build cannot read is skipped rather than stopping the tenant.
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let def: String = r.get(1);
                    serde_json::from_str::<ToolDef>(&def).ok().map(|def| StoredTool {
                        name: r.get(0),
                        def,
                        removed: r.get(2),
                    })
                })
                .collect())
        })
    }

    fn put_capability(&self, tenant: &str, name: &str, spec: &CapabilitySpec) -> Result<()> {
        let json = serde_json::to_string(spec).unwrap_or_default();
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            let path = c.path.clone();
            c.get()?
                .execute(
                    "INSERT INTO tidegate_capabilities(tenant, name, spec, updated_at_ms) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (tenant, name) DO UPDATE SET spec = excluded.spec, updated_at_ms = excluded.updated_at_ms",
                    &[&tenant, &name, &json, &now_ms()],
                )
                .map_err(pg_err(&path, "store a capability"))?;
            Ok(())
        })
    }

    fn delete_capability(&self, tenant: &str, name: &str) -> Result<bool> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            let path = c.path.clone();
            let n = c
                .get()?
                .execute("DELETE FROM tidegate_capabilities WHERE tenant = $1 AND name = $2", &[&tenant, &name])
                .map_err(pg_err(&path, "delete a capability"))?;
            Ok(n > 0)
        })
    }

    fn capabilities(&self, tenant: &str) -> Result<Vec<(String, CapabilitySpec)>> {
        let tenant = tenant.to_owned();
        self.run(move |c| {
            let path = c.path.clone();
            let rows = c
                .get()?
                .query("SELECT name, spec FROM tidegate_capabilities WHERE tenant = $1 ORDER BY name", &[&tenant])
                .map_err(pg_err(&path, "list capabilities"))?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let spec: String = r.get(1);
                    serde_json::from_str::<CapabilitySpec>(&spec).ok().map(|s| (r.get(0), s))
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{parse_key, secret_matches};

    fn admin_url() -> String {
        std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// The SQLite catalog's contract test, on PostgreSQL, plus what sharing adds: two handles
    /// (two nodes) see each other's writes, and racing creations of one tenant make one tenant.
    #[test]
    fn keys_are_stored_hashed_and_revocable_and_shared_between_nodes() {
        let name = format!("tidegate_catalog_{}", std::process::id());
        let admin = admin_url();
        let mut c = Client::connect(&admin, NoTls)
            .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin} (TIDEGATE_PG_URL): {e}"));
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);

        let cat = PgCatalog::open(&url).unwrap();
        let t = cat.create_tenant("acme").unwrap();
        assert_eq!(t.tag.len(), 8);
        assert!(matches!(cat.create_tenant("acme"), Err(ServiceError::TenantExists { .. })));
        assert!(matches!(cat.create_tenant("Bad Name"), Err(ServiceError::Invalid { .. })));
        let (new, rec) = cat.create_key("acme", Role::Agent, Some("ci")).unwrap();
        let (_, secret) = parse_key(&new.key).unwrap();
        let other_node = PgCatalog::open(&url).unwrap();
        let stored = other_node.key(&rec.id).unwrap().unwrap();
        assert!(secret_matches(secret, &stored.hash), "the other node authenticates the key");
        let mut db = Client::connect(&url, NoTls).unwrap();
        let found: i64 = db
            .query_one(
                "SELECT COUNT(*) FROM tidegate_keys WHERE position($1::bytea in hash) > 0",
                &[&secret.as_bytes()],
            )
            .unwrap()
            .get(0);
        assert_eq!(found, 0, "the secret is not stored");
        assert!(other_node.revoke_key(&rec.id, Some("other")).is_err());
        let r = other_node.revoke_key(&rec.id, Some("acme")).unwrap();
        let again = cat.revoke_key(&rec.id, None).unwrap();
        assert_eq!(again.revoked_at_ms, r.revoked_at_ms, "revoking twice keeps the first time");
        assert_eq!(cat.keys(Some("acme")).unwrap().len(), 1);
        assert!(matches!(cat.create_key("nope", Role::Admin, None), Err(ServiceError::NotFound { .. })));
        // Racing creations of one tenant on two nodes: exactly one succeeds.
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| cat.create_tenant("race").is_ok());
            let b = s.spawn(|| other_node.create_tenant("race").is_ok());
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(a ^ b, "one tenant, created once: {a} {b}");
        assert_eq!(cat.tenants().unwrap().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["acme", "race"]);
        // A newer catalog schema is refused.
        db.execute("UPDATE tidegate_meta SET value = 5 WHERE key = 'catalog_schema_version'", &[]).unwrap();
        assert!(matches!(PgCatalog::open(&url), Err(ServiceError::CatalogVersion { found: 5, .. })));
        drop((cat, other_node, db));
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).unwrap();
    }
}
