//! Projection checkpoints: reopening from a checkpoint plus the ledger's tail recovers exactly
//! what a full replay recovers, including after crashes placed around checkpoint writes and
//! with transactions that span a checkpoint; damaged checkpoints fall back to a full replay,
//! and newer ones are refused.

#![allow(clippy::unwrap_used)] // tests unwrap by design

mod common;

use std::sync::Arc;

use common::World;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tidegate_runtime::{CheckpointPolicy, EffectClass, RecoveryReport, Tidegate, Tool, TxOptions};
use tidegate_storage::{FaultOptions, FaultyStore, LedgerStore, MemoryStore, StoredCheckpoint};

fn tools(w: &World) -> Vec<Tool> {
    vec![
        w.tool("book", EffectClass::Reversible, "travel:booking"),
        w.tool("note", EffectClass::Bufferable, "kv:notes"),
        w.tool("mail", EffectClass::Gated, "mail"),
    ]
}

/// Random transactions, some aborted and some left open (so that they span checkpoints),
/// until the store crashes or `n` are done.
async fn workload(tg: &Tidegate, tools: &[Tool], rng: &mut SmallRng, n: usize) {
    let mut open = Vec::new();
    const PREFIXES: [&str; 3] = ["travel:booking", "kv:notes", "mail"];
    for i in 0..n {
        let choice = rng.gen_range(0..10);
        // Transactions left open get a scope of their own, so that they block nobody.
        let id = if choice == 1 { format!("open{i}") } else { format!("x{}", rng.gen_range(0..6)) };
        let k = rng.gen_range(0..tools.len());
        let opts = TxOptions::agent("a").may_touch([format!("{}:{id}", PREFIXES[k])]);
        let Ok(tx) = tg.begin_with(opts) else { return };
        if tx.call(&tools[k], json!({"id": id})).await.is_err() {
            return;
        }
        match choice {
            0 => {
                if tx.abort("planned").await.is_err() {
                    return;
                }
            }
            1 => open.push(tx), // left open: spans later checkpoints
            _ => {
                if tx.seal().is_err() || tx.commit().await.is_err() {
                    return;
                }
            }
        }
        if i % 7 == 3 {
            // Also on demand, between appends (blocking: the checkpointer needs no runtime).
            let _ = tg.checkpoint_now();
        }
    }
    drop(open);
}

/// The recovery report without the event count (a checkpointed open replays fewer events).
fn comparable(mut r: RecoveryReport) -> RecoveryReport {
    r.events = 0;
    r
}

async fn reopen(store: Arc<MemoryStore>, w: &World) -> (Tidegate, RecoveryReport) {
    let tg = Tidegate::builder().store(store).checkpoints(CheckpointPolicy::never()).build().unwrap();
    for t in tools(w) {
        tg.register(&t).unwrap();
    }
    let rep = tg.recover().await.unwrap();
    tg.check_integrity().unwrap();
    (tg, rep)
}

