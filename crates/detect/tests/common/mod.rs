//! Shared test support: a seeded generator of small random traces that exercise every
//! corner of the format (unknown fields, duplicate cells, aborted records, replicas, tool
//! signatures), and helpers to read the generated JSON back for the reference models.
#![allow(dead_code, clippy::unwrap_used)]

use serde_json::{Value, json};

/// SplitMix64, so the suites need no extra dependency and seeds replay everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const CELLS: [&str; 3] = ["c0", "c1", "c2"];
const AGENTS: [&str; 3] = ["a", "b", "c"];
const REPLICAS: [&str; 3] = ["primary", "r1", "r2"];

fn value(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 => Value::Null,
        1 => json!(1),
        2 => json!(2),
        3 => json!("x"),
        4 => json!({"k": 1, "j": [1, 2]}),
        _ => json!(1.5),
    }
}

fn tool(rng: &mut Rng) -> Value {
    match rng.below(4) {
        0 => json!("t0"),
        1 => json!("t1"),
        2 => json!({"name": "t2", "signature": rng.below(2)}),
        _ => json!({"name": "t0", "signature": "s"}),
    }
}

fn tools(rng: &mut Rng, max: u64) -> Value {
    Value::Array((0..rng.below(max + 1)).map(|_| tool(rng)).collect())
}

fn effects(rng: &mut Rng, max: u64, unknown_value_percent: u64) -> Vec<Value> {
    (0..rng.below(max + 1))
        .map(|_| {
            let cell = *rng.pick(&CELLS);
            if rng.chance(unknown_value_percent) { json!([cell]) } else { json!([cell, value(rng)]) }
        })
        .collect()
}

/// One random record. `unknown` is the percentage of optional fields left out.
pub fn record(rng: &mut Rng, index: usize, n: usize, unknown: u64) -> Value {
    let mut r = serde_json::Map::new();
    let mut put = |rng: &mut Rng, key: &str, v: Value| {
        if !rng.chance(unknown) {
            r.insert(key.to_owned(), v);
        }
    };
    // Duplicate tx ids now and then, so predecessor ids can name several records.
    let tx = if rng.chance(10) { rng.below(n as u64) } else { index as u64 };
    put(rng, "tx", json!(format!("t{tx}")));
    let agent = *rng.pick(&AGENTS);
    put(rng, "agent", json!(agent));
    let read_time = rng.below(6);
    put(rng, "read_time", json!(read_time));
    let write_time = rng.below(7);
    put(rng, "write_time", json!(write_time));
    let reads: Vec<Value> = (0..rng.below(4))
        .map(|_| {
            let mut e = serde_json::Map::new();
            e.insert("cell".into(), json!(rng.pick(&CELLS)));
            if !rng.chance(10) {
                e.insert("value".into(), value(rng));
            }
            if rng.chance(30) {
                e.insert("time".into(), json!(rng.below(6)));
            }
            if rng.chance(80) {
                e.insert("replica".into(), json!(rng.pick(&REPLICAS)));
            }
            Value::Object(e)
        })
        .collect();
    put(rng, "reads", Value::Array(reads));
    if rng.chance(20) {
        let replica = *rng.pick(&REPLICAS);
        put(rng, "replica", json!(replica));
    }
    let writes = effects(rng, 3, 5);
    put(rng, "writes", Value::Array(writes.clone()));
    // io is usually a permutation of a small effect list; co is io, a shuffle, or different.
    let io = if rng.chance(50) { writes } else { effects(rng, 3, 3) };
    let mut co = io.clone();
    match rng.below(4) {
        0 => co.reverse(),
        1 if co.len() > 1 => co.swap(0, 1),
        2 => co = effects(rng, 3, 3),
        _ => {}
    }
    put(rng, "io", Value::Array(io));
    put(rng, "co", Value::Array(co));
    let planned = tools(rng, 2);
    put(rng, "planned_tools", planned);
    let at_read = tools(rng, 3);
    put(rng, "registry_at_read", at_read);
    let at_commit = tools(rng, 3);
    put(rng, "registry_at_commit", at_commit);
    let is_aborted = rng.chance(30);
    put(rng, "aborted", json!(is_aborted));
    let preds: Vec<Value> = (0..rng.below(3)).map(|_| json!(format!("t{}", rng.below(n as u64 + 1)))).collect();
    put(rng, "predecessors", Value::Array(preds));
    Value::Object(r)
}

