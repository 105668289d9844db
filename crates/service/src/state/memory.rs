//! [`MemoryState`]: the tenant state in this process's memory (a `memory:` store). Nothing is
//! carried over: a new process starts empty.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{
    ATTEMPTS_PER_KEY, AttemptStore, Depth, Enqueued, IdempotencyStore, Limits, Reported, SETTLED_TASKS_KEPT,
    StateFuture, TaskLease, TaskRecord, TaskSpec, TaskStore, Withdrawn,
};
use crate::dispatch::Attempt;
use crate::dispatch::queue::{TaskRefusal, TaskResult};
use crate::idempotency::{Begin, Fingerprint, Recorded, difference};

fn ready<T: Send + 'static>(v: T) -> StateFuture<T> {
    Box::pin(std::future::ready(Ok(v)))
}

enum Record {
    Running(Fingerprint),
    Done(Fingerprint, Recorded),
}

#[derive(Default)]
struct Idempotency {
    next: u64,
    /// key → (sequence, begun at, record).
    map: HashMap<String, (u64, u64, Record)>,
    /// sequence → key, oldest first.
    order: BTreeMap<u64, String>,
}

impl Idempotency {
    /// Drops completed records begun more than `ttl_ms` before `now_ms`.
    fn drop_expired(&mut self, ttl_ms: u64, now_ms: u64) {
        let mut drop = Vec::new();
        for (seq, key) in &self.order {
            let Some((_, at, rec)) = self.map.get(key) else { continue };
            if now_ms.saturating_sub(*at) <= ttl_ms {
                // Later records began later (a running one may be older: it stays).
                break;
            }
            if matches!(rec, Record::Done(..)) {
                drop.push((*seq, key.clone()));
            }
        }
        self.remove(drop);
    }

    /// Drops the oldest completed records until fewer than `max` are kept.
    fn make_room(&mut self, max: usize) {
        let excess = (self.map.len() + 1).saturating_sub(max);
        let drop: Vec<(u64, String)> = self
            .order
            .iter()
            .filter(|(_, k)| matches!(self.map.get(*k), Some((_, _, Record::Done(..)))))
            .take(excess)
            .map(|(s, k)| (*s, k.clone()))
            .collect();
        self.remove(drop);
    }

    fn remove(&mut self, drop: Vec<(u64, String)>) {
        for (seq, key) in drop {
            self.order.remove(&seq);
            self.map.remove(&key);
        }
    }
}

struct Task {
    rec: TaskRecord,
    holders: Vec<String>,
}

#[derive(Default)]
struct Tasks {
    next: u64,
    open: BTreeMap<u64, Task>,
    /// Queued task numbers by capability.
    ready: HashMap<String, BTreeSet<u64>>,
    /// Settled tasks: their reported result, newest [`SETTLED_TASKS_KEPT`].
    settled: HashMap<u64, Option<(TaskResult, u32)>>,
    settled_order: VecDeque<u64>,
}

impl Tasks {
    fn settle(&mut self, n: u64, result: Option<(TaskResult, u32)>) {
        if let Some(t) = self.open.remove(&n)
            && let Some(q) = self.ready.get_mut(&t.rec.spec.capability)
        {
            q.remove(&n);
        }
        if self.settled_order.len() == SETTLED_TASKS_KEPT
            && let Some(old) = self.settled_order.pop_front()
        {
            self.settled.remove(&old);
        }
        self.settled.insert(n, result);
        self.settled_order.push_back(n);
    }
}

#[derive(Default)]
struct Attempts {
    by_key: HashMap<String, VecDeque<Attempt>>,
    order: VecDeque<String>,
}

/// The tenant state in memory.
pub struct MemoryState {
    limits: Limits,
    idempotency: Mutex<Idempotency>,
    tasks: Mutex<Tasks>,
    attempts: Mutex<Attempts>,
}

impl std::fmt::Debug for MemoryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryState")
            .field("idempotency_records", &self.idempotency.lock().map.len())
            .field("open_tasks", &self.tasks.lock().open.len())
            .finish_non_exhaustive()
    }
}

