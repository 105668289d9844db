//! The PostgreSQL backend ([`PgDatabase`]) and the least-privilege setup of a tenant's role
//! (docs/review.md, "Least privilege").
//!
//! A tenant's SQL (its schema, its templates' statements, the values an LLM chose for their
//! parameters) runs on a connection that logs in as the tenant's own role, never as the role
//! of the configured URL. The configured URL is the *admin* connection: it is used once per
//! open to create or repair the tenant's role and schema, then closed. Logging in as the
//! tenant's role (rather than `SET ROLE` on an admin connection) matters: the tenant's SQL
//! could `RESET ROLE` or `SET ROLE` back to anything the session user may become; a session
//! that logged in as the tenant's role has nothing to go back to.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::db::{Database, SqlBounds};
use crate::error::{Error, Result};
use crate::value::{Dialect, Row, SqlValue};

/// How [`PgDatabase::connect_tenant`] sets a tenant's connection up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PgTenantOptions {
    /// The statement timeout of the tenant's connection.
    pub bounds: SqlBounds,
    /// Whether the admin connection may run as a superuser. Default `false`: a superuser
    /// admin URL is refused ([`Error::Privilege`]); a role with `CREATEROLE` is enough.
    pub allow_superuser_admin: bool,
}

/// How much longer than the statement timeout the client waits before it cancels a call
/// itself (the tenant's SQL can change its session's `statement_timeout`; it cannot change
/// this).
const WATCHDOG_GRACE: Duration = Duration::from_secs(2);

/// How often a tenant's setup is tried when it collides with another's (two setups granting
/// on one database at once: "tuple concurrently updated"). No lock serialises them: a lock the
/// admin connection waited for is one a tenant's SQL could take and keep (an advisory lock of
/// a known key), stopping every other tenant's setup.
const SETUP_ATTEMPTS: u32 = 8;

/// How long the admin connection waits for a lock before its setup fails (retryable).
const ADMIN_LOCK_TIMEOUT_MS: u32 = 10_000;

/// The most connections a tenant's role may hold at once (the server holds one; a restart
/// may briefly overlap the previous process's).
const ROLE_CONNECTION_LIMIT: u32 = 4;

/// PostgreSQL through the `postgres` crate. Column types the middleware reads: `BIGINT`,
/// `INTEGER`, `SMALLINT`, `DOUBLE PRECISION`, `REAL`, `TEXT`, `VARCHAR`, `BOOLEAN` (cast other
/// types in the SQL, e.g. `CAST(SUM(x) AS BIGINT)`).
///
/// The client is blocking and runs a runtime of its own: call every method, and connect, from
/// a thread that is not a tokio worker. Dropping it is safe anywhere: the connection is closed
/// on a thread of its own.
pub struct PgDatabase {
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
    in_tx: bool,
    /// Present on a tenant's least-privilege connection.
    tenant: Option<TenantSession>,
}

struct TenantSession {
    role: String,
    schema: String,
    /// Run at every `begin`: the tenant's SQL may have changed its session's settings.
    pin: String,
    timeout: Duration,
    watchdog: Watchdog,
}

impl std::fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDatabase")
            .field("statements", &self.statements.len())
            .field("in_tx", &self.in_tx)
            .field("role", &self.tenant.as_ref().map(|t| &t.role))
            .finish()
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        // Stops the watchdog (joins its thread) before the connection goes.
        self.tenant = None;
        if let Some(client) = self.client.take() {
            close_off_runtime(client);
        }
    }
}

/// Closes `client` on a thread of its own and waits up to 5 s for it. The blocking client
/// drives a runtime of its own, and starting or dropping one inside another runtime panics
/// ("Cannot start a runtime from within a runtime"): a server dropping the last handle of a
/// tenant on a tokio worker must not take the process down.
fn close_off_runtime(client: postgres::Client) {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("tidegate-review-pg-close".into()).spawn(move || {
        let _ = client.close();
        let _ = tx.send(());
    });
    if spawned.is_ok() {
        let _ = rx.recv_timeout(Duration::from_secs(5));
    }
}

fn pg_err(op: &str, e: postgres::Error) -> Error {
    let retryable = e.is_closed()
        || e.code().is_some_and(|c| {
            *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                || *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
                || *c == postgres::error::SqlState::LOCK_NOT_AVAILABLE
                || *c == postgres::error::SqlState::TOO_MANY_CONNECTIONS
        })
        || e.code().is_none();
    let msg = match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    };
    Error::db(op, msg, retryable)
}

