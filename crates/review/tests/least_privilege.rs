//! Least privilege of the SQL a tenant or an LLM supplies (docs/review.md, "Least privilege"),
//! at the crate level: every escape a security reviewer would try on SQLite is refused with an
//! error naming it, and nothing changes anywhere (the other database file, the tenant's own
//! tables, the file system). PostgreSQL's tenant roles: `least_privilege_pg_*` (skipped with a
//! message when no server answers at `TIDEGATE_PG_URL`, default
//! postgres://postgres@127.0.0.1:5432/test).

#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::path::Path;
use std::time::{Duration, Instant};

use tidegate_review::value::SqlValue;
use tidegate_review::{Database, Error, SqlBounds, SqliteDatabase};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
INSERT OR IGNORE INTO account VALUES (1, 100), (2, 100);";

/// A tenant's database next to a "catalog" file it must never reach.
struct Scene {
    dir: tempfile::TempDir,
    db: SqliteDatabase,
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::tempdir().unwrap();
        let catalog = rusqlite::Connection::open(dir.path().join("catalog.db")).unwrap();
        catalog
            .execute_batch("CREATE TABLE api_key (tenant TEXT, role TEXT); INSERT INTO api_key VALUES ('a', 'admin');")
            .unwrap();
        drop(catalog);
        std::fs::create_dir(dir.path().join("tenant")).unwrap();
        let mut db = SqliteDatabase::open(&dir.path().join("tenant/review.db")).unwrap();
        db.batch(SCHEMA).unwrap();
        Scene { dir, db }
    }

    fn catalog(&self) -> Vec<(String, String)> {
        let c = rusqlite::Connection::open(self.dir.path().join("catalog.db")).unwrap();
        let mut st = c.prepare("SELECT tenant, role FROM api_key ORDER BY 1, 2").unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    }

    fn files(&self) -> Vec<String> {
        fn walk(p: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(p).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    walk(&e, out);
                } else {
                    let name = e.to_string_lossy().into_owned();
                    // The tenant's own WAL files come and go with its checkpoints.
                    if !name.ends_with("-wal") && !name.ends_with("-shm") {
                        out.push(name);
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(self.dir.path(), &mut out);
        out.sort();
        out
    }

    fn balances(&mut self) -> Vec<SqlValue> {
        self.db
            .query("SELECT balance FROM account ORDER BY id", &[])
            .unwrap()
            .into_iter()
            .map(|r| r[0].1.clone())
            .collect()
    }

    /// Runs `sql` as a batch (a template registration's schema) and as a query (a template's
    /// statement), expects both refused naming `what`, and checks nothing changed.
    fn refused(&mut self, sql: &str, what: &str) {
        let (catalog, files, balances) = (self.catalog(), self.files(), self.balances());
        // The tenant's own directory: the SQL below never names it, so an error showing it
        // came from the server.
        let own = self.dir.path().join("tenant").to_string_lossy().into_owned();
        for (how, r) in [("batch", self.db.batch(sql).map(|_| ())), ("query", self.db.query(sql, &[]).map(|_| ()))] {
            let e = r.expect_err(&format!("{how} {sql:?} must be refused"));
            let text = e.to_string();
            assert!(matches!(e, Error::Database { retryable: false, .. }), "{how} {sql:?}: {e:?}");
            assert!(text.contains("not permitted") && text.contains(what), "{how} {sql:?}: {text}");
            assert!(!text.contains(&own), "{how} {sql:?}: the error shows a server path: {text}");
        }
        assert_eq!(self.catalog(), catalog, "{sql:?}: the catalog changed");
        assert_eq!(self.files(), files, "{sql:?}: files changed");
        assert_eq!(self.balances(), balances, "{sql:?}: the tenant's own rows changed");
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }
}

/// Issue 27 item 8: ATTACH opened the server's catalog from a template registration's schema.
#[test]
fn least_privilege_sqlite_attach_plain_and_by_uri_is_refused() {
    let mut s = Scene::new();
    let cat = s.path("catalog.db");
    s.refused(&format!("ATTACH DATABASE '{cat}' AS cat"), "ATTACH");
    s.refused(&format!("ATTACH 'file:{cat}?mode=rw' AS cat"), "ATTACH");
    s.refused(&format!("ATTACH 'file:{cat}?mode=rw' AS cat; INSERT INTO cat.api_key VALUES ('b', 'admin')"), "ATTACH");
    s.refused(&format!("ATTACH '{}' AS fresh", s.path("new.db")), "ATTACH");
    s.refused("ATTACH ':memory:' AS scratch", "ATTACH");
    // The file named by a bound value, as a template's statement with an LLM's parameter.
    let e = s.db.query("ATTACH ?1 AS cat", &[SqlValue::Text(cat.clone())]).unwrap_err().to_string();
    assert!(e.contains("not permitted: ATTACH DATABASE"), "{e}");
    let e = s.db.execute("DETACH ?1", &[SqlValue::Text("main".into())]).unwrap_err().to_string();
    assert!(e.contains("not permitted: DETACH DATABASE"), "{e}");
    assert_eq!(s.catalog(), vec![("a".to_owned(), "admin".to_owned())]);
}

#[test]
fn least_privilege_sqlite_detach_is_refused() {
    let mut s = Scene::new();
    s.refused("DETACH DATABASE temp", "DETACH");
    s.refused("DETACH DATABASE main", "DETACH");
}

#[test]
fn least_privilege_sqlite_vacuum_into_a_file_is_refused() {
    let mut s = Scene::new();
    let target = s.path("copy.db");
    s.refused(&format!("VACUUM INTO '{target}'"), "ATTACH");
    s.refused("VACUUM INTO '/tmp/tidegate-review-vacuum-into.db'", "ATTACH");
    assert!(!Path::new(&target).exists());
}

#[test]
fn least_privilege_sqlite_load_extension_is_refused() {
    let mut s = Scene::new();
    s.refused("SELECT load_extension('/usr/lib/x86_64-linux-gnu/libsqlite3.so.0')", "load_extension");
    s.refused("SELECT fts3_tokenizer('simple')", "fts3_tokenizer");
}

#[test]
fn least_privilege_sqlite_temp_schema_objects_are_refused() {
    let mut s = Scene::new();
    s.refused("CREATE TEMP TABLE spy (x)", "temp");
    s.refused("CREATE TEMPORARY VIEW spy AS SELECT 1", "temp");
    s.refused("CREATE TEMP TRIGGER spy AFTER UPDATE ON main.account BEGIN UPDATE account SET balance = 0; END", "temp");
    s.refused("CREATE TEMP TRIGGER spy AFTER UPDATE ON account BEGIN SELECT 1; END", "temp");
    s.refused("SELECT * FROM temp.sqlite_master", "temp");
}

#[test]
fn least_privilege_sqlite_dangerous_pragmas_are_refused() {
    let mut s = Scene::new();
    s.refused("PRAGMA writable_schema = ON", "writable_schema");
    s.refused("PRAGMA writable_schema", "writable_schema");
    s.refused("PRAGMA foreign_keys = OFF", "foreign_keys");
    s.refused("PRAGMA database_list", "database_list");
    s.refused("PRAGMA trusted_schema = ON", "trusted_schema");
    s.refused("PRAGMA journal_mode = DELETE", "journal_mode");
    // A pragma of the allow-list works: the policy is not "refuse everything".
    let cols = s.db.query("PRAGMA table_info(account)", &[]).unwrap();
    assert_eq!(cols.len(), 2);
}

/// Issue 27 item 8: a failing json_extract echoed the database's path, read from
/// pragma_database_list.
#[test]
fn least_privilege_sqlite_pragma_table_functions_are_refused_and_no_path_leaks() {
    let mut s = Scene::new();
    s.refused("SELECT file FROM pragma_database_list", "database_list");
    s.refused("SELECT json_extract('{}', file) FROM pragma_database_list", "database_list");
    s.refused("SELECT * FROM pragma_function_list", "function_list");
    s.refused("SELECT * FROM pragma_compile_options", "compile_options");
    s.refused("SELECT * FROM dbstat", "dbstat");
    s.refused("CREATE VIRTUAL TABLE v USING fts5(x)", "virtual table");
    // Hidden in a view of the tenant's own database, it is still refused when read (by
    // trusted_schema = off before the authorizer sees it).
    let _ = s.db.batch("CREATE VIEW leak AS SELECT file FROM pragma_database_list");
    let e = s.db.query("SELECT * FROM leak", &[]).unwrap_err().to_string();
    assert!(e.contains("unsafe use of virtual table \"pragma_database_list\""), "{e}");
    let rows = s.db.query("SELECT name FROM pragma_table_info('account') ORDER BY cid", &[]).unwrap();
    assert_eq!(rows.len(), 2, "an allowed pragma's table function works");
    // Errors that name the database's file say so without the path.
    let root = s.dir.path().to_string_lossy().into_owned();
    let e = s.db.query("SELECT * FROM nowhere", &[]).unwrap_err().to_string();
    assert!(!e.contains(&root), "{e}");
    // Even where SQLite itself names the file (an error opening it), the path is replaced.
    let blocked = s.dir.path().join("blocked");
    std::fs::create_dir(&blocked).unwrap();
    let e = SqliteDatabase::open(&blocked).unwrap_err().to_string();
    assert!(!e.contains(&root), "{e}");
}

/// A statement running longer than the statement timeout is interrupted, and the connection
/// keeps working.
#[test]
fn least_privilege_sqlite_a_runaway_statement_is_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let bounds = SqlBounds { statement_timeout: Duration::from_millis(300) };
    let mut db = SqliteDatabase::open_with(&dir.path().join("r.db"), bounds).unwrap();
    db.batch(SCHEMA).unwrap();
    let started = Instant::now();
    let e = db
        .query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", &[])
        .unwrap_err();
    let took = started.elapsed();
    assert!(e.to_string().contains("statement timeout of 300 ms"), "{e}");
    assert!(!e.retryable());
    assert!(took < Duration::from_secs(5), "interrupted after {took:?}");
    assert_eq!(db.query("SELECT count(*) FROM account", &[]).unwrap()[0][0].1, SqlValue::Int(2));
}

