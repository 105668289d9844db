//! How transactions ended, so that an error about a finished one says how: a bounded memory
//! of recent decisions, and the ledger for older ones.

use rustc_hash::FxHashMap as HashMap;
use tidegate_core::TxId;

use super::Tidegate;
use crate::Error;

/// How a transaction ended, as its ledger events said.
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    committed: bool,
    reason: Option<tidegate_core::AbortReason>,
    settled: bool,
}

/// The endings of the last [`Endings::CAPACITY`] decided transactions (the engine itself
/// forgets a finished transaction; this bounded memory only serves error messages).
#[derive(Debug, Default)]
pub(crate) struct Endings {
    map: HashMap<TxId, Ending>,
    order: std::collections::VecDeque<TxId>,
}

impl Endings {
    const CAPACITY: usize = 4096;

    /// Notes a decision or a settlement, as it goes to the ledger.
    pub(super) fn note(&mut self, event: &tidegate_core::Event) {
        use tidegate_core::Event;
        match event {
            Event::Decided { tx, commit, reason, .. } => {
                let ending = Ending { committed: *commit, reason: reason.clone(), settled: false };
                if self.map.insert(*tx, ending).is_none() {
                    self.order.push_back(*tx);
                    if self.order.len() > Self::CAPACITY
                        && let Some(old) = self.order.pop_front()
                    {
                        self.map.remove(&old);
                    }
                }
            }
            Event::Settled { tx, committed, .. } => {
                if let Some(e) = self.map.get_mut(tx) {
                    e.committed = *committed;
                    e.settled = true;
                }
            }
            _ => {}
        }
    }

    /// Why `tx` aborted, if it was decided recently and aborted.
    pub(crate) fn abort_reason(&self, tx: TxId) -> Option<tidegate_core::AbortReason> {
        self.map.get(&tx).filter(|e| !e.committed).and_then(|e| e.reason.clone())
    }

    /// `err` about `tx`, saying how the transaction ended when it is known.
    pub(crate) fn explain(&self, err: tidegate_core::EngineError) -> Error {
        use tidegate_core::{EngineError, TxState};
        let tx = match &err {
            EngineError::Settled { tx } => *tx,
            EngineError::WrongState { tx, state: TxState::Aborting | TxState::Committing, .. } => *tx,
            _ => return Error::Engine(err),
        };
        match self.map.get(&tx) {
            Some(e) => Error::Finished { tx, committed: e.committed, reason: e.reason.clone(), settled: e.settled },
            None => Error::Engine(err),
        }
    }
}

impl Tidegate {
    /// How the finished transaction `tx` ended, from the ledger's `decided` and `settled`
    /// events (`None` if the ledger has no decision for it or cannot be read).
    pub(super) fn ending_in_ledger(&self, tx: TxId) -> Option<Error> {
        use tidegate_core::Event;
        let mut found: Option<(bool, Option<tidegate_core::AbortReason>, bool)> = None;
        let scanned = self.inner.store.scan(1, &mut |_, event| {
            match event {
                Event::Decided { tx: t, commit, reason, .. } if *t == tx => {
                    found = Some((*commit, reason.clone(), false));
                }
                Event::Settled { tx: t, committed, .. } if *t == tx => {
                    let reason = found.take().and_then(|(_, r, _)| r);
                    found = Some((*committed, reason, true));
                    return false;
                }
                _ => {}
            }
            true
        });
        let (committed, reason, settled) = found.filter(|_| scanned.is_ok())?;
        Some(Error::Finished { tx, committed, reason, settled })
    }
}
