//! Values that cross the database boundary, and named-placeholder SQL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One SQL value. Money and counts are integers (TPC-C amounts are cents), so consistency
/// checks are exact.
#[derive(Debug, Clone, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SqlValue {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Int(i64),
    /// A double.
    Real(f64),
    /// Text.
    Text(String),
}

impl SqlValue {
    /// The value as an integer, if it is one (a real with no fraction counts).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            SqlValue::Int(i) => Some(*i),
            SqlValue::Real(f) if f.fract() == 0.0 => Some(*f as i64),
            _ => None,
        }
    }

    /// The value as a double, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            SqlValue::Int(i) => Some(*i as f64),
            SqlValue::Real(f) => Some(*f),
            _ => None,
        }
    }

    /// The canonical key used to compare row keys in dependency checks: numbers compare by
    /// value, and a text that reads as a number is that number (SQLite stores `"1"` as `1`
    /// in an integer column and `1` as `"1"` in a text column, so a check that told them
    /// apart would miss a dependency: issue 27 item 6).
    pub fn key(&self) -> String {
        fn num(f: f64) -> String {
            if f.fract() == 0.0 && f.abs() < 9.0e15 { format!("n{}", f as i64) } else { format!("n{f}") }
        }
        match self {
            SqlValue::Null => "null".into(),
            SqlValue::Int(i) => format!("n{i}"),
            SqlValue::Real(f) => num(*f),
            SqlValue::Text(s) => {
                let t = s.trim();
                if let Ok(i) = t.parse::<i64>() {
                    format!("n{i}")
                } else if let Ok(f) = t.parse::<f64>()
                    && f.is_finite()
                    && t.bytes().any(|b| b.is_ascii_digit())
                {
                    num(f)
                } else {
                    format!("t{s}")
                }
            }
        }
    }

    /// Converts a scalar JSON parameter; `None` for arrays and objects.
    pub fn from_json(v: &serde_json::Value) -> Option<SqlValue> {
        Some(match v {
            serde_json::Value::Null => SqlValue::Null,
            serde_json::Value::Bool(b) => SqlValue::Int(i64::from(*b)),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => SqlValue::Int(i),
                None => SqlValue::Real(n.as_f64()?),
            },
            serde_json::Value::String(s) => SqlValue::Text(s.clone()),
            _ => return None,
        })
    }
}

/// One result row: column names and values, in select order.
pub type Row = Vec<(String, SqlValue)>;

/// The values named placeholders are bound from.
pub type Env = BTreeMap<String, SqlValue>;

/// How a database numbers its placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: `?1`, `?2`, ...
    Sqlite,
    /// PostgreSQL: `$1`, `$2`, ...
    Postgres,
}

/// Names of the `:name` placeholders of `sql`, in order of first appearance (string literals
/// and PostgreSQL `::` casts are skipped).
pub fn placeholders(sql: &str) -> Vec<String> {
    let mut names = Vec::new();
    scan(sql, |name| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
        String::new()
    });
    names
}

/// Rewrites `:name` placeholders to the dialect's positional ones and returns the values in
/// position order, taken from `env`. A name missing from `env` is an error naming it.
pub fn bind(sql: &str, env: &Env, dialect: Dialect) -> Result<(String, Vec<SqlValue>)> {
    let mut order: Vec<String> = Vec::new();
    let text = scan(sql, |name| {
        let pos = match order.iter().position(|n| n == name) {
            Some(p) => p,
            None => {
                order.push(name.to_owned());
                order.len() - 1
            }
        } + 1;
        match dialect {
            Dialect::Sqlite => format!("?{pos}"),
            Dialect::Postgres => format!("${pos}"),
        }
    });
    let mut values = Vec::with_capacity(order.len());
    for name in &order {
        match env.get(name) {
            Some(v) => values.push(v.clone()),
            None => {
                return Err(Error::db(
                    format!("binding {sql:?}"),
                    format!("placeholder :{name} has no value (known: {:?})", env.keys().collect::<Vec<_>>()),
                    false,
                ));
            }
        }
    }
    Ok((text, values))
}

fn scan(sql: &str, mut on_name: impl FnMut(&str) -> String) -> String {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    let mut in_str = false;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if in_str {
            out.push(c);
            if c == '\'' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == '\'' {
            in_str = true;
            out.push(c);
            i += 1;
            continue;
        }
        if c == ':' {
            if i + 1 < bytes.len() && bytes[i + 1] == b':' {
                out.push_str("::");
                i += 2;
                continue;
            }
            let start = i + 1;
            let mut end = start;
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            if end > start && !bytes[start].is_ascii_digit() {
                out.push_str(&on_name(&sql[start..end]));
                i = end;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_skip_literals_and_casts() {
        assert_eq!(placeholders("SELECT ':x', a::text FROM t WHERE a = :a AND b = :b_2 OR c = :a"), ["a", "b_2"]);
        let env: Env = [("a".to_owned(), SqlValue::Int(1)), ("b_2".to_owned(), SqlValue::Text("x".into()))].into();
        let (sql, vals) = bind("UPDATE t SET a = :a WHERE b = :b_2 AND a = :a", &env, Dialect::Postgres).unwrap();
        assert_eq!(sql, "UPDATE t SET a = $1 WHERE b = $2 AND a = $1");
        assert_eq!(vals.len(), 2);
        assert!(bind("SELECT :zz", &env, Dialect::Sqlite).is_err());
    }
}
