//! The conformance suite every [`LedgerStore`] backend must pass, run once per backend.
//!
//! ```no_run
//! use tidegate_storage::{MemoryStore, conformance};
//! // A volatile backend: a closure making a new, empty store.
//! conformance::run_all(MemoryStore::new);
//! ```
//!
//! A durable backend also says how to close a store and reopen the same ledger (this is
//! `tidegate-sqlite`'s own test):
//!
//! ```ignore
//! use tidegate_storage::conformance::{self, Reopenable};
//! let mut n = 0;
//! conformance::run_all(Reopenable::new(
//!     || { n += 1; SqliteStore::open(format!("/tmp/conformance/{n}")).unwrap() },
//!     |store: SqliteStore| {
//!         let dir = store.dir().to_owned();
//!         store.close().unwrap();
//!         SqliteStore::open(dir).unwrap()
//!     },
//! ));
//! ```
//!
//! Every case starts from a new store ([`Backend::create`]); a failed check panics with the
//! case's name and what differed, so run the suite from a `#[test]`. The cases follow the
//! contract written on [`LedgerStore`]; each one is also public, to run alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use serde_json::Value;
use tidegate_core::{EffectId, Event, TxId, Version};

use crate::{LedgerStore, Lsn, StoreError, StoredCheckpoint};

/// How long the fencing case waits for an old owner's refused write to be reported.
const FENCE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How the suite gets stores from a backend.
pub trait Backend {
    /// The store type.
    type Store: LedgerStore;

    /// A new, empty store (a fresh directory or database for durable backends).
    fn create(&mut self) -> Self::Store;

    /// Closes `store` cleanly and opens the same ledger again; `None` for volatile backends
    /// (the reopen cases are then skipped).
    fn reopen(&mut self, store: Self::Store) -> Option<Self::Store> {
        drop(store);
        None
    }

    /// Opens the stream of `store` for a new owner while `store` is still open: `Ok` with the
    /// new owner's handle (which must fence `store` out), `Err` if the backend refuses a second
    /// owner while the first lives (an exclusive lock), or `None` if the backend has no way to
    /// open a stream twice (the fencing case is then skipped). Default `None`.
    fn take_over(&mut self, store: &Self::Store) -> Option<Result<Self::Store, StoreError>> {
        let _ = store;
        None
    }
}

/// A backend plus how a new owner takes a stream over ([`Backend::take_over`]).
#[derive(Debug)]
pub struct Owned<B, T> {
    backend: B,
    take_over: T,
}

impl<B, T> Owned<B, T> {
    /// `take_over` opens the stream of a store that is still open, for a new owner.
    pub fn new(backend: B, take_over: T) -> Owned<B, T> {
        Owned { backend, take_over }
    }
}

impl<B: Backend, T: FnMut(&B::Store) -> Result<B::Store, StoreError>> Backend for Owned<B, T> {
    type Store = B::Store;

    fn create(&mut self) -> B::Store {
        self.backend.create()
    }

    fn reopen(&mut self, store: B::Store) -> Option<B::Store> {
        self.backend.reopen(store)
    }

    fn take_over(&mut self, store: &B::Store) -> Option<Result<B::Store, StoreError>> {
        Some((self.take_over)(store))
    }
}

impl<S: LedgerStore, F: FnMut() -> S> Backend for F {
    type Store = S;

    fn create(&mut self) -> S {
        self()
    }
}

/// A durable backend: how to create a store and how to reopen one.
#[derive(Debug)]
pub struct Reopenable<C, R> {
    create: C,
    reopen: R,
}

impl<C, R> Reopenable<C, R> {
    /// `create` makes a new, empty store; `reopen` closes a store and opens its ledger again.
    pub fn new(create: C, reopen: R) -> Reopenable<C, R> {
        Reopenable { create, reopen }
    }
}

impl<S: LedgerStore, C: FnMut() -> S, R: FnMut(S) -> S> Backend for Reopenable<C, R> {
    type Store = S;

