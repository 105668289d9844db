//! Least privilege of the review middleware over HTTP (issue 27 items 7 and 8, docs/review.md
//! "Least privilege"): one tenant's SQL (a registration's `schema`, a template's statements
//! with the values an LLM chose) never reaches the catalog, the server's files or another
//! tenant, on SQLite and on PostgreSQL; refusals are clear problems that show no server path;
//! and a server with a PostgreSQL review tenant shuts down cleanly.
//!
//! PostgreSQL tests use the superuser at `TIDEGATE_PG_URL` (default
//! postgres://postgres@127.0.0.1:5432/test) only to set up a database and an admin role of
//! their own (CREATEROLE, owner of the database) and to read what changed; they are skipped with
//! a message when no server answers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidegate_review::value::SqlValue;
use tidegate_review::{Database, PgDatabase};
use tidegate_server::AppState;
use tidegate_server::config::Config;

use crate::common::{Harness, Keys};

/// Accounts, one template per write kind the escapes need.
fn set() -> Value {
    json!({
        "tables": {"account": {"primary_key": ["id"]}},
        "invariants": [{"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0}],
        "templates": [
            {"name": "deposit", "params": ["id", "amount"],
             "steps": [{"statements": [{"sql": "UPDATE account SET balance = balance + :amount WHERE id = :id"}]}],
             "writes": [{"table": "account", "column": "balance", "kind": "increment", "row": {"id": "id"}}]}
        ]
    })
}

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
INSERT OR IGNORE INTO account VALUES (1, 100), (2, 100);";

const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
INSERT INTO account VALUES (1, 100), (2, 100) ON CONFLICT DO NOTHING;";

/// A template whose one statement is `sql` (writing `account` as declared), for the escapes
/// an LLM's parameter values would drive.
fn hostile_template(name: &str, params: &[&str], sql: &str) -> Value {
    json!({"templates": [{"name": name, "params": params,
        "steps": [{"statements": [{"sql": sql}]}],
        "writes": [{"table": "account", "kind": "insert", "row": {"id": "id"}}]}]})
}

async fn register(h: &Harness, k: &Keys, schema: &str) {
    let r =
        h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": set(), "schema": schema}))).await;
    assert!(r.status == 201 || r.status == 200, "{r:?}");
}

async fn deposit(h: &Harness, k: &Keys, id: i64) -> Value {
    let body = json!({"template": "deposit", "params": {"id": id, "amount": 1}});
    let r = h.req("POST", "/v1/review/transactions", Some(&k.agent), Some(body)).await;
    assert_eq!(r.status, 201, "{r:?}");
    r.body
}

/// Registers `schema` as `k`'s operator and expects a 422 `database_refused` whose detail
/// contains `expect` and none of `secrets`.
async fn refused_schema(h: &Harness, k: &Keys, schema: &str, expect: &str, secrets: &[String]) {
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": {}, "schema": schema}))).await;
    assert_eq!((r.status, r.body["code"].as_str()), (422, Some("database_refused")), "{schema:?}: {r:?}");
    assert!(r.content_type().starts_with("application/problem+json"), "{r:?}");
    let detail = r.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(expect), "{schema:?}: expected {expect:?} in {detail:?}");
    for s in secrets {
        assert!(!r.text.contains(s.as_str()), "{schema:?}: the problem shows {s:?}: {r:?}");
    }
}

/// Registers a hostile template as `k`'s operator, requests it as `k`'s agent with `params`,
/// and expects the transaction `failed` with an error containing `expect` and none of
/// `secrets`.
async fn refused_template(
    h: &Harness,
    k: &Keys,
    name: &str,
    sql: &str,
    params: Value,
    expect: &str,
    secrets: &[String],
) {
    let names: Vec<&str> = params.as_object().unwrap().keys().map(String::as_str).collect();
    let body = json!({"set": hostile_template(name, &names, sql)});
    let r = h.req("POST", "/v1/review/templates", Some(&k.operator), Some(body)).await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = h
        .req("POST", "/v1/review/transactions", Some(&k.agent), Some(json!({"template": name, "params": params})))
        .await;
    assert_eq!((r.status, r.body["status"].as_str()), (201, Some("failed")), "{sql:?}: {r:?}");
    let error = r.body["error"].as_str().unwrap_or_default();
    assert!(error.contains(expect), "{sql:?}: expected {expect:?} in {error:?}");
    for s in secrets {
        assert!(!r.text.contains(s.as_str()), "{sql:?}: the transaction shows {s:?}: {r:?}");
    }
}

/// Every file under `dir` but SQLite's WAL and shared-memory files and the logs.
fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap().path();
            if e.is_dir() {
                walk(&e, out);
            } else if !["-wal", "-shm", ".log"].iter().any(|s| e.to_string_lossy().ends_with(s)) {
                out.push(e);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The catalog's tenants and keys (ids, roles, hashes, revocations).
fn catalog(dir: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open_with_flags(dir.join("catalog.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut out = Vec::new();
    for sql in [
        "SELECT name || ' ' || tag FROM tenants ORDER BY 1",
        "SELECT id || ' ' || tenant || ' ' || role || ' ' || hex(hash) || ' ' || coalesce(revoked_at_ms, '') FROM keys ORDER BY 1",
    ] {
        let mut st = c.prepare(sql).unwrap();
        out.extend(st.query_map([], |r| r.get::<_, String>(0)).unwrap().map(Result::unwrap));
    }
    out
}

fn balances(dir: &Path, tenant: &str) -> Vec<(i64, i64)> {
    let c = rusqlite::Connection::open(dir.join(format!("tenants/{tenant}/review.db"))).unwrap();
    let mut st = c.prepare("SELECT id, balance FROM account ORDER BY id").unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
}

/// Issue 27 item 8: an operator of one tenant attached the server's catalog from a template
/// registration's `schema`, inserted an admin key for another tenant and used it; a failing
/// json_extract echoed the database's path. On SQLite every such escape is now refused by the
/// review connection's authorizer and limits, with a problem that names the refusal and no
/// path, and nothing changes: the catalog, the other tenant's rows, the data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_sql_of_one_tenant_never_reaches_the_catalog_files_or_another_tenant_on_sqlite() {
    let h = Harness::durable(tempfile::tempdir().unwrap(), |c| c.server.shutdown_drain_ms = 300).await;
    let data = h.dir.as_ref().unwrap().path().to_owned();
    let (_, alpha) = h.tenant("alpha");
    let (_, bravo) = h.tenant("bravo");
    register(&h, &alpha, SQLITE_SCHEMA).await;
    register(&h, &bravo, SQLITE_SCHEMA).await;
    assert_eq!(deposit(&h, &alpha, 1).await["status"], "committed");
    let whoami = h.req("GET", "/v1/whoami", Some(&bravo.operator), None).await.body;
    let (cat, rows, before_files) = (catalog(&data), balances(&data, "alpha"), files(&data));
    let data_text = data.to_string_lossy().into_owned();
    let canonical = std::fs::canonicalize(&data).unwrap().to_string_lossy().into_owned();
    let secrets = vec![data_text.clone(), canonical, "alpha".to_owned()];
    let catalog_db = data.join("catalog.db").to_string_lossy().into_owned();
    let alpha_db = data.join("tenants/alpha/review.db").to_string_lossy().into_owned();
    let outside = data.join("stolen.db").to_string_lossy().into_owned();
    let cases = [
        (format!("ATTACH DATABASE '{catalog_db}' AS cat"), "ATTACH"),
        (
            format!(
                "ATTACH 'file:{catalog_db}?mode=rw' AS cat; INSERT INTO cat.keys SELECT 'k_x', 'alpha', 'admin', hash, NULL, 0, NULL FROM cat.keys"
            ),
            "ATTACH",
        ),
        (format!("ATTACH '{alpha_db}' AS victim; UPDATE victim.account SET balance = 0"), "ATTACH"),
        ("DETACH DATABASE temp".to_owned(), "DETACH"),
        (format!("VACUUM INTO '{outside}'"), "ATTACH"),
        ("SELECT load_extension('/usr/lib/x86_64-linux-gnu/libsqlite3.so.0')".to_owned(), "load_extension"),
        ("CREATE TEMP TRIGGER t AFTER UPDATE ON account BEGIN SELECT 1; END".to_owned(), "temp"),
        ("CREATE TEMP TABLE t (x)".to_owned(), "temp"),
        ("PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql = 'x'".to_owned(), "writable_schema"),
        ("SELECT json_extract('{}', file) FROM pragma_database_list".to_owned(), "database_list"),
        ("SELECT * FROM pragma_database_list".to_owned(), "database_list"),
    ];
    for (sql, expect) in &cases {
        refused_schema(&h, &bravo, sql, expect, &secrets).await;
    }
    // The same escapes from a template's statement, with the value an LLM chose (the
    // transaction shows its own parameters, so the data directory may appear there; the
    // tenants' directories may not).
    let secrets = vec![data.join("tenants").to_string_lossy().into_owned(), "alpha".to_owned()];
    refused_template(
        &h,
        &bravo,
        "attach",
        "ATTACH :path AS cat",
        json!({"id": 1, "path": catalog_db}),
        "not permitted: ATTACH DATABASE",
        &secrets,
    )
    .await;
    refused_template(
        &h,
        &bravo,
        "peek",
        "INSERT INTO account (id, balance) SELECT :id, length(file) FROM pragma_database_list",
        json!({"id": 9}),
        "database_list",
        &secrets,
    )
    .await;

    assert_eq!(catalog(&data), cat, "the catalog changed");
    assert_eq!(balances(&data, "alpha"), rows, "the other tenant's rows changed");
    assert_eq!(files(&data), before_files, "the data directory changed");
    assert_eq!(h.req("GET", "/v1/whoami", Some(&bravo.operator), None).await.body, whoami);
    assert_eq!(deposit(&h, &alpha, 1).await["status"], "committed", "the other tenant still works");
    assert_eq!(deposit(&h, &bravo, 2).await["status"], "committed", "the hostile tenant's own tables still work");
    h.stop().await;
}

fn super_url() -> String {
    std::env::var("TIDEGATE_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Runs `f` on a blocking thread with a trusted connection to `url` (the blocking client runs
/// a runtime of its own).
async fn on_pg<R: Send + 'static>(
    url: String,
    f: impl FnOnce(&mut PgDatabase) -> R + Send + 'static,
) -> Result<R, String> {
    tokio::task::spawn_blocking(move || {
        let mut db = PgDatabase::connect(&url, None).map_err(|e| e.to_string())?;
        Ok(f(&mut db))
    })
    .await
    .unwrap()
}

/// A database and an admin role (CREATEROLE, owner of the database) of the test's own, made by
/// the superuser; dropped, with the tenants' roles, by [`PgScene::drop_all`].
pub(crate) struct PgScene {
    database: String,
    admin: String,
    host_port: String,
}

impl PgScene {
    /// `None`, with a message, when no PostgreSQL answers.
    pub(crate) async fn new(tag: &str) -> Option<PgScene> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let unique = format!("{tag}_{}_{}", std::process::id(), nanos % 1_000_000_000_000);
        let (database, admin) = (format!("tg_rs_{unique}"), format!("tg_rs_admin_{unique}"));
        let (d, a) = (database.clone(), admin.clone());
        let made = on_pg(super_url(), move |su| {
            su.batch(&format!("CREATE ROLE {a} LOGIN CREATEROLE")).unwrap();
            su.batch(&format!("CREATE DATABASE {d} OWNER {a}")).unwrap();
        })
        .await;
        if let Err(e) = made {
            eprintln!("SKIPPED: no PostgreSQL at {} ({e}); set TIDEGATE_PG_URL to run this test", super_url());
            return None;
        }
        let rest = super_url().split_once('@').map(|(_, r)| r.to_owned()).unwrap();
        let host_port = rest.split('/').next().unwrap().to_owned();
        Some(PgScene { database, admin, host_port })
    }

    fn url_as(&self, user: &str) -> String {
        format!("postgres://{user}@{}/{}", self.host_port, self.database)
    }

    pub(crate) fn admin_url(&self) -> String {
        self.url_as(&self.admin)
    }

    pub(crate) fn superuser_url(&self) -> String {
        let (scheme_user, _) = super_url().split_once('@').map(|(a, b)| (a.to_owned(), b.to_owned())).unwrap();
        format!("{scheme_user}@{}/{}", self.host_port, self.database)
    }

    fn schema(tenant: &str) -> String {
        tidegate_server::config::ReviewSection::default().pg_schema(tenant).unwrap()
    }

    fn role(&self, tenant: &str) -> String {
        tidegate_review::pg::tenant_role_name(&self.database, &Self::schema(tenant))
    }

    /// Drops the database, its tenant roles and the admin role (also done on drop, so a
    /// failing test leaves nothing behind).
    pub(crate) async fn drop_all(self) {
        tokio::task::spawn_blocking(move || drop(self)).await.unwrap();
    }
}

impl Drop for PgScene {
    /// Drops the database, every tenant role granted CONNECT on it, and the roles whose names
    /// start with the admin's, from a thread of its own (the blocking client cannot run on a
    /// tokio worker).
    fn drop(&mut self) {
        let (database, admin) = (self.database.clone(), self.admin.clone());
        let cleanup = std::thread::spawn(move || {
            let Ok(mut su) = PgDatabase::connect(&super_url(), None) else { return };
            let tenants = su
                .query(
                    &format!(
                        "SELECT r.rolname::text AS r FROM pg_database d, aclexplode(d.datacl) a \
                         JOIN pg_roles r ON r.oid = a.grantee WHERE d.datname = '{database}' AND r.rolname LIKE 'tgr\\_%'"
                    ),
                    &[],
                )
                .unwrap_or_default();
            let _ = su.batch(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"));
            let mut roles: Vec<String> = tenants
                .into_iter()
                .filter_map(|r| match &r[0].1 {
                    SqlValue::Text(t) => Some(t.clone()),
                    _ => None,
                })
                .collect();
            let admins = su
                .query(&format!("SELECT rolname::text AS r FROM pg_roles WHERE rolname LIKE '{admin}%'"), &[])
                .unwrap_or_default();
            roles.extend(admins.into_iter().filter_map(|r| match &r[0].1 {
                SqlValue::Text(t) => Some(t.clone()),
                _ => None,
            }));
            for r in roles {
                let _ = su.batch(&format!("DROP ROLE IF EXISTS {r}"));
            }
        });
        let _ = cleanup.join();
    }
}

/// What the superuser sees of everything a tenant might have changed: alpha's rows, the
/// attributes, memberships and password verifiers of `roles` (and of any role named `evil`),
/// the scene database's extensions, schemas and grants. (Only these roles: other tests create
/// and drop roles of their own at the same time.)
async fn pg_world(scene: &PgScene, alpha_schema: &str, roles: &[String]) -> Vec<String> {
    let schema = alpha_schema.to_owned();
    let names: Vec<String> =
        roles.iter().chain(&["postgres".to_owned(), "evil".to_owned()]).map(|r| format!("'{r}'")).collect();
    let names = names.join(", ");
    on_pg(scene.superuser_url(), move |su| {
        let mut out = Vec::new();
        for sql in [
            format!("SELECT id::text || '=' || balance::text AS x FROM {schema}.account ORDER BY id"),
            format!(
                "SELECT rolname::text || ':' || rolsuper::text || rolcreaterole::text || rolcreatedb::text || \
                 rolcanlogin::text || rolbypassrls::text || coalesce(rolpassword, '') AS x FROM pg_authid \
                 WHERE rolname IN ({names}) ORDER BY rolname"
            ),
            format!(
                "SELECT roleid::regrole::text || '>' || member::regrole::text AS x FROM pg_auth_members \
                 WHERE roleid::regrole::text IN ({names}) OR member::regrole::text IN ({names}) ORDER BY 1"
            ),
            "SELECT extname::text AS x FROM pg_extension ORDER BY 1".to_owned(),
            "SELECT nspname::text || ':' || nspowner::regrole::text AS x FROM pg_namespace ORDER BY 1".to_owned(),
            "SELECT coalesce(datacl::text, '') AS x FROM pg_database WHERE datname = current_database()".to_owned(),
        ] {
            for r in su.query(&sql, &[]).unwrap() {
                out.push(format!("{:?}", r[0].1));
            }
        }
        out
    })
    .await
    .unwrap()
}

/// Issue 27 item 8 on PostgreSQL: the review connection ran as the configured role (a
/// superuser here), so a template's SQL reached other tenants' schemas and whatever that role
/// could do. Now each tenant's SQL runs as a login role of its own that owns only its schema:
/// every escape is refused with the database's clear error, the hostile tenant's attempts
/// change nothing the superuser can see, and the other tenant keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_sql_of_one_tenant_never_reaches_another_tenant_files_or_roles_on_postgres() {
    let Some(scene) = PgScene::new("escape").await else { return };
    let admin_url = scene.admin_url();
    let h = Harness::memory(move |c| {
        c.review.database = admin_url;
        c.server.shutdown_drain_ms = 300;
    })
    .await;
    let (_, alpha) = h.tenant("alpha");
    let (_, bravo) = h.tenant("bravo");
    register(&h, &alpha, PG_SCHEMA).await;
    register(&h, &bravo, PG_SCHEMA).await;
    assert_eq!(deposit(&h, &alpha, 1).await["status"], "committed");
    let a_schema = PgScene::schema("alpha");
    on_pg(scene.superuser_url(), |su| su.batch("CREATE EXTENSION IF NOT EXISTS dblink SCHEMA public").unwrap())
        .await
        .unwrap();
    let roles = vec![scene.admin.clone(), scene.role("alpha"), scene.role("bravo")];
    let before = pg_world(&scene, &a_schema, &roles).await;
    let marker = format!("/tmp/tidegate-review-security-{}", scene.database);
    let a_role = scene.role("alpha");
    // (The admin role's name is in the tenant's own SQL below, and readable in pg_roles.)
    let secrets = vec![super_url()];
    let cases = [
        (format!("SELECT * FROM {a_schema}.account"), format!("permission denied for schema {a_schema}")),
        (format!("UPDATE {a_schema}.account SET balance = 0"), format!("permission denied for schema {a_schema}")),
        (format!("COPY account TO PROGRAM 'touch {marker}'"), "pg_execute_server_program".to_owned()),
        ("COPY account FROM '/etc/passwd'".to_owned(), "pg_read_server_files".to_owned()),
        ("SET ROLE postgres".to_owned(), "permission denied to set role".to_owned()),
        (format!("SET ROLE {}", scene.admin), "permission denied to set role".to_owned()),
        (
            format!("RESET ROLE; UPDATE {a_schema}.account SET balance = 0"),
            format!("permission denied for schema {a_schema}"),
        ),
        ("CREATE EXTENSION postgres_fdw".to_owned(), "permission denied to create extension".to_owned()),
        (
            "SELECT public.dblink_connect('dbname=test user=postgres')".to_owned(),
            "permission denied for schema public".to_owned(),
        ),
        ("SELECT pg_read_file('/etc/passwd')".to_owned(), "permission denied for function pg_read_file".to_owned()),
        ("SELECT pg_ls_dir('.')".to_owned(), "permission denied for function pg_ls_dir".to_owned()),
        (format!("ALTER ROLE {a_role} PASSWORD 'known'"), "permission denied".to_owned()),
        ("ALTER ROLE CURRENT_USER SUPERUSER".to_owned(), "superuser".to_owned()),
        ("CREATE ROLE evil LOGIN".to_owned(), "permission denied to create role".to_owned()),
        ("CREATE ROLE evil LOGIN SUPERUSER".to_owned(), "must be superuser to create superusers".to_owned()),
    ];
    for (sql, expect) in &cases {
        refused_schema(&h, &bravo, sql, expect, &secrets).await;
    }
    refused_template(
        &h,
        &bravo,
        "file",
        "INSERT INTO account (id, balance) SELECT :id, length(pg_read_file(:path))",
        json!({"id": 9, "path": "/etc/passwd"}),
        "permission denied for function pg_read_file",
        &secrets,
    )
    .await;
    refused_template(
        &h,
        &bravo,
        "reach",
        &format!("INSERT INTO {a_schema}.account (id, balance) VALUES (:id, 1000000)"),
        json!({"id": 9}),
        &format!("permission denied for schema {a_schema}"),
        &secrets,
    )
    .await;
    assert_eq!(pg_world(&scene, &a_schema, &roles).await, before, "the superuser sees something changed");
    assert!(!Path::new(&marker).exists(), "COPY TO PROGRAM ran");
    assert_eq!(deposit(&h, &alpha, 1).await["status"], "committed", "the other tenant still works");
    assert_eq!(deposit(&h, &bravo, 2).await["status"], "committed", "the hostile tenant's own tables still work");
    h.stop().await;
    scene.drop_all().await;
}

/// The tenant's SQL may lift its session's statement_timeout; the server's timeout still
/// stops it, and the tenant's next request works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_statement_timeout_holds_against_the_tenants_own_set_on_postgres_and_sqlite() {
    let Some(scene) = PgScene::new("timeout").await else { return };
    let admin_url = scene.admin_url();
    let h = Harness::memory(move |c| {
        c.review.statement_timeout_ms = 1000;
        c.review
            .tenants
            .insert("slow".into(), tidegate_server::config::ReviewTenant { database: admin_url, ..Default::default() });
    })
    .await;
    let (_, pg) = h.tenant("slow");
    let (_, lite) = h.tenant("lite");
    register(&h, &pg, PG_SCHEMA).await;
    register(&h, &lite, SQLITE_SCHEMA).await;
    let started = Instant::now();
    refused_schema(&h, &pg, "SET statement_timeout = 0; SELECT pg_sleep(30)", "statement timeout of 1000 ms", &[])
        .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "cancelled after {took:?}");
    let started = Instant::now();
    refused_schema(
        &h,
        &lite,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        "statement timeout of 1000 ms",
        &[],
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(deposit(&h, &pg, 1).await["status"], "committed");
    assert_eq!(deposit(&h, &lite, 1).await["status"], "committed");
    h.stop().await;
    scene.drop_all().await;
}

/// A PostgreSQL review URL that connects as a superuser is refused at start, naming the key and
/// the override; with `review.allow_postgres_superuser` the server starts, and the tenant's SQL
/// still runs as the tenant's own role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_refuses_a_superuser_postgres_url_unless_explicitly_allowed() {
    let Some(scene) = PgScene::new("super").await else { return };
    let mut cfg = Config::default();
    cfg.server.memory = true;
    cfg.review.tenants.insert(
        "acme".into(),
        tidegate_server::config::ReviewTenant { database: scene.superuser_url(), ..Default::default() },
    );
    let Err(e) = AppState::open(cfg.clone()).await else { panic!("a superuser URL is refused") };
    let text = e.to_string();
    assert!(text.contains("review.tenants.acme.database") && text.contains("superuser"), "{text}");
    assert!(text.contains("review.allow_postgres_superuser"), "{text}");
    // A URL of a role that cannot create roles is refused too.
    let plain = format!("{}_plain", scene.admin);
    let p = plain.clone();
    on_pg(scene.superuser_url(), move |su| su.batch(&format!("CREATE ROLE {p} LOGIN")).unwrap()).await.unwrap();
    let mut weak = cfg.clone();
    weak.review.tenants.get_mut("acme").unwrap().database = scene.url_as(&plain);
    let Err(e) = AppState::open(weak).await else { panic!("a role without CREATEROLE is refused") };
    let text = e.to_string();
    assert!(text.contains("CREATEROLE"), "{text}");

    let as_superuser = scene.superuser_url();
    let h = Harness::memory(move |c| {
        c.review.allow_postgres_superuser = true;
        c.review.tenants.insert(
            "acme".into(),
            tidegate_server::config::ReviewTenant { database: as_superuser, ..Default::default() },
        );
    })
    .await;
    let (_, k) = h.tenant("acme");
    register(&h, &k, PG_SCHEMA).await;
    refused_schema(&h, &k, "SET ROLE postgres", "permission denied to set role", &[]).await;
    let body = json!({"set": hostile_template("who", &["id"], "INSERT INTO account (id, balance) SELECT :id, CASE WHEN current_user = 'postgres' THEN -1 ELSE 1 END")});
    assert_eq!(h.req("POST", "/v1/review/templates", Some(&k.operator), Some(body)).await.status, 201);
    let r = h
        .req("POST", "/v1/review/transactions", Some(&k.agent), Some(json!({"template": "who", "params": {"id": 5}})))
        .await;
    assert_eq!(r.body["status"], "committed", "{r:?}");
    h.stop().await;
    let schema = PgScene::schema("acme");
    let balance = on_pg(scene.superuser_url(), move |su| {
        su.query(&format!("SELECT balance FROM {schema}.account WHERE id = 5"), &[]).unwrap()[0][0].1.clone()
    })
    .await
    .unwrap();
    assert_eq!(balance, SqlValue::Int(1), "the template ran as the tenant's role, not as the superuser");
    scene.drop_all().await;
}

/// Issue 27 item 7: every server with a PostgreSQL review tenant panicked when it shut down
/// ("Cannot start a runtime from within a runtime", the blocking client dropped on a tokio
/// worker when the tenants were cleared). The serve task now ends cleanly, and a restart on
/// the same directory has every transaction as it was and the rows in PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_postgres_review_tenant_shuts_down_cleanly_and_loses_nothing() {
    let Some(scene) = PgScene::new("shutdown").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::default();
    cfg.server.data_dir = Some(dir.path().to_owned());
    cfg.server.shutdown_drain_ms = 2_000;
    cfg.review.database = scene.admin_url();
    let serve = |cfg: Config| async move {
        let state = AppState::open(cfg).await.expect("open");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = tidegate_server::api::app(state.clone(), axum::Router::new());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tidegate_server::serve(state.clone(), listener, app, async move {
            let _ = rx.await;
        }));
        (state, base, tx, task)
    };
    let (state, base, stop, task) = serve(cfg.clone()).await;
    let http = reqwest::Client::new();
    let cat = state.catalog().clone();
    cat.create_tenant("acme").unwrap();
    let key = |r| cat.create_key("acme", r, None).unwrap().0.key;
    let (operator, agent, reviewer) = (
        key(tidegate_service::auth::Role::Operator),
        key(tidegate_service::auth::Role::Agent),
        key(tidegate_service::auth::Role::Reviewer),
    );
    let call = |method: reqwest::Method, path: String, key: String, body: Option<Value>| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let mut r = http.request(method, format!("{base}{path}")).bearer_auth(key);
            if let Some(b) = body {
                r = r.json(&b);
            }
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, _) = call(
        reqwest::Method::POST,
        "/v1/review/templates".into(),
        operator.clone(),
        Some(json!({"set": set(), "schema": PG_SCHEMA})),
    )
    .await;
    assert_eq!(s, 201);
    let mut ids = Vec::new();
    for (id, suspicious) in [(1, true), (1, false), (2, false), (2, true)] {
        let body = json!({"template": "deposit", "params": {"id": id, "amount": 10}, "suspicious": suspicious});
        let (s, b) = call(reqwest::Method::POST, "/v1/review/transactions".into(), agent.clone(), Some(body)).await;
        assert_eq!(s, 201, "{b}");
        ids.push(b["id"].as_str().unwrap().to_owned());
    }
    let (s, _) =
        call(reqwest::Method::POST, format!("/v1/review/transactions/{}/accept", ids[0]), reviewer.clone(), None).await;
    assert_eq!(s, 200);
    let mut views = Vec::new();
    for id in &ids {
        views.push(call(reqwest::Method::GET, format!("/v1/review/transactions/{id}"), agent.clone(), None).await.1);
    }
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), task).await.expect("the server stops");
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the server did not close cleanly: {e}"),
        Err(e) => panic!("the server panicked while shutting down: {e}"),
    }
    drop(state);

    let (state, base2, stop, task) = serve(cfg).await;
    let http = reqwest::Client::new();
    for (id, before) in ids.iter().zip(&views) {
        let r = http.get(format!("{base2}/v1/review/transactions/{id}")).bearer_auth(&agent).send().await.unwrap();
        assert_eq!(&r.json::<Value>().await.unwrap(), before, "{id} after the restart");
    }
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), task).await.expect("the server stops");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    drop(state);
    let schema = PgScene::schema("acme");
    let rows = on_pg(scene.superuser_url(), move |su| {
        su.query(&format!("SELECT id, balance FROM {schema}.account ORDER BY id"), &[]).unwrap()
    })
    .await
    .unwrap();
    let got: Vec<(SqlValue, SqlValue)> = rows.into_iter().map(|r| (r[0].1.clone(), r[1].1.clone())).collect();
    // Account 1: the accepted deposit and the one that ran at once (an increment never
    // breaks a lower bound); account 2: the committed one (the suspicious one awaits review
    // under buffer_suspicious).
    assert_eq!(
        got,
        vec![(SqlValue::Int(1), SqlValue::Int(120)), (SqlValue::Int(2), SqlValue::Int(110))],
        "the database has exactly what was committed"
    );
    scene.drop_all().await;
}

/// A PostgreSQL review database that does not answer does not stop the server from starting
/// (it is checked again at the first request); the request answers 503 `review_unavailable`
/// with `Retry-After`, and the problem shows neither the URL nor its credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_on_a_postgres_that_does_not_answer_is_a_retryable_503_naming_no_url() {
    let h = Harness::memory(|c| {
        c.review.tenants.insert(
            "acme".into(),
            tidegate_server::config::ReviewTenant {
                database: "postgres://hidden_user:hidden_pw@127.0.0.1:1/hidden_db".into(),
                ..Default::default()
            },
        );
    })
    .await;
    let (_, k) = h.tenant("acme");
    let r = h
        .req("POST", "/v1/review/templates", Some(&k.operator), Some(json!({"set": set(), "schema": PG_SCHEMA})))
        .await;
    assert_eq!((r.status, r.body["code"].as_str()), (503, Some("review_unavailable")), "{r:?}");
    assert!(r.headers.get("retry-after").is_some(), "{r:?}");
    for secret in ["hidden_user", "hidden_pw", "hidden_db", "127.0.0.1:1"] {
        assert!(!r.text.contains(secret), "{secret}: {r:?}");
    }
    h.stop().await;
}