/// Limits: no database can be attached even if the authorizer were bypassed, and oversized
/// values are refused.
#[test]
fn least_privilege_sqlite_limits_hold() {
    let mut s = Scene::new();
    let e = s.db.query("SELECT length(zeroblob(100000000))", &[]).unwrap_err();
    assert!(e.to_string().contains("too big"), "{e}");
    let e = s.db.query(&format!("SELECT '{}'", "x".repeat(2 << 20)), &[]).unwrap_err();
    assert!(e.to_string().contains("too long") || e.to_string().contains("too big"), "{e}");
}

/// Everything the middleware itself needs still runs under the policy: the manager's schema,
/// JSON, recursive CTEs, triggers and views in the tenant's own database.
#[test]
fn least_privilege_sqlite_ordinary_sql_still_runs() {
    let mut s = Scene::new();
    s.db.batch(
        "CREATE TABLE IF NOT EXISTS audit (n INTEGER);
         CREATE TRIGGER IF NOT EXISTS audited AFTER UPDATE ON account BEGIN INSERT INTO audit VALUES (NEW.id); END;
         CREATE VIEW IF NOT EXISTS rich AS SELECT id FROM account WHERE balance > 50;
         CREATE INDEX IF NOT EXISTS by_balance ON account (balance);
         BEGIN; UPDATE account SET balance = balance + 1 WHERE id = 1; COMMIT;
         SAVEPOINT s; RELEASE s;",
    )
    .unwrap();
    let rows =
        s.db.query(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3)
             SELECT json_extract(json_object('n', (SELECT count(*) FROM c)), '$.n') AS n,
                    (SELECT count(*) FROM audit) AS audited, (SELECT count(*) FROM rich) AS rich,
                    datetime(0, 'unixepoch') AS t, abs(-2) AS a, lower('X') AS l",
            &[],
        )
        .unwrap();
    assert_eq!(rows[0][0].1, SqlValue::Int(3));
    assert_eq!(rows[0][1].1, SqlValue::Int(1));
    assert_eq!(rows[0][2].1, SqlValue::Int(2));
    let each = s.db.query("SELECT value FROM json_each('[1,2,3]')", &[]).unwrap();
    assert_eq!(each.len(), 3);
    let mut m = SqliteDatabase::memory().unwrap();
    m.batch(SCHEMA).unwrap();
    m.begin().unwrap();
    assert_eq!(
        m.execute("UPDATE account SET balance = ?1 WHERE id = ?2", &[SqlValue::Int(5), SqlValue::Int(1)]).unwrap(),
        1
    );
    m.commit().unwrap();
}