fn closed() -> Error {
    Error::db("connection", "the connection is closed", true)
}

fn check_ident(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 63 || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Error::db("connect", format!("{what} {s:?}: expected 1 to 63 letters, digits and _"), false));
    }
    Ok(())
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The login role of the tenant whose tables are in `schema` of `database`: `tgr_` and 16 hex
/// digits of a hash of both, so roles (which are cluster-wide) of two databases never
/// coincide, and the role's name does not show the tenant's.
pub fn tenant_role_name(database: &str, schema: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in database.bytes().chain([0]).chain(schema.to_ascii_lowercase().bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("tgr_{h:016x}")
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).clamp(1, i64::from(i32::MAX))
}

/// Cancels the running call when it outlives its deadline, from a thread of its own.
struct Watchdog {
    shared: Arc<(Mutex<Watch>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Watch {
    deadline: Option<Instant>,
    fired: bool,
    stop: bool,
}

impl Watchdog {
    fn start(token: postgres::CancelToken) -> Result<Watchdog> {
        let shared = Arc::new((Mutex::new(Watch::default()), Condvar::new()));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tidegate-review-pg-watchdog".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut w = lock.lock().unwrap_or_else(PoisonError::into_inner);
                while !w.stop {
                    match w.deadline {
                        None => w = cv.wait(w).unwrap_or_else(PoisonError::into_inner),
                        Some(d) if Instant::now() >= d => {
                            w.deadline = None;
                            w.fired = true;
                            drop(w);
                            let _ = token.cancel_query(postgres::NoTls);
                            w = lock.lock().unwrap_or_else(PoisonError::into_inner);
                        }
                        Some(d) => {
                            let left = d.saturating_duration_since(Instant::now());
                            w = match cv.wait_timeout(w, left) {
                                Ok((g, _)) => g,
                                Err(e) => e.into_inner().0,
                            };
                        }
                    }
                }
            })
            .map_err(|e| Error::db("connect", format!("start the statement watchdog: {e}"), true))?;
        Ok(Watchdog { shared, thread: Some(thread) })
    }

    fn arm(&self, after: Duration) {
        let (lock, cv) = &*self.shared;
        let mut w = lock.lock().unwrap_or_else(PoisonError::into_inner);
        w.deadline = Some(Instant::now() + after);
        w.fired = false;
        cv.notify_one();
    }

