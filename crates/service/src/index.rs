//! The ledger index: per tenant, what the API reads about transactions, derived from the
//! ledger only (docs/server.md, "Ledger index").
//!
//! ```text
//!  engine lock ─► store.append(&batch) ─► Ok(lsn) ─► AppendObserver::appended ─► LedgerIndex::apply_batch
//!  start-up    ─► LedgerIndex::rebuild(store)  (one scan; the same apply path)
//!  evicted tx  ─► LedgerIndex::load(store, tx) (scan of its LSN range; the same apply path)
//! ```
//!
//! Holds a full record per unfinished transaction and per recently settled one (the newest
//! `retain` settled), a slot `(first LSN, last LSN, phase)` per transaction ever begun, the
//! list of effects settled with a tag other than `clean`, and the branches of each
//! speculation group with a retained branch.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tidegate_core::{
    AbortReason, Batch, Disposition, EffectClass, EffectId, Epoch, Event, GroupId, Tag, Timestamp, TxId,
};
use tidegate_storage::{LedgerStore, Lsn, StoreError};
use tokio::sync::{broadcast, watch};

use crate::console::{OPERATOR_STREAM, Resolution, Resolutions, Series, now_ms};

use crate::metrics::{Metrics, ReasonLabel, TagLabel};

/// A transaction's phase, from the ledger (plus the server's "waiting" flag, see
/// [`TxView::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Accepting reads and effects.
    Open,
    /// Footprint frozen.
    Sealed,
    /// Commit decided; releasing.
    Committing,
    /// Abort decided; compensating.
    Aborting,
    /// Settled: committed.
    Committed,
    /// Settled: aborted.
    Aborted,
}

impl Phase {
    /// Whether the transaction has settled.
    pub fn settled(self) -> bool {
        matches!(self, Phase::Committed | Phase::Aborted)
    }

    fn code(self) -> u8 {
        match self {
            Phase::Open => 1,
            Phase::Sealed => 2,
            Phase::Committing => 3,
            Phase::Aborting => 4,
            Phase::Committed => 5,
            Phase::Aborted => 6,
        }
    }

    fn from_code(c: u8) -> Option<Phase> {
        Some(match c {
            1 => Phase::Open,
            2 => Phase::Sealed,
            3 => Phase::Committing,
            4 => Phase::Aborting,
            5 => Phase::Committed,
            6 => Phase::Aborted,
            _ => return None,
        })
    }
}

/// Where an effect is, from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectStatus {
    /// An eager call recorded, not yet reported.
    InFlight,
    /// An eager call executed.
    Executed,
    /// An eager call failed (or its outcome is unknown: see `unknown`).
    Failed,
    /// A held effect (staged or queued), not yet released.
    Held,
    /// A release started.
    Releasing,
    /// Released at commit.
    Released,
    /// The release failed (or its outcome is unknown).
    ReleaseFailed,
    /// Compensated.
    Compensated,
    /// The compensation failed.
    CompensationFailed,
}

impl EffectStatus {
    /// Its name: `in_flight`, `executed`, `failed`, `held`, `releasing`, `released`,
    /// `release_failed`, `compensated`, `compensation_failed`.
    pub fn name(self) -> &'static str {
        match self {
            EffectStatus::InFlight => "in_flight",
            EffectStatus::Executed => "executed",
            EffectStatus::Failed => "failed",
            EffectStatus::Held => "held",
            EffectStatus::Releasing => "releasing",
            EffectStatus::Released => "released",
            EffectStatus::ReleaseFailed => "release_failed",
            EffectStatus::Compensated => "compensated",
            EffectStatus::CompensationFailed => "compensation_failed",
        }
    }
}

/// One effect of a transaction.
#[derive(Debug, Clone)]
pub struct EffectRecord {
    /// Issuance position.
    pub id: EffectId,
    /// Tool.
    pub tool: Arc<str>,
    /// Class.
    pub class: EffectClass,
    /// Canonical scopes.
    pub scopes: Vec<Arc<str>>,
    /// Effect key.
    pub key: Arc<str>,
    /// Arguments as recorded (for server tools, the envelope `{args, key}`).
    pub args: Arc<Value>,
    /// Where it is.
    pub status: EffectStatus,
    /// Output of the call or release.
    pub output: Option<Arc<Value>>,
    /// Error text of a failed call, release or compensation.
    pub error: Option<String>,
    /// Whether a failure's outcome is unknown.
    pub unknown: bool,
    /// Residue reported by a compensation.
    pub residue: Option<String>,
    /// Disposition and tag, once settled.
    pub settled: Option<(Disposition, Tag)>,
}

