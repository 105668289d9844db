//! The executor's snapshot (docs/plans.md, "Checkpoints"): [`Executor::snapshot`] encodes the
//! executor state compactly (postcard, after [`PLAN_SNAPSHOT_VERSION`]) so that a reopen loads
//! it instead of folding the log from its start, and [`Executor::restore`] decodes it and checks
//! every index a later step would follow, so a decoded snapshot cannot panic.
//!
//! The few types whose serde form is JSON-specific (internally tagged: causes, stuck reasons,
//! predicates) are stored as their JSON text inside the binary form; everything else is the
//! derived binary form of the executor's own structures, indexes included, so a load does no
//! re-indexing.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Executor, Status, Timer};
use crate::error::PlanError;
use crate::fact::{Outcome, PlanId, StuckReason};

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

/// The version of [`Executor::snapshot`]'s form this build writes and reads.
pub const PLAN_SNAPSHOT_VERSION: u32 = 3;

impl Executor {
    /// The executor's state as bytes ([`Executor::restore`] reads them back): what a
    /// checkpoint stores so that a reopen folds only the log after it. Versioned
    /// ([`PLAN_SNAPSHOT_VERSION`]); the encoding is compact and not meant to be read by anything
    /// but this crate.
    pub fn snapshot(&self) -> Result<Vec<u8>, PlanError> {
        let mut out = postcard::to_stdvec(&PLAN_SNAPSHOT_VERSION)
            .map_err(|e| PlanError::Snapshot { detail: format!("encoding the version: {e}") })?;
        postcard::to_io(self, &mut out)
            .map_err(|e| PlanError::Snapshot { detail: format!("encoding the executor: {e}") })?;
        Ok(out)
    }

    /// An executor of `tenant` from [`Executor::snapshot`]'s bytes: the same state, indexes
    /// included. Refused ([`PlanError::Snapshot`]) when the bytes do not decode, are of a newer
    /// version, belong to another tenant or are inconsistent; the caller then folds the log.
    pub fn restore(tenant: &str, bytes: &[u8]) -> Result<Executor, PlanError> {
        let bad = |detail: String| PlanError::Snapshot { detail };
        let (version, rest) =
            postcard::take_from_bytes::<u32>(bytes).map_err(|e| bad(format!("reading the version: {e}")))?;
        if version != PLAN_SNAPSHOT_VERSION {
            return Err(bad(format!("snapshot version {version}; this build reads {PLAN_SNAPSHOT_VERSION}")));
        }
        let (exec, rest) =
            postcard::take_from_bytes::<Executor>(rest).map_err(|e| bad(format!("decoding the executor: {e}")))?;
        if !rest.is_empty() {
            return Err(bad(format!("{} bytes after the executor", rest.len())));
        }
        if exec.tenant != tenant {
            return Err(bad(format!("it is tenant `{}`'s, this executor serves `{tenant}`", exec.tenant)));
        }
        exec.check().map_err(bad)?;
        Ok(exec)
    }

    /// The structural facts code elsewhere indexes by, so a decoded snapshot cannot panic.
    fn check(&self) -> Result<(), String> {
        self.wheel.check()?;
        let n = self.atoms.len();
        let atom_ok = |i: &usize| *i < n;
        for (id, p) in self.plans.0.iter().enumerate() {
            for t in &p.triggers {
                if !t.atoms.iter().all(atom_ok) || !t.node.atoms_below(t.atoms.len()) {
                    return Err(format!("plan {} has a trigger naming an atom that does not exist", id + 1));
                }
            }
        }
        for a in &self.atoms {
            let Some(p) = self.plans.get(&a.plan) else {
                return Err(format!("an atom names plan {}, which does not exist", a.plan));
            };
            if p.triggers.get(a.trigger as usize).is_none() {
                return Err(format!("an atom names trigger {} of plan {}, which does not exist", a.trigger, a.plan));
            }
        }
        let indexed = self
            .by_tagged
            .values()
            .chain(self.by_comp.values())
            .chain(self.by_scope.values())
            .chain(self.blocked.values());
        let timed = self.wheel.items().filter_map(|t| match t {
            Timer::Atom(i) => Some(i),
            Timer::Deadline { .. } => None,
        });
        if !indexed.flatten().chain(timed).all(atom_ok) {
            return Err("an index names an atom that does not exist".into());
        }
        for (tx, info) in &self.txs {
            if !self.plans.contains_key(&info.plan) {
                return Err(format!("transaction {tx} is a step of plan {}, which does not exist", info.plan));
            }
        }
        for (&(tx, effect), &seq) in &self.by_effect {
            let reg = self.txs.get(&tx).and_then(|i| self.plans.get(&i.plan)).and_then(|p| p.regs.get(seq as usize));
            if reg.is_none_or(|r| r.tx != tx || r.effect != effect) {
                return Err(format!("effect {effect} of transaction {tx} names registration {seq}, which is not it"));
            }
        }
        if self.next_plan != self.plans.0.len() as PlanId + 1 {
            return Err(format!("next plan id {} after {} plans", self.next_plan, self.plans.0.len()));
        }
        Ok(())
    }
}
