//! A history checker for the failover runs (issue 29): the clients' record of every
//! operation (invoked, acknowledged, refused, or unknown) read against the ledger (every event,
//! `tidegate ledger export`) and the webhook sink's log (the ground truth of what reached the
//! world). It knows nothing of the server's code: only the API's ids, the ledger's event
//! format and the sink's deliveries.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::common::Delivery;

/// What a client asked for at the end of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Commit,
    Abort,
}

/// How an operation ended as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Acknowledged: committed.
    Committed,
    /// Acknowledged: aborted (the client's abort, or a commit answered `committed: false`).
    Aborted,
    /// No answer, or an answer that does not say (a transport error, a 503 mid-way): the
    /// outcome is the ledger's to tell, either is allowed.
    Unknown,
}

/// One operation of one client: a transaction from begin to its end.
#[derive(Debug, Clone)]
pub struct Op {
    /// `s<seed>-c<client>-<n>`: also in the arguments of its effects.
    pub op: String,
    /// The transaction's API id (`tx_<tag>_<n>`).
    pub tx: String,
    pub want: Want,
    pub seen: Seen,
    /// Milliseconds since the run began, when the outcome was seen.
    pub done_ms: u64,
}

/// What the checker found. Every list must be empty.
#[derive(Debug, Default)]
pub struct Report {
    pub ops: usize,
    pub acked_commits: usize,
    pub acked_aborts: usize,
    pub unknown: usize,
    /// Operations whose client asked for an abort.
    pub asked_aborts: usize,
    pub decisions: usize,
    /// Releases and successful compensations the ledger records.
    pub releases: usize,
    pub compensations: usize,
    /// Acknowledged commits the ledger does not hold as committed.
    pub lost_commits: Vec<String>,
    /// Acknowledged aborts the ledger does not hold as aborted.
    pub lost_aborts: Vec<String>,
    /// Transactions decided more than once (by two owners, or twice by one).
    pub decided_twice: Vec<String>,
    /// Transactions the ledger never decided (after every lease ran out).
    pub undecided: Vec<String>,
    /// The same operation's call on the same path delivered under two keys.
    pub two_keys: Vec<String>,
    /// Effects the ledger records as released, or as compensated, more than once.
    pub done_twice: Vec<String>,
    /// Held effects released for a transaction that did not commit.
    pub released_uncommitted: Vec<String>,
    /// Acknowledged commits whose held effect never reached the sink.
    pub release_missing: Vec<String>,
    /// Compensations of transactions that did not abort.
    pub compensated_not_aborted: Vec<String>,
    /// Client-executed calls of aborted transactions left without their compensation.
    pub uncompensated: Vec<String>,
}

impl Report {
    pub fn violations(&self) -> usize {
        self.lost_commits.len()
            + self.lost_aborts.len()
            + self.decided_twice.len()
            + self.undecided.len()
            + self.two_keys.len()
            + self.done_twice.len()
            + self.released_uncommitted.len()
            + self.release_missing.len()
            + self.compensated_not_aborted.len()
            + self.uncompensated.len()
    }
}

/// The ledger's transaction number of an API id `tx_<tag>_<n>`, or of a dispatch key
/// `tx_<tag>_<n>:<effect>[#compensate]`.
fn tx_number(id: &str) -> Option<u64> {
    let id = id.split(':').next()?;
    id.rsplit('_').next()?.parse().ok()
}

