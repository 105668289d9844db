//! The executor's snapshot form (docs/plans.md, "Checkpoints"): the executor state, encoded
//! compactly (postcard) so that a reopen loads it instead of folding the log from its start.
//!
//! The few types whose serde form is JSON-specific (internally tagged: causes, stuck reasons,
//! predicates) are stored as their JSON text inside the binary form; everything else is the
//! derived binary form of the executor's own structures, indexes included, so a load does no
//! re-indexing.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::executor::Status;
use crate::fact::{Outcome, StuckReason};

/// Serializes a value as its JSON text (for types whose serde form needs a self-describing
/// format).
pub(crate) mod as_json {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::ser::Error as _;

    use super::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(v).map_err(S::Error::custom)?;
        s.serialize_str(&text)
    }

    pub(crate) fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

/// A plan's status in the snapshot (its stuck reason as JSON text).
#[derive(Serialize, Deserialize)]
enum StatusForm {
    Open,
    Failing { depth: u32 },
    Stuck { reason: String, depth: u32, was_open: bool },
    Ended(Outcome),
}

pub(crate) mod status {
    use serde::de::Error as _;
    use serde::ser::Error as _;

    use super::{Deserialize, Deserializer, Serialize, Serializer, Status, StatusForm, StuckReason};

    pub(crate) fn serialize<S: Serializer>(v: &Status, s: S) -> Result<S::Ok, S::Error> {
        let form = match v {
            Status::Open => StatusForm::Open,
            Status::Failing { depth } => StatusForm::Failing { depth: *depth },
            Status::Stuck { reason, depth, was_open } => StatusForm::Stuck {
                reason: serde_json::to_string(reason).map_err(S::Error::custom)?,
                depth: *depth,
                was_open: *was_open,
            },
            Status::Ended(o) => StatusForm::Ended(*o),
        };
        form.serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
        Ok(match StatusForm::deserialize(d)? {
            StatusForm::Open => Status::Open,
            StatusForm::Failing { depth } => Status::Failing { depth },
            StatusForm::Stuck { reason, depth, was_open } => Status::Stuck {
                reason: serde_json::from_str::<StuckReason>(&reason).map_err(D::Error::custom)?,
                depth,
                was_open,
            },
            StatusForm::Ended(o) => Status::Ended(o),
        })
    }
}
