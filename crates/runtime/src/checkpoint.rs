//! Projection checkpoints: a background thread keeps a *replaying shadow* of the engine and
//! stores its state every so many events, so that reopening replays only the tail.
//!
//! ```text
//!  with_core (engine lock)                   checkpointer thread (no engine lock)
//!  append(events) ─► store                   applies fed batches in ledger order;
//!  feed(lsn, events) ─► buffer ────────────►   (a gap: scan(shadow.lsn + 1 ..) instead)
//!  lsn ≥ next_at? ─► poke ─────────────────►   every `every_events` LSNs, or on demand:
//!                                              put_checkpoint(lsn, shadow.checkpoint())
//! ```
//!
//! The shadow is a [`Replay`], so a checkpoint is exactly the state replay reaches at its LSN
//! (the live engine's state is not: renewed leases, waiting sets and running late
//! compensations are not in the ledger). The hot path pays one clone per event and a short
//! buffer lock; the thread applies each event once more, off the engine lock. (Re-reading the
//! events from the store instead cost about a third of the 64-client throughput on two cores:
//! decoding JSON is the expensive part.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tidegate_core::engine::{Checkpoint, Replay};
use tidegate_core::{CoreConfig, ScopeRegistry};
use tidegate_storage::{LedgerStore, Lsn, StoreError};

use crate::engine::Tidegate;
use crate::plan::{PlanShadow, SECTION};
use crate::{Error, Result};

/// When the engine stores checkpoints of its projections. Every default is given on its
/// field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Take a checkpoint each time this many events were appended since the last one
    /// (`None`: never on a count). Bounds what a reopen replays. Default: 200 000.
    pub every_events: Option<u64>,
    /// Take one when the engine is dropped, so a clean restart replays nothing.
    /// Default: `true`.
    pub on_close: bool,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy { every_events: Some(200_000), on_close: true }
    }
}

impl CheckpointPolicy {
    /// No automatic checkpoints (only [`Tidegate::checkpoint_now`], which then replays the
    /// ledger from its start).
    pub fn never() -> CheckpointPolicy {
        CheckpointPolicy { every_events: None, on_close: false }
    }
}

/// A stored checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointInfo {
    /// The last event it covers.
    pub lsn: Lsn,
    /// Its encoded size.
    pub bytes: usize,
    /// Events the shadow replayed to reach it since the previous one.
    pub replayed: u64,
    /// Time to replay, encode and store it.
    pub micros: u64,
}

/// How the engine's projections were rebuilt when it was built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// The checkpoint loaded, if any (its LSN).
    pub checkpoint_lsn: Option<Lsn>,
    /// Events replayed after it (the whole ledger without one).
    pub replayed_events: u64,
    /// Why a stored checkpoint was not used (damaged, or beyond the ledger's end): the whole
    /// ledger was replayed instead. Never silent.
    pub checkpoint_fallback: Option<String>,
    /// Time spent reading the checkpoint and replaying, in microseconds.
    pub micros: u64,
    /// Whether the plan executor's state came from the checkpoint's `plans` section (then
    /// only the events after it were folded for plans too).
    pub plans_from_checkpoint: bool,
    /// Why the plan executor was folded from the ledger's start although a checkpoint was
    /// loaded (a checkpoint of an older build, a damaged or unreadable section). Never silent.
    pub plans_fallback: Option<String>,
}

/// Batches handed over by the append path, in ledger order.
#[derive(Debug, Default)]
struct Feed {
    /// The appended batches not yet applied, shared with the store and the other observers
    /// (no event is copied for the shadow).
    batches: Vec<tidegate_core::Batch>,
    /// How many events `batches` hold.
    events: usize,
    /// The LSN of the last event appended to `events` (or of the seed).
    last: Lsn,
    /// A batch did not continue `last`: the thread re-reads the store instead.
    gap: bool,
}

/// Wake the thread to apply the buffer once it holds this many events.
const FEED_BATCH: usize = 4096;

#[derive(Debug, Default)]
struct Ctl {
    /// The feed holds a full batch.
    fed: bool,
    /// Requests made, and the newest one served.
    wanted: u64,
    served: u64,
    stop: bool,
    last: Option<CheckpointInfo>,
    /// Why checkpointing stopped (the thread then serves requests with this error).
    disabled: Option<String>,
}