/// A random trace of 1..=max_records records as JSON values.
pub fn trace(rng: &mut Rng, max_records: usize, unknown: u64) -> Vec<Value> {
    let n = 1 + rng.below(max_records as u64) as usize;
    (0..n).map(|i| record(rng, i, n, unknown)).collect()
}

/// The JSON Lines text of `records`.
pub fn jsonl(records: &[Value]) -> String {
    records.iter().map(|r| r.to_string() + "\n").collect()
}

/// Reads `records` strictly.
pub fn read(records: &[Value]) -> tidegate_detect::Trace {
    tidegate_detect::read_str(&jsonl(records), &tidegate_detect::ReadOptions::strict()).unwrap()
}

/// Runs `case` for `runs` seeds derived from `base`; on failure, names the seed to replay.
pub fn for_seeds(base: u64, runs: u64, mut case: impl FnMut(u64)) {
    for k in 0..runs {
        let seed = base.wrapping_mul(1_000_003).wrapping_add(k);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(seed)));
        if let Err(panic) = result {
            eprintln!("failing seed: {seed} (replay: run the case body with Rng({seed}))");
            std::panic::resume_unwind(panic);
        }
    }
}

// ---- accessors for the reference models: plain reads of the JSON, no interning ----

pub fn aborted(r: &Value) -> bool {
    r["aborted"] == json!(true)
}
pub fn str_field<'a>(r: &'a Value, key: &str) -> Option<&'a str> {
    r.get(key).and_then(Value::as_str)
}
pub fn time(r: &Value, key: &str) -> Option<u64> {
    r.get(key).and_then(Value::as_u64)
}
pub fn list<'a>(r: &'a Value, key: &str) -> Option<&'a Vec<Value>> {
    r.get(key).and_then(Value::as_array)
}

/// A read entry: (cell, value if present, effective time, effective replica).
pub type ReadEntry = (String, Option<Value>, Option<u64>, Option<String>);

pub fn read_entries(r: &Value) -> Option<Vec<ReadEntry>> {
    let reads = list(r, "reads")?;
    Some(
        reads
            .iter()
            .map(|e| {
                let cell = e["cell"].as_str().unwrap().to_owned();
                let value = e.get("value").cloned();
                let t = e.get("time").and_then(Value::as_u64).or(time(r, "read_time"));
                let replica = e.get("replica").or(r.get("replica")).and_then(Value::as_str).map(str::to_owned);
                (cell, value, t, replica)
            })
            .collect(),
    )
}

/// A first read: (cell, value if present, effective time).
pub type FirstRead = (String, Option<Value>, Option<u64>);

/// The first read of each cell.
pub fn first_reads(r: &Value) -> Option<Vec<FirstRead>> {
    let mut out: Vec<FirstRead> = Vec::new();
    for (cell, value, t, _) in read_entries(r)? {
        if !out.iter().any(|(c, _, _)| *c == cell) {
            out.push((cell, value, t));
        }
    }
    Some(out)
}

/// An effect list as (cell, value if present).
pub fn effect_list(r: &Value, key: &str) -> Option<Vec<(String, Option<Value>)>> {
    Some(list(r, key)?.iter().map(|e| (e[0].as_str().unwrap().to_owned(), e.get(1).cloned())).collect())
}

/// The write set: `writes`, or else (as the paper derives it) `co`.
pub fn writes(r: &Value) -> Option<Vec<(String, Option<Value>)>> {
    effect_list(r, "writes").or_else(|| effect_list(r, "co"))
}

/// The value record `r` first wrote to `cell`: `None` if it did not write it (or writes are
/// unknown), `Some(None)` if the value is unknown.
pub fn first_write(r: &Value, cell: &str) -> Option<Option<Value>> {
    writes(r)?.into_iter().find(|(c, _)| c == cell).map(|(_, v)| v)
}

/// A tool entry as (name, signature if recorded separately).
pub fn tool_entries(r: &Value, key: &str) -> Option<Vec<(String, Option<Value>)>> {
    Some(
        list(r, key)?
            .iter()
            .map(|t| match t {
                Value::String(s) => (s.clone(), None),
                obj => (obj["name"].as_str().unwrap().to_owned(), obj.get("signature").cloned()),
            })
            .collect(),
    )
}