    /// Disarms; whether the watchdog cancelled the call.
    fn disarm(&self) -> bool {
        let mut w = self.shared.0.lock().unwrap_or_else(PoisonError::into_inner);
        w.deadline = None;
        std::mem::take(&mut w.fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.shared;
            lock.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
            cv.notify_one();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The admin connection's role: `(name, superuser, createrole, database)`.
fn admin_identity(admin: &mut postgres::Client) -> Result<(String, bool, bool, String)> {
    let row = admin
        .query_one(
            "SELECT current_user::text, r.rolsuper, r.rolcreaterole, pg_catalog.current_database()::text \
             FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .map_err(|e| pg_err("admin role", e))?;
    Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
}

fn refuse_admin(name: &str, superuser: bool, createrole: bool, allow_superuser: bool) -> Result<()> {
    if superuser && !allow_superuser {
        return Err(Error::Privilege {
            message: format!(
                "the admin connection runs as the superuser `{name}`: give it a role with CREATEROLE that owns the \
                 review database instead, or allow a superuser admin connection explicitly (tenant SQL never runs as \
                 it either way)"
            ),
        });
    }
    if !superuser && !createrole {
        return Err(Error::Privilege {
            message: format!(
                "the admin connection's role `{name}` cannot create the tenants' roles: it needs CREATEROLE (and should \
                 own the review database)"
            ),
        });
    }
    Ok(())
}

/// Creates or repairs `role` (a login role with a fresh password, nothing else), its
/// `schema`, and the database's grants, then verifies what the role can reach; the role's
/// password becomes `password`. Runs in one transaction, tried again when it collides with
/// another tenant's setup.
fn setup_tenant(
    admin: &mut postgres::Client,
    role: &str,
    schema: &str,
    password: &str,
    timeout_ms: i64,
    admin_superuser: bool,
) -> Result<()> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match setup_once(admin, role, schema, password, timeout_ms, admin_superuser) {
            Err(e) if attempt < SETUP_ATTEMPTS && collided(&e) => {
                std::thread::sleep(Duration::from_millis(20 * u64::from(attempt)));
            }
            other => return other,
        }
    }
}

/// Whether a setup failed only because another ran at the same time.
fn collided(e: &Error) -> bool {
    matches!(e, Error::Database { message, .. }
        if message.contains("tuple concurrently updated") || message.contains("(40001)") || message.contains("(40P01)")
            || message.contains("(23505)"))
}

fn setup_once(
    admin: &mut postgres::Client,
    role: &str,
    schema: &str,
    password: &str,
    timeout_ms: i64,
    admin_superuser: bool,
) -> Result<()> {
    let (ri, si) = (quote_ident(role), quote_ident(schema));
    let mut tx = admin.transaction().map_err(|e| pg_err("setup", e))?;
    let run = |tx: &mut postgres::Transaction<'_>, sql: &str| {
        // The password's verifier is the only literal; it is not worth showing in an error.
        let op = if sql.contains("PASSWORD") { "CREATE/ALTER ROLE" } else { sql };
        tx.batch_execute(sql).map_err(|e| pg_err(op, e))
    };
    let database: String =
        tx.query_one("SELECT pg_catalog.current_database()::text", &[]).map_err(|e| pg_err("setup", e))?.get(0);
    let di = quote_ident(&database);
    let current = tx
        .query_opt(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolinherit, rolreplication, rolbypassrls \
             FROM pg_catalog.pg_roles WHERE rolname = $1",
            &[&role],
        )
        .map_err(|e| pg_err("setup", e))?;
    let verifier = postgres_protocol::password::scram_sha_256(password.as_bytes());
    let login = format!("LOGIN CONNECTION LIMIT {ROLE_CONNECTION_LIMIT} PASSWORD {}", quote_literal(&verifier));
    const OFF: [&str; 6] = ["NOSUPERUSER", "NOCREATEDB", "NOCREATEROLE", "NOINHERIT", "NOREPLICATION", "NOBYPASSRLS"];
    match current {
        None => run(&mut tx, &format!("CREATE ROLE {ri} {} {login}", OFF.join(" ")))?,
        Some(r) => {
            // Only the attributes that are on are named: a role with CREATEROLE may not even
            // mention some of them (superuser, replication, bypassrls) in ALTER ROLE.
            let on: Vec<&str> = (0..OFF.len()).filter(|i| r.get::<_, bool>(*i)).map(|i| OFF[i]).collect();
            run(&mut tx, &format!("ALTER ROLE {ri} WITH {} {login}", on.join(" ")))?;
        }
    }
    // Whatever the role was made a member of (predefined roles such as pg_read_server_files
    // included) is taken back.
    let groups = tx
        .query(
            "SELECT g.rolname::text FROM pg_catalog.pg_auth_members m \
             JOIN pg_catalog.pg_roles g ON g.oid = m.roleid JOIN pg_catalog.pg_roles u ON u.oid = m.member \
             WHERE u.rolname = $1",
            &[&role],
        )
        .map_err(|e| pg_err("setup", e))?;
    for g in groups {
        let g: String = g.get(0);
        run(&mut tx, &format!("REVOKE {} FROM {ri}", quote_ident(&g)))?;
    }
    run(&mut tx, &format!("ALTER ROLE {ri} SET search_path TO {si}"))?;
    run(&mut tx, &format!("ALTER ROLE {ri} SET statement_timeout TO {timeout_ms}"))?;
    if !admin_superuser {
        // Needed to give the schema and its objects to the role.
        run(&mut tx, &format!("GRANT {ri} TO CURRENT_USER"))?;
    }
    let owner: Option<String> = tx
        .query_opt(
            "SELECT r.rolname::text FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner \
             WHERE n.nspname = $1",
            &[&schema],
        )
        .map_err(|e| pg_err("setup", e))?
        .map(|r| r.get(0));
    match owner {
        None => run(&mut tx, &format!("CREATE SCHEMA {si} AUTHORIZATION {ri}"))?,
        Some(o) if o != role => run(&mut tx, &format!("ALTER SCHEMA {si} OWNER TO {ri}"))?,
        Some(_) => {}
    }
    run(&mut tx, &format!("REVOKE ALL ON SCHEMA {si} FROM PUBLIC"))?;
    // Objects an earlier version created in the schema as the admin's role become the
    // tenant's (a sequence owned by a column moves with its table).
    let objects = tx
        .query(
            "SELECT c.relname::text, c.relkind::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') \
             AND c.relowner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $2) \
             AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend d \
               WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid = c.oid \
               AND d.deptype IN ('a', 'i'))) \
             ORDER BY c.relkind DESC",
            &[&schema, &role],
        )
        .map_err(|e| pg_err("setup", e))?;
    for o in objects {
        let (name, kind): (String, String) = (o.get(0), o.get(1));
        let what = match kind.as_str() {
            "v" => "VIEW",
            "m" => "MATERIALIZED VIEW",
            "f" => "FOREIGN TABLE",
            "S" => "SEQUENCE",
            _ => "TABLE",
        };
        run(&mut tx, &format!("ALTER {what} {si}.{} OWNER TO {ri}", quote_ident(&name)))?;
    }
    let routines = tx
        .query(
            "SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proowner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = $2)",
            &[&schema, &role],
        )
        .map_err(|e| pg_err("setup", e))?;
    for r in routines {
        let sig: String = r.get(0);
        run(&mut tx, &format!("ALTER ROUTINE {sig} OWNER TO {ri}"))?;
    }
    // The database: no one connects or makes temporary tables by default (PUBLIC), the
    // tenant's role may connect; the `public` schema is no one's. A role that does not own the
    // database gets a warning here rather than an error; the checks below decide.
    // Each only when needed: concurrent grants on one database collide.
    let r = tx
        .query_one(
            "SELECT pg_catalog.has_database_privilege('public', pg_catalog.current_database(), 'CONNECT') \
               OR pg_catalog.has_database_privilege('public', pg_catalog.current_database(), 'TEMPORARY'), \
             pg_catalog.has_database_privilege($1, pg_catalog.current_database(), 'CONNECT'), \
             EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n WHERE n.nspname = 'public' \
               AND (pg_catalog.has_schema_privilege('public', n.oid, 'USAGE') \
                 OR pg_catalog.has_schema_privilege('public', n.oid, 'CREATE')))",
            &[&role],
        )
        .map_err(|e| pg_err("setup", e))?;
    let (public_db, role_connects, public_schema): (bool, bool, bool) = (r.get(0), r.get(1), r.get(2));
    if public_db {
        run(&mut tx, &format!("REVOKE ALL ON DATABASE {di} FROM PUBLIC"))?;
    }
    if !role_connects || public_db {
        run(&mut tx, &format!("GRANT CONNECT ON DATABASE {di} TO {ri}"))?;
    }
    if public_schema {
        run(&mut tx, "REVOKE ALL ON SCHEMA public FROM PUBLIC")?;
    }
    verify_role(&mut tx, role, schema)?;
    tx.commit().map_err(|e| pg_err("setup commit", e))
}

/// Refuses unless `role` has no attribute beyond LOGIN, is a member of no role, cannot create
/// anything in the database but in its schema, and can use no schema but its own and the
/// system's.
fn verify_role(tx: &mut postgres::Transaction<'_>, role: &str, schema: &str) -> Result<()> {
    let refuse = |what: String| Err(Error::Privilege { message: format!("the tenant's role `{role}` {what}") });
    let r = tx
        .query_one(
            "SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls, \
             (SELECT count(*) FROM pg_catalog.pg_auth_members m WHERE m.member = r.oid), \
             pg_catalog.has_database_privilege(r.oid, pg_catalog.current_database(), 'CREATE') \
             FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
            &[&role],
        )
        .map_err(|e| pg_err("verify role", e))?;
    let attrs: [bool; 5] = [r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)];
    if attrs.iter().any(|a| *a) {
        return refuse(format!(
            "kept an attribute (superuser, createrole, createdb, replication, bypassrls: {attrs:?})"
        ));
    }
    let groups: i64 = r.get(5);
    if groups > 0 {
        return refuse(format!("is still a member of {groups} roles"));
    }
    let create_db: bool = r.get(6);
    if create_db {
        return refuse("may create schemas and extensions in the review database (CREATE on it)".into());
    }
    let other: Vec<String> = tx
        .query(
            "SELECT n.nspname::text FROM pg_catalog.pg_namespace n \
             WHERE n.nspname <> $2 AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
             AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%' \
             AND (pg_catalog.has_schema_privilege($1, n.oid, 'USAGE') \
               OR pg_catalog.has_schema_privilege($1, n.oid, 'CREATE')) \
             ORDER BY 1",
            &[&role, &schema],
        )
        .map_err(|e| pg_err("verify role", e))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !other.is_empty() {
        return refuse(format!(
            "may use schemas besides its own: {other:?} (the review database must grant tenant roles nothing beyond \
             their schema: REVOKE ALL ON SCHEMA ... FROM PUBLIC, or give the admin role ownership of the database)"
        ));
    }
    Ok(())
}