/// The handle the engine keeps; dropping it stops the thread (after a final checkpoint if
/// the policy says so).
pub(crate) struct Checkpointer {
    ctl: Arc<(Mutex<Ctl>, Condvar)>,
    /// Poke the thread once the ledger reaches this LSN.
    next_at: Arc<AtomicU64>,
    every: u64,
    feed: Option<Arc<Mutex<Feed>>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer").field("next_at", &self.next_at).finish_non_exhaustive()
    }
}

/// What the thread starts from: the replayed state at `lsn`, encoded, and whether it must be
/// stored at once (the open replayed a tail the stored checkpoint does not cover).
pub(crate) struct Seed {
    pub(crate) lsn: Lsn,
    pub(crate) bytes: Option<Vec<u8>>,
    pub(crate) store_now: bool,
    /// The tenant of the plan executor whose fold the checkpoints carry.
    pub(crate) tenant: String,
}

/// What the checkpoint thread replays: the engine's projections and, beside them, the plan
/// executor's fold of the same events (`None` once it cannot follow the ledger, say a plan
/// record of a newer build: its checkpoints then carry no `plans` section and the next open
/// folds the plans from the ledger's start, as the report says).
struct Shadow {
    replay: Replay,
    plans: Option<PlanShadow>,
}

impl Shadow {
    fn lsn(&self) -> Lsn {
        self.replay.lsn()
    }

    fn applied(&self) -> u64 {
        self.replay.applied()
    }

    fn apply(&mut self, e: &tidegate_core::Event) -> std::result::Result<(), String> {
        self.replay.apply(e).map_err(|e| format!("the replaying shadow could not apply the ledger: {e}"))?;
        if let Some(p) = &mut self.plans
            && p.apply(e).is_err()
        {
            self.plans = None;
        }
        Ok(())
    }

    fn checkpoint(&self) -> std::result::Result<Vec<u8>, String> {
        match &self.plans {
            Some(p) => {
                let section = p.encode().map_err(|e| e.to_string())?;
                self.replay.checkpoint_with(&[(SECTION, &section)])
            }
            None => self.replay.checkpoint(),
        }
        .map_err(|e| e.to_string())
    }
}

impl Checkpointer {
    pub(crate) fn start(
        store: Arc<dyn LedgerStore>,
        cfg: CoreConfig,
        scopes: ScopeRegistry,
        policy: CheckpointPolicy,
        seed: Seed,
    ) -> Result<Checkpointer> {
        let ctl: Arc<(Mutex<Ctl>, Condvar)> = Arc::default();
        let every = policy.every_events.unwrap_or(u64::MAX).max(1);
        let next_at = Arc::new(AtomicU64::new(seed.lsn.saturating_add(every)));
        let feed = policy
            .every_events
            .is_some()
            .then(|| Arc::new(Mutex::new(Feed { batches: Vec::new(), events: 0, last: seed.lsn, gap: false })));
        let (ctl2, next2, feed2) = (ctl.clone(), next_at.clone(), feed.clone());
        let thread = std::thread::Builder::new()
            .name("tidegate-checkpoint".into())
            .spawn(move || run(&*store, cfg, scopes, policy, seed, &ctl2, &next2, every, feed2.as_deref()))
            .map_err(|e| Error::Store(StoreError::Io { op: "start the checkpoint thread", source: e }))?;
        Ok(Checkpointer { ctl, next_at, every, feed, thread: Some(thread) })
    }

    /// Called after each append with the batch's last LSN (and the batch, when feeding).
    #[inline]
    pub(crate) fn appended(&self, lsn: Lsn, batch: &tidegate_core::Batch) {
        if let Some(feed) = &self.feed {
            let mut f = feed.lock();
            if !f.gap && f.last + batch.len() as Lsn == lsn {
                f.events += batch.len();
                f.batches.push(batch.clone());
            } else {
                f.gap = true;
                f.batches.clear();
                f.events = 0;
            }
            f.last = lsn;
            let full = f.events >= FEED_BATCH;
            drop(f);
            if full {
                let (m, cv) = &*self.ctl;
                m.lock().fed = true;
                cv.notify_all();
            }
        }
        if lsn >= self.next_at.load(Ordering::Relaxed) {
            self.next_at.fetch_max(lsn.saturating_add(self.every), Ordering::Relaxed);
            let (m, cv) = &*self.ctl;
            m.lock().wanted += 1;
            cv.notify_all();
        }
    }

