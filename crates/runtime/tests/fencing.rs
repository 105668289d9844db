//! A store that fences the engine out (another owner took its ledger stream) stops the engine
//! with a typed, non-retryable [`Error::Fenced`] naming the tenant, the stream and both tokens:
//! every later operation is refused with it, every waiter gets it (nothing hangs), nothing the
//! engine acknowledged is missing from the ledger the new owner reads, and nothing the ledger
//! lacks is shown. Two ways in: the in-memory store's `take_over` (the append is refused) and a
//! group-commit store whose writer finds a newer owner (the append was queued, its durability
//! wait fails).
#![allow(clippy::unwrap_used)] // tests unwrap by design

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use common::World;
use serde_json::json;
use tidegate_core::{Batch, Event};
use tidegate_runtime::{EffectClass, Error, Fence, Tidegate, TxId, TxOptions};
use tidegate_storage::{LedgerStore, Lsn, MemoryStore, Ownership, StoreError, StoredCheckpoint};
use tokio::time::timeout;

const NEVER: Duration = Duration::from_secs(3600);

/// The transactions the ledger says were decided to commit.
fn committed_in(store: &dyn LedgerStore) -> HashSet<TxId> {
    let mut out = HashSet::new();
    store
        .scan(1, &mut |_, e| {
            if let Event::Decided { tx, commit: true, .. } = e {
                out.insert(*tx);
            }
            true
        })
        .unwrap();
    out
}

fn assert_fence(e: &Error, store: &MemoryStore, tenant: &str) -> Fence {
    assert!(e.is_fenced(), "expected a fence, got {e:?}");
    assert!(!e.retryable(), "a fence is not retryable on this engine: {e:?}");
    let f = e.fence().cloned().unwrap_or_else(|| panic!("the engine's own error is Error::Fenced, got {e:?}"));
    assert_eq!(f.tenant, tenant);
    assert_eq!(f.stream, store.ownership().stream.to_string());
    assert!(f.current > f.token, "the new owner's token is larger: {f:?}");
    let text = e.to_string();
    assert!(text.contains(tenant) && text.contains("fenced out"), "{text}");
    f
}

#[tokio::test]
async fn a_take_over_stops_the_old_engine_with_a_typed_fence_and_loses_nothing_acknowledged() {
    let world = World::new();
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder().store(store.clone()).tenant("acme").build().unwrap();
    let refund = world.tool("refund", EffectClass::Reversible, "retail:order");
    let mut acknowledged = Vec::new();
    for i in 0..3 {
        let tx = tg.begin("agent").unwrap();
        tx.call(&refund, json!({"id": format!("W{i}")})).await.unwrap();
        tx.seal().unwrap();
        acknowledged.push(tx.commit().await.unwrap().tx);
    }
    // An open transaction whose executed call was acknowledged: the new owner must undo it.
    let open = tg.begin("agent").unwrap();
    open.call(&refund, json!({"id": "OPEN"})).await.unwrap();
    assert!(tg.fenced().is_none());

    let new_owner = Arc::new(store.take_over());
    let ledger_at_take_over = new_owner.last_lsn();

    // The next append is refused: the engine stops with the fence.
    let e = tg.begin("agent").unwrap_err();
    let fence = assert_fence(&e, &store, "acme");
    assert_eq!((fence.token, fence.current), (1, 2));
    assert_eq!(tg.fenced(), Some(fence.clone()));
    assert_eq!(timeout(NEVER, tg.when_fenced()).await.unwrap(), Some(fence.clone()));

    // Every later operation, reads included, answers the same fence (not a generic "closed").
    let refusals = [
        open.read("retail:order:OPEN").unwrap_err(),
        open.state().unwrap_err(),
        open.call(&refund, json!({"id": "LATE"})).await.unwrap_err(),
        open.seal().unwrap_err(),
        open.commit().await.unwrap_err(),
        open.abort("cleanup").await.unwrap_err(),
        tg.transaction(open.id()).unwrap_err(),
        tg.version("retail:order:W0").unwrap_err(),
        tg.waits_for(open.id()).unwrap_err(),
        tg.begin_with(TxOptions::agent("other")).unwrap_err(),
        tg.plan_list().await.unwrap_err(),
        tg.checkpoint_now().unwrap_err(),
    ];
    for r in &refusals {
        assert_eq!(r.fence(), Some(&fence), "{r:?}");
    }
    assert_eq!(world.count("refund", "exec"), 4, "no call ran after the fence");
    // Nothing of the refused work reached the ledger.
    assert_eq!(new_owner.last_lsn(), ledger_at_take_over);

    // The new owner opens the ledger: every acknowledged commit is there, and recovery undoes
    // the open transaction's executed call.
    let next = Tidegate::builder().store(new_owner.clone()).tenant("acme").build().unwrap();
    next.register(&refund).unwrap();
    let report = next.recover().await.unwrap();
    let committed = committed_in(&*new_owner);
    for tx in &acknowledged {
        assert!(committed.contains(tx), "acknowledged commit {tx} is missing from the new owner's ledger");
    }
    assert!(!committed.contains(&open.id()));
    assert_eq!(report.aborts_resumed.len() + report.orphans.len(), 1, "{report:?}");
    assert_eq!(world.count("refund", "compensate"), 1, "{:?}", world.names());
    // And the new owner serves.
    let tx = next.begin("agent").unwrap();
    tx.call(&refund, json!({"id": "NEW"})).await.unwrap();
    tx.seal().unwrap();
    assert!(tx.commit().await.unwrap().committed);
    // The old engine stays stopped.
    assert!(tg.begin("agent").unwrap_err().is_fenced());
}

