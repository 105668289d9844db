//! Idempotency keys: deriving a call's key, refusing a key reused for another call, and
//! replaying a call whose key already ran (DESIGN.md §2 rule 12, docs/engine.md invariant 7).
//!
//! A key names one call: one tool with one set of arguments. An adapter's key is engine-wide
//! and outlives its transaction (the key table remembers the tool and a hash of the
//! arguments, rebuilt from the ledger on replay); a derived key is local to its transaction
//! and is `tool:tx:n`, with `n` the call's issuance position (every call is a new one), or
//! `tool:tx:call:<id>` when the caller names the call (a retry carries the same id).

use std::sync::Arc;

use serde_json::Value;

use super::{Core, EffStatus, KeyEntry, KeyState, Recorded};
use crate::effect::EffectDecl;
use crate::error::EngineError;
use crate::ids::{EffectId, TxId};

/// The canonical hash of a call's JSON arguments (object members in key order), truncated
/// to 128 bits.
pub(crate) type ArgsHash = [u8; 16];

/// The end of a derived key: the caller's call id, or the call's issuance position.
enum KeyTail<'a> {
    Call(&'a str),
    Number(&'a str),
}

/// What an adapter key was first used for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeyUse {
    /// The tool (one allocation per tool name when loaded from a checkpoint, not per key).
    #[serde(deserialize_with = "super::checkpoint::interned")]
    pub(crate) tool: Arc<str>,
    /// [`args_hash`] of the arguments: hex in checkpoints (format 1 wrote 16 numbers; both
    /// are read).
    #[serde(serialize_with = "hash_hex", deserialize_with = "hash_either")]
    pub(crate) args: ArgsHash,
}

