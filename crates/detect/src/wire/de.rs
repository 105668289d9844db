//! Serde building blocks of the wire format: strings borrowed from the line, ids, JSON values,
//! effects and tool entries, each accepting the alternative shapes the format allows.

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeSeq, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// A string field, borrowed from the input line when it contains no escapes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Str<'_> {
    /// An owned copy.
    pub fn to_static(&self) -> Str<'static> {
        Str(Cow::Owned(self.0.clone().into_owned()))
    }
}

impl<'a> From<&'a str> for Str<'a> {
    fn from(s: &'a str) -> Self {
        Str(Cow::Borrowed(s))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// A transaction id: a JSON string or integer. Ids compare by their text, so `7` and `"7"`
/// name the same transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Id<'a>(pub Cow<'a, str>);

impl<'a> From<&'a str> for Id<'a> {
    fn from(s: &'a str) -> Self {
        Id(Cow::Borrowed(s))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Id<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a transaction id (string or integer)")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v.to_string())))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id<'a>, E> {
                Ok(Id(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A cell value, tool signature or other opaque datum: any JSON value.
///
/// `Null` is the paper's distinguished `NULL` sentinel (the value of a never-written cell).
/// Two values are equal when they are equal as JSON values: strings by content, integers by
/// value, floats by value (`1` and `1.0` differ, as in `serde_json`), arrays element-wise and
/// objects key-wise regardless of key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// JSON `null`: the `NULL` sentinel.
    Null,
    /// A boolean.
    Bool(bool),
    /// A negative integer.
    Int(i64),
    /// A non-negative integer.
    UInt(u64),
    /// A number with a fraction or exponent.
    Float(f64),
    /// A string.
    Str(Cow<'a, str>),
    /// An array or object.
    Compound(serde_json::Value),
}

impl Value<'_> {
    /// An owned copy.
    pub fn to_static(&self) -> Value<'static> {
        match self {
            Value::Null => Value::Null,
            Value::Bool(b) => Value::Bool(*b),
            Value::Int(i) => Value::Int(*i),
            Value::UInt(u) => Value::UInt(*u),
            Value::Float(f) => Value::Float(*f),
            Value::Str(s) => Value::Str(Cow::Owned(s.clone().into_owned())),
            Value::Compound(v) => Value::Compound(v.clone()),
        }
    }
}

impl Serialize for Value<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::UInt(u) => s.serialize_u64(*u),
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(v) => s.serialize_str(v),
            Value::Compound(v) => v.serialize(s),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Value<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Value<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Value<'a>, E> {
                Ok(Value::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Value<'a>, E> {
                Ok(Value::Null)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value<'a>, E> {
                Ok(Value::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value<'a>, E> {
                Ok(if v >= 0 { Value::UInt(v as u64) } else { Value::Int(v) })
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value<'a>, E> {
                Ok(Value::UInt(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value<'a>, E> {
                Ok(Value::Float(v))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Value<'a>, E> {
                Ok(Value::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Value<'a>, E> {
                Ok(Value::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Value<'a>, E> {
                Ok(Value::Str(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value<'a>, A::Error> {
                serde_json::Value::deserialize(SeqAccessDeserializer::new(seq)).map(Value::Compound)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value<'a>, A::Error> {
                serde_json::Value::deserialize(MapAccessDeserializer::new(map)).map(Value::Compound)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// Deserialises a field that is present (possibly `null`) into `Some`, so that an absent field
/// (`None` through `#[serde(default)]`) stays distinguishable from an explicit `null`.
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// One write or effect: `[cell, value]`, or `{"cell": .., "value": ..}`. A missing value
/// (`[cell]` or an object without `value`) means the value is unknown.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect<'a> {
    /// The cell written.
    pub cell: Str<'a>,
    /// The value written; `None` if unknown.
    pub value: Option<Value<'a>>,
}

impl Serialize for Effect<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(if self.value.is_some() { 2 } else { 1 }))?;
        seq.serialize_element(&self.cell)?;
        if let Some(v) = &self.value {
            seq.serialize_element(v)?;
        }
        seq.end()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Effect<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Effect<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("[cell, value] or {\"cell\": .., \"value\": ..}")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Effect<'a>, A::Error> {
                let cell: Str<'a> = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let value: Option<Value<'a>> = seq.next_element()?;
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(Effect { cell, value })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Effect<'a>, A::Error> {
                let mut cell = None;
                let mut value = None;
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match &*key.0 {
                        "cell" => cell = Some(map.next_value::<Str<'a>>()?),
                        "value" => value = Some(map.next_value::<Value<'a>>()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let cell = cell.ok_or_else(|| de::Error::missing_field("cell"))?;
                Ok(Effect { cell, value })
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A tool entry of a registry or a plan: `"name"`, or `{"name": .., "signature": ..}`
/// (`sig` and `version` are accepted for `signature`). A plain string is a tool whose
/// signature is not recorded separately, so the string itself identifies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool<'a> {
    /// The tool's name (or full signature string).
    pub name: Str<'a>,
    /// Its signature, when recorded separately from the name.
    pub signature: Option<Value<'a>>,
}

impl Tool<'_> {
    /// An owned copy.
    pub fn to_static(&self) -> Tool<'static> {
        Tool { name: self.name.to_static(), signature: self.signature.as_ref().map(Value::to_static) }
    }
}

impl Serialize for Tool<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match &self.signature {
            None => self.name.serialize(s),
            Some(sig) => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("name", &self.name)?;
                m.serialize_entry("signature", sig)?;
                m.end()
            }
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Tool<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Tool<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tool name or {\"name\": .., \"signature\": ..}")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Tool<'a>, E> {
                Ok(Tool { name: Str(Cow::Borrowed(v)), signature: None })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Tool<'a>, E> {
                Ok(Tool { name: Str(Cow::Owned(v.to_owned())), signature: None })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tool<'a>, A::Error> {
                let mut name = None;
                let mut signature = None;
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match &*key.0 {
                        "name" => name = Some(map.next_value::<Str<'a>>()?),
                        "signature" | "sig" | "version" if signature.is_none() => {
                            signature = Some(map.next_value::<Value<'a>>()?);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let name = name.ok_or_else(|| de::Error::missing_field("name"))?;
                Ok(Tool { name, signature })
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A cell-to-value map in the paper's reference form: `{"cell": value, ..}` or a list of
/// `[cell, value]` pairs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CellValues<'a>(pub Vec<Effect<'a>>);

impl Serialize for CellValues<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for CellValues<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = CellValues<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of cell: value, or a list of [cell, value]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CellValues<'a>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(e) = seq.next_element::<Effect<'a>>()? {
                    out.push(e);
                }
                Ok(CellValues(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CellValues<'a>, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some((cell, value)) = map.next_entry::<Str<'a>, Value<'a>>()? {
                    out.push(Effect { cell, value: Some(value) });
                }
                Ok(CellValues(out))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}