    fn create(&mut self) -> S {
        (self.create)()
    }

    fn reopen(&mut self, store: S) -> Option<S> {
        Some((self.reopen)(store))
    }
}

/// A named case of the suite.
type Case<B> = (&'static str, fn(&mut B));

/// Runs every case against `backend`, printing each case's name to stderr as it starts.
pub fn run_all<B: Backend>(mut backend: B) {
    let cases: [Case<B>; 14] = [
        ("lsns_start_at_one_and_are_consecutive", lsns_start_at_one_and_are_consecutive),
        ("empty_batch_appends_nothing", empty_batch_appends_nothing),
        ("concurrent_batches_are_atomic_and_in_call_order", concurrent_batches_are_atomic_and_in_call_order),
        ("scan_from_any_lsn_and_stop_early", scan_from_any_lsn_and_stop_early),
        ("scan_includes_events_not_yet_durable", scan_includes_events_not_yet_durable),
        ("durability_waits_resolve_blocking_and_async", durability_waits_resolve_blocking_and_async),
        ("waiting_beyond_the_last_lsn_is_an_error", waiting_beyond_the_last_lsn_is_an_error),
        ("large_payloads_and_batches_round_trip", large_payloads_and_batches_round_trip),
        ("awkward_text_round_trips", awkward_text_round_trips),
        ("reopen_sees_exactly_the_durable_events", reopen_sees_exactly_the_durable_events),
        ("reopen_after_clean_close_keeps_every_event", reopen_after_clean_close_keeps_every_event),
        ("checkpoints_keep_the_latest_and_survive_reopen", checkpoints_keep_the_latest_and_survive_reopen),
        ("a_stored_checkpoint_makes_its_events_durable", a_stored_checkpoint_makes_its_events_durable),
        ("a_fenced_out_owner_can_never_append_again", a_fenced_out_owner_can_never_append_again),
    ];
    for (name, case) in cases {
        eprintln!("conformance: {name}");
        case(&mut backend);
    }
}

/// A distinct, recognisable event: transaction `tx`, sequence number `n`.
pub fn event(tx: u64, n: u64) -> Event {
    Event::Read { tx: TxId(tx), scope: format!("test:/t{tx}/n{n}").into(), version: Version(n) }
}

fn ok<T>(case: &str, what: &str, r: Result<T, StoreError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("conformance case `{case}`: {what} failed: {e}"),
    }
}

fn append<S: LedgerStore + ?Sized>(case: &str, store: &S, events: Vec<Event>) -> Lsn {
    ok(case, "append", store.append(&tidegate_core::Batch::from(events)))
}

/// Every event of `store` from `from`, with its LSN.
pub fn collect<S: LedgerStore + ?Sized>(store: &S, from: Lsn) -> Result<Vec<(Lsn, Event)>, StoreError> {
    let mut out = Vec::new();
    store.scan(from, &mut |lsn, e| {
        out.push((lsn, e.clone()));
        true
    })?;
    Ok(out)
}

fn numbered(events: &[Event], first: Lsn) -> Vec<(Lsn, Event)> {
    events.iter().cloned().enumerate().map(|(i, e)| (first + i as Lsn, e)).collect()
}

/// Blocks on a future without an async runtime (the suite must not need one).
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread, AtomicBool);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.1.store(true, Ordering::Release);
            self.0.unpark();
        }
    }
    let unpark = Arc::new(Unpark(std::thread::current(), AtomicBool::new(false)));
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        while !unpark.1.swap(false, Ordering::AcqRel) {
            std::thread::park();
        }
    }
}

