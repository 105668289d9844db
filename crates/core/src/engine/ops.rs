//! Transitions of an open transaction: begin, read, record an effect, seal.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use smallvec::SmallVec;

use super::apply::Given;
use super::{Core, EffStatus, KeyEntry, KeyState};
use crate::effect::{AbortReason, EffectDecl, HeldAck};
use crate::error::{EngineError, TxState};
use crate::ids::{EffectId, Epoch, GroupId, Timestamp, TxId, Version};
use crate::ledger::Event;
use crate::scope::Scope;

/// Up to this many scopes, footprint bookkeeping at seal compares pairs; beyond, it hashes.
const SMALL_FOOTPRINT: usize = 16;

type HashSet<T> = rustc_hash::FxHashSet<T>;

/// Arguments of [`Core::begin`].
#[derive(Debug, Clone, Default)]
pub struct BeginRequest {
    /// The agent (for records and traces).
    pub agent: Arc<str>,
    /// Scopes the transaction may touch. `None` blocks every scope until it seals; `Some`
    /// blocks only these, and touching anything outside them is a protocol violation.
    pub may_touch: Option<Vec<Scope>>,
    /// Lease override; `None` takes the engine's.
    pub lease: Option<Duration>,
}

/// A begun transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begun {
    /// Its id.
    pub tx: TxId,
    /// Its epoch.
    pub epoch: Epoch,
}

/// The result of a read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadResult {
    /// The committed version of the scope.
    pub version: Version,
    /// The latest value this transaction staged (bufferable effect arguments) on an
    /// overlapping scope: read-your-writes.
    pub staged: Option<Arc<Value>>,
}

/// What the caller must do after [`Core::record_effect`].
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Call the tool now, then report with [`Core::executed`].
    Execute(EffectId),
    /// Held until commit; give the agent this acknowledgement.
    Held(EffectId, HeldAck),
    /// The key already executed; give the agent this output, do not call the tool.
    Replay(EffectId, Arc<Value>),
}

/// A read-only view of a sealed transaction's footprint, for pre-commit hooks.
#[derive(Debug, Clone)]
pub struct SealedView {
    /// The transaction.
    pub tx: TxId,
    /// Its epoch.
    pub epoch: Epoch,
    /// Its agent.
    pub agent: Arc<str>,
    /// Its speculation group, if a branch.
    pub group: Option<GroupId>,
    /// When it began.
    pub began: Timestamp,
    /// Scopes read and the versions seen.
    pub reads: Vec<(Scope, Version)>,
    /// Effects in issuance order.
    pub effects: Vec<EffectView>,
}

/// One effect in a [`SealedView`].
#[derive(Debug, Clone)]
pub struct EffectView {
    /// Issuance position.
    pub id: EffectId,
    /// Tool name.
    pub tool: Arc<str>,
    /// Effect class.
    pub class: crate::effect::EffectClass,
    /// Scopes.
    pub scopes: Vec<Scope>,
    /// Arguments.
    pub args: Arc<Value>,
    /// Output of an executed (or replayed) effect.
    pub output: Option<Arc<Value>>,
}

impl Core {
    /// The footprint of a transaction, for hooks and inspection.
    pub fn view(&self, tx: TxId) -> Result<SealedView, EngineError> {
        let t = self.tx(tx)?;
        Ok(SealedView {
            tx,
            epoch: t.epoch,
            agent: t.agent.clone(),
            group: t.group,
            began: t.began,
            reads: t.reads.to_vec(),
            effects: t
                .effects
                .iter()
                .enumerate()
                .map(|(i, e)| EffectView {
                    id: EffectId(i as u32),
                    tool: e.tool.clone(),
                    class: e.class,
                    scopes: e.scopes.to_vec(),
                    args: e.args.clone(),
                    output: e.output.clone(),
                })
                .collect(),
        })
    }

    /// Begins a transaction at a fresh epoch. Fails only with [`EngineError::Exhausted`]
    /// (an id allocator at the end of its range).
    pub fn begin(&mut self, req: BeginRequest, now: Timestamp) -> Result<Begun, EngineError> {
        self.ids_left(1)?;
        let epoch = Epoch(self.next_epoch);
        self.next_epoch += 1;
        Ok(self.begin_at(req, epoch, None, now))
    }