impl PgDatabase {
    fn with_client(client: postgres::Client) -> PgDatabase {
        PgDatabase { client: Some(client), statements: HashMap::new(), in_tx: false, tenant: None }
    }

    /// Connects to `url` (`postgres://user@host:port/db`) as its own role, optionally setting
    /// `search_path` to `schema` (created if missing). For trusted SQL only (benchmarks,
    /// loaders, tests): a tenant's SQL runs on [`PgDatabase::connect_tenant`].
    pub fn connect(url: &str, schema: Option<&str>) -> Result<PgDatabase> {
        let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(|e| pg_err("connect", e))?;
        if let Some(s) = schema {
            if let Err(e) = check_ident("schema name", s) {
                close_off_runtime(client);
                return Err(e);
            }
            if let Err(e) = client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}; SET search_path TO {s}")) {
                close_off_runtime(client);
                return Err(pg_err("schema", e));
            }
        }
        Ok(PgDatabase::with_client(client))
    }

    /// Refuses an admin URL that connects as a superuser unless `allow_superuser`, and one
    /// whose role cannot create roles ([`Error::Privilege`]); connection trouble is a
    /// retryable [`Error::Database`]. Waits at most `connect_timeout` for the server.
    pub fn check_admin(admin_url: &str, allow_superuser: bool, connect_timeout: Duration) -> Result<()> {
        let mut cfg: postgres::Config = admin_url.parse().map_err(|e| pg_err("admin URL", e))?;
        cfg.connect_timeout(connect_timeout);
        let mut admin = cfg.connect(postgres::NoTls).map_err(|e| pg_err("connect (admin)", e))?;
        let r = admin_identity(&mut admin);
        close_off_runtime(admin);
        let (name, superuser, createrole, _) = r?;
        refuse_admin(&name, superuser, createrole, allow_superuser)
    }

    /// A tenant's least-privilege connection. Connects to `admin_url` (whose role needs
    /// `CREATEROLE`; a superuser is refused unless `options.allow_superuser_admin`), and in one
    /// transaction creates or repairs the tenant's login role ([`tenant_role_name`]: no
    /// superuser, createdb, createrole, replication or bypassrls, no role memberships, a fresh
    /// random password stored only as a SCRAM verifier, `search_path` and `statement_timeout`
    /// as role defaults), the schema `schema` owned by it (objects already in it are given to
    /// it), takes CONNECT and TEMPORARY on the database and everything on `public` from PUBLIC,
    /// grants the role CONNECT, and verifies the role reaches no other schema. Then closes the
    /// admin connection and logs in as the tenant's role with that password, `search_path`
    /// set to `schema` and the statement timeout set, checks `current_user`, and returns that
    /// connection. Every call is bounded by a watchdog that cancels it a little after the
    /// statement timeout (the tenant's SQL may change its session's timeout, not the
    /// watchdog), and `begin` sets `search_path` and the timeout again.
    pub fn connect_tenant(admin_url: &str, schema: &str, options: &PgTenantOptions) -> Result<PgDatabase> {
        check_ident("schema name", schema)?;
        // Unquoted names fold to lower case: the schema an earlier version created.
        let schema = schema.to_ascii_lowercase();
        let timeout_ms = millis(options.bounds.statement_timeout);
        let mut cfg: postgres::Config = admin_url.parse().map_err(|e| pg_err("admin URL", e))?;
        cfg.connect_timeout(Duration::from_secs(10));
        let mut admin = cfg.clone().connect(postgres::NoTls).map_err(|e| pg_err("connect (admin)", e))?;
        let set = (|| {
            // Nothing a tenant created can stand in for a catalog function or operator, and a
            // lock a tenant's SQL holds makes the setup fail (retryable) rather than hang.
            admin
                .batch_execute(&format!(
                    "SET search_path TO pg_catalog, pg_temp; SET lock_timeout = {ADMIN_LOCK_TIMEOUT_MS}; \
                     SET statement_timeout = {}",
                    6 * ADMIN_LOCK_TIMEOUT_MS
                ))
                .map_err(|e| pg_err("setup", e))?;
            let (name, superuser, createrole, database) = admin_identity(&mut admin)?;
            refuse_admin(&name, superuser, createrole, options.allow_superuser_admin)?;
            let role = tenant_role_name(&database, &schema);
            let mut secret = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut secret);
            let password: String = secret.iter().map(|b| format!("{b:02x}")).collect();
            setup_tenant(&mut admin, &role, &schema, &password, timeout_ms, superuser)?;
            Ok::<_, Error>((role, password))
        })();
        close_off_runtime(admin);
        let (role, password) = set?;
        cfg.user(&role)
            .password(password.as_bytes())
            .options(&format!("-c search_path={schema} -c statement_timeout={timeout_ms}"))
            .application_name("tidegate-review");
        let mut client = cfg.connect(postgres::NoTls).map_err(|e| pg_err("connect (tenant role)", e))?;
        let check = client.query_one(
            "SELECT current_user::text, r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
            &[],
        );
        let (user, superuser): (String, bool) = match check {
            Ok(r) => (r.get(0), r.get(1)),
            Err(e) => {
                close_off_runtime(client);
                return Err(pg_err("connect (tenant role)", e));
            }
        };
        if user != role || superuser {
            close_off_runtime(client);
            return Err(Error::Privilege {
                message: format!(
                    "the tenant's connection runs as `{user}` (superuser: {superuser}), expected `{role}`"
                ),
            });
        }
        let watchdog = match Watchdog::start(client.cancel_token()) {
            Ok(w) => w,
            Err(e) => {
                close_off_runtime(client);
                return Err(e);
            }
        };
        let mut db = PgDatabase::with_client(client);
        db.tenant = Some(TenantSession {
            pin: format!("SET LOCAL search_path TO {schema}; SET LOCAL statement_timeout = {timeout_ms}"),
            role,
            schema,
            timeout: Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(u64::MAX)),
            watchdog,
        });
        Ok(db)
    }

    /// The tenant's role, on a [`PgDatabase::connect_tenant`] connection.
    pub fn role(&self) -> Option<&str> {
        self.tenant.as_ref().map(|t| t.role.as_str())
    }

    /// The tenant's schema, on a [`PgDatabase::connect_tenant`] connection.
    pub fn schema(&self) -> Option<&str> {
        self.tenant.as_ref().map(|t| t.schema.as_str())
    }

    /// Drops a schema and everything in it.
    pub fn drop_schema(&mut self, schema: &str) -> Result<()> {
        check_ident("schema name", schema)?;
        self.client()?
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .map_err(|e| pg_err("drop schema", e))
    }

    fn client(&mut self) -> Result<&mut postgres::Client> {
        self.client.as_mut().ok_or_else(closed)
    }

    /// Runs `f` on the client with the watchdog armed (on a tenant's connection).
    fn timed<R>(
        &mut self,
        op: &str,
        f: impl FnOnce(&mut postgres::Client) -> std::result::Result<R, postgres::Error>,
    ) -> Result<R> {
        let client = self.client.as_mut().ok_or_else(closed)?;
        if let Some(t) = &self.tenant {
            t.watchdog.arm(t.timeout + WATCHDOG_GRACE);
        }
        let r = f(client);
        let fired = self.tenant.as_ref().is_some_and(|t| t.watchdog.disarm());
        r.map_err(|e| {
            let cancelled = e.code() == Some(&postgres::error::SqlState::QUERY_CANCELED);
            match (&self.tenant, cancelled || fired) {
                (Some(t), true) => Error::db(
                    op,
                    format!(
                        "cancelled: it ran longer than the statement timeout of {} ms ({})",
                        t.timeout.as_millis(),
                        e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned())
                    ),
                    false,
                ),
                _ => pg_err(op, e),
            }
        })
    }

    fn prepare(&mut self, sql: &str) -> Result<postgres::Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.timed(sql, |c| c.prepare(sql))?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    fn args(
        &mut self,
        sql: &str,
        params: &[SqlValue],
    ) -> Result<(postgres::Statement, Vec<Box<dyn postgres::types::ToSql + Sync>>)> {
        let st = self.prepare(sql)?;
        let mut args = Vec::with_capacity(params.len());
        for (v, ty) in params.iter().zip(st.params()) {
            args.push(to_pg(v, ty)?);
        }
        Ok((st, args))
    }
}