/// A new ledger has LSN 0; batches get consecutive LSNs from 1; `append` returns the last.
pub fn lsns_start_at_one_and_are_consecutive<B: Backend>(backend: &mut B) {
    const CASE: &str = "lsns_start_at_one_and_are_consecutive";
    let store = backend.create();
    assert_eq!(store.last_lsn(), 0, "{CASE}: a new store's last LSN");
    assert!(ok(CASE, "scan", collect(&store, 1)).is_empty(), "{CASE}: a new store is empty");
    let a: Vec<Event> = (0..3).map(|n| event(1, n)).collect();
    let b: Vec<Event> = (0..2).map(|n| event(2, n)).collect();
    assert_eq!(append(CASE, &store, a.clone()), 3, "{CASE}: first batch of 3");
    assert_eq!(append(CASE, &store, vec![event(3, 0)]), 4, "{CASE}: a single event");
    assert_eq!(append(CASE, &store, b.clone()), 6, "{CASE}: third batch of 2");
    assert_eq!(store.last_lsn(), 6, "{CASE}: last_lsn");
    let mut want = numbered(&a, 1);
    want.push((4, event(3, 0)));
    want.extend(numbered(&b, 5));
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), want, "{CASE}: scan");
}

/// An empty batch appends nothing and returns the current last LSN.
pub fn empty_batch_appends_nothing<B: Backend>(backend: &mut B) {
    const CASE: &str = "empty_batch_appends_nothing";
    let store = backend.create();
    assert_eq!(append(CASE, &store, vec![]), 0, "{CASE}: empty batch on an empty store");
    append(CASE, &store, vec![event(1, 0), event(1, 1)]);
    assert_eq!(append(CASE, &store, vec![]), 2, "{CASE}: empty batch returns the last LSN");
    assert_eq!(store.last_lsn(), 2, "{CASE}: last_lsn");
    ok(CASE, "wait_durable", store.wait_durable(2));
    assert_eq!(ok(CASE, "scan", collect(&store, 1)).len(), 2, "{CASE}: nothing added");
}

/// Threads appending concurrently: each batch occupies consecutive LSNs, whole and in
/// order, and each thread's batches appear in its call order.
pub fn concurrent_batches_are_atomic_and_in_call_order<B: Backend>(backend: &mut B) {
    const CASE: &str = "concurrent_batches_are_atomic_and_in_call_order";
    const THREADS: u64 = 8;
    const BATCHES: u64 = 150;
    let store = backend.create();
    let results: Vec<Vec<(Lsn, Vec<Event>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut n = 0;
                    for b in 0..BATCHES {
                        let len = 1 + (b * 7 + t) % 5;
                        let batch: Vec<Event> = (0..len)
                            .map(|_| {
                                n += 1;
                                event(t + 1, n)
                            })
                            .collect();
                        let last = append(CASE, store, batch.clone());
                        if b % 10 == 0 {
                            ok(CASE, "wait_durable", store.wait_durable(last));
                        }
                        mine.push((last, batch));
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| panic!("{CASE}: an appender panicked"))).collect()
    });
    let all = ok(CASE, "scan", collect(&store, 1));
    let total: usize = results.iter().flatten().map(|(_, b)| b.len()).sum();
    assert_eq!(all.len(), total, "{CASE}: every event is in the ledger once");
    assert_eq!(store.last_lsn(), total as Lsn, "{CASE}: last_lsn");
    for (i, (lsn, _)) in all.iter().enumerate() {
        assert_eq!(*lsn, i as Lsn + 1, "{CASE}: LSNs are consecutive from 1");
    }
    for mine in &results {
        let mut prev = 0;
        for (last, batch) in mine {
            assert!(*last > prev, "{CASE}: a thread's batches get increasing LSNs in call order");
            prev = *last;
            let first = (*last - batch.len() as Lsn) as usize;
            let stored: Vec<Event> = all[first..*last as usize].iter().map(|(_, e)| e.clone()).collect();
            assert_eq!(&stored, batch, "{CASE}: the batch ending at LSN {last} is whole and in order");
        }
    }
    let last = store.last_lsn();
    ok(CASE, "wait_durable", store.wait_durable(last));
    assert!(store.is_durable(last), "{CASE}: everything durable after the wait");
}