    /// Refuses a begin of `txs` transactions at one new epoch if an allocator would pass the
    /// end of its range (`u64::MAX` is never handed out, so "the next one" always exists).
    pub(super) fn ids_left(&self, txs: u64) -> Result<(), EngineError> {
        if self.next_epoch == u64::MAX {
            return Err(EngineError::Exhausted { counter: "epoch", value: self.next_epoch });
        }
        if self.next_tx.checked_add(txs).is_none() {
            return Err(EngineError::Exhausted { counter: "transaction id", value: self.next_tx });
        }
        Ok(())
    }

    /// Begins one transaction; the caller checked [`Core::ids_left`].
    pub(super) fn begin_at(
        &mut self,
        req: BeginRequest,
        epoch: Epoch,
        group: Option<GroupId>,
        now: Timestamp,
    ) -> Begun {
        let tx = TxId(self.next_tx);
        let lease = req.lease.unwrap_or(self.cfg.lease);
        let lease_until = now.after(lease);
        let ev = Event::Begin {
            tx,
            epoch,
            agent: req.agent,
            group,
            may_touch: req.may_touch.as_ref().map(|v| v.iter().map(|s| s.as_str().to_owned()).collect()),
            lease_until,
        };
        let may_touch = req.may_touch.map(SmallVec::from_vec);
        self.emit(ev, Given::Begin { may_touch, lease, began: now });
        Begun { tx, epoch }
    }

    /// Checks that `tx` is open and `scope` inside its may-touch set; on a violation the
    /// transaction is aborted (the abort is queued as [`super::Action::RunAbort`]).
    fn check_touch(&mut self, tx: TxId, scope: &Scope, what: &str, now: Timestamp) -> Result<(), EngineError> {
        let missing = self.missing(tx);
        let t = self.txs.get_mut(&tx).ok_or(missing)?;
        let lease = t.lease;
        match t.state {
            TxState::Open => {}
            TxState::Sealed | TxState::Waiting => {
                let what = format!("{what} `{scope}` after seal");
                return Err(self.violation(tx, what));
            }
            state => {
                return Err(EngineError::WrongState { tx, op: "touch", state, hint: "" });
            }
        }
        if let Some(mt) = &t.may_touch
            && !mt.iter().any(|m| m.covers(scope))
        {
            let declared: Vec<&str> = mt.iter().map(Scope::as_str).collect();
            let what = format!("{what} `{scope}` outside the declared may-touch set {declared:?}");
            return Err(self.violation(tx, what));
        }
        t.lease_until = now.after(lease);
        Ok(())
    }

    fn violation(&mut self, tx: TxId, what: String) -> EngineError {
        match self.abort(tx, AbortReason::ProtocolViolation { what: what.clone() }) {
            Ok(plan) => self.actions.push(super::Action::RunAbort(plan)),
            Err(e) => debug_assert!(false, "violation abort of {tx} failed: {e}"),
        }
        EngineError::ProtocolViolation { tx, what }
    }

    /// Records that `tx` read `scope` at its current committed version.
    pub fn read(&mut self, tx: TxId, scope: &Scope, now: Timestamp) -> Result<ReadResult, EngineError> {
        self.check_touch(tx, scope, "read of", now)?;
        self.lock_check(tx, scope)?;
        self.eager_check(tx, scope, super::levels::Touch::Read)?;
        let sight = self.sight(tx, scope);
        let version = sight.version;
        let t = self.txs.get_mut(&tx).expect("checked by check_touch");
        let staged = t
            .effects
            .iter()
            .rev()
            .find(|e| e.status == EffStatus::Held(HeldAck::Staged) && e.scopes.iter().any(|s| s.overlaps(scope)))
            .map(|e| e.args.clone());
        if !t.reads.iter().any(|(s, v)| s == scope && *v == version) {
            let ev = Event::Read { tx, scope: scope.as_arc(), version };
            self.emit(ev, Given::Read { scope: scope.clone(), writers: Some(sight.writers) });
        }
        Ok(ReadResult { version, staged })
    }

