//! `Idempotency-Key` records of one tenant (docs/server.md, invariant 7): in memory, bounded
//! by count and age.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

/// What identifies a request for reuse checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Fingerprint {
    /// Method.
    pub method: String,
    /// Path (with query).
    pub path: String,
    /// The JSON body (`Null` for none; a string for a body that is not JSON).
    pub body: Value,
}

/// A recorded response.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Status.
    pub status: u16,
    /// Content type.
    pub content_type: Option<String>,
    /// Location header.
    pub location: Option<String>,
    /// Body.
    pub body: Vec<u8>,
}

enum Entry {
    Running(Fingerprint),
    Done(Fingerprint, Recorded),
}

/// What to do with a request carrying a key.
#[derive(Debug)]
pub enum Begin {
    /// First use: run it (and call [`IdempotencyStore::finish`]).
    Proceed,
    /// Completed before: answer with this.
    Replay(Recorded),
    /// The first use is still running.
    InProgress,
    /// Used before with other parameters: what differs.
    Mismatch(String),
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    order: VecDeque<(String, Instant)>,
}

/// The records.
pub struct IdempotencyStore {
    inner: Mutex<Inner>,
    ttl: Duration,
    max: usize,
}

impl std::fmt::Debug for IdempotencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyStore").field("records", &self.inner.lock().map.len()).finish()
    }
}

impl IdempotencyStore {
    /// Records kept for `ttl`, at most `max`.
    pub fn new(ttl: Duration, max: usize) -> IdempotencyStore {
        IdempotencyStore { inner: Mutex::new(Inner::default()), ttl, max: max.max(1) }
    }

    /// Checks `key` for a request with `fp`, marking it running if it is new.
    pub fn begin(&self, key: &str, fp: Fingerprint) -> Begin {
        let mut g = self.inner.lock();
        let now = Instant::now();
        while let Some((k, at)) = g.order.front() {
            let expired = now.duration_since(*at) > self.ttl;
            if !(expired || g.order.len() > self.max) {
                break;
            }
            let k = k.clone();
            g.order.pop_front();
            // Only completed records expire; a running one stays until it finishes.
            if matches!(g.map.get(&k), Some(Entry::Done(..))) {
                g.map.remove(&k);
            }
        }
        match g.map.get(key) {
            None => {
                g.map.insert(key.to_owned(), Entry::Running(fp));
                g.order.push_back((key.to_owned(), now));
                Begin::Proceed
            }
            Some(Entry::Running(first)) => match difference(first, &fp) {
                Some(d) => Begin::Mismatch(d),
                None => Begin::InProgress,
            },
            Some(Entry::Done(first, rec)) => match difference(first, &fp) {
                Some(d) => Begin::Mismatch(d),
                None => Begin::Replay(rec.clone()),
            },
        }
    }

    /// Ends the first use of `key`: keeps `response`, or forgets the key (`None`: the request
    /// did not take effect, so it may be sent again with the same key).
    pub fn finish(&self, key: &str, response: Option<Recorded>) {
        let mut g = self.inner.lock();
        match response {
            Some(rec) => {
                if let Some(Entry::Running(fp)) = g.map.remove(key) {
                    g.map.insert(key.to_owned(), Entry::Done(fp, rec));
                }
            }
            None => {
                if matches!(g.map.get(key), Some(Entry::Running(_))) {
                    g.map.remove(key);
                }
            }
        }
    }
}

/// The first difference between two requests, for the 409 message; `None` if equal.
pub fn difference(first: &Fingerprint, now: &Fingerprint) -> Option<String> {
    if first.method != now.method || first.path != now.path {
        return Some(format!(
            "the key was first used for {} {}, this request is {} {}",
            first.method, first.path, now.method, now.path
        ));
    }
    value_diff(&first.body, &now.body, "body").map(|d| format!("the key was first used with another body: {d}"))
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 80 {
        return s;
    }
    let mut end = 80;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn value_diff(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => {
                        if let Some(d) = value_diff(u, v, &p) {
                            return Some(d);
                        }
                    }
                    (Some(u), None) => return Some(format!("`{p}` was {} and is now absent", short(u))),
                    (None, Some(v)) => return Some(format!("`{p}` was absent and is now {}", short(v))),
                    (None, None) => {}
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                if let Some(d) = value_diff(u, v, &format!("{path}[{i}]")) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| format!("`{path}` had {} items and now has {}", x.len(), y.len()))
        }
        _ if a == b => None,
        _ => Some(format!("`{path}` was {} and is now {}", short(a), short(b))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fp(body: Value) -> Fingerprint {
        Fingerprint { method: "POST".into(), path: "/v1/transactions".into(), body }
    }

    #[test]
    fn reuse_with_another_body_names_the_first_difference() {
        let s = IdempotencyStore::new(Duration::from_secs(60), 10);
        assert!(matches!(s.begin("k", fp(json!({"agent": "a"}))), Begin::Proceed));
        assert!(matches!(s.begin("k", fp(json!({"agent": "a"}))), Begin::InProgress));
        s.finish("k", Some(Recorded { status: 201, content_type: None, location: None, body: b"{}".to_vec() }));
        assert!(matches!(s.begin("k", fp(json!({"agent": "a"}))), Begin::Replay(r) if r.status == 201));
        match s.begin("k", fp(json!({"agent": "b"}))) {
            Begin::Mismatch(d) => assert!(d.contains("`body.agent` was \"a\" and is now \"b\""), "{d}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_that_took_no_effect_frees_its_key_and_old_records_expire() {
        let s = IdempotencyStore::new(Duration::from_secs(60), 2);
        assert!(matches!(s.begin("k", fp(json!(1))), Begin::Proceed));
        s.finish("k", None);
        assert!(matches!(s.begin("k", fp(json!(2))), Begin::Proceed));
        for k in ["a", "b", "c"] {
            assert!(matches!(s.begin(k, fp(json!(1))), Begin::Proceed));
            s.finish(k, Some(Recorded { status: 200, content_type: None, location: None, body: vec![] }));
        }
        // At most two kept: "a" (and the finished "k") were dropped.
        assert!(matches!(s.begin("a", fp(json!(1))), Begin::Proceed));
    }
}
