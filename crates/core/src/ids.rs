//! Identifiers and logical time.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A transaction's identity. Allocated monotonically; never reused within one engine.
    TxId,
    "tx-"
);
id_type!(
    /// A logical timestamp from the engine's monotonic allocator. Orders work; does not name
    /// it (the branches of one speculation group share one epoch).
    Epoch,
    "e"
);
id_type!(
    /// A speculation group's identity.
    GroupId,
    "group-"
);

/// An effect's position in its transaction's issuance order (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EffectId(pub u32);

impl fmt::Display for EffectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A scope version: the commit stamp of the latest committed write overlapping the scope
/// (0 if none). Monotonic per scope; advances on every committed write that touches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub u64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A point on the engine's clock, in nanoseconds since the clock's origin. The engine never
/// reads a system clock; callers pass `now` in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// `self + d`, saturating.
    pub fn after(self, d: std::time::Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// The time from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Timestamp) -> std::time::Duration {
        std::time::Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}