    /// Records an effect and routes it by class.
    pub fn record_effect(&mut self, tx: TxId, decl: EffectDecl, now: Timestamp) -> Result<Recorded, EngineError> {
        self.record_effect_with(tx, decl, None, now)
    }

    /// [`Core::record_effect`] with a durable compensation descriptor written in the same
    /// event ([`Event::EffectRecorded`]'s `compensation`; the engine never reads it).
    pub fn record_effect_with(
        &mut self,
        tx: TxId,
        decl: EffectDecl,
        compensation: Option<Arc<Value>>,
        now: Timestamp,
    ) -> Result<Recorded, EngineError> {
        if decl.scopes.is_empty() {
            return Err(EngineError::InvalidArgument {
                field: "scopes",
                value: format!("[] (tool `{}`)", decl.tool),
                expected: "at least one scope the effect touches",
            });
        }
        if let Err(bytes) = args_within(&decl.args, self.cfg.max_args_bytes) {
            return Err(EngineError::ArgsTooLarge {
                tool: decl.tool.to_string(),
                bytes,
                limit: self.cfg.max_args_bytes,
            });
        }
        let touch =
            if decl.class.executes_eagerly() { super::levels::Touch::Eager } else { super::levels::Touch::Held };
        for s in &decl.scopes {
            self.check_touch(tx, s, "effect on", now)?;
            self.lock_check(tx, s)?;
        }
        let t = self.txs.get(&tx).expect("checked by check_touch");
        let id = EffectId(u32::try_from(t.effects.len()).unwrap_or(u32::MAX));

        // Idempotency (keys.rs): a derived key is local to the transaction; an adapter's key
        // is engine-wide. A key first used for another call is refused.
        let (key, global_key) = self.derive_key(tx, id, &decl);
        if let Some(r) = self.replay(tx, &key, global_key, &decl)? {
            return Ok(r);
        }
        // An effect that will replay a key's recorded output does not touch the world.
        if !(global_key && matches!(self.keys.get(&key), Some(KeyEntry { state: KeyState::Done(_), .. }))) {
            for s in &decl.scopes {
                self.eager_check(tx, s, touch)?;
            }
        }
        let ev = Event::EffectRecorded {
            tx,
            effect: id,
            tool: decl.tool,
            class: decl.class,
            scopes: decl.scopes.iter().map(Scope::as_arc).collect(),
            key,
            args: decl.args,
            compensable: decl.compensable,
            adapter_key: global_key,
            compensation,
        };
        self.emit(ev, Given::Effect(SmallVec::from_vec(decl.scopes)));
        let e = self.txs.get(&tx).and_then(|t| t.effects.last()).expect("recorded above");
        let recorded = match &e.status {
            EffStatus::InFlight => Recorded::Execute(id),
            EffStatus::Held(ack) => Recorded::Held(id, *ack),
            _ => {
                // The key executed and settled before: its output is this effect's.
                let out = match self.keys.get(&e.key) {
                    Some(KeyEntry { state: KeyState::Done(out), .. }) => out.value(),
                    _ => Arc::default(),
                };
                self.emit(Event::EffectExecuted { tx, effect: id, output: out.clone() }, Given::Nothing);
                Recorded::Replay(id, out)
            }
        };
        Ok(recorded)
    }

    /// Seals `tx`: freezes its footprint and narrows what it blocks to exactly that footprint.
    pub fn seal(&mut self, tx: TxId, _now: Timestamp) -> Result<(), EngineError> {
        let missing = self.missing(tx);
        let t = self.txs.get_mut(&tx).ok_or(missing)?;
        if t.state != TxState::Open {
            let state = t.state;
            return Err(EngineError::WrongState { tx, op: "seal", state, hint: "; only an open transaction can seal" });
        }
        if t.in_flight > 0 {
            let effects = t
                .effects
                .iter()
                .enumerate()
                .filter(|(_, e)| e.status == EffStatus::InFlight)
                .map(|(i, _)| EffectId(i as u32))
                .collect();
            return Err(EngineError::InFlight { tx, effects });
        }
        self.emit(Event::Sealed { tx }, Given::Nothing);
        Ok(())
    }