#[cfg(feature = "postgres")]
mod pg {
    use std::time::{Duration, Instant};

    use tidegate_review::pg::tenant_role_name;
    use tidegate_review::value::SqlValue;
    use tidegate_review::{Database, Error, PgDatabase, PgTenantOptions, SqlBounds};

    fn super_url() -> String {
        std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    /// A database of the test's own and an admin role with CREATEROLE that owns it, made by
    /// the superuser at `TIDEGATE_PG_URL` (used for setup and for reading what changed, never
    /// by a tenant). Dropped with the tenants' roles at the end.
    pub struct Scene {
        pub database: String,
        pub admin: String,
        pub admin_url: String,
        host: String,
        port: u16,
        roles: Vec<String>,
    }

    impl Scene {
        pub fn new(tag: &str) -> Option<Scene> {
            let mut su = match postgres::Client::connect(&super_url(), postgres::NoTls) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("SKIPPED: no PostgreSQL at {} ({e}); set TIDEGATE_PG_URL to run this test", super_url());
                    return None;
                }
            };
            let cfg: postgres::Config = super_url().parse().unwrap();
            let host = match &cfg.get_hosts()[0] {
                postgres::config::Host::Tcp(h) => h.clone(),
                other => panic!("TIDEGATE_PG_URL must name a TCP host, not {other:?}"),
            };
            let port = cfg.get_ports().first().copied().unwrap_or(5432);
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            let unique = format!("{tag}_{}_{}", std::process::id(), nanos % 1_000_000_000_000);
            let (database, admin) = (format!("tg_lp_{unique}"), format!("tg_lp_admin_{unique}"));
            su.batch_execute(&format!("CREATE ROLE {admin} LOGIN CREATEROLE")).unwrap();
            su.batch_execute(&format!("CREATE DATABASE {database} OWNER {admin}")).unwrap();
            let admin_url = format!("postgres://{admin}@{host}:{port}/{database}");
            Some(Scene { database, admin, admin_url, host, port, roles: Vec::new() })
        }