    /// Asks for a checkpoint of everything appended so far and waits for it.
    pub(crate) fn now(&self) -> std::result::Result<CheckpointInfo, String> {
        let (m, cv) = &*self.ctl;
        let mut c = m.lock();
        // A disabled checkpointer's thread has ended: nobody would serve the request.
        if let Some(why) = &c.disabled {
            return Err(why.clone());
        }
        c.wanted += 1;
        let w = c.wanted;
        cv.notify_all();
        while c.served < w {
            cv.wait(&mut c);
        }
        match (&c.disabled, c.last) {
            (Some(why), _) => Err(why.clone()),
            (None, Some(info)) => Ok(info),
            (None, None) => Err("no checkpoint was stored (the ledger is empty)".into()),
        }
    }

    pub(crate) fn last(&self) -> Option<CheckpointInfo> {
        self.ctl.0.lock().last
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (m, cv) = &*self.ctl;
        m.lock().stop = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    store: &dyn LedgerStore,
    cfg: CoreConfig,
    scopes: ScopeRegistry,
    policy: CheckpointPolicy,
    seed: Seed,
    ctl: &(Mutex<Ctl>, Condvar),
    next_at: &AtomicU64,
    every: u64,
    feed: Option<&Mutex<Feed>>,
) {
    let (m, cv) = ctl;
    let disable = |why: String| {
        let mut c = m.lock();
        c.disabled = Some(why);
        c.served = c.wanted;
        cv.notify_all();
    };
    let shadow = match &seed.bytes {
        None => {
            Ok(Shadow { replay: Replay::new(cfg.clone(), scopes.clone()), plans: Some(PlanShadow::new(&seed.tenant)) })
        }
        Some(b) => Checkpoint::parse(seed.lsn, b)
            .and_then(|c| load_both(&cfg, &scopes, &seed.tenant, &c))
            .map(|(replay, plans)| Shadow { replay, plans: plans.and_then(std::result::Result::ok) }),
    };
    let mut shadow = match shadow {
        Ok(s) => s,
        Err(e) => return disable(format!("the replaying shadow could not start: {e}")),
    };
    let mut stored = if seed.store_now { 0 } else { seed.lsn };
    if seed.store_now
        && let Some(b) = &seed.bytes
    {
        match store.put_checkpoint(seed.lsn, b) {
            Ok(()) => {
                stored = seed.lsn;
                m.lock().last = Some(CheckpointInfo { lsn: seed.lsn, bytes: b.len(), replayed: 0, micros: 0 });
            }
            Err(e) => return disable(format!("storing the checkpoint at open failed: {e}")),
        }
    } else if let Some(b) = &seed.bytes {
        // The checkpoint found at open covers everything replayed: it is the last one, so a
        // checkpoint asked for before anything new is appended answers with it (a reopened
        // tenant closed with no new event failed its close with "no checkpoint was stored").
        m.lock().last = Some(CheckpointInfo { lsn: seed.lsn, bytes: b.len(), replayed: 0, micros: 0 });
    }
    drop(seed);
    loop {
        let (w, stopping, wanted) = {
            let mut c = m.lock();
            while c.served >= c.wanted && !c.stop && !c.fed {
                cv.wait(&mut c);
            }
            c.fed = false;
            (c.wanted, c.stop, c.served < c.wanted)
        };
        if let Some(feed) = feed
            && let Err(why) = drain(feed, &mut shadow)
        {
            return disable(why);
        }
        if stopping && !policy.on_close {
            break;
        }
        if !wanted && !stopping {
            continue;
        }
        let started = Instant::now();
        let before = shadow.applied();
        match take(store, &mut shadow, &mut stored) {
            Ok(Some(bytes)) => {
                let info = CheckpointInfo {
                    lsn: shadow.lsn(),
                    bytes,
                    replayed: shadow.applied() - before,
                    micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                };
                next_at.fetch_max(info.lsn.saturating_add(every), Ordering::Relaxed);
                let mut c = m.lock();
                c.last = Some(info);
                c.served = c.served.max(w);
                cv.notify_all();
            }
            Ok(None) => {
                let mut c = m.lock();
                c.served = c.served.max(w);
                cv.notify_all();
            }
            Err(why) => return disable(why),
        }
        if stopping {
            break;
        }
    }
    // Anyone still waiting is answered.
    let mut c = m.lock();
    c.served = c.wanted;
    cv.notify_all();
}

/// Applies the fed events if they continue the shadow; after a gap, leaves the catching up
/// to [`take`]'s scan.
fn drain(feed: &Mutex<Feed>, shadow: &mut Shadow) -> std::result::Result<(), String> {
    let (batches, count, last) = {
        let mut f = feed.lock();
        if f.gap {
            f.gap = false;
            f.batches.clear();
            f.events = 0;
            return Ok(());
        }
        let count = std::mem::take(&mut f.events);
        (std::mem::take(&mut f.batches), count, f.last)
    };
    let first = last + 1 - count as Lsn;
    if count == 0 || first > shadow.lsn() + 1 || last <= shadow.lsn() {
        // Not contiguous, or already applied (a scan caught up past them): the scan covers it.
        return Ok(());
    }
    // A scan may have applied the first few already.
    let skip = usize::try_from(shadow.lsn() + 1 - first).unwrap_or(usize::MAX);
    for e in batches.iter().flat_map(|b| b.iter()).skip(skip) {
        shadow.apply(e)?;
    }
    Ok(())
}

/// Brings the shadow up to the store's last LSN and stores a checkpoint there, unless one is
/// already stored at that LSN. Returns the checkpoint's size.
fn take(store: &dyn LedgerStore, shadow: &mut Shadow, stored: &mut Lsn) -> std::result::Result<Option<usize>, String> {
    let target = store.last_lsn();
    if target > shadow.lsn() {
        let mut failed = None;
        store
            .scan(shadow.lsn() + 1, &mut |lsn, e| {
                if lsn > target {
                    return false;
                }
                if let Err(err) = shadow.apply(e) {
                    failed = Some(err);
                    return false;
                }
                true
            })
            .map_err(|e| format!("reading the ledger for a checkpoint failed: {e}"))?;
        if let Some(f) = failed {
            return Err(f);
        }
        if shadow.lsn() < target {
            return Err(format!(
                "the store returned events only up to LSN {} of {target} (it does not retain events)",
                shadow.lsn()
            ));
        }
    }
    if shadow.lsn() <= *stored {
        return Ok(None);
    }
    let bytes = shadow.checkpoint()?;
    match store.put_checkpoint(shadow.lsn(), &bytes) {
        Ok(()) => {
            *stored = shadow.lsn();
            Ok(Some(bytes.len()))
        }
        Err(e) => Err(format!("storing the checkpoint at LSN {} failed: {e}", shadow.lsn())),
    }
}

impl Tidegate {
    /// Stores a checkpoint of the projections at the ledger's current end now, and waits for
    /// it (the engine also takes them by its [`CheckpointPolicy`]). Blocks the calling
    /// thread; call it from outside the async runtime or through `spawn_blocking`.
    pub fn checkpoint_now(&self) -> Result<CheckpointInfo> {
        // A fenced engine's store belongs to another owner now: nothing of it is written.
        self.refuse_if_fenced()?;
        let Some(ck) = &self.inner.checkpointer else {
            return Err(Error::Store(StoreError::Unsupported { op: "checkpoints (disabled by the policy)" }));
        };
        ck.now()
            .map_err(|why| Error::Store(StoreError::Io { op: "take a checkpoint", source: std::io::Error::other(why) }))
    }