fn hash_hex<S: serde::Serializer>(h: &ArgsHash, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; 32];
    for (i, b) in h.iter().enumerate() {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        buf[2 * i] = HEX[usize::from(b >> 4)];
        buf[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    s.serialize_str(std::str::from_utf8(&buf).map_err(serde::ser::Error::custom)?)
}

fn hash_either<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ArgsHash, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = ArgsHash;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an arguments hash: 32 hex digits or 16 bytes")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ArgsHash, E> {
            let bytes = v.as_bytes();
            if bytes.len() != 32 {
                return Err(E::invalid_length(bytes.len(), &self));
            }
            let nib = |c: u8| match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
            };
            let mut out = [0u8; 16];
            for (i, o) in out.iter_mut().enumerate() {
                *o = (nib(bytes[2 * i])? << 4) | nib(bytes[2 * i + 1])?;
            }
            Ok(out)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ArgsHash, A::Error> {
            let mut out = [0u8; 16];
            for (i, o) in out.iter_mut().enumerate() {
                *o = seq.next_element()?.ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
            }
            if seq.next_element::<u8>()?.is_some() {
                return Err(serde::de::Error::invalid_length(17, &self));
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

impl KeyUse {
    pub(crate) fn of(tool: &Arc<str>, args: &Value) -> KeyUse {
        KeyUse { tool: tool.clone(), args: args_hash(args) }
    }
}

impl KeyEntry {
    /// A key now held by `tx`'s effect `effect`, a call of `tool` with `args`.
    pub(crate) fn pending(tx: TxId, effect: EffectId, tool: &Arc<str>, args: &Value) -> KeyEntry {
        KeyEntry { tx, effect, state: KeyState::Pending, used_for: Some(KeyUse::of(tool, args)) }
    }
}

/// The canonical hash of `args`: independent of the order of object members (and of
/// serde_json's `preserve_order` feature), stable across releases.
pub(crate) fn args_hash(args: &Value) -> ArgsHash {
    let mut h = blake3::Hasher::new();
    feed(&mut h, args);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// Feeds `v` with a type tag and lengths, so that no two values feed the same bytes.
fn feed(h: &mut blake3::Hasher, v: &Value) {
    match v {
        Value::Null => {
            h.update(b"n");
        }
        Value::Bool(b) => {
            h.update(if *b { b"t" } else { b"f" });
        }
        Value::Number(n) => {
            let text = n.to_string();
            h.update(b"#");
            h.update(&(text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        }
        Value::String(s) => {
            h.update(b"s");
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        Value::Array(a) => {
            h.update(b"[");
            h.update(&(a.len() as u64).to_le_bytes());
            for x in a {
                feed(h, x);
            }
        }
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            h.update(b"{");
            h.update(&(members.len() as u64).to_le_bytes());
            for (k, x) in members {
                h.update(&(k.len() as u64).to_le_bytes());
                h.update(k.as_bytes());
                feed(h, x);
            }
        }
    }
}

/// At most `max` characters of `v`'s JSON text, for error messages.
fn short(v: &Value, max: usize) -> String {
    let text = v.to_string();
    if text.chars().count() <= max {
        return text;
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

/// What differs between two argument values: the top-level members of two objects that are
/// missing on one side or unequal, else the whole values.
fn differing(first: &Value, this: &Value) -> String {
    if let (Value::Object(a), Value::Object(b)) = (first, this) {
        let mut names: Vec<&str> = a
            .iter()
            .filter(|(k, v)| b.get(*k) != Some(*v))
            .map(|(k, _)| k.as_str())
            .chain(b.keys().filter(|k| !a.contains_key(*k)).map(String::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        if !names.is_empty() {
            let list: Vec<String> = names
                .iter()
                .map(|n| {
                    let show =
                        |m: &serde_json::Map<String, Value>| m.get(*n).map_or("(absent)".into(), |v| short(v, 40));
                    format!("`{n}` ({} then {})", show(a), show(b))
                })
                .collect();
            return format!("arguments: {}", list.join(", "));
        }
    }
    format!("arguments: {} then {}", short(first, 80), short(this, 80))
}

fn describe(tool: &str, args: &Value) -> String {
    format!("tool `{tool}` with arguments {}", short(args, 120))
}

impl Core {
    /// The idempotency key recorded for effect `effect` of the unfinished transaction `tx`
    /// (the adapter's, or the one derived for it), for the runtime's two-step protocol,
    /// which tells the caller the key to execute under.
    pub fn effect_key(&self, tx: TxId, effect: EffectId) -> Option<Arc<str>> {
        self.txs.get(&tx)?.effects.get(effect.0 as usize).map(|e| e.key.clone())
    }

    /// The adapter's idempotency key of effect `effect` of the unfinished transaction `tx`, if
    /// its call had one (`None` for a derived key): what a handler run by recovery, which has
    /// no call context, is given as the call's key.
    pub fn adapter_key(&self, tx: TxId, effect: EffectId) -> Option<Arc<str>> {
        let e = self.txs.get(&tx)?.effects.get(effect.0 as usize)?;
        e.global_key.then(|| e.key.clone())
    }

    /// The key of the call `decl` at issuance position `id` of `tx`, and whether it is an
    /// adapter's (engine-wide) key.
    pub(super) fn derive_key(&self, tx: TxId, id: EffectId, decl: &EffectDecl) -> (Arc<str>, bool) {
        let prefix = self.cfg.derived_key_prefix.as_deref();
        if let Some(k) = &decl.key {
            return (k.clone(), true);
        }
        // Built by hand rather than with `format!`: this runs for every call without an
        // adapter key, and the formatting machinery cost more than the rest of the key.
        let mut tx_digits = itoa::Buffer::new();
        let tx_text = tx_digits.format(tx.0);
        let mut n_digits = itoa::Buffer::new();
        let tail = match &decl.call_id {
            Some(call) => KeyTail::Call(call),
            None => KeyTail::Number(n_digits.format(id.0)),
        };
        let tail_len = match tail {
            KeyTail::Call(c) => ":call:".len() + c.len(),
            KeyTail::Number(n) => 1 + n.len(),
        };
        let tool = &*decl.tool;
        let capacity = prefix.map_or(3, str::len) + tx_text.len() + tool.len() + 1 + tail_len;
        let built = crate::text::shared::<(), std::convert::Infallible>(capacity, |key| {
            match prefix {
                // `<prefix><n>:<tool>:<n>` (or `...:call:<id>`)
                Some(p) => {
                    key.push_str(p);
                    key.push_str(tx_text);
                    key.push(':');
                    key.push_str(tool);
                }
                // `<tool>:tx-<n>:<n>` (or `...:call:<id>`)
                None => {
                    key.push_str(tool);
                    key.push_str(":tx-");
                    key.push_str(tx_text);
                }
            }
            match tail {
                KeyTail::Call(c) => {
                    key.push_str(":call:");
                    key.push_str(c);
                }
                KeyTail::Number(n) => {
                    key.push(':');
                    key.push_str(n);
                }
            }
            Ok(())
        });
        let (key, ()) = match built {
            Ok(k) => k,
            Err(never) => match never {},
        };
        (key, false)
    }

    /// Handles a key seen before. Refuses a key first used for another call
    /// ([`EngineError::KeyReused`]), keys held by another transaction or unresolved; returns
    /// the earlier outcome for a retry within the same transaction; otherwise lets the caller
    /// record a new effect (a key whose effect committed is replayed by the caller).
    pub(super) fn replay(
        &self,
        tx: TxId,
        key: &Arc<str>,
        global: bool,
        decl: &EffectDecl,
    ) -> Result<Option<Recorded>, EngineError> {
        let own = if global {
            let Some(entry) = self.keys.get(key) else { return Ok(None) };
            self.check_reuse(key, entry, decl)?;
            match entry {
                KeyEntry { state: KeyState::Done(_), .. } => return Ok(None),
                KeyEntry { state: KeyState::Unresolved, .. } => {
                    return Err(EngineError::KeyUnresolved { key: key.to_string() });
                }
                KeyEntry { tx: holder, effect, state: KeyState::Pending, .. } => {
                    if *holder != tx {
                        return Err(EngineError::KeyInUse { key: key.to_string(), holder: *holder });
                    }
                    *effect
                }
            }
        } else {
            // A positional key is new by construction: only a named call can repeat.
            if decl.call_id.is_none() {
                return Ok(None);
            }
            let t = self.tx(tx)?;
            let Some(i) = t.effects.iter().position(|e| &e.key == key) else { return Ok(None) };
            let e = &t.effects[i];
            if e.args != decl.args {
                return Err(EngineError::KeyReused {
                    key: key.to_string(),
                    first: describe(&e.tool, &e.args),
                    this: describe(&decl.tool, &decl.args),
                    differs: differing(&e.args, &decl.args),
                });
            }
            EffectId(i as u32)
        };
        let e = &self.tx(tx)?.effects[own.0 as usize];
        match &e.status {
            EffStatus::Executed | EffStatus::Replayed => {
                Ok(Some(Recorded::Replay(own, e.output.clone().unwrap_or_default())))
            }
            EffStatus::Held(ack) => Ok(Some(Recorded::Held(own, *ack))),
            _ => Err(EngineError::KeyInUse { key: key.to_string(), holder: tx }),
        }
    }

    /// Refuses an adapter key whose first use was another tool or other arguments.
    fn check_reuse(&self, key: &Arc<str>, entry: &KeyEntry, decl: &EffectDecl) -> Result<(), EngineError> {
        let Some(used) = &entry.used_for else { return Ok(()) };
        let same_tool = used.tool == decl.tool;
        if same_tool && used.args == args_hash(&decl.args) {
            return Ok(());
        }
        // The first call's arguments, while its transaction is still in the engine.
        let first_args = self
            .txs
            .get(&entry.tx)
            .and_then(|t| t.effects.get(entry.effect.0 as usize))
            .filter(|e| e.key == *key)
            .map(|e| e.args.clone());
        let first = match &first_args {
            Some(a) => describe(&used.tool, a),
            None => format!(
                "tool `{}` with other arguments (hash {})",
                used.tool,
                used.args.iter().take(6).map(|b| format!("{b:02x}")).collect::<String>()
            ),
        };
        let differs = if !same_tool {
            format!("tool (`{}` then `{}`)", used.tool, decl.tool)
        } else {
            match &first_args {
                Some(a) => differing(a, &decl.args),
                None => "arguments".to_owned(),
            }
        };
        Err(EngineError::KeyReused { key: key.to_string(), first, this: describe(&decl.tool, &decl.args), differs })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_hash_ignores_member_order_and_tells_types_apart() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":[true,null,"x"]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b":[true,null,"x"],"a":1}"#).unwrap();
        assert_eq!(args_hash(&a), args_hash(&b));
        assert_ne!(args_hash(&json!({"a": 1})), args_hash(&json!({"a": "1"})));
        assert_ne!(args_hash(&json!(["ab", "c"])), args_hash(&json!(["a", "bc"])));
        assert_ne!(args_hash(&json!({"a": 1})), args_hash(&json!({"a": 2})));
    }

    #[test]
    fn derived_keys_have_one_spelling_per_form() {
        let decl = |key: Option<&str>, call: Option<&str>| EffectDecl {
            tool: Arc::from("refund"),
            class: crate::effect::EffectClass::Reversible,
            scopes: Vec::new(),
            key: key.map(Arc::from),
            call_id: call.map(Arc::from),
            args: Arc::new(Value::Null),
            compensable: false,
        };
        let plain = Core::new(crate::CoreConfig::default());
        let prefixed =
            Core::new(crate::CoreConfig { derived_key_prefix: Some(Arc::from("tx_ab_")), ..Default::default() });
        let (tx, n) = (TxId(1207), EffectId(30));
        let key = |c: &Core, d: EffectDecl| {
            let (k, adapter) = c.derive_key(tx, n, &d);
            (k.to_string(), adapter)
        };
        assert_eq!(key(&plain, decl(None, None)), ("refund:tx-1207:30".to_owned(), false));
        assert_eq!(key(&plain, decl(None, Some("c-9"))), ("refund:tx-1207:call:c-9".to_owned(), false));
        assert_eq!(key(&prefixed, decl(None, None)), ("tx_ab_1207:refund:30".to_owned(), false));
        assert_eq!(key(&prefixed, decl(None, Some("c-9"))), ("tx_ab_1207:refund:call:c-9".to_owned(), false));
        assert_eq!(key(&prefixed, decl(Some("order-1"), Some("c-9"))), ("order-1".to_owned(), true));
        let (k, _) = plain.derive_key(TxId(u64::MAX), EffectId(u32::MAX), &decl(None, None));
        assert_eq!(&*k, format!("refund:tx-{}:{}", u64::MAX, u32::MAX));
    }

    #[test]
    fn differing_names_the_members_that_changed() {
        let d = differing(&json!({"amount": 10, "to": "x"}), &json!({"amount": 20, "to": "x", "memo": "m"}));
        assert_eq!(d, "arguments: `amount` (10 then 20), `memo` ((absent) then \"m\")");
    }
}
