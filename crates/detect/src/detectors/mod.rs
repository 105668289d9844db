//! The anomaly detectors, one module per anomaly of the source paper's §3.
//!
//! Each detector returns *every* witness of its predicate (up to an optional limit, with the
//! exact count either way), in time near-linear in the trace: records are bucketed per cell
//! with a counting sort, each bucket is sorted by logical time, and the predicates become
//! binary searches and scans over those buckets. See `docs/detectors.md` for each predicate.

pub mod a1;
pub mod a2;
pub mod a3;
pub mod a4;
pub mod a6;

use crate::trace::Record;
use serde::Serialize;

/// Options of [`crate::check_with`] and of the individual detectors.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Evaluate A1, A2, A4 and A6 over every record, aborted ones included, as the paper's
    /// Definitions 1, 2 and 4 read literally. Default `false`: over the committed projection
    /// (records not flagged `"aborted": true`), which is the history those definitions assume.
    /// A3 and the conflict graph always treat aborted records as their definitions say.
    pub include_aborted: bool,
    /// Which form of A3 to evaluate (default [`A3Form::Auto`]).
    pub a3_form: A3Form,
    /// Keep at most this many witnesses per anomaly (and cycles); counts stay exact.
    /// Default `None`: keep every witness.
    pub witness_limit: Option<usize>,
}

/// The form of the causal-cascade predicate (A3) to evaluate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum A3Form {
    /// Precise form if the trace carries `predecessors` and `aborted` flags, else residue.
    #[default]
    Auto,
    /// The paper's Definition 3: a non-aborted record with an aborted predecessor.
    Precise,
    /// The paper's flat-trace residue: a non-`NULL` read no earlier committed write produced.
    Residue,
}

/// The witnesses of one detector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection<W> {
    /// The witnesses found, at most `witness_limit` of them, in trace order (cycles: each
    /// starting at its earliest record, ordered by it).
    pub witnesses: Vec<W>,
    /// The exact number of witnesses (may exceed `witnesses.len()` under a limit).
    pub count: u64,
    /// Records the detector could not fully evaluate because a field it needs is unknown.
    pub skipped: u64,
}

impl<W> Detection<W> {
    /// Whether the anomaly occurred.
    pub fn found(&self) -> bool {
        self.count > 0
    }
    /// Whether witnesses were dropped by the limit.
    pub fn truncated(&self) -> bool {
        self.count > self.witnesses.len() as u64
    }
}

/// Whether `r` belongs to the history A1, A2, A4 and A6 are evaluated over.
#[inline]
pub(crate) fn in_history(r: &Record, opts: &CheckOptions) -> bool {
    opts.include_aborted || !r.is_aborted()
}

/// Items grouped by a dense `u32` key (a cell id), built with a counting sort.
#[derive(Debug)]
pub(crate) struct Buckets<T> {
    offsets: Vec<usize>,
    items: Vec<T>,
}

impl<T: Copy + Default> Buckets<T> {
    /// `fill` is called twice with an `emit(key, item)` callback and must emit the same
    /// sequence both times: once to count, once to place. Keys must be `< n_keys`.
    pub(crate) fn build(n_keys: usize, fill: impl Fn(&mut dyn FnMut(u32, T))) -> Self {
        let mut offsets = vec![0usize; n_keys + 1];
        fill(&mut |k, _| offsets[k as usize + 1] += 1);
        for i in 0..n_keys {
            offsets[i + 1] += offsets[i];
        }
        let mut items = vec![T::default(); offsets[n_keys]];
        let mut next = offsets.clone();
        fill(&mut |k, item| {
            let slot = &mut next[k as usize];
            items[*slot] = item;
            *slot += 1;
        });
        Buckets { offsets, items }
    }

    pub(crate) fn keys(&self) -> usize {
        self.offsets.len() - 1
    }

    pub(crate) fn get(&self, key: u32) -> &[T] {
        let k = key as usize;
        &self.items[self.offsets[k]..self.offsets[k + 1]]
    }

    /// Sorts every bucket by `key`.
    pub(crate) fn sort_each_by_key<K: Ord>(&mut self, key: impl Fn(&T) -> K + Copy) {
        for k in 0..self.keys() {
            let (a, b) = (self.offsets[k], self.offsets[k + 1]);
            self.items[a..b].sort_unstable_by_key(key);
        }
    }
}

/// Pushes a witness unless the limit is reached; returns `false` once it is.
#[inline]
pub(crate) fn keep<W>(out: &mut Vec<W>, limit: usize, w: W) -> bool {
    if out.len() < limit {
        out.push(w);
        true
    } else {
        false
    }
}

/// `n choose 2`.
#[inline]
pub(crate) fn pairs(n: u64) -> u64 {
    n * n.saturating_sub(1) / 2
}