/// `scan(from)` yields exactly the events with LSN ≥ `from` (0 reads as 1; past the end is
/// empty), and stops when the visitor says so.
pub fn scan_from_any_lsn_and_stop_early<B: Backend>(backend: &mut B) {
    const CASE: &str = "scan_from_any_lsn_and_stop_early";
    let store = backend.create();
    let events: Vec<Event> = (0..20).map(|n| event(n % 3, n)).collect();
    for chunk in events.chunks(6) {
        append(CASE, &store, chunk.to_vec());
    }
    ok(CASE, "wait_durable", store.wait_durable(12)); // part durable, part perhaps not
    let want = numbered(&events, 1);
    for from in 0..=22u64 {
        let got = ok(CASE, "scan", collect(&store, from));
        let skip = from.max(1) as usize - 1;
        assert_eq!(got, want[skip.min(want.len())..].to_vec(), "{CASE}: scan from {from}");
    }
    for stop_after in [1usize, 5, 13, 20] {
        let mut seen = Vec::new();
        ok(
            CASE,
            "scan",
            store.scan(1, &mut |lsn, _| {
                seen.push(lsn);
                seen.len() < stop_after
            }),
        );
        assert_eq!(seen, (1..=stop_after as Lsn).collect::<Vec<_>>(), "{CASE}: stop after {stop_after}");
    }
}

/// Events appended and not yet waited for are already visible to `scan`.
pub fn scan_includes_events_not_yet_durable<B: Backend>(backend: &mut B) {
    const CASE: &str = "scan_includes_events_not_yet_durable";
    let store = backend.create();
    let a: Vec<Event> = (0..4).map(|n| event(1, n)).collect();
    append(CASE, &store, a.clone());
    ok(CASE, "wait_durable", store.wait_durable(4));
    let b: Vec<Event> = (0..3).map(|n| event(2, n)).collect();
    append(CASE, &store, b.clone());
    let mut want = numbered(&a, 1);
    want.extend(numbered(&b, 5));
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), want, "{CASE}: scan sees the queued batch");
    assert_eq!(ok(CASE, "scan", collect(&store, 6)), want[5..].to_vec(), "{CASE}: scan from inside it");
}

/// `wait_durable` and the async [`crate::durable`] resolve, alone and with many waiters;
/// durability is a prefix that never goes back.
pub fn durability_waits_resolve_blocking_and_async<B: Backend>(backend: &mut B) {
    const CASE: &str = "durability_waits_resolve_blocking_and_async";
    let store = backend.create();
    ok(CASE, "wait_durable(0)", store.wait_durable(0));
    assert!(store.is_durable(0), "{CASE}: LSN 0 is always durable");
    let l1 = append(CASE, &store, vec![event(1, 1), event(1, 2)]);
    ok(CASE, "wait_durable", store.wait_durable(l1));
    assert!(store.is_durable(l1) && store.is_durable(1), "{CASE}: durable after the wait, with its prefix");
    let l2 = append(CASE, &store, vec![event(2, 1)]);
    ok(CASE, "durable().await", block_on(crate::durable(&store, l2)));
    assert!(store.is_durable(l2), "{CASE}: durable after the async wait");
    // Many threads append and wait at once, half blocking, half async.
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let store = &store;
            s.spawn(move || {
                for n in 0..10 {
                    let lsn = append(CASE, store, vec![event(100 + t, n)]);
                    if t % 2 == 0 {
                        ok(CASE, "wait_durable", store.wait_durable(lsn));
                    } else {
                        ok(CASE, "durable().await", block_on(crate::durable(store, lsn)));
                    }
                    assert!(store.is_durable(lsn), "{CASE}: durable after the wait");
                }
            });
        }
    });
    let last = store.last_lsn();
    assert_eq!(last, l2 + 160, "{CASE}: every append counted");
    ok(CASE, "wait_durable", store.wait_durable(last));
    assert!((0..=last).all(|l| store.is_durable(l)), "{CASE}: durability is a prefix");
}