/// Checks `history` against the exported `ledger` events and the sink's `deliveries`.
///
/// Paths: `client_path` the client-executed calls the clients made themselves (keyed by the
/// effect key), `undo_path` their compensations, `release_path` the held effects' releases.
pub fn check(
    history: &[Op],
    ledger: &[Value],
    deliveries: &[Delivery],
    client_path: &str,
    undo_path: &str,
    release_path: &str,
) -> Report {
    let mut r = Report { ops: history.len(), ..Report::default() };
    let mut decided: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
    let mut begun: BTreeSet<u64> = BTreeSet::new();
    let mut done: BTreeMap<(&str, u64, u64), usize> = BTreeMap::new();
    for e in ledger {
        let Some(tx) = e["tx"].as_u64() else { continue };
        match e["event"].as_str() {
            Some("begin") => {
                begun.insert(tx);
            }
            // A release, or a compensation that succeeded, happens once per effect.
            Some(kind @ ("released" | "compensated")) if e.get("error").is_none() => {
                *done.entry((kind, tx, e["effect"].as_u64().unwrap_or(u64::MAX))).or_default() += 1;
            }
            Some("decided") => decided.entry(tx).or_default().push(e["commit"] == true),
            _ => {}
        }
    }
    r.decisions = decided.values().map(Vec::len).sum();
    let state = |tx: u64| match decided.get(&tx).map(Vec::as_slice) {
        Some([true]) => Some(true),
        Some([false]) => Some(false),
        _ => None,
    };
    for (tx, d) in &decided {
        if d.len() > 1 {
            r.decided_twice.push(format!("tx {tx}: decided {d:?}"));
        }
    }
    r.releases = done.iter().filter(|((k, _, _), _)| *k == "released").map(|(_, n)| n).sum();
    r.compensations = done.iter().filter(|((k, _, _), _)| *k == "compensated").map(|(_, n)| n).sum();
    for ((kind, tx, effect), n) in &done {
        if *n > 1 {
            r.done_twice.push(format!("tx {tx} effect {effect}: {kind} {n} times"));
        }
    }
    for tx in &begun {
        if !decided.contains_key(tx) {
            r.undecided.push(format!("tx {tx}"));
        }
    }
    for op in history {
        if op.want == Want::Abort {
            r.asked_aborts += 1;
        }
        let n = tx_number(&op.tx);
        match op.seen {
            Seen::Committed => {
                r.acked_commits += 1;
                if n.and_then(state) != Some(true) {
                    r.lost_commits.push(format!("{} ({}): {:?}", op.tx, op.op, n.and_then(|n| decided.get(&n))));
                }
            }
            Seen::Aborted => {
                r.acked_aborts += 1;
                if n.and_then(state) != Some(false) {
                    r.lost_aborts.push(format!("{} ({}): {:?}", op.tx, op.op, n.and_then(|n| decided.get(&n))));
                }
            }
            Seen::Unknown => r.unknown += 1,
        }
    }

    let mut keys: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut released_ops: BTreeSet<String> = BTreeSet::new();
    let mut undone: BTreeSet<String> = BTreeSet::new();
    for d in deliveries {
        let op = d.body["args"]["op"].as_str().or(d.body["op"].as_str()).unwrap_or_default().to_owned();
        if !op.is_empty() {
            keys.entry((d.path.clone(), op.clone())).or_default().insert(d.key.clone());
        }
        let tx = tx_number(&d.key);
        if d.path == release_path && d.applied {
            released_ops.insert(op);
            if tx.and_then(state) != Some(true) {
                r.released_uncommitted.push(format!("{} ({:?})", d.key, tx.and_then(|n| decided.get(&n))));
            }
        }
        if d.path == undo_path && d.applied {
            undone.insert(d.key.trim_end_matches("#compensate").to_owned());
            if tx.and_then(state) != Some(false) {
                r.compensated_not_aborted.push(format!("{} ({:?})", d.key, tx.and_then(|n| decided.get(&n))));
            }
        }
    }
    for ((path, op), ks) in &keys {
        if ks.len() > 1 {
            r.two_keys.push(format!("{path} of {op}: {ks:?}"));
        }
    }
    for op in history.iter().filter(|o| o.seen == Seen::Committed) {
        if !released_ops.contains(&op.op) {
            r.release_missing.push(format!("{} ({})", op.tx, op.op));
        }
    }
    for d in deliveries.iter().filter(|d| d.path == client_path && d.applied) {
        if tx_number(&d.key).and_then(state) == Some(false) && !undone.contains(&d.key) {
            r.uncompensated.push(d.key.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn op(op: &str, tx: u64, want: Want, seen: Seen) -> Op {
        Op { op: op.into(), tx: format!("tx_abcd1234_{tx}"), want, seen, done_ms: 0 }
    }

    fn delivery(path: &str, key: &str, op: &str) -> Delivery {
        Delivery {
            path: path.into(),
            key: key.into(),
            operation: String::new(),
            attempt: "1".into(),
            body: json!({"args": {"op": op}}),
            raw: String::new(),
            applied: true,
        }
    }

    fn ledger() -> Vec<Value> {
        vec![
            json!({"event": "begin", "tx": 1}),
            json!({"event": "decided", "tx": 1, "commit": true}),
            json!({"event": "begin", "tx": 2}),
            json!({"event": "decided", "tx": 2, "commit": false}),
        ]
    }

    fn good() -> (Vec<Op>, Vec<Delivery>) {
        let history = vec![op("a", 1, Want::Commit, Seen::Committed), op("b", 2, Want::Abort, Seen::Aborted)];
        let deliveries = vec![
            delivery("client", "tx_abcd1234_1:0", "a"),
            delivery("release", "tx_abcd1234_1:1", "a"),
            delivery("client", "tx_abcd1234_2:0", "b"),
            delivery("undo", "tx_abcd1234_2:0#compensate", "b"),
        ];
        (history, deliveries)
    }

    fn run(history: &[Op], ledger: &[Value], deliveries: &[Delivery]) -> Report {
        check(history, ledger, deliveries, "client", "undo", "release")
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let (h, d) = good();
        let r = run(&h, &ledger(), &d);
        assert_eq!((r.violations(), r.acked_commits, r.acked_aborts), (0, 1, 1), "{r:?}");
    }

    #[test]
    fn each_kind_of_violation_is_found() {
        let (h, d) = good();
        // A lost commit and a lost abort: the ledger decided the other way.
        let mut flipped = ledger();
        flipped[1]["commit"] = json!(false);
        flipped[3]["commit"] = json!(true);
        let r = run(&h, &flipped, &d);
        assert_eq!((r.lost_commits.len(), r.lost_aborts.len()), (1, 1), "{r:?}");
        assert_eq!((r.released_uncommitted.len(), r.compensated_not_aborted.len()), (1, 1), "{r:?}");
        // Decided by two owners.
        let mut twice = ledger();
        twice.push(json!({"event": "decided", "tx": 1, "commit": true}));
        assert_eq!(run(&h, &twice, &d).decided_twice.len(), 1);
        // Released or compensated twice by the ledger's account.
        let mut again = ledger();
        again.push(json!({"event": "released", "tx": 1, "effect": 1}));
        again.push(json!({"event": "released", "tx": 1, "effect": 1}));
        again.push(json!({"event": "compensated", "tx": 2, "effect": 0}));
        again.push(json!({"event": "compensated", "tx": 2, "effect": 0, "error": "failed first"}));
        assert_eq!(run(&h, &again, &d).done_twice.len(), 1, "a failed attempt is not a second run");
        again.push(json!({"event": "compensated", "tx": 2, "effect": 0}));
        assert_eq!(run(&h, &again, &d).done_twice.len(), 2);
        // Never decided.
        let mut open = ledger();
        open.push(json!({"event": "begin", "tx": 3}));
        assert_eq!(run(&h, &open, &d).undecided.len(), 1);
        // Delivered under two keys; a release missing; a compensation missing.
        let mut d2 = d.clone();
        d2.push(delivery("release", "tx_abcd1234_9:1", "a"));
        assert_eq!(run(&h, &ledger(), &d2).two_keys.len(), 1);
        let d3: Vec<Delivery> = d.iter().filter(|x| x.path != "release").cloned().collect();
        assert_eq!(run(&h, &ledger(), &d3).release_missing.len(), 1);
        let d4: Vec<Delivery> = d.iter().filter(|x| x.path != "undo").cloned().collect();
        assert_eq!(run(&h, &ledger(), &d4).uncompensated.len(), 1);
        // An unknown outcome allows either.
        let unknown = vec![op("a", 1, Want::Commit, Seen::Unknown), op("b", 2, Want::Commit, Seen::Unknown)];
        let r = run(&unknown, &ledger(), &d);
        assert_eq!((r.violations(), r.unknown), (0, 2), "{r:?}");
    }
}