impl MemoryState {
    /// Empty state kept within `limits`.
    pub fn new(limits: Limits) -> MemoryState {
        let limits = Limits {
            idempotency_max: limits.idempotency_max.max(1),
            attempts_retained: limits.attempts_retained.max(1),
            ..limits
        };
        MemoryState { limits, idempotency: Mutex::default(), tasks: Mutex::default(), attempts: Mutex::default() }
    }
}

impl IdempotencyStore for MemoryState {
    fn begin(&self, key: &str, fp: Fingerprint, now_ms: u64) -> StateFuture<Begin> {
        let mut g = self.idempotency.lock();
        g.drop_expired(self.limits.idempotency_ttl_ms, now_ms);
        let answer = match g.map.get(key) {
            Some((_, _, Record::Running(first))) => match difference(first, &fp) {
                Some(d) => Begin::Mismatch(d),
                None => Begin::InProgress,
            },
            Some((_, _, Record::Done(first, rec))) => match difference(first, &fp) {
                Some(d) => Begin::Mismatch(d),
                None => Begin::Replay(rec.clone()),
            },
            None => {
                g.make_room(self.limits.idempotency_max);
                g.next += 1;
                let seq = g.next;
                g.map.insert(key.to_owned(), (seq, now_ms, Record::Running(fp)));
                g.order.insert(seq, key.to_owned());
                Begin::Proceed
            }
        };
        ready(answer)
    }

    fn finish(&self, key: &str, response: Option<Recorded>) -> StateFuture<()> {
        let mut g = self.idempotency.lock();
        let g = &mut *g;
        if let Some((seq, at, Record::Running(_))) = g.map.get(key) {
            let (seq, at) = (*seq, *at);
            match response {
                Some(rec) => {
                    if let Some((_, _, Record::Running(fp))) = g.map.remove(key) {
                        g.map.insert(key.to_owned(), (seq, at, Record::Done(fp, rec)));
                    }
                }
                None => {
                    g.map.remove(key);
                    g.order.remove(&seq);
                }
            }
        }
        ready(())
    }
}

impl TaskStore for MemoryState {
    fn enqueue(&self, spec: TaskSpec, attempt: u32, lease_ms: u64) -> StateFuture<Enqueued> {
        let mut s = self.tasks.lock();
        s.next += 1;
        let n = s.next;
        let rec = TaskRecord {
            n,
            spec: Arc::new(spec),
            attempt,
            lease_ms,
            lease: None,
            lease_started_ms: 0,
            ever_leased: false,
        };
        s.ready.entry(rec.spec.capability.clone()).or_default().insert(n);
        s.open.insert(n, Task { rec: rec.clone(), holders: Vec::new() });
        ready(Enqueued::New(rec))
    }