fn to_pg(v: &SqlValue, ty: &postgres::types::Type) -> Result<Box<dyn postgres::types::ToSql + Sync>> {
    use postgres::types::Type;
    let bad = || Error::db("bind", format!("value {v:?} for a parameter of type {ty}"), false);
    Ok(match (v, ty) {
        (SqlValue::Null, t) if *t == Type::INT8 => Box::new(None::<i64>),
        (SqlValue::Null, t) if *t == Type::INT4 => Box::new(None::<i32>),
        (SqlValue::Null, t) if *t == Type::FLOAT8 => Box::new(None::<f64>),
        (SqlValue::Null, t) if *t == Type::BOOL => Box::new(None::<bool>),
        (SqlValue::Null, _) => Box::new(None::<String>),
        (v, t) if *t == Type::INT8 => Box::new(v.as_i64().ok_or_else(bad)?),
        (v, t) if *t == Type::INT4 => Box::new(i32::try_from(v.as_i64().ok_or_else(bad)?).map_err(|_| bad())?),
        (v, t) if *t == Type::INT2 => Box::new(i16::try_from(v.as_i64().ok_or_else(bad)?).map_err(|_| bad())?),
        (v, t) if *t == Type::FLOAT8 => Box::new(v.as_f64().ok_or_else(bad)?),
        (v, t) if *t == Type::FLOAT4 => Box::new(v.as_f64().ok_or_else(bad)? as f32),
        (v, t) if *t == Type::BOOL => Box::new(v.as_i64().ok_or_else(bad)? != 0),
        (SqlValue::Text(s), _) => Box::new(s.clone()),
        (SqlValue::Int(i), _) => Box::new(i.to_string()),
        (SqlValue::Real(f), _) => Box::new(f.to_string()),
    })
}

