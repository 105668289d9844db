//! Live Python objects of executed calls, for their compensations.
//!
//! The engine records a call's arguments and output as JSON, and that JSON is what it hands a
//! compensation. A Python compensation wants the live objects instead: the output exactly as
//! the tool returned it (which may have no JSON form) and the arguments as they were passed.
//! Until the runtime carries an opaque per-call handle from the call to its compensation (the
//! two-step effect protocol, issue 12 item 6), the binding keeps them here, keyed by the
//! address of the output `Arc` the engine holds for the effect; each entry keeps that `Arc`
//! alive, so the address cannot be reused while the entry exists. A transaction forgets its
//! entries when it settles. A compensation with no entry (run by recovery in a later process,
//! or after the transaction settled) gets the recorded JSON instead.
//!
//! This module, `CallCtx::live` / `CallCtx::output` (calls.rs) and `Tx::finish_call` are the
//! only places that change when the per-call handle arrives.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use serde_json::Value;

/// The live side of one executed call.
pub(crate) struct Live {
    pub(crate) output: Py<PyAny>,
    pub(crate) args: Py<PyTuple>,
    pub(crate) kwargs: Option<Py<PyDict>>,
    pub(crate) call_id: Option<String>,
}

impl Live {
    pub(crate) fn clone_ref(&self, py: Python<'_>) -> Live {
        Live {
            output: self.output.clone_ref(py),
            args: self.args.clone_ref(py),
            kwargs: self.kwargs.as_ref().map(|k| k.clone_ref(py)),
            call_id: self.call_id.clone(),
        }
    }
}

struct Entry {
    _keep: Arc<Value>,
    live: Live,
}

/// One engine's table (shared by its transactions).
#[derive(Default)]
pub(crate) struct LiveTable {
    map: Mutex<HashMap<usize, Entry>>,
}

fn key_of(output: &Arc<Value>) -> usize {
    Arc::as_ptr(output) as usize
}

impl LiveTable {
    /// Remembers the live side of the call whose recorded output is `output`; returns the key
    /// its transaction must [`LiveTable::forget`] when it settles.
    pub(crate) fn remember(&self, output: &Arc<Value>, live: Live) -> usize {
        let key = key_of(output);
        let old = self.map.lock().insert(key, Entry { _keep: output.clone(), live });
        drop(old);
        key
    }

    /// The live side of the call whose recorded output is `output`, if remembered.
    pub(crate) fn get(&self, py: Python<'_>, output: &Arc<Value>) -> Option<Live> {
        self.map.lock().get(&key_of(output)).map(|e| e.live.clone_ref(py))
    }

    /// Forgets entries.
    pub(crate) fn forget(&self, keys: Vec<usize>) {
        if keys.is_empty() {
            return;
        }
        // Dropped after the lock is released: dropping a Python object may run Python code.
        let removed: Vec<Entry> = {
            let mut map = self.map.lock();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        drop(removed);
    }
}