    fn lease(
        &self,
        worker: &str,
        capabilities: &[String],
        max: usize,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> StateFuture<Vec<TaskRecord>> {
        let mut s = self.tasks.lock();
        let s = &mut *s;
        let mut out = Vec::new();
        for cap in capabilities {
            while out.len() < max {
                let Some(n) = s.ready.get_mut(cap).and_then(BTreeSet::pop_first) else { break };
                let Some(t) = s.open.get_mut(&n) else { continue };
                let l = lease_ms.unwrap_or(t.rec.lease_ms);
                t.rec.lease = Some(TaskLease { worker: worker.to_owned(), until_ms: now_ms.saturating_add(l) });
                t.rec.lease_started_ms = now_ms;
                t.rec.ever_leased = true;
                if !t.holders.iter().any(|h| h == worker) {
                    t.holders.push(worker.to_owned());
                }
                out.push(t.rec.clone());
            }
        }
        ready(out)
    }

    fn heartbeat(
        &self,
        n: u64,
        worker: &str,
        lease_ms: Option<u64>,
        now_ms: u64,
    ) -> StateFuture<Result<TaskRecord, TaskRefusal>> {
        let mut s = self.tasks.lock();
        if s.settled.contains_key(&n) {
            return ready(Err(TaskRefusal::Settled));
        }
        let Some(t) = s.open.get_mut(&n) else { return ready(Err(TaskRefusal::NotFound)) };
        let l = lease_ms.unwrap_or(t.rec.lease_ms);
        match &mut t.rec.lease {
            Some(lease) if lease.worker == worker => lease.until_ms = now_ms.saturating_add(l),
            _ => return ready(Err(TaskRefusal::NotLeased)),
        }
        ready(Ok(t.rec.clone()))
    }

    fn report(&self, n: u64, worker: &str, result: TaskResult) -> StateFuture<Result<Reported, TaskRefusal>> {
        let mut s = self.tasks.lock();
        if s.settled.contains_key(&n) {
            return ready(Err(TaskRefusal::Settled));
        }
        let Some(t) = s.open.get(&n) else { return ready(Err(TaskRefusal::NotFound)) };
        if !t.holders.iter().any(|h| h == worker) {
            return ready(Err(TaskRefusal::NotLeased));
        }
        let record = t.rec.clone();
        s.settle(n, Some((result, record.attempt)));
        ready(Ok(Reported { record, waited: true }))
    }

    fn expire(&self, now_ms: u64) -> StateFuture<Vec<TaskRecord>> {
        let mut s = self.tasks.lock();
        let s = &mut *s;
        let mut out = Vec::new();
        for t in s.open.values_mut() {
            if t.rec.lease.as_ref().is_some_and(|l| l.until_ms <= now_ms) {
                out.push(t.rec.clone());
                t.rec.lease = None;
                t.rec.attempt = t.rec.attempt.saturating_add(1);
                s.ready.entry(t.rec.spec.capability.clone()).or_default().insert(t.rec.n);
            }
        }
        ready(out)
    }

    fn withdraw(&self, n: u64) -> StateFuture<Withdrawn> {
        let mut s = self.tasks.lock();
        let answer = match s.open.get(&n) {
            Some(t) => {
                let rec = t.rec.clone();
                s.settle(n, None);
                Withdrawn::Open(rec)
            }
            None if s.settled.contains_key(&n) => Withdrawn::Settled,
            None => Withdrawn::Unknown,
        };
        ready(answer)
    }

    fn outcome(&self, n: u64) -> StateFuture<Option<(TaskResult, u32)>> {
        ready(self.tasks.lock().settled.get(&n).cloned().flatten())
    }

    fn list(&self) -> StateFuture<Vec<TaskRecord>> {
        ready(self.tasks.lock().open.values().map(|t| t.rec.clone()).collect())
    }

    fn depth(&self) -> StateFuture<Depth> {
        let s = self.tasks.lock();
        let leased = s.open.values().filter(|t| t.rec.lease.is_some()).count() as u64;
        ready((s.open.len() as u64 - leased, leased))
    }

    fn next_expiry(&self) -> StateFuture<Option<u64>> {
        ready(self.tasks.lock().open.values().filter_map(|t| t.rec.lease.as_ref().map(|l| l.until_ms)).min())
    }

    fn drop_carried_over(&self, _now_ms: u64) -> StateFuture<usize> {
        // Nothing outlives the process here, so nothing is carried over.
        ready(0)
    }
}

impl AttemptStore for MemoryState {
    fn record(&self, effect_key: &str, attempt: Attempt) -> StateFuture<()> {
        let mut g = self.attempts.lock();
        let g = &mut *g;
        if !g.by_key.contains_key(effect_key) {
            g.order.push_back(effect_key.to_owned());
            while g.order.len() > self.limits.attempts_retained {
                if let Some(old) = g.order.pop_front() {
                    g.by_key.remove(&old);
                }
            }
        }
        let v = g.by_key.entry(effect_key.to_owned()).or_default();
        if v.len() == ATTEMPTS_PER_KEY {
            v.pop_front();
        }
        v.push_back(attempt);
        ready(())
    }

    fn list(&self, effect_key: &str) -> StateFuture<Vec<Attempt>> {
        ready(self.attempts.lock().by_key.get(effect_key).map(|v| v.iter().cloned().collect()).unwrap_or_default())
    }
}