#[tokio::test(start_paused = true)]
async fn concurrent_transactions_all_get_an_error_when_the_fence_falls_and_none_hangs() {
    let world = World::new();
    // Each call takes 10 ms, so transactions are mid-call, waiting at commit and settling
    // when the fence falls.
    world.delay("refund", Duration::from_millis(10));
    world.delay("ship", Duration::from_millis(10));
    let store = Arc::new(MemoryStore::new());
    let tg = Tidegate::builder().store(store.clone()).tenant("acme").build().unwrap();
    let refund = world.tool("refund", EffectClass::Reversible, "retail:order");
    let ship = world.tool("ship", EffectClass::Gated, "retail:order");
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        let (tg, refund, ship) = (tg.clone(), refund.clone(), ship.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(u64::from(i) * 3)).await;
            // No may-touch declaration: each commit waits for every earlier transaction.
            let id = format!("O{i}");
            let tx = tg.begin("agent")?;
            tx.call(&refund, json!({"id": id})).await?;
            tx.call(&ship, json!({"id": id})).await?;
            tx.seal()?;
            tx.commit().await
        }));
    }
    tokio::time::sleep(Duration::from_millis(45)).await;
    let new_owner = Arc::new(store.take_over());
    let (mut ok, mut fenced) = (Vec::new(), 0);
    for t in tasks {
        // No hang (an hour of paused time), no panic.
        match timeout(NEVER, t).await.expect("a transaction hung after the fence").expect("no panic") {
            Ok(outcome) => ok.push(outcome),
            Err(e) => {
                assert!(e.is_fenced(), "every refusal after the fence names it: {e:?}");
                fenced += 1;
            }
        }
    }
    assert!(fenced > 0 && !ok.is_empty(), "the fence fell mid-run: {} committed, {fenced} fenced", ok.len());
    eprintln!("{} committed before the fence, {fenced} refused with it", ok.len());
    let fence = tg.fenced().expect("the engine knows it was fenced");
    assert_eq!((fence.tenant.as_str(), fence.token, fence.current), ("acme", 1, 2));
    // Every commit the engine acknowledged is in the ledger the new owner reads.
    let committed = committed_in(&*new_owner);
    for o in &ok {
        assert!(o.committed);
        assert!(committed.contains(&o.tx), "acknowledged commit {} missing", o.tx);
    }
    // A gated effect fires only after its commit decision is in the ledger, and every
    // acknowledged commit fired its own: acknowledged <= fired <= decided.
    let fired = world.count("ship", "fire");
    assert!(
        ok.len() <= fired && fired <= committed.len(),
        "{} acked, {fired} fired, {} decided",
        ok.len(),
        committed.len()
    );
}

/// A group-commit store: appends are queued (accepted at once) and become durable when
/// waited for, unless a newer owner has taken the stream since; then the writer's commit is
/// refused, the store stops, and every wait and later append fails with the fence (as the
/// SQLite writer does when the `owner_token` changed under it).
#[derive(Debug)]
struct GroupCommit {
    inner: MemoryStore,
    /// Durable up to here.
    durable: AtomicU64,
    /// 0 until a newer owner took the stream, then its token.
    newer_owner: AtomicU64,
}