/// Waiting for an LSN that was never assigned fails instead of blocking forever.
pub fn waiting_beyond_the_last_lsn_is_an_error<B: Backend>(backend: &mut B) {
    const CASE: &str = "waiting_beyond_the_last_lsn_is_an_error";
    let store = backend.create();
    append(CASE, &store, vec![event(1, 1)]);
    match store.wait_durable(5) {
        Err(StoreError::BeyondEnd { lsn: 5, last: 1 }) => {}
        other => panic!("{CASE}: wait_durable(5) with last LSN 1 returned {other:?}"),
    }
    assert!(!store.is_durable(5), "{CASE}: an unassigned LSN is not durable");
    match block_on(crate::durable(&store, 5)) {
        Err(StoreError::BeyondEnd { .. }) => {}
        other => panic!("{CASE}: durable(5).await with last LSN 1 returned {other:?}"),
    }
    // The store still works.
    assert_eq!(append(CASE, &store, vec![event(1, 2)]), 2, "{CASE}: append after the refused wait");
}

/// A 4 MiB payload and a 20 000-event batch come back unchanged.
pub fn large_payloads_and_batches_round_trip<B: Backend>(backend: &mut B) {
    const CASE: &str = "large_payloads_and_batches_round_trip";
    let store = backend.create();
    let big = Event::EffectExecuted {
        tx: TxId(1),
        effect: EffectId(0),
        output: Arc::new(Value::String("x".repeat(4 << 20))),
    };
    let many: Vec<Event> = (0..20_000).map(|n| event(2, n)).collect();
    let l1 = append(CASE, &store, vec![big.clone()]);
    let l2 = append(CASE, &store, many.clone());
    assert_eq!((l1, l2), (1, 20_001), "{CASE}: LSNs");
    ok(CASE, "wait_durable", store.wait_durable(l2));
    let mut want = vec![(1, big)];
    want.extend(numbered(&many, 2));
    assert!(ok(CASE, "scan", collect(&store, 1)) == want, "{CASE}: scan returns the events unchanged");
}

/// Text with quotes, escapes, control characters and non-ASCII survives storage.
pub fn awkward_text_round_trips<B: Backend>(backend: &mut B) {
    const CASE: &str = "awkward_text_round_trips";
    let store = backend.create();
    let texts = [
        "quote \" backslash \\ slash /",
        "nul \u{0} tab \t newline \n",
        "ünïcødé ✓ 🌊 ライン",
        "",
        "'; DROP TABLE events; --",
    ];
    let events: Vec<Event> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Event::EffectFailed {
            tx: TxId(i as u64),
            effect: EffectId(1),
            error: (*t).into(),
            unknown: i % 2 == 0,
        })
        .collect();
    let last = append(CASE, &store, events.clone());
    ok(CASE, "wait_durable", store.wait_durable(last));
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), numbered(&events, 1), "{CASE}: scan");
}

/// Reopened after durability waits, a durable backend shows the same events at the same
/// LSNs and goes on from the next LSN.
pub fn reopen_sees_exactly_the_durable_events<B: Backend>(backend: &mut B) {
    const CASE: &str = "reopen_sees_exactly_the_durable_events";
    let store = backend.create();
    let a: Vec<Event> = (0..5).map(|n| event(1, n)).collect();
    let l = append(CASE, &store, a.clone());
    ok(CASE, "wait_durable", store.wait_durable(l));
    let Some(store) = backend.reopen(store) else {
        eprintln!("conformance: {CASE} skipped (volatile backend)");
        return;
    };
    assert_eq!(store.last_lsn(), 5, "{CASE}: last_lsn after reopen");
    assert!(store.is_durable(5), "{CASE}: reopened events are durable");
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), numbered(&a, 1), "{CASE}: scan after reopen");
    let b: Vec<Event> = (0..3).map(|n| event(2, n)).collect();
    assert_eq!(append(CASE, &store, b.clone()), 8, "{CASE}: LSNs go on after reopen");
    ok(CASE, "wait_durable", store.wait_durable(8));
    let Some(store) = backend.reopen(store) else { return };
    let mut want = numbered(&a, 1);
    want.extend(numbered(&b, 6));
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), want, "{CASE}: scan after the second reopen");
}

