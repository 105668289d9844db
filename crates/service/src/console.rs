//! What the operator console (docs/console.md) needs beyond the ledger index's views: the
//! per-minute series of commits, aborts by reason and commit waits of one tenant (the same
//! increments as the `/metrics` counters, kept for the last hour), and the operator's
//! resolutions of attention entries (extension records on the ledger stream `operator`).
//!
//! ```text
//!  LedgerIndex::apply_one (live) ─► metrics.commits / aborts{reason}  ─┐ same place
//!                                 ─► Series::commit / abort(reason)    ─┘
//!  tenant sweeper (≤ 250 ms)      ─► Series::sample_waits(engine.wait_stats, stats.waiting)
//!  ledger Extension{stream: "operator"} (live and on rebuild) ─► Resolutions
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_core::{EffectId, TxId};
use tidegate_storage::Lsn;

/// The ledger's extension stream of operator actions.
pub const OPERATOR_STREAM: &str = "operator";

/// Minutes kept.
pub const MINUTES: usize = 60;

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// One minute's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Minute {
    /// The minute (Unix milliseconds of its start).
    pub start_ms: u64,
    /// Commit decisions.
    pub commits: u64,
    /// Abort decisions by reason kind.
    pub aborts: BTreeMap<String, u64>,
    /// Commits that had to wait for earlier transactions (the engine's counter's increase).
    pub waits: u64,
    /// The most transactions waiting to commit at one sample.
    pub waiting_max: u64,
}

/// Per-minute figures of one tenant, the last [`MINUTES`] minutes.
#[derive(Debug, Default)]
pub struct Series {
    minutes: VecDeque<Minute>,
    /// The engine's cumulative commit-wait counter at the last sample.
    last_waits: Option<u64>,
}

impl Series {
    fn minute(&mut self, now_ms: u64) -> &mut Minute {
        let start = now_ms - now_ms % 60_000;
        if self.minutes.back().is_none_or(|m| m.start_ms < start) {
            self.minutes.push_back(Minute { start_ms: start, ..Minute::default() });
            while self.minutes.len() > MINUTES {
                self.minutes.pop_front();
            }
        }
        // A clock stepping back lands in the newest minute.
        self.minutes.back_mut().expect("pushed above")
    }

    /// Counts a commit decision.
    pub fn commit(&mut self, now_ms: u64) {
        self.minute(now_ms).commits += 1;
    }

    /// Counts an abort decision.
    pub fn abort(&mut self, now_ms: u64, reason: &str) {
        *self.minute(now_ms).aborts.entry(reason.to_owned()).or_insert(0) += 1;
    }

    /// Samples the engine's cumulative commit-wait counter and its waiting gauge.
    pub fn sample_waits(&mut self, now_ms: u64, waits_total: u64, waiting: u64) {
        let delta = self.last_waits.map_or(0, |l| waits_total.saturating_sub(l));
        self.last_waits = Some(waits_total);
        let m = self.minute(now_ms);
        m.waits += delta;
        m.waiting_max = m.waiting_max.max(waiting);
    }

    /// The last `MINUTES` minutes up to `now_ms`, oldest first, one entry per minute (minutes
    /// with nothing are zero).
    pub fn last_hour(&self, now_ms: u64) -> Vec<Minute> {
        let end = now_ms - now_ms % 60_000;
        let first = end.saturating_sub(60_000 * (MINUTES as u64 - 1));
        let mut out = Vec::with_capacity(MINUTES);
        let mut it = self.minutes.iter().filter(|m| m.start_ms >= first).peekable();
        let mut t = first;
        while t <= end {
            match it.peek() {
                Some(m) if m.start_ms == t => out.push((*it.next().expect("peeked")).clone()),
                _ => out.push(Minute { start_ms: t, ..Minute::default() }),
            }
            t += 60_000;
        }
        out
    }
}

/// What an operator did about an attention entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OperatorAction {
    /// Checked and set right outside Tidegate (e.g. refunded by hand).
    Resolved,
    /// Accepted as it is (e.g. the leaked effect may stand).
    Accepted,
    /// Retried from the console (`POST .../retry`) and the retry was confirmed done.
    Retried,
}