    /// The last checkpoint this engine stored, or found stored at open and covering the
    /// whole ledger, if any.
    pub fn last_checkpoint(&self) -> Option<CheckpointInfo> {
        self.inner.checkpointer.as_ref().and_then(Checkpointer::last)
    }

    /// How the projections were rebuilt when the engine was built.
    pub fn open_report(&self) -> &ReplayReport {
        &self.inner.open
    }
}

/// The `plans` section of a verified checkpoint: `None` if it has none (an older build's),
/// else the decoded fold or why it cannot be used.
fn plan_section(tenant: &str, c: &Checkpoint<'_>) -> Option<std::result::Result<PlanShadow, String>> {
    c.section(SECTION).map(|b| PlanShadow::decode(tenant, b).map_err(|e| e.to_string()))
}

/// Decodes a verified checkpoint's engine state and its `plans` section, the section on a
/// second thread when there is one: they are independent, and on a reopen of a large ledger
/// each takes seconds.
fn load_both(
    cfg: &CoreConfig,
    scopes: &ScopeRegistry,
    tenant: &str,
    c: &Checkpoint<'_>,
) -> std::result::Result<
    (Replay, Option<std::result::Result<PlanShadow, String>>),
    tidegate_core::engine::CheckpointError,
> {
    if c.section(SECTION).is_none() {
        return Replay::from_checkpoint(cfg.clone(), scopes.clone(), c).map(|r| (r, None));
    }
    std::thread::scope(|s| {
        let plans =
            std::thread::Builder::new().name("tidegate-open".into()).spawn_scoped(s, || plan_section(tenant, c));
        let replay = Replay::from_checkpoint(cfg.clone(), scopes.clone(), c);
        let plans = match plans {
            Ok(h) => h.join().unwrap_or_else(|_| Some(Err("decoding the plans section panicked".into()))),
            // No second thread: decode it here.
            Err(_) => plan_section(tenant, c),
        };
        replay.map(|r| (r, plans))
    })
}

/// What an open rebuilt: the engine's projections, the plan executor's fold at the same LSN
/// (`None` if a plan record could not be folded: the executor's start reports it), and the
/// stored checkpoint's bytes when they are exactly that state (nothing after them).
pub(crate) struct Opened {
    pub(crate) replay: Replay,
    pub(crate) plans: Option<PlanShadow>,
    pub(crate) report: ReplayReport,
    pub(crate) stored: Option<Vec<u8>>,
}

/// Replays the store into a fresh engine state: from its checkpoint when it has a usable one,
/// else from LSN 1. A checkpoint from a newer format is an error; a damaged one, or one beyond
/// the ledger's end, falls back to the full replay and says so in the report. The plan
/// executor of `tenant` is folded alongside, from the checkpoint's `plans` section when it
/// has a usable one, else from LSN 1.
pub(crate) fn replay(
    store: &dyn LedgerStore,
    cfg: &CoreConfig,
    scopes: &ScopeRegistry,
    tenant: &str,
) -> Result<Opened> {
    let started = Instant::now();
    let mut report = ReplayReport::default();
    let last = store.last_lsn();
    let mut replay = None;
    let mut plans = None;
    let mut stored = None;
    if last > 0 {
        match store.checkpoint()? {
            None => {}
            Some(c) if c.lsn > last => {
                report.checkpoint_fallback = Some(format!(
                    "the stored checkpoint is at LSN {} but the ledger ends at {last}; replayed the whole ledger",
                    c.lsn
                ));
            }
            Some(c) => match Checkpoint::parse(c.lsn, &c.bytes).and_then(|v| load_both(cfg, scopes, tenant, &v)) {
                Ok((r, section)) => {
                    report.checkpoint_lsn = Some(c.lsn);
                    match section {
                        Some(Ok(p)) => {
                            report.plans_from_checkpoint = true;
                            plans = Some(p);
                        }
                        Some(Err(why)) => {
                            report.plans_fallback = Some(format!("{why}; folded the plans from the ledger's start"));
                        }
                        None => {
                            report.plans_fallback = Some(
                                "the checkpoint has no plans section (an older build wrote it); folded the plans from the ledger's start"
                                    .into(),
                            );
                        }
                    }
                    replay = Some(r);
                    if plans.is_some() && c.lsn == last {
                        stored = Some(c.bytes);
                    }
                }
                Err(tidegate_core::engine::CheckpointError::NewerFormat { what, found, supported, .. }) => {
                    return Err(Error::Store(StoreError::NewerFormat {
                        path: format!("the checkpoint at LSN {}", c.lsn).into(),
                        key: if what == "format version" {
                            "checkpoint format_version"
                        } else {
                            "checkpoint ledger_format"
                        },
                        found: found.into(),
                        supported: supported.into(),
                    }));
                }
                Err(e) => {
                    report.checkpoint_fallback = Some(format!("{e}; replayed the whole ledger"));
                }
            },
        }
    }
    let mut replay = replay.unwrap_or_else(|| Replay::new(cfg.clone(), scopes.clone()));
    // The plans' fold up to the checkpoint, when the checkpoint did not carry it.
    let mut plan_error = false;
    if plans.is_none() {
        let mut p = PlanShadow::new(tenant);
        if replay.lsn() > 0 {
            let upto = replay.lsn();
            store.scan(1, &mut |lsn, e| {
                if lsn > upto {
                    return false;
                }
                if p.apply(e).is_err() {
                    plan_error = true;
                    return false;
                }
                true
            })?;
        }
        plans = Some(p);
    }
    if last > replay.lsn() {
        let mut failed = None;
        store.scan(replay.lsn() + 1, &mut |_, e| match replay.apply(e) {
            Ok(()) => {
                if !plan_error
                    && let Some(p) = &mut plans
                    && p.apply(e).is_err()
                {
                    plan_error = true;
                }
                true
            }
            Err(err) => {
                failed = Some(err);
                false
            }
        })?;
        if let Some(e) = failed {
            return Err(Error::Store(StoreError::Corrupt { lsn: e.index + 1, detail: e.to_string() }));
        }
    }
    if plan_error {
        // The executor's own start folds the ledger again and reports the record it refuses.
        plans = None;
    }
    report.replayed_events = replay.applied();
    report.micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(Opened { replay, plans, report, stored })
}
