//! What an `Idempotency-Key` record holds (docs/server.md, invariant 7): the first use's
//! fingerprint and its response, and how two requests differ. Where records are kept is
//! [`crate::state::IdempotencyStore`] (in memory, or durable in the tenant's state file).

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
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// What to do with a request carrying a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// First use: run it (and call [`crate::state::IdempotencyStore::finish`]).
    Proceed,
    /// Completed before: answer with this.
    Replay(Recorded),
    /// The first use is still running.
    InProgress,
    /// Used before with other parameters: what differs.
    Mismatch(String),
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
    fn the_first_difference_is_named_by_its_path() {
        assert_eq!(difference(&fp(json!({"a": [1, 2]})), &fp(json!({"a": [1, 2]}))), None);
        let d = difference(&fp(json!({"a": [1, 2]})), &fp(json!({"a": [1, 3]}))).unwrap_or_default();
        assert!(d.contains("`body.a[1]` was 2 and is now 3"), "{d}");
        let other = Fingerprint { method: "POST".into(), path: "/v1/calls".into(), body: json!({}) };
        let d = difference(&fp(json!({})), &other).unwrap_or_default();
        assert!(d.contains("POST /v1/transactions, this request is POST /v1/calls"), "{d}");
    }
}