    /// Marks `tx` sealed and narrows what it claims to exactly its footprint (from its
    /// may-touch set, or from "everything" if it declared none). Returns its epoch.
    pub(super) fn freeze_footprint(&mut self, tx: TxId) -> Epoch {
        let t = self.txs.get_mut(&tx).expect("caller checked the transaction exists");
        t.state = TxState::Sealed;
        let epoch = t.epoch;
        // The footprint: every scope read or written, once, in first-seen order. Past a few
        // scopes a set replaces the linear `contains` (a transaction of 1,000 calls would
        // otherwise compare half a million pairs at its seal).
        let mut footprint: SmallVec<[Scope; 4]> = SmallVec::new();
        let touched = t.reads.iter().map(|(s, _)| s).chain(t.effects.iter().flat_map(|e| e.scopes.iter()));
        if t.reads.len() + t.effects.len() <= SMALL_FOOTPRINT {
            for s in touched {
                if !footprint.contains(s) {
                    footprint.push(s.clone());
                }
            }
        } else {
            let mut seen: HashSet<&Scope> = HashSet::default();
            for s in touched {
                if seen.insert(s) {
                    footprint.push(s.clone());
                }
            }
        }
        // A scope both declared and in the footprint keeps its claim (claiming it again and
        // unclaiming the old one would walk the index twice for no change).
        let mut old = std::mem::take(&mut t.claims);
        if old.len() <= SMALL_FOOTPRINT {
            for s in &footprint {
                match old.iter().position(|o| o == s) {
                    Some(i) => {
                        old.swap_remove(i);
                    }
                    None => self.index.claim(s, epoch),
                }
            }
        } else {
            // Declared scopes are distinct (begin keeps each once), and so is the footprint.
            let declared: HashSet<&Scope> = old.iter().collect();
            for s in footprint.iter().filter(|s| !declared.contains(s)) {
                self.index.claim(s, epoch);
            }
            let used: HashSet<&Scope> = footprint.iter().collect();
            old.retain(|s| !used.contains(s));
        }
        t.claims = footprint;
        for s in &old {
            self.index.unclaim(s, epoch);
        }
        if std::mem::take(&mut t.blocks_all) {
            self.remove_undeclared(epoch);
        }
        epoch
    }

    pub(super) fn remove_undeclared(&mut self, epoch: Epoch) {
        if let Some(n) = self.undeclared.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                self.undeclared.remove(&epoch);
            }
        }
    }
}

/// `Ok` if `args` serialises to at most `limit` bytes of JSON, else `Err(size)`. A cheap
/// upper bound (no formatting, a heap stack, stopping once past the limit) settles the common
/// case; only arguments it cannot clear are serialised to count exactly.
fn args_within(args: &Value, limit: usize) -> Result<(), usize> {
    if json_upper_bound(args, limit) <= limit {
        return Ok(());
    }
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    match serde_json::to_writer(&mut n, args) {
        Ok(()) if n.0 <= limit => Ok(()),
        _ => Err(n.0.max(limit.saturating_add(1))),
    }
}

/// An upper bound of the JSON size of `v` (each string byte counted as a 6-byte escape, each
/// number as 32 bytes), computed until it passes `stop`.
fn json_upper_bound(v: &Value, stop: usize) -> usize {
    let mut n = 0usize;
    let mut stack: SmallVec<[&Value; 8]> = SmallVec::new();
    stack.push(v);
    while let Some(v) = stack.pop() {
        n = n.saturating_add(match v {
            Value::Null | Value::Bool(_) => 5,
            Value::Number(_) => 32,
            Value::String(s) => s.len().saturating_mul(6).saturating_add(2),
            Value::Array(a) => {
                stack.extend(a.iter());
                a.len() + 2
            }
            Value::Object(m) => {
                let mut k = 2usize;
                for (key, x) in m {
                    k = k.saturating_add(key.len().saturating_mul(6).saturating_add(4));
                    stack.push(x);
                }
                k
            }
        });
        if n > stop {
            return n;
        }
    }
    n
}