        /// The superuser, on the scene's database.
        pub fn superuser(&self) -> postgres::Client {
            let mut cfg: postgres::Config = super_url().parse().unwrap();
            cfg.dbname(&self.database);
            cfg.connect(postgres::NoTls).unwrap()
        }

        pub fn tenant(&mut self, schema: &str, options: &PgTenantOptions) -> PgDatabase {
            self.roles.push(tenant_role_name(&self.database, schema));
            PgDatabase::connect_tenant(&self.admin_url, schema, options).unwrap()
        }

        pub fn url_as(&self, user: &str) -> String {
            format!("postgres://{user}@{}:{}/{}", self.host, self.port, self.database)
        }
    }

    impl Drop for Scene {
        fn drop(&mut self) {
            let Ok(mut su) = postgres::Client::connect(&super_url(), postgres::NoTls) else { return };
            let _ = su.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database));
            for r in self.roles.iter().chain([&self.admin]) {
                let _ = su.batch_execute(&format!("DROP ROLE IF EXISTS {r}"));
            }
        }
    }

    /// What the superuser sees of everything a tenant might have changed: tenant a's rows, the
    /// attributes, memberships and password verifiers of `roles` (and of any role named
    /// `evil`), the database's extensions and schemas, and the grants on the database. (Only
    /// these roles: other tests create and drop roles of their own at the same time.)
    fn world(su: &mut postgres::Client, a_schema: &str, roles: &[String]) -> Vec<String> {
        let names: Vec<String> =
            roles.iter().chain(&["postgres".to_owned(), "evil".to_owned()]).map(|r| format!("'{r}'")).collect();
        let names = names.join(", ");
        let mut out = Vec::new();
        for r in su
            .query(&format!("SELECT id::text || '=' || balance::text FROM {a_schema}.account ORDER BY id"), &[])
            .unwrap()
        {
            out.push(r.get(0));
        }
        for sql in [
            format!(
                "SELECT rolname::text || ':' || rolsuper::text || rolcreaterole::text || rolcreatedb::text || \
                 rolcanlogin::text || rolbypassrls::text || coalesce(rolpassword, '') FROM pg_authid \
                 WHERE rolname IN ({names}) ORDER BY rolname"
            ),
            format!(
                "SELECT roleid::regrole::text || '>' || member::regrole::text FROM pg_auth_members \
                 WHERE roleid::regrole::text IN ({names}) OR member::regrole::text IN ({names}) ORDER BY 1"
            ),
            "SELECT extname::text FROM pg_extension ORDER BY 1".to_owned(),
            "SELECT nspname::text || ':' || nspowner::regrole::text FROM pg_namespace ORDER BY 1".to_owned(),
            "SELECT coalesce(datacl::text, '') FROM pg_database WHERE datname = current_database()".to_owned(),
        ] {
            for r in su.query(&sql, &[]).unwrap() {
                out.push(r.get(0));
            }
        }
        out
    }

    fn refused(db: &mut PgDatabase, sql: &str, expect: &str) {
        let e = db.batch(sql).expect_err(&format!("{sql:?} must be refused"));
        assert!(matches!(e, Error::Database { retryable: false, .. }), "{sql:?}: {e:?}");
        assert!(e.to_string().contains(expect), "{sql:?}: {e}");
    }

    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
        INSERT INTO account VALUES (1, 100), (2, 100) ON CONFLICT DO NOTHING;";

    /// Issue 27 item 8: on PostgreSQL the review connection ran as the configured role (a
    /// superuser on the test machine), so a template's SQL reached other tenants' schemas,
    /// files and programs. Every escape below is refused by the tenant role's privileges, and
    /// the superuser sees nothing changed.
    #[test]
    fn least_privilege_pg_a_tenant_role_reaches_only_its_own_schema() {
        let Some(mut s) = Scene::new("escape") else { return };
        let opts = PgTenantOptions::default();
        let mut a = s.tenant("tenant_a", &opts);
        let mut b = s.tenant("tenant_b", &opts);
        a.batch(SCHEMA).unwrap();
        b.batch(SCHEMA).unwrap();
        refused(&mut b, "CREATE EXTENSION dblink", "permission denied to create extension");
        // Installed by the superuser, it is still out of the tenant's reach.
        let mut su = s.superuser();
        su.batch_execute("CREATE EXTENSION IF NOT EXISTS dblink SCHEMA public").unwrap();
        let a_role = tenant_role_name(&s.database, "tenant_a");
        let roles = vec![s.admin.clone(), a_role.clone(), tenant_role_name(&s.database, "tenant_b")];
        let before = world(&mut su, "tenant_a", &roles);
        let marker = format!("/tmp/tidegate-lp-{}", s.database);
        let cases = [
            ("SELECT * FROM tenant_a.account".to_owned(), "permission denied for schema tenant_a"),
            ("UPDATE tenant_a.account SET balance = 0".to_owned(), "permission denied for schema tenant_a"),
            ("SET search_path TO tenant_a; UPDATE account SET balance = 0".to_owned(), "does not exist"),
            (format!("COPY account TO PROGRAM 'touch {marker}'"), "pg_execute_server_program"),
            ("COPY account FROM '/etc/passwd'".to_owned(), "pg_read_server_files"),
            ("COPY account TO '/tmp/tidegate-lp-copy'".to_owned(), "pg_write_server_files"),
            ("SET ROLE postgres".to_owned(), "permission denied to set role"),
            (format!("SET ROLE {}", s.admin), "permission denied to set role"),
            (format!("SET ROLE {a_role}"), "permission denied to set role"),
            ("SET SESSION AUTHORIZATION postgres".to_owned(), "permission denied to set session authorization"),
            ("RESET ROLE; UPDATE tenant_a.account SET balance = 0".to_owned(), "permission denied for schema tenant_a"),
            ("CREATE EXTENSION postgres_fdw".to_owned(), "permission denied to create extension"),
            (
                "SELECT public.dblink_connect('dbname=test user=postgres')".to_owned(),
                "permission denied for schema public",
            ),
            ("SELECT pg_read_file('/etc/passwd')".to_owned(), "permission denied for function pg_read_file"),
            ("SELECT pg_ls_dir('.')".to_owned(), "permission denied for function pg_ls_dir"),
            ("SELECT lo_import('/etc/passwd')".to_owned(), "permission denied for function lo_import"),
            ("SELECT * FROM pg_authid".to_owned(), "permission denied for table pg_authid"),
            (format!("ALTER ROLE {a_role} PASSWORD 'known'"), "permission denied"),
            ("ALTER ROLE CURRENT_USER SUPERUSER".to_owned(), "superuser"),
            ("ALTER ROLE CURRENT_USER CREATEROLE".to_owned(), "permission denied"),
            ("CREATE ROLE evil LOGIN".to_owned(), "permission denied to create role"),
            ("CREATE DATABASE evil".to_owned(), "permission denied to create database"),
            ("CREATE SCHEMA evil".to_owned(), "permission denied for database"),
            ("CREATE TABLE public.evil (x int)".to_owned(), "permission denied for schema public"),
            ("CREATE TEMP TABLE evil (x int)".to_owned(), "permission denied to create temporary tables"),
            (format!("GRANT {a_role} TO CURRENT_USER"), "must have admin option"),
        ];
        for (sql, expect) in &cases {
            refused(&mut b, sql, expect);
        }
        assert_eq!(world(&mut su, "tenant_a", &roles), before, "the superuser sees something changed");
        assert!(!std::path::Path::new(&marker).exists(), "COPY TO PROGRAM ran");
        // Both tenants still work on their own tables.
        b.batch("UPDATE account SET balance = balance + 1 WHERE id = 1").unwrap();
        let rows = a.query("SELECT balance FROM account WHERE id = 1", &[]).unwrap();
        assert_eq!(rows[0][0].1, SqlValue::Int(100));
        assert_eq!(a.role(), Some(a_role.as_str()));
    }

    /// A superuser admin URL is refused unless explicitly allowed; allowed, the tenant's SQL
    /// still runs as the tenant's role.
    #[test]
    fn least_privilege_pg_a_superuser_admin_is_refused_unless_allowed() {
        let Some(mut s) = Scene::new("superuser") else { return };
        let su_url = s.url_as("postgres");
        let e = PgDatabase::connect_tenant(&su_url, "tenant_s", &PgTenantOptions::default()).unwrap_err();
        assert!(matches!(e, Error::Privilege { .. }), "{e:?}");
        assert!(e.to_string().contains("superuser"), "{e}");
        let e = PgDatabase::check_admin(&su_url, false, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, Error::Privilege { .. }), "{e:?}");
        PgDatabase::check_admin(&s.admin_url, false, Duration::from_secs(5)).unwrap();
        PgDatabase::check_admin(&su_url, true, Duration::from_secs(5)).unwrap();
        // A role that cannot create roles cannot be an admin connection.
        let plain = format!("{}_plain", s.admin);
        s.roles.push(plain.clone());
        s.superuser().batch_execute(&format!("CREATE ROLE {plain} LOGIN")).unwrap();
        let e = PgDatabase::check_admin(&s.url_as(&plain), false, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("CREATEROLE"), "{e}");
        // An unreachable server is retryable, not a refusal.
        let e =
            PgDatabase::check_admin("postgres://nobody@127.0.0.1:1/none", false, Duration::from_secs(2)).unwrap_err();
        assert!(e.retryable(), "{e:?}");

        let allowed = PgTenantOptions { allow_superuser_admin: true, ..Default::default() };
        s.roles.push(tenant_role_name(&s.database, "tenant_s"));
        let mut db = PgDatabase::connect_tenant(&su_url, "tenant_s", &allowed).unwrap();
        let who = db
            .query(
                "SELECT current_user::text AS u, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS s",
                &[],
            )
            .unwrap();
        assert_eq!(who[0][0].1, SqlValue::Text(tenant_role_name(&s.database, "tenant_s")));
        assert_eq!(who[0][1].1, SqlValue::Int(0));
        refused(&mut db, "SET ROLE postgres", "permission denied to set role");
    }

    /// Tenants set up at the same time on one database all succeed (their grants collide and
    /// are retried), and a tenant holding advisory locks (or anything it may lock) does not
    /// stop another's setup: the setup takes no lock a tenant could hold.
    #[test]
    fn least_privilege_pg_concurrent_setups_succeed_and_a_tenant_cannot_block_them() {
        let Some(mut s) = Scene::new("concurrent") else { return };
        let opts = PgTenantOptions::default();
        let mut hog = s.tenant("tenant_hog", &opts);
        hog.batch("SELECT pg_advisory_lock(k) FROM generate_series(0, 1000) k").unwrap();
        hog.batch("SELECT pg_advisory_lock(8388608001166409729)").unwrap();
        let names: Vec<String> = (0..6).map(|i| format!("tenant_c{i}")).collect();
        for n in &names {
            s.roles.push(tenant_role_name(&s.database, n));
        }
        let url = s.admin_url.clone();
        let started = Instant::now();
        let handles: Vec<_> = names
            .iter()
            .cloned()
            .map(|n| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let mut db = PgDatabase::connect_tenant(&url, &n, &PgTenantOptions::default())?;
                    db.batch("CREATE TABLE IF NOT EXISTS t (x BIGINT); INSERT INTO t VALUES (1)")?;
                    Ok::<_, Error>(db.query("SELECT count(*) AS n FROM t", &[])?[0][0].1.clone())
                })
            })
            .collect();
        for (n, h) in names.iter().zip(handles) {
            assert_eq!(h.join().unwrap().unwrap_or_else(|e| panic!("{n}: {e}")), SqlValue::Int(1), "{n}");
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
        drop(hog);
    }

    /// The tenant's SQL may lift its session's statement_timeout; the watchdog still cancels.
    #[test]
    fn least_privilege_pg_a_tenant_cannot_lift_its_statement_timeout() {
        let Some(mut s) = Scene::new("timeout") else { return };
        let opts = PgTenantOptions {
            bounds: SqlBounds { statement_timeout: Duration::from_millis(500) },
            ..Default::default()
        };
        let mut db = s.tenant("tenant_t", &opts);
        let started = Instant::now();
        let e = db.batch("SELECT pg_sleep(5)").unwrap_err();
        assert!(e.to_string().contains("statement timeout of 500 ms"), "{e}");
        let started2 = Instant::now();
        let e = db.batch("SET statement_timeout = 0; SELECT pg_sleep(30)").unwrap_err();
        let took = started2.elapsed();
        assert!(e.to_string().contains("statement timeout of 500 ms"), "{e}");
        assert!(!e.retryable());
        assert!(took < Duration::from_secs(10), "cancelled after {took:?}");
        assert!(started.elapsed() < Duration::from_secs(15));
        // The connection keeps working, and `begin` restores the timeout.
        db.begin().unwrap();
        let e = db.query("SELECT pg_sleep(3)", &[]).unwrap_err();
        assert!(e.to_string().contains("statement timeout"), "{e}");
        db.rollback().unwrap();
        assert_eq!(db.query("SELECT 1::bigint AS one", &[]).unwrap()[0][0].1, SqlValue::Int(1));
    }

    /// A schema an earlier version made as the admin's role (tables owned by it) is given to the
    /// tenant's role; opening again (a fresh password) works and keeps the rows. One the admin
    /// role does not own is refused, naming it.
    #[test]
    fn least_privilege_pg_reopening_takes_over_an_earlier_schema_and_keeps_its_rows() {
        let Some(mut s) = Scene::new("reopen") else { return };
        let mut su = s.superuser();
        su.batch_execute("CREATE SCHEMA tenant_su").unwrap();
        s.roles.push(tenant_role_name(&s.database, "tenant_su"));
        let e = PgDatabase::connect_tenant(&s.admin_url, "tenant_su", &PgTenantOptions::default()).unwrap_err();
        assert!(e.to_string().contains("must be owner of schema tenant_su"), "{e}");
        let mut admin = postgres::Client::connect(&s.admin_url, postgres::NoTls).unwrap();
        admin.batch_execute(
            "CREATE SCHEMA tenant_old; CREATE TABLE tenant_old.account (id BIGSERIAL PRIMARY KEY, balance BIGINT);
             INSERT INTO tenant_old.account (balance) VALUES (7); CREATE VIEW tenant_old.v AS SELECT * FROM tenant_old.account;",
        )
        .unwrap();
        let opts = PgTenantOptions::default();
        let mut db = s.tenant("tenant_old", &opts);
        db.batch("INSERT INTO account (balance) VALUES (8); UPDATE account SET balance = balance + 1").unwrap();
        assert_eq!(
            db.query("SELECT CAST(SUM(balance) AS BIGINT) AS s FROM v", &[]).unwrap()[0][0].1,
            SqlValue::Int(17)
        );
        drop(db);
        let mut again = s.tenant("tenant_old", &opts);
        assert_eq!(again.query("SELECT count(*) AS n FROM account", &[]).unwrap()[0][0].1, SqlValue::Int(2));
        let owners: Vec<String> = su
            .query(
                "SELECT DISTINCT relowner::regrole::text FROM pg_class WHERE relnamespace = 'tenant_old'::regnamespace",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(owners, vec![tenant_role_name(&s.database, "tenant_old")]);
    }
}