/// A transaction as the API shows it.
#[derive(Debug, Clone)]
pub struct TxView {
    /// Id.
    pub tx: TxId,
    /// Epoch.
    pub epoch: Epoch,
    /// Agent.
    pub agent: Arc<str>,
    /// Speculation group.
    pub group: Option<GroupId>,
    /// Declared may-touch scopes.
    pub may_touch: Option<Vec<String>>,
    /// Lease deadline at begin (engine clock, Unix nanoseconds).
    pub lease_until: Timestamp,
    /// Phase.
    pub phase: Phase,
    /// The server asked for the commit and it is not yet decided.
    pub waiting: bool,
    /// Reads: canonical scope and version.
    pub reads: Vec<(Arc<str>, u64)>,
    /// Effects in issuance order.
    pub effects: Vec<EffectRecord>,
    /// Commit decision: `Some(true)` commit, `Some(false)` abort.
    pub decided: Option<bool>,
    /// Why it aborted.
    pub reason: Option<AbortReason>,
    /// First and last LSN seen.
    pub lsns: (Lsn, Lsn),
}

impl TxView {
    /// The state name: `open`, `sealed`, `waiting`, `committing`, `aborting`, `committed`,
    /// `aborted`.
    pub fn state(&self) -> &'static str {
        match self.phase {
            Phase::Open => "open",
            Phase::Sealed if self.waiting => "waiting",
            Phase::Sealed => "sealed",
            Phase::Committing => "committing",
            Phase::Aborting => "aborting",
            Phase::Committed => "committed",
            Phase::Aborted => "aborted",
        }
    }

    fn from_begin(lsn: Lsn, e: &Event) -> Option<TxView> {
        let Event::Begin { tx, epoch, agent, group, may_touch, lease_until } = e else { return None };
        Some(TxView {
            tx: *tx,
            epoch: *epoch,
            agent: agent.clone(),
            group: *group,
            may_touch: may_touch.clone(),
            lease_until: *lease_until,
            phase: Phase::Open,
            waiting: false,
            reads: Vec::new(),
            effects: Vec::new(),
            decided: None,
            reason: None,
            lsns: (lsn, lsn),
        })
    }

    /// Applies one of this transaction's events (the one apply path). An effect's arguments
    /// are shown as the client sent them (`ids::legacy_envelope`).
    fn apply(&mut self, lsn: Lsn, e: &Event) {
        self.lsns.1 = lsn;
        match e {
            Event::Begin { .. } | Event::ToolChanged { .. } => {}
            Event::Read { scope, version, .. } => self.reads.push((scope.clone(), version.0)),
            Event::EffectRecorded { effect: id, tool, class, scopes, key, args, adapter_key, .. } => {
                let status = if class.executes_eagerly() { EffectStatus::InFlight } else { EffectStatus::Held };
                // The key is recorded in its public form (the engine derives keys with the
                // tenant's prefix); an adapter key may carry an earlier version's envelope.
                let args = if *adapter_key {
                    crate::ids::legacy_envelope(args, Some(key)).map_or_else(|| args.clone(), |a| Arc::new(a.clone()))
                } else {
                    args.clone()
                };
                let key = key.clone();
                let rec = EffectRecord {
                    id: *id,
                    tool: tool.clone(),
                    class: *class,
                    scopes: scopes.clone(),
                    key,
                    args,
                    status,
                    output: None,
                    error: None,
                    unknown: false,
                    residue: None,
                    settled: None,
                };
                if id.0 as usize == self.effects.len() {
                    self.effects.push(rec);
                } else if let Some(slot) = self.effects.iter_mut().find(|r| r.id == *id) {
                    *slot = rec;
                } else {
                    self.effects.push(rec);
                    self.effects.sort_by_key(|r| r.id);
                }
            }
            Event::EffectExecuted { effect: id, output, .. } => {
                if let Some(r) = find(&mut self.effects, *id) {
                    r.status = EffectStatus::Executed;
                    r.output = Some(output.clone());
                }
            }
            Event::EffectFailed { effect: id, error, unknown, .. } => {
                if let Some(r) = find(&mut self.effects, *id) {
                    r.status = EffectStatus::Failed;
                    r.error = Some(error.clone());
                    r.unknown = *unknown;
                }
            }
            Event::Sealed { .. } if self.phase == Phase::Open => self.phase = Phase::Sealed,
            Event::Decided { commit, reason, .. } => {
                self.decided = Some(*commit);
                self.reason = reason.clone();
                self.waiting = false;
                self.phase = if *commit { Phase::Committing } else { Phase::Aborting };
            }
            Event::ReleaseStarted { effect: id, .. } => {
                if let Some(r) = find(&mut self.effects, *id) {
                    r.status = EffectStatus::Releasing;
                }
            }
            Event::Released { effect: id, output, error, unknown, .. } => {
                if let Some(r) = find(&mut self.effects, *id) {
                    r.status = if error.is_some() { EffectStatus::ReleaseFailed } else { EffectStatus::Released };
                    r.output = output.clone().or(r.output.take());
                    r.error = error.clone();
                    r.unknown = *unknown;
                }
            }
            Event::Compensated { effect: id, residue, error, .. } => {
                if let Some(r) = find(&mut self.effects, *id) {
                    r.status =
                        if error.is_some() { EffectStatus::CompensationFailed } else { EffectStatus::Compensated };
                    r.residue = residue.clone();
                    if error.is_some() {
                        r.error = error.clone();
                    }
                }
            }
            Event::Settled { committed, effects, .. } => {
                self.phase = if *committed { Phase::Committed } else { Phase::Aborted };
                self.waiting = false;
                for (id, disposition, tag) in effects {
                    if let Some(r) = find(&mut self.effects, *id) {
                        r.settled = Some((disposition.clone(), *tag));
                    }
                }
            }
            _ => {}
        }
    }
}

