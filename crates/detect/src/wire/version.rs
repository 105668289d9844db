//! The `schema_version` field.

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};
use std::fmt;

/// The `schema_version` of a record: `"MAJOR.MINOR"` (a bare integer is a major version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SchemaVersion {
    /// Incompatible changes bump the major version.
    pub major: u32,
    /// New optional fields bump the minor version.
    pub minor: u32,
}

impl SchemaVersion {
    /// The version this crate writes and reads.
    pub const CURRENT: SchemaVersion = SchemaVersion { major: 1, minor: 1 };
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for SchemaVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SchemaVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SchemaVersion;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a version such as \"1.0\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SchemaVersion, E> {
                let major = u32::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))?;
                Ok(SchemaVersion { major, minor: 0 })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SchemaVersion, E> {
                let mut parts = v.trim().split('.');
                let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
                let major = num(parts.next());
                let minor = match parts.next() {
                    None => Some(0),
                    some => num(some),
                };
                match (major, minor) {
                    (Some(major), Some(minor)) => Ok(SchemaVersion { major, minor }),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}