/// A clean close keeps even the events nobody waited for.
pub fn reopen_after_clean_close_keeps_every_event<B: Backend>(backend: &mut B) {
    const CASE: &str = "reopen_after_clean_close_keeps_every_event";
    let store = backend.create();
    let a: Vec<Event> = (0..7).map(|n| event(3, n)).collect();
    append(CASE, &store, a[..4].to_vec());
    append(CASE, &store, a[4..].to_vec());
    let Some(store) = backend.reopen(store) else {
        eprintln!("conformance: {CASE} skipped (volatile backend)");
        return;
    };
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), numbered(&a, 1), "{CASE}: scan after reopen");
    assert!(store.is_durable(7), "{CASE}: durable after reopen");
}

/// A store keeps the latest checkpoint (opaque bytes and their LSN), refuses one beyond its
/// last LSN, and a durable backend still has it, byte for byte, after reopening.
pub fn checkpoints_keep_the_latest_and_survive_reopen<B: Backend>(backend: &mut B) {
    const CASE: &str = "checkpoints_keep_the_latest_and_survive_reopen";
    let store = backend.create();
    assert_eq!(ok(CASE, "checkpoint", store.checkpoint()), None, "{CASE}: a new store has no checkpoint");
    let a: Vec<Event> = (0..10).map(|n| event(4, n)).collect();
    append(CASE, &store, a.clone());
    ok(CASE, "put_checkpoint(5)", store.put_checkpoint(5, b"first"));
    let got = ok(CASE, "checkpoint", store.checkpoint());
    assert_eq!(got, Some(StoredCheckpoint { lsn: 5, bytes: b"first".to_vec() }), "{CASE}: after the first put");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    ok(CASE, "put_checkpoint(10)", store.put_checkpoint(10, &big));
    let got = ok(CASE, "checkpoint", store.checkpoint()).map(|c| (c.lsn, c.bytes == big));
    assert_eq!(got, Some((10, true)), "{CASE}: the latest put replaces the earlier one");
    match store.put_checkpoint(11, b"beyond") {
        Err(StoreError::BeyondEnd { lsn: 11, last: 10 }) => {}
        other => panic!("{CASE}: a checkpoint beyond the last LSN must fail with BeyondEnd, got {other:?}"),
    }
    let Some(store) = backend.reopen(store) else {
        eprintln!("conformance: {CASE} reopen skipped (volatile backend)");
        return;
    };
    let got = ok(CASE, "checkpoint", store.checkpoint()).map(|c| (c.lsn, c.bytes == big));
    assert_eq!(got, Some((10, true)), "{CASE}: the checkpoint after reopen");
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), numbered(&a, 1), "{CASE}: events after reopen");
}

/// Storing a checkpoint at LSN `l` makes the events `1..=l` durable: a checkpoint never
/// survives without the events it summarises.
pub fn a_stored_checkpoint_makes_its_events_durable<B: Backend>(backend: &mut B) {
    const CASE: &str = "a_stored_checkpoint_makes_its_events_durable";
    let store = backend.create();
    let a: Vec<Event> = (0..6).map(|n| event(5, n)).collect();
    let l = append(CASE, &store, a.clone());
    ok(CASE, "put_checkpoint", store.put_checkpoint(l, b"state"));
    assert!(store.is_durable(l), "{CASE}: events up to the checkpoint are durable once it is stored");
    let Some(store) = backend.reopen(store) else { return };
    assert_eq!(ok(CASE, "scan", collect(&store, 1)), numbered(&a, 1), "{CASE}: events after reopen");
    assert_eq!(ok(CASE, "checkpoint", store.checkpoint()).map(|c| c.lsn), Some(l), "{CASE}: checkpoint after reopen");
}

