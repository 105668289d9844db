//! A tenant whose ledger store fences the node out (another node took the tenant over) is
//! dropped by the node: later requests for it are `TenantUnavailable` (retryable, naming the
//! tenant and the fence), its API keys answer the same, the node lets go of its ledger, and the
//! other tenants keep working. The fence is real: a newer owner raises the SQLite ledger's
//! `owner_token`, which the store's writer checks in every commit.
#![allow(clippy::unwrap_used)] // tests unwrap by design

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tidegate_runtime::{Level, Ordering, ScopeRegistry, StoreUrl, Tidegate};
use tidegate_service::auth::Role;
use tidegate_service::settings::{DispatchSection, ReviewSection};
use tidegate_service::tenant::TenantSettings;
use tidegate_service::{AuthError, Service, ServiceError, ServiceSettings};

fn settings(dir: &Path) -> ServiceSettings {
    ServiceSettings {
        tenant: TenantSettings {
            store: StoreUrl::sqlite(dir),
            node_id: "test-node".into(),
            ownership_lease: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            level: Level::L4,
            ordering: Ordering::default(),
            checkpoint_every: 0,
            retain: 1000,
            max_concurrent: 64,
            idempotency_ttl: Duration::from_secs(3600),
            idempotency_max: 1000,
            dispatch: DispatchSection::default(),
            scopes: ScopeRegistry::default(),
            review: ReviewSection::default(),
        },
        advertise: None,
        key_cache_ttl: Duration::from_secs(60),
    }
}

/// Another node takes the tenant's ledger stream: a larger owner token in its `meta` table.
fn take_over(dir: &Path, tenant: &str) {
    let db = StoreUrl::sqlite(dir).for_tenant(tenant).dir().unwrap().join("ledger.db");
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let n = conn
        .execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key = 'owner_token'", [])
        .unwrap();
    assert_eq!(n, 1);
}

/// One empty transaction, committed (its decision waits for durability).
async fn commit_one(engine: &Tidegate) -> Result<(), tidegate_runtime::Error> {
    let tx = engine.begin("agent")?;
    tx.seal()?;
    tx.commit().await.map(|_| ())
}

fn assert_unavailable(e: &ServiceError, tenant: &str) {
    match e {
        ServiceError::TenantUnavailable { tenant: t, reason } => {
            assert_eq!(t, tenant);
            assert!(reason.contains("fenced out"), "{reason}");
        }
        other => panic!("expected TenantUnavailable for {tenant}, got {other:?}"),
    }
    assert!(e.retryable(), "another node may serve the tenant: {e:?}");
    assert!(e.to_string().contains(&format!("tenant `{tenant}`")), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_tenant_is_dropped_from_the_node_and_the_others_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let node = Service::open(settings(dir.path())).await.unwrap();
    node.catalog().create_tenant("acme").unwrap();
    node.catalog().create_tenant("globex").unwrap();
    let (acme_key, _) = node.catalog().create_key("acme", Role::Agent, None).unwrap();
    let acme = node.open_tenant("acme").await.unwrap();
    let globex = node.open_tenant("globex").await.unwrap();
    commit_one(&acme.engine).await.unwrap();
    commit_one(&globex.engine).await.unwrap();

    take_over(dir.path(), "acme");
    // The next durable write of acme meets the fence: the engine stops with it.
    let e = commit_one(&acme.engine).await.unwrap_err();
    assert!(e.is_fenced() && !e.retryable(), "{e:?}");
    let fence = e.fence().cloned().unwrap();
    assert_eq!(fence.tenant, "acme");
    assert!(fence.current > fence.token, "{fence:?}");
    assert_unavailable(&ServiceError::from(e), "acme");

    // The node drops acme: it answers TenantUnavailable, by name and by key.
    assert_unavailable(&node.open_tenant("acme").await.unwrap_err(), "acme");
    match node.authenticate(&acme_key.key).await {
        Err(AuthError::NotServed { tenant, reason }) => {
            assert_unavailable(&ServiceError::TenantUnavailable { tenant, reason }, "acme");
        }
        other => panic!("expected NotServed, got {other:?}"),
    }
    assert!(node.tenants().iter().all(|t| t.name != "acme"));
    assert_eq!(node.dropped_tenants().len(), 1);
    assert_eq!(node.dropped_tenants()[0].0, "acme");
    assert_eq!(node.metrics().tenants_fenced.get(), 1);

    // globex is untouched: same engine, still committing.
    let again = node.open_tenant("globex").await.unwrap();
    assert!(Arc::ptr_eq(&again, &globex));
    for _ in 0..3 {
        commit_one(&globex.engine).await.unwrap();
    }
    assert!(globex.engine.fenced().is_none());

    // The node lets go of acme's ledger (its engine, tasks and store are stopped): once the
    // last handle is gone, another owner can open the directory.
    drop(acme);
    let acme_dir = StoreUrl::sqlite(dir.path()).for_tenant("acme").dir().unwrap().to_path_buf();
    let mut reopened = None;
    for _ in 0..100 {
        match tidegate_runtime::SqliteStore::open(&acme_dir) {
            Ok(s) => {
                reopened = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let store = reopened.expect("the dropped tenant's ledger was let go within 5 s");
    // The new owner's ledger holds both acknowledged commits of acme's first engine... and the
    // refused one is nowhere (never durable).
    let engine = Tidegate::builder().store(Arc::new(store)).tenant("acme").build().unwrap();
    engine.recover().await.unwrap();
    let mut decided = 0;
    engine
        .store()
        .scan(1, &mut |_, e| {
            if matches!(e, tidegate_core::Event::Decided { commit: true, .. }) {
                decided += 1;
            }
            true
        })
        .unwrap();
    assert_eq!(decided, 1, "one acknowledged commit; the fenced one never became durable");

    let problems = node.close(Duration::from_secs(2)).await;
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_met_in_the_background_drops_the_tenant_without_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let node = Service::open(settings(dir.path())).await.unwrap();
    node.catalog().create_tenant("acme").unwrap();
    let acme = node.open_tenant("acme").await.unwrap();
    take_over(dir.path(), "acme");
    // A transaction meets the fence on a task of its own; nobody asks the node afterwards.
    let engine = acme.engine.clone();
    drop(acme);
    tokio::spawn(async move { commit_one(&engine).await }).await.unwrap().unwrap_err();
    // The node's watcher drops the tenant by itself.
    for _ in 0..100 {
        if node.tenants().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(node.tenants().is_empty(), "the watcher dropped acme");
    assert_eq!(node.dropped_tenants().len(), 1);
    assert_unavailable(&node.open_tenant("acme").await.unwrap_err(), "acme");
    node.close(Duration::from_secs(2)).await;
}