fn find(effects: &mut [EffectRecord], id: EffectId) -> Option<&mut EffectRecord> {
    match effects.get(id.0 as usize) {
        Some(r) if r.id == id => effects.get_mut(id.0 as usize),
        _ => effects.iter_mut().find(|r| r.id == id),
    }
}

/// An effect settled with a tag other than `clean`.
#[derive(Debug, Clone)]
pub struct AttentionEntry {
    /// The `settled` event's LSN.
    pub lsn: Lsn,
    /// Transaction.
    pub tx: TxId,
    /// Whether the transaction committed.
    pub committed: bool,
    /// The effect.
    pub effect: EffectRecord,
    /// Disposition.
    pub disposition: Disposition,
    /// Tag.
    pub tag: Tag,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    first: Lsn,
    last: Lsn,
    phase: u8,
}

struct Record {
    view: TxView,
    notify: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    records: HashMap<TxId, Record>,
    settled: VecDeque<TxId>,
    /// Slot of transaction `n` at index `n - 1`.
    slots: Vec<Slot>,
    attention: Vec<AttentionEntry>,
    groups: HashMap<u64, Vec<TxId>>,
    last_lsn: Lsn,
    /// Operator resolutions of attention entries (the ledger's `operator` stream).
    resolutions: Resolutions,
    /// Per-minute figures for the console's picture.
    series: Series,
}

/// The ledger index of one tenant.
pub struct LedgerIndex {
    state: Mutex<State>,
    retain: usize,
    metrics: Arc<Metrics>,
    /// Every change of a transaction's record (tenant-wide stream of the console).
    changes: broadcast::Sender<TxId>,
}

impl std::fmt::Debug for LedgerIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("LedgerIndex").field("records", &s.records.len()).field("last_lsn", &s.last_lsn).finish()
    }
}

/// Which transactions a list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFilter {
    /// Every transaction.
    All,
    /// Not settled.
    Unfinished,
    /// Settled.
    Settled,
    /// In this phase (`waiting` is listed as `sealed` with the flag).
    Phase(Phase),
    /// Sealed and waiting for its commit.
    Waiting,
}