/// An operator's resolution of one effect, as recorded on the `operator` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    /// `resolve_effect`, or `retry_effect` for a retry (which resolves the entry only when its
    /// `outcome` is `done`).
    pub kind: String,
    /// The transaction's number (the `<n>` of `tx_<tag>_<n>`).
    pub tx: u64,
    /// The effect's issuance position.
    pub effect: u32,
    /// What was done.
    pub action: OperatorAction,
    /// The operator's note.
    pub note: String,
    /// Who: `key_<id>` of the key that did it, and its role.
    pub by: String,
    /// When, Unix milliseconds.
    pub at_ms: u64,
    /// A retry's operation (`call`, `release`, `compensate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// A retry's outcome (`done`, `failed`, `unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The record's LSN (filled when read back, not stored).
    #[serde(skip)]
    pub lsn: Lsn,
}

impl Resolution {
    /// The record's body.
    pub fn body(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Every resolution of a tenant, by effect (a later one replaces an earlier one).
#[derive(Debug, Default)]
pub struct Resolutions {
    by_effect: HashMap<(TxId, EffectId), Resolution>,
}

impl Resolutions {
    /// Applies an `operator` stream record (others kinds and malformed bodies are skipped:
    /// the stream is this server's, but a ledger is input).
    pub fn apply(&mut self, lsn: Lsn, body: &Value) {
        let Ok(mut r) = serde_json::from_value::<Resolution>(body.clone()) else { return };
        let resolves = match r.kind.as_str() {
            "resolve_effect" => true,
            "retry_effect" => r.outcome.as_deref() == Some("done"),
            _ => false,
        };
        if !resolves {
            return;
        }
        r.lsn = lsn;
        self.by_effect.insert((TxId(r.tx), EffectId(r.effect)), r);
    }

    /// The resolution of an effect, if any.
    pub fn get(&self, tx: TxId, effect: EffectId) -> Option<&Resolution> {
        self.by_effect.get(&(tx, effect))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_has_one_entry_per_minute_of_the_last_hour() {
        let mut s = Series::default();
        let t0 = 10 * 3_600_000;
        s.commit(t0);
        s.commit(t0 + 1_000);
        s.abort(t0 + 61_000, "conflict");
        s.sample_waits(t0, 5, 0);
        s.sample_waits(t0 + 62_000, 8, 2);
        let h = s.last_hour(t0 + 125_000);
        assert_eq!(h.len(), MINUTES);
        assert_eq!(h.last().unwrap().start_ms, t0 + 120_000);
        let m0 = h.iter().find(|m| m.start_ms == t0).unwrap();
        assert_eq!((m0.commits, m0.waits), (2, 0), "the first sample only sets the base");
        let m1 = h.iter().find(|m| m.start_ms == t0 + 60_000).unwrap();
        assert_eq!((m1.aborts.get("conflict").copied(), m1.waits, m1.waiting_max), (Some(1), 3, 2));
        // An hour later the old minutes are gone.
        let later = s.last_hour(t0 + 2 * 3_600_000);
        assert!(later.iter().all(|m| m.commits == 0 && m.aborts.is_empty()));
    }

    #[test]
    fn malformed_operator_records_are_skipped() {
        let mut r = Resolutions::default();
        r.apply(3, &serde_json::json!({"kind": "resolve_effect", "tx": "x"}));
        r.apply(4, &serde_json::json!(17));
        assert!(r.get(TxId(1), EffectId(0)).is_none());
        let ok = Resolution {
            kind: "resolve_effect".into(),
            tx: 1,
            effect: 0,
            action: OperatorAction::Resolved,
            note: "refunded".into(),
            by: "key_ab".into(),
            at_ms: 5,
            operation: None,
            outcome: None,
            lsn: 0,
        };
        r.apply(9, &ok.body());
        assert_eq!(r.get(TxId(1), EffectId(0)).map(|r| (r.lsn, r.note.as_str())), Some((9, "refunded")));
        // A failed retry is recorded but resolves nothing; a done one does.
        let retry = |outcome: &str| Resolution {
            kind: "retry_effect".into(),
            tx: 2,
            action: OperatorAction::Retried,
            operation: Some("release".into()),
            outcome: Some(outcome.into()),
            ..ok.clone()
        };
        r.apply(10, &retry("failed").body());
        assert!(r.get(TxId(2), EffectId(0)).is_none());
        r.apply(11, &retry("done").body());
        assert_eq!(r.get(TxId(2), EffectId(0)).map(|r| r.lsn), Some(11));
    }
}