fn from_pg(row: &postgres::Row, i: usize) -> Result<SqlValue> {
    use postgres::types::Type;
    let ty = row.columns()[i].type_().clone();
    let e = |err: postgres::Error| pg_err("read column", err);
    Ok(if ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i).map_err(e)?.map_or(SqlValue::Null, SqlValue::Int)
    } else if ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Int(x.into()))
    } else if ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Int(x.into()))
    } else if ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(i).map_err(e)?.map_or(SqlValue::Null, SqlValue::Real)
    } else if ty == Type::FLOAT4 {
        row.try_get::<_, Option<f32>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Real(x.into()))
    } else if ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(i).map_err(e)?.map_or(SqlValue::Null, |x| SqlValue::Int(x.into()))
    } else {
        row.try_get::<_, Option<String>>(i).map_err(e)?.map_or(SqlValue::Null, SqlValue::Text)
    })
}

impl Database for PgDatabase {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn batch(&mut self, sql: &str) -> Result<()> {
        self.timed("batch", |c| c.batch_execute(sql))
    }

    fn begin(&mut self) -> Result<()> {
        let sql = match &self.tenant {
            Some(t) => format!("BEGIN; {}", t.pin),
            None => "BEGIN".to_owned(),
        };
        self.client()?.batch_execute(&sql).map_err(|e| pg_err("begin", e))?;
        self.in_tx = true;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.in_tx = false;
        self.client()?.batch_execute("COMMIT").map_err(|e| pg_err("commit", e))
    }

    fn rollback(&mut self) -> Result<()> {
        if !self.in_tx {
            return Ok(());
        }
        self.in_tx = false;
        self.client()?.batch_execute("ROLLBACK").map_err(|e| pg_err("rollback", e))
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>> {
        let (st, args) = self.args(sql, params)?;
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = args.iter().map(|b| b.as_ref()).collect();
        let rows = self.timed(sql, |c| c.query(&st, &refs))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let mut row = Vec::with_capacity(r.len());
            for (i, c) in r.columns().iter().enumerate() {
                row.push((c.name().to_owned(), from_pg(r, i)?));
            }
            out.push(row);
        }
        Ok(out)
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64> {
        let (st, args) = self.args(sql, params)?;
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = args.iter().map(|b| b.as_ref()).collect();
        self.timed(sql, |c| c.execute(&st, &refs))
    }
}