impl tidegate_runtime::AppendObserver for LedgerIndex {
    fn appended(&self, last: Lsn, batch: &Batch) {
        self.apply_batch(last, batch, true);
    }
}

impl LedgerIndex {
    /// An empty index keeping `retain` settled transactions in memory.
    pub fn new(retain: usize, metrics: Arc<Metrics>) -> LedgerIndex {
        let (changes, _) = broadcast::channel(4096);
        LedgerIndex { state: Mutex::new(State::default()), retain, metrics, changes }
    }

    /// Applies an appended batch whose last event has LSN `last`. `live`: count metrics.
    pub fn apply_batch(&self, last: Lsn, batch: &[Event], live: bool) {
        if batch.is_empty() {
            return;
        }
        let first = last + 1 - batch.len() as Lsn;
        let mut s = self.state.lock();
        for (i, e) in batch.iter().enumerate() {
            self.apply_one(&mut s, first + i as Lsn, e, live);
        }
    }

    fn apply_one(&self, s: &mut State, lsn: Lsn, e: &Event, live: bool) {
        s.last_lsn = s.last_lsn.max(lsn);
        let tx = e.tx();
        if tx.0 == 0 {
            if let Event::Extension { stream, body } = e
                && &**stream == OPERATOR_STREAM
            {
                s.resolutions.apply(lsn, body);
            }
            return;
        }
        if live {
            match e {
                Event::Decided { commit: true, .. } => {
                    self.metrics.commits.inc();
                    s.series.commit(now_ms());
                }
                Event::Decided { commit: false, reason, .. } => {
                    let reason = reason.as_ref().map_or("unknown", AbortReason::kind).to_owned();
                    s.series.abort(now_ms(), &reason);
                    self.metrics.aborts.get_or_create(&ReasonLabel { reason }).inc();
                }
                Event::Settled { effects, .. } => {
                    for (_, _, tag) in effects.iter().filter(|(_, _, t)| *t != Tag::Clean) {
                        self.metrics.tags.get_or_create(&TagLabel { tag: tag.to_string() }).inc();
                    }
                }
                _ => {}
            }
        }
        let n = usize::try_from(tx.0).unwrap_or(usize::MAX);
        if let Event::Begin { group, .. } = e {
            if s.slots.len() < n {
                s.slots.resize(n, Slot::default());
            }
            if let Some(view) = TxView::from_begin(lsn, e) {
                let (notify, _) = watch::channel(0u64);
                s.records.insert(tx, Record { view, notify });
            }
            if let Some(g) = group {
                s.groups.entry(g.0).or_default().push(tx);
            }
            if let Some(slot) = s.slots.get_mut(n - 1) {
                *slot = Slot { first: lsn, last: lsn, phase: Phase::Open.code() };
            }
            if live {
                let _ = self.changes.send(tx);
            }
            return;
        }
        let mut settled = None;
        if let Some(rec) = s.records.get_mut(&tx) {
            rec.view.apply(lsn, e);
            rec.notify.send_modify(|v| *v += 1);
            if live {
                let _ = self.changes.send(tx);
            }
            if let Event::Settled { committed, effects, .. } = e {
                let entries: Vec<AttentionEntry> = effects
                    .iter()
                    .filter(|(_, _, t)| *t != Tag::Clean)
                    .filter_map(|(id, d, t)| {
                        rec.view.effects.iter().find(|r| r.id == *id).map(|r| AttentionEntry {
                            lsn,
                            tx,
                            committed: *committed,
                            effect: r.clone(),
                            disposition: d.clone(),
                            tag: *t,
                        })
                    })
                    .collect();
                settled = Some(entries);
            }
            let phase = rec.view.phase.code();
            if let Some(slot) = n.checked_sub(1).and_then(|i| s.slots.get_mut(i)) {
                slot.last = lsn;
                slot.phase = phase;
            }
        } else if let Some(slot) = n.checked_sub(1).and_then(|i| s.slots.get_mut(i)) {
            slot.last = lsn;
        }
        if let Some(entries) = settled {
            s.attention.extend(entries);
            s.settled.push_back(tx);
            while s.settled.len() > self.retain {
                let Some(old) = s.settled.pop_front() else { break };
                if let Some(rec) = s.records.get(&old)
                    && rec.view.phase.settled()
                {
                    let group = rec.view.group;
                    s.records.remove(&old);
                    if let Some(g) = group {
                        let gone = s.groups.get(&g.0).is_some_and(|b| b.iter().all(|t| !s.records.contains_key(t)));
                        if gone {
                            s.groups.remove(&g.0);
                        }
                    }
                }
            }
        }
    }

