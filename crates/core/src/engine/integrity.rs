//! A full consistency check of the engine's projections, for tests and `verify`.

use std::collections::{BTreeMap, HashMap};

use super::{Core, EffStatus, KeyState};
use crate::error::TxState;
use crate::ids::Epoch;

impl Core {
    /// Checks every invariant the engine maintains between its projections. Slow (linear in
    /// the unfinished transactions and remembered keys); meant for tests and `verify`.
    pub fn check_integrity(&self) -> Result<(), String> {
        let mut undeclared: BTreeMap<Epoch, u32> = BTreeMap::new();
        for (id, t) in &self.txs {
            if t.blocks_all {
                // An undeclared transaction blocks every scope while open, and keeps doing so
                // while an abort decided before it sealed runs its compensations.
                if !matches!(t.state, TxState::Open | TxState::Aborting) {
                    return Err(format!("{id} blocks all scopes but is {}", t.state));
                }
                *undeclared.entry(t.epoch).or_insert(0) += 1;
            }
            let in_flight = t.effects.iter().filter(|e| e.status == EffStatus::InFlight).count();
            if in_flight != t.in_flight as usize {
                return Err(format!("{id} counts {} calls in flight but has {in_flight}", t.in_flight));
            }
            if t.state == TxState::Waiting
                && !self.waiting.contains(&(t.epoch, *id))
                && !self.actions.iter().any(|a| matches!(a, super::Action::Wake(w) if w == id))
            {
                // A waiting transaction is either parked in `waiting` or about to be woken or
                // deciding right now; neither is observable from outside a method call.
            }
            if matches!(t.state, TxState::Sealed | TxState::Waiting | TxState::Committing) {
                for s in t.reads.iter().map(|(s, _)| s).chain(t.effects.iter().flat_map(|e| e.scopes.iter())) {
                    if !t.claims.contains(s) {
                        return Err(format!("{id} is {} but does not claim its footprint scope {s}", t.state));
                    }
                }
            }
            for s in &t.claims {
                if !self.index.blocked_before(s, Epoch(t.epoch.0 + 1)) {
                    return Err(format!("{id} claims {s} but the index does not hold the claim"));
                }
            }
            for e in t.effects.iter().filter(|e| self.keeps_marks() && Core::marks_dirty(e)) {
                for s in &e.scopes {
                    if !self.dirty.blocked_before(s, Epoch(t.epoch.0 + 1)) {
                        return Err(format!("{id} has an eager effect on {s} but no dirty mark there"));
                    }
                }
            }
            if let Some(g) = t.group
                && !self.groups.get(&g).is_some_and(|g| g.branches.contains(id))
            {
                return Err(format!("{id} names group {g} which does not list it"));
            }
        }
        let mut marks: BTreeMap<Epoch, u32> = BTreeMap::new();
        for t in self.txs.values() {
            for e in t.effects.iter().filter(|e| self.keeps_marks() && Core::marks_dirty(e)) {
                *marks.entry(t.epoch).or_insert(0) += e.scopes.len() as u32;
            }
        }
        if marks != self.dirty_epochs {
            return Err(format!("dirty-mark counts {:?} differ from the transactions' {marks:?}", self.dirty_epochs));
        }
        if undeclared != self.undeclared {
            return Err(format!(
                "undeclared-epoch multiset {:?} differs from the open undeclared transactions {undeclared:?}",
                self.undeclared
            ));
        }
        for &(e, w) in &self.waiting {
            match self.txs.get(&w) {
                Some(t) if t.state == TxState::Waiting && t.epoch == e => {}
                _ => return Err(format!("{w} is parked as waiting but is not a waiting transaction")),
            }
        }
        let mut pending: HashMap<_, usize> = HashMap::new();
        for (key, entry) in &self.keys {
            if let KeyState::Pending = entry.state {
                let Some(t) = self.txs.get(&entry.tx) else {
                    return Err(format!("key `{key}` is pending for {} which has finished", entry.tx));
                };
                if t.effects.get(entry.effect.0 as usize).is_none_or(|e| &e.key != key) {
                    return Err(format!("key `{key}` points at {}{} which has another key", entry.tx, entry.effect));
                }
                *pending.entry(entry.tx).or_default() += 1;
            }
        }
        Ok(())
    }
}