/// Ownership: a new owner of the stream gets a larger token and sees every durable event; the
/// old handle's later writes are refused with [`StoreError::Fenced`] (not retryable), never
/// become durable or visible to the new owner, and stay refused. A backend that refuses the
/// second owner while the first lives must say so with a non-retryable error and keep the
/// first owner working.
pub fn a_fenced_out_owner_can_never_append_again<B: Backend>(backend: &mut B) {
    const CASE: &str = "a_fenced_out_owner_can_never_append_again";
    let old = backend.create();
    let before: Vec<Event> = (0..3).map(|n| event(6, n)).collect();
    let l = append(CASE, &old, before.clone());
    ok(CASE, "wait_durable", old.wait_durable(l));
    let new = match backend.take_over(&old) {
        None => {
            eprintln!("conformance: {CASE} skipped (the backend cannot open a stream twice)");
            return;
        }
        Some(Err(e)) => {
            assert!(!e.retryable(), "{CASE}: refusing a second owner must not be retryable: {e:?}");
            let l = append(CASE, &old, vec![event(6, 9)]);
            ok(CASE, "wait_durable after the refused take-over", old.wait_durable(l));
            eprintln!("conformance: {CASE}: the backend refuses a second owner while the first lives: {e}");
            return;
        }
        Some(Ok(new)) => new,
    };
    let (was, now) = (old.ownership(), new.ownership());
    assert_eq!(was.stream, now.stream, "{CASE}: the new owner holds the same stream");
    assert!(now.token > was.token, "{CASE}: the new owner's token {} must exceed the old {}", now.token, was.token);
    assert_eq!(ok(CASE, "scan", collect(&new, 1)), numbered(&before, 1), "{CASE}: the new owner sees the events");
    let mine = append(CASE, &new, vec![event(7, 0)]);
    ok(CASE, "new owner's wait_durable", new.wait_durable(mine));

    // The old owner wakes up and tries to append: refused at the append, or at the latest
    // when it waits for durability; never durable, never seen by the new owner.
    let refused = match old.append(&tidegate_core::Batch::from(vec![event(6, 100)])) {
        Err(e) => e,
        Ok(lsn) => {
            let started = std::time::Instant::now();
            let r = old.wait_durable(lsn);
            assert!(started.elapsed() < FENCE_WAIT, "{CASE}: the old owner's wait took too long");
            match r {
                Err(e) => e,
                Ok(()) => panic!("{CASE}: the fenced-out owner's append at LSN {lsn} became durable"),
            }
        }
    };
    assert!(refused.is_fenced(), "{CASE}: the old owner's write must fail with Fenced, got {refused:?}");
    assert!(!refused.retryable(), "{CASE}: Fenced is not retryable");
    assert!(
        old.append(&tidegate_core::Batch::from(vec![event(6, 101)])).is_err(),
        "{CASE}: a fenced owner stays refused"
    );
    let seen: Vec<Event> = ok(CASE, "scan", collect(&new, 1)).into_iter().map(|(_, e)| e).collect();
    assert!(!seen.contains(&event(6, 100)), "{CASE}: the new owner sees the fenced-out owner's event");
    let more = append(CASE, &new, vec![event(7, 1)]);
    ok(CASE, "new owner's wait_durable", new.wait_durable(more));
    assert_eq!(more, mine + 1, "{CASE}: the new owner's LSNs go on without a gap");
    drop(old);
    let seen = ok(CASE, "scan", collect(&new, 1));
    assert_eq!(seen.len() as Lsn, more, "{CASE}: the new owner's ledger after the old handle is dropped");
}