    /// Rebuilds the index from the whole ledger (start-up). Returns the events read.
    pub fn rebuild(&self, store: &dyn LedgerStore) -> Result<u64, StoreError> {
        let mut s = self.state.lock();
        let mut n = 0u64;
        let from = s.last_lsn + 1;
        store.scan(from, &mut |lsn, e| {
            self.apply_one(&mut s, lsn, e, false);
            n += 1;
            true
        })?;
        Ok(n)
    }

    /// One effect of a transaction, as recorded: a copy of that record only while the
    /// transaction is in memory (its view otherwise). `None` if there is no such effect.
    pub fn effect(&self, store: &dyn LedgerStore, tx: TxId, effect: EffectId) -> Option<EffectRecord> {
        {
            let s = self.state.lock();
            if let Some(r) = s.records.get(&tx) {
                return r.view.effects.iter().find(|e| e.id == effect).cloned();
            }
        }
        self.view(store, tx).ok()??.effects.into_iter().find(|e| e.id == effect)
    }

    /// The transaction's view, from memory or (when it was evicted) from the ledger. `None`
    /// if the tenant's engine never began it; a failed read of the ledger is an error, never
    /// taken for "no such transaction".
    ///
    /// The evicted path scans the store (blocking I/O on a durable backend): inside a
    /// multi-threaded tokio runtime it runs under `block_in_place`, so the worker's other
    /// tasks move elsewhere instead of waiting behind it.
    pub fn view(&self, store: &dyn LedgerStore, tx: TxId) -> Result<Option<TxView>, StoreError> {
        let slot = {
            let s = self.state.lock();
            if let Some(r) = s.records.get(&tx) {
                return Ok(Some(r.view.clone()));
            }
            let Some(i) = usize::try_from(tx.0).ok().and_then(|n| n.checked_sub(1)) else { return Ok(None) };
            let Some(slot) = s.slots.get(i).copied() else { return Ok(None) };
            if slot.first == 0 {
                return Ok(None);
            }
            slot
        };
        let read = || {
            let mut view: Option<TxView> = None;
            store
                .scan(slot.first, &mut |lsn, e| {
                    if lsn > slot.last {
                        return false;
                    }
                    if e.tx() == tx {
                        match &mut view {
                            None => view = TxView::from_begin(lsn, e),
                            Some(v) => v.apply(lsn, e),
                        }
                    }
                    true
                })
                .map(|()| view)
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(read)
            }
            _ => read(),
        }
    }

    /// A receiver that changes whenever the transaction's record changes; `None` if it is not
    /// in memory (settled and evicted, or never begun).
    pub fn subscribe(&self, tx: TxId) -> Option<watch::Receiver<u64>> {
        self.state.lock().records.get(&tx).map(|r| r.notify.subscribe())
    }

    /// Sets or clears the server's "commit requested" flag.
    pub fn mark_waiting(&self, tx: TxId, waiting: bool) {
        let mut s = self.state.lock();
        if let Some(r) = s.records.get_mut(&tx)
            && r.view.phase == Phase::Sealed
            && r.view.waiting != waiting
        {
            r.view.waiting = waiting;
            r.notify.send_modify(|v| *v += 1);
            let _ = self.changes.send(tx);
        }
    }

    /// Transaction ids after `after` (by number), oldest first, matching `filter`: up to
    /// `limit`, and whether more follow.
    pub fn list(&self, after: u64, limit: usize, filter: ListFilter) -> (Vec<TxId>, bool) {
        let s = self.state.lock();
        let mut out = Vec::new();
        let start = usize::try_from(after).unwrap_or(usize::MAX);
        for (i, slot) in s.slots.iter().enumerate().skip(start) {
            if slot.first == 0 {
                continue;
            }
            let tx = TxId(i as u64 + 1);
            let phase = Phase::from_code(slot.phase).unwrap_or(Phase::Open);
            let waiting = s.records.get(&tx).is_some_and(|r| r.view.waiting);
            let keep = match filter {
                ListFilter::All => true,
                ListFilter::Unfinished => !phase.settled(),
                ListFilter::Settled => phase.settled(),
                ListFilter::Phase(Phase::Sealed) => phase == Phase::Sealed && !waiting,
                ListFilter::Phase(p) => phase == p,
                ListFilter::Waiting => phase == Phase::Sealed && waiting,
            };
            if keep {
                if out.len() == limit {
                    return (out, true);
                }
                out.push(tx);
            }
        }
        (out, false)
    }

    /// Attention entries after position `after` with tag `tag` (all with `None`) and, with
    /// `resolved`, only those an operator resolved (`true`) or not (`false`): up to `limit`,
    /// the position of the last one returned, and whether more follow.
    pub fn attention(
        &self,
        after: usize,
        limit: usize,
        tag: Option<Tag>,
        resolved: Option<bool>,
    ) -> (Vec<AttentionEntry>, usize, bool) {
        let s = self.state.lock();
        let mut out = Vec::new();
        let mut pos = after;
        for (i, a) in s.attention.iter().enumerate().skip(after) {
            if tag.is_some_and(|t| t != a.tag) {
                continue;
            }
            if resolved.is_some_and(|r| r != s.resolutions.get(a.tx, a.effect.id).is_some()) {
                continue;
            }
            if out.len() == limit {
                return (out, pos, true);
            }
            out.push(a.clone());
            pos = i + 1;
        }
        (out, pos, false)
    }

    /// The branches of a speculation group, if any of them is still in memory.
    pub fn group(&self, group: u64) -> Option<Vec<TxId>> {
        self.state.lock().groups.get(&group).cloned()
    }

    /// A transaction's phase from its slot (no ledger read); `None` if never begun.
    pub fn phase(&self, tx: TxId) -> Option<Phase> {
        let s = self.state.lock();
        let i = usize::try_from(tx.0).ok()?.checked_sub(1)?;
        s.slots.get(i).filter(|sl| sl.first != 0).and_then(|sl| Phase::from_code(sl.phase))
    }

    /// The LSN range of a transaction.
    pub fn range(&self, tx: TxId) -> Option<(Lsn, Lsn)> {
        let s = self.state.lock();
        let i = usize::try_from(tx.0).ok()?.checked_sub(1)?;
        s.slots.get(i).filter(|sl| sl.first != 0).map(|sl| (sl.first, sl.last))
    }

    /// A receiver of every transaction whose record changes from now on (begun, an event
    /// applied, the waiting flag set or cleared). A receiver that falls more than 4096
    /// changes behind gets `Lagged` and should re-read the unfinished transactions.
    pub fn changes(&self) -> broadcast::Receiver<TxId> {
        self.changes.subscribe()
    }

    /// The attention entry of an effect, if it settled with a tag other than `clean`.
    pub fn attention_entry(&self, tx: TxId, effect: EffectId) -> Option<AttentionEntry> {
        self.state.lock().attention.iter().find(|a| a.tx == tx && a.effect.id == effect).cloned()
    }

    /// The agent of a transaction in memory.
    pub fn agent(&self, tx: TxId) -> Option<Arc<str>> {
        self.state.lock().records.get(&tx).map(|r| r.view.agent.clone())
    }

    /// The operator's resolution of an effect, if any.
    pub fn resolution(&self, tx: TxId, effect: EffectId) -> Option<Resolution> {
        self.state.lock().resolutions.get(tx, effect).cloned()
    }

    /// Samples the engine's commit-wait counter and waiting gauge into the per-minute series.
    pub fn sample_waits(&self, waits_total: u64, waiting: u64) {
        self.state.lock().series.sample_waits(now_ms(), waits_total, waiting);
    }

    /// The per-minute figures of the last hour, oldest first.
    pub fn last_hour(&self) -> Vec<crate::console::Minute> {
        self.state.lock().series.last_hour(now_ms())
    }

    /// The last LSN applied.
    pub fn last_lsn(&self) -> Lsn {
        self.state.lock().last_lsn
    }

    /// Transactions in memory (unfinished and retained settled ones).
    pub fn resident(&self) -> usize {
        self.state.lock().records.len()
    }
}