impl GroupCommit {
    fn new() -> GroupCommit {
        GroupCommit { inner: MemoryStore::new(), durable: AtomicU64::new(0), newer_owner: AtomicU64::new(0) }
    }

    fn fenced(&self) -> Option<StoreError> {
        let current = self.newer_owner.load(Ordering::SeqCst);
        (current != 0).then(|| StoreError::Failed {
            cause: Arc::new(StoreError::Fenced {
                stream: self.inner.ownership().stream.to_string(),
                token: self.inner.ownership().token,
                current,
            }),
        })
    }

    fn sync(&self, lsn: Lsn) -> Result<(), StoreError> {
        if lsn <= self.durable.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(e) = self.fenced() {
            return Err(e);
        }
        self.durable.store(self.inner.last_lsn(), Ordering::SeqCst);
        Ok(())
    }
}

impl LedgerStore for GroupCommit {
    fn append(&self, batch: &Batch) -> Result<Lsn, StoreError> {
        // The writer has not met the fence yet: the batch is queued.
        self.inner.append(batch)
    }
    fn is_durable(&self, lsn: Lsn) -> bool {
        lsn <= self.durable.load(Ordering::SeqCst)
    }
    fn wait_durable(&self, lsn: Lsn) -> Result<(), StoreError> {
        self.sync(lsn)
    }
    fn poll_durable(&self, lsn: Lsn, _cx: &mut Context<'_>) -> Poll<Result<(), StoreError>> {
        Poll::Ready(self.sync(lsn))
    }
    fn last_lsn(&self) -> Lsn {
        self.inner.last_lsn()
    }
    fn ownership(&self) -> Ownership {
        self.inner.ownership()
    }
    fn scan(&self, from: Lsn, visit: &mut dyn FnMut(Lsn, &Event) -> bool) -> Result<(), StoreError> {
        self.inner.scan(from, visit)
    }
    fn put_checkpoint(&self, lsn: Lsn, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put_checkpoint(lsn, bytes)
    }
    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.inner.checkpoint()
    }
}

#[tokio::test]
async fn a_fence_met_at_the_durability_wait_stops_the_engine_before_the_call_runs() {
    let world = World::new();
    let store = Arc::new(GroupCommit::new());
    let tg = Tidegate::builder().store(store.clone()).tenant("globex").build().unwrap();
    let refund = world.tool("refund", EffectClass::Reversible, "retail:order");
    let tx = tg.begin("agent").unwrap();
    tx.call(&refund, json!({"id": "A"})).await.unwrap();
    store.newer_owner.store(7, Ordering::SeqCst);

    // The pending record of the next call is queued, but its durability wait meets the fence:
    // the call must not run (a crash now could not tell it happened).
    let e = tx.call(&refund, json!({"id": "B"})).await.unwrap_err();
    assert!(e.is_fenced() && !e.retryable(), "{e:?}");
    let f = e.fence().expect("Error::Fenced").clone();
    assert_eq!((f.tenant.as_str(), f.token, f.current), ("globex", 1, 7));
    assert_eq!(world.count("refund", "exec"), 1, "the second call never ran: {:?}", world.names());
    // The engine's state is ahead of the durable ledger now; it shows none of it.
    assert_eq!(tx.state().unwrap_err().fence(), Some(&f));
    assert_eq!(tg.version("retail:order:A").unwrap_err().fence(), Some(&f));
    assert_eq!(tg.begin("agent").unwrap_err().fence(), Some(&f));
    assert_eq!(tg.fenced(), Some(f));
}

#[tokio::test]
async fn a_plain_store_failure_is_not_a_fence_and_stop_is_not_one_either() {
    // Only a fence says "another node owns this": a closed engine keeps its old error.
    let tg = Tidegate::in_memory().unwrap();
    tg.stop();
    let e = tg.begin("agent").unwrap_err();
    assert!(matches!(e, Error::Store(StoreError::Closed)), "{e:?}");
    assert!(!e.is_fenced() && e.fence().is_none());
    assert!(tg.fenced().is_none());
    // Dropping the engine resolves a watcher with `None` rather than leaving it hanging.
    let watch = tg.when_fenced();
    drop(tg);
    assert_eq!(timeout(NEVER, watch).await.unwrap(), None);
}