#[tokio::test(flavor = "current_thread")]
async fn crashes_around_checkpoint_writes_recover_the_same_as_a_full_replay() {
    let mut with_checkpoint = 0;
    for seed in 0..150u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let world = World::new();
        let crash_after = rng.gen_range(1..60);
        let faulty = Arc::new(FaultyStore::new(
            MemoryStore::new(),
            FaultOptions { crash_after_syncs: Some(crash_after), crash_after_appends: None },
        ));
        let policy = CheckpointPolicy { every_events: Some(rng.gen_range(3..40)), on_close: rng.gen_bool(0.5) };
        {
            let tg = Tidegate::builder().store(faulty.clone()).checkpoints(policy).build().unwrap();
            workload(&tg, &tools(&world), &mut rng, 40).await;
        }
        // "Reopen" what survived: the synced events and the synced checkpoint.
        let events = faulty.inner().events();
        let ckpt: Option<StoredCheckpoint> = faulty.inner().checkpoint().unwrap();
        if let Some(c) = &ckpt {
            assert!(c.lsn <= events.len() as u64, "seed {seed}: a checkpoint survived without its events");
            with_checkpoint += 1;
        }
        let a = Arc::new(MemoryStore::from_events(events.clone()).with_checkpoint(ckpt.clone()));
        let b = Arc::new(MemoryStore::from_events(events.clone()));
        let (ta, ra) = reopen(a.clone(), &World::new()).await;
        let (tb, rb) = reopen(b.clone(), &World::new()).await;
        let open = ta.open_report();
        assert_eq!(open.checkpoint_fallback, None, "seed {seed}");
        assert_eq!(open.checkpoint_lsn, ckpt.as_ref().map(|c| c.lsn), "seed {seed}");
        assert_eq!(
            open.replayed_events,
            events.len() as u64 - ckpt.as_ref().map_or(0, |c| c.lsn),
            "seed {seed}: only the tail is replayed"
        );
        assert_eq!(comparable(ra), comparable(rb), "seed {seed}: recovery differs from a full replay");
        assert_eq!(ta.stats(), tb.stats(), "seed {seed}");
        for s in ["travel:booking:x0", "kv:notes:x1", "mail:x2", "travel:booking"] {
            assert_eq!(ta.version(s).unwrap(), tb.version(s).unwrap(), "seed {seed}: version of {s}");
        }
        // After recovery both ledgers hold the same facts.
        assert_eq!(a.events()[events.len()..].len(), b.events()[events.len()..].len(), "seed {seed}");
    }
    assert!(with_checkpoint > 50, "too few runs reopened from a checkpoint: {with_checkpoint}");
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn reopening_a_sqlite_ledger_replays_only_the_events_after_its_checkpoint() {
    let root = std::env::temp_dir().join(format!("tidegate-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = TempDir(root);
    let world = World::new();
    let (last, ckpt_lsn, committed) = {
        let store = Arc::new(tidegate_sqlite::SqliteStore::open(dir.path()).unwrap());
        let tg = Tidegate::builder()
            .store(store.clone())
            .checkpoints(CheckpointPolicy { every_events: None, on_close: false })
            .build()
            .unwrap();
        let book = &tools(&world)[0];
        for i in 0..30 {
            let tx = tg.begin("a").unwrap();
            tx.call(book, json!({"id": format!("b{i}")})).await.unwrap();
            tx.seal().unwrap();
            tx.commit().await.unwrap();
        }
        let info = tg.checkpoint_now().unwrap();
        let spanning = tg.begin_with(TxOptions::agent("a").may_touch(["travel:booking:span"])).unwrap();
        spanning.call(book, json!({"id": "span"})).await.unwrap();
        for i in 0..5 {
            let tx = tg.begin_with(TxOptions::agent("a").may_touch([format!("travel:booking:c{i}")])).unwrap();
            tx.call(book, json!({"id": format!("c{i}")})).await.unwrap();
            tx.seal().unwrap();
            tx.commit().await.unwrap();
        }
        store.sync().unwrap();
        (store.last_lsn(), info.lsn, tg.stats().committed)
    };
    let store = Arc::new(
        tidegate_sqlite::SqliteStore::open_with(
            dir.path(),
            tidegate_sqlite::Options { verify: tidegate_sqlite::Verify::SinceCheckpoint, ..Default::default() },
        )
        .unwrap(),
    );
    assert_eq!(store.open_report().rows_verified, last - ckpt_lsn, "open reads only the rows after the checkpoint");
    let tg = Tidegate::builder().store(store.clone()).build().unwrap();
    let r = tg.open_report().clone();
    assert_eq!((r.checkpoint_lsn, r.replayed_events, r.checkpoint_fallback), (Some(ckpt_lsn), last - ckpt_lsn, None));
    for t in tools(&world) {
        tg.register(&t).unwrap();
    }
    let rep = tg.recover().await.unwrap();
    assert_eq!(rep.orphans.len(), 1, "the transaction spanning the checkpoint is rebuilt (and aborted as an orphan)");
    assert_eq!(tg.stats().committed, committed);
    assert_eq!(world.count("book", "compensate"), 1, "its effect is compensated");
    // The open stored a checkpoint covering the tail; a clean close one more after recovery.
    drop(tg);
    let store = Arc::try_unwrap(store).unwrap();
    let end = store.last_lsn();
    assert_eq!(store.checkpoint().unwrap().map(|c| c.lsn), Some(end), "a clean close checkpoints the end");
}

#[tokio::test(flavor = "current_thread")]
async fn a_damaged_checkpoint_falls_back_to_a_full_replay_and_says_so() {
    let world = World::new();
    let store = Arc::new(MemoryStore::new());
    {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let tx = tg.begin("a").unwrap();
        tx.call(&tools(&world)[0], json!({"id": "d"})).await.unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
        tg.checkpoint_now().unwrap();
    }
    let good = store.checkpoint().unwrap().unwrap();
    let mut bad = good.bytes.clone();
    let at = bad.len() - 3;
    bad[at] ^= 0x20;
    let damaged = Arc::new(
        MemoryStore::from_events(store.events()).with_checkpoint(Some(StoredCheckpoint { lsn: good.lsn, bytes: bad })),
    );
    let tg = Tidegate::builder().store(damaged).build().unwrap();
    let r = tg.open_report();
    assert_eq!(r.checkpoint_lsn, None);
    assert_eq!(r.replayed_events, good.lsn, "the whole ledger was replayed");
    let why = r.checkpoint_fallback.clone().unwrap();
    assert!(why.contains("checksum") && why.contains("replayed the whole ledger"), "{why}");
    assert_eq!(tg.stats().committed, 1);
}

/// Issue 27 item 7: a server reopened on a tenant and stopped before anything new was
/// appended failed its close ("no checkpoint was stored (the ledger is empty)") and exited
/// non-zero: the checkpoint found at open now counts as the last one.
#[tokio::test(flavor = "current_thread")]
async fn a_checkpoint_asked_for_right_after_a_reopen_answers_with_the_one_found_at_open() {
    let world = World::new();
    let store = Arc::new(MemoryStore::new());
    let first = {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        let tx = tg.begin("a").unwrap();
        tx.call(&tools(&world)[0], json!({"id": "r"})).await.unwrap();
        tx.seal().unwrap();
        tx.commit().await.unwrap();
        tg.append_extension_blocking("review", json!({"n": 1})).unwrap();
        tg.checkpoint_now().unwrap()
    };
    for _ in 0..2 {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        assert_eq!(tg.open_report().checkpoint_lsn, Some(first.lsn));
        let again = tg.checkpoint_now().unwrap();
        assert_eq!(again.lsn, first.lsn, "nothing new: the checkpoint found at open");
        assert_eq!(tg.last_checkpoint().map(|c| c.lsn), Some(first.lsn));
    }
    assert_eq!(store.checkpoint().unwrap().unwrap().lsn, first.lsn);
}

#[tokio::test(flavor = "current_thread")]
async fn a_checkpoint_from_a_newer_format_is_refused() {
    let store = Arc::new(MemoryStore::new());
    {
        let tg = Tidegate::builder().store(store.clone()).build().unwrap();
        tg.begin("a").unwrap();
        tg.checkpoint_now().unwrap();
    }
    let c = store.checkpoint().unwrap().unwrap();
    // The header is the first line (JSON); sections after the state may be binary.
    let nl = c.bytes.iter().position(|&b| b == b'\n').unwrap();
    let format = format!("\"format\":{}", tidegate_core::engine::CHECKPOINT_FORMAT_VERSION);
    let head = String::from_utf8(c.bytes[..nl].to_vec()).unwrap();
    assert!(head.contains(&format), "{head}");
    let head = head.replacen(&format, "\"format\":99", 1);
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&c.bytes[nl..]);
    let newer = Arc::new(
        MemoryStore::from_events(store.events()).with_checkpoint(Some(StoredCheckpoint { lsn: c.lsn, bytes })),
    );
    let err = Tidegate::builder().store(newer).build().unwrap_err().to_string();
    assert!(err.contains("99") && err.contains("newer"), "{err}");
}
