//! The record types: the ledger's JSON form, apart from the engine's [`Event`].
//!
//! One type, [`Record`], serves both directions: built from an `&Event` it borrows every string
//! and JSON value (appending clones nothing); decoded from stored text it borrows what it can
//! and owns the rest, and converts into an `Event`. The engine's enums (`EffectClass`,
//! `Disposition`, `Tag`, `AbortReason`) have their own record forms here too, so renaming or
//! reshaping one in the engine cannot change the format silently: the conversions below must
//! be edited, and the golden tests (`crates/storage/tests/wire.rs`) say whether the bytes moved.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_core::{
    AbortReason, Disposition, EffectClass, EffectId, Epoch, Event, GroupId, Tag, Timestamp, TxId, Version,
};

/// One ledger record. Field order is the JSON's; every field is specified in
/// [`super`]'s table.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Record<'a> {
    Begin {
        tx: u64,
        epoch: u64,
        #[serde(borrow)]
        agent: Cow<'a, str>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        may_touch: Option<Cow<'a, [String]>>,
        lease_until: u64,
    },
    Read {
        tx: u64,
        #[serde(borrow)]
        scope: Cow<'a, str>,
        version: u64,
    },
    EffectRecorded {
        tx: u64,
        effect: u32,
        #[serde(borrow)]
        tool: Cow<'a, str>,
        class: ClassRecord,
        #[serde(borrow)]
        scopes: Vec<Cow<'a, str>>,
        #[serde(borrow)]
        key: Cow<'a, str>,
        args: Cow<'a, Value>,
        compensable: bool,
        #[serde(default)]
        adapter_key: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compensation: Option<Cow<'a, Value>>,
    },
    EffectExecuted {
        tx: u64,
        effect: u32,
        output: Cow<'a, Value>,
    },
    EffectFailed {
        tx: u64,
        effect: u32,
        #[serde(borrow)]
        error: Cow<'a, str>,
        unknown: bool,
    },
    Sealed {
        tx: u64,
    },
    Decided {
        tx: u64,
        commit: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stamp: Option<u64>,
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        reason: Option<ReasonRecord<'a>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<u64>,
    },
    ReleaseStarted {
        tx: u64,
        effect: u32,
    },
    Released {
        tx: u64,
        effect: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Cow<'a, Value>>,
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        error: Option<Cow<'a, str>>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unknown: bool,
    },
    Compensated {
        tx: u64,
        effect: u32,
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        residue: Option<Cow<'a, str>>,
        #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
        error: Option<Cow<'a, str>>,
    },
    Settled {
        tx: u64,
        committed: bool,
        effects: Vec<(u32, DispositionRecord, TagRecord)>,
    },
    ToolChanged {
        #[serde(borrow)]
        tool: Cow<'a, str>,
        version: u64,
        present: bool,
    },
    Extension {
        #[serde(borrow)]
        stream: Cow<'a, str>,
        body: Cow<'a, Value>,
    },
    Touched {
        #[serde(borrow)]
        scopes: Vec<Cow<'a, str>>,
        undoes: u64,
        effect: u32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        done: bool,
    },
}

/// `EffectClass` as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ClassRecord {
    Reversible,
    ReversibleWithCost,
    Bufferable,
    Gated,
    Idempotent,
}

/// `Disposition` as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DispositionRecord {
    Accepted,
    Applied,
    Fired,
    Discarded,
    Compensated,
    CompensationFailed,
    NotCompensable,
    ReleaseFailed,
    NotReleased,
    Unknown,
    Replayed,
}

/// `Tag` as stored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum TagRecord {
    Clean,
    Leaked,
    Unresolved,
    PartialCommit,
}

/// `AbortReason` as stored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum ReasonRecord<'a> {
    ToolFailed {
        #[serde(borrow)]
        tool: Cow<'a, str>,
        #[serde(borrow)]
        message: Cow<'a, str>,
        /// Added in format 2 without a version bump (optional, absent = false): the call
        /// certainly did not take effect and failed transiently to the last attempt
        /// (`AbortReason::ToolUnavailable`). An older reader sees a plain `tool_failed`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unavailable: bool,
    },
    ReleaseFailed {
        #[serde(borrow)]
        tool: Cow<'a, str>,
        #[serde(borrow)]
        message: Cow<'a, str>,
    },
    Vetoed {
        #[serde(borrow)]
        hook: Cow<'a, str>,
        #[serde(borrow)]
        reason: Cow<'a, str>,
    },
    LostBranch {
        winner: u64,
    },
    StaleRead {
        #[serde(borrow)]
        scope: Cow<'a, str>,
        read: u64,
        current: u64,
    },
    LeaseExpired,
    WaitTimeout,
    ProtocolViolation {
        #[serde(borrow)]
        what: Cow<'a, str>,
    },
    Explicit {
        #[serde(borrow)]
        reason: Cow<'a, str>,
    },
    WriteConflict {
        #[serde(borrow)]
        scope: Cow<'a, str>,
        snapshot: u64,
        current: u64,
    },
    LockConflict {
        #[serde(borrow)]
        scope: Cow<'a, str>,
    },
    CascadingAbort {
        predecessor: u64,
    },
    PhantomTool {
        #[serde(borrow)]
        tool: Cow<'a, str>,
        pinned: u64,
        current: Option<u64>,
    },
}

/// Why an event has no record form: the engine gained a kind (or a class, disposition, tag or
/// abort reason) this format does not know yet. Adding it here is a format change (see the
/// rule in [`super`]).
pub(crate) fn unknown(what: &str, value: &dyn std::fmt::Debug) -> String {
    format!("{what} {value:?} has no record form in ledger format {}", super::LEDGER_FORMAT_VERSION)
}

fn class(c: EffectClass) -> Result<ClassRecord, String> {
    Ok(match c {
        EffectClass::Reversible => ClassRecord::Reversible,
        EffectClass::ReversibleWithCost => ClassRecord::ReversibleWithCost,
        EffectClass::Bufferable => ClassRecord::Bufferable,
        EffectClass::Gated => ClassRecord::Gated,
        EffectClass::Idempotent => ClassRecord::Idempotent,
        other => return Err(unknown("effect class", &other)),
    })
}

fn disposition(d: &Disposition) -> Result<DispositionRecord, String> {
    Ok(match d {
        Disposition::Accepted => DispositionRecord::Accepted,
        Disposition::Applied => DispositionRecord::Applied,
        Disposition::Fired => DispositionRecord::Fired,
        Disposition::Discarded => DispositionRecord::Discarded,
        Disposition::Compensated => DispositionRecord::Compensated,
        Disposition::CompensationFailed => DispositionRecord::CompensationFailed,
        Disposition::NotCompensable => DispositionRecord::NotCompensable,
        Disposition::ReleaseFailed => DispositionRecord::ReleaseFailed,
        Disposition::NotReleased => DispositionRecord::NotReleased,
        Disposition::Unknown => DispositionRecord::Unknown,
        Disposition::Replayed => DispositionRecord::Replayed,
        other => return Err(unknown("disposition", other)),
    })
}

fn tag(t: Tag) -> Result<TagRecord, String> {
    Ok(match t {
        Tag::Clean => TagRecord::Clean,
        Tag::Leaked => TagRecord::Leaked,
        Tag::Unresolved => TagRecord::Unresolved,
        Tag::PartialCommit => TagRecord::PartialCommit,
        other => return Err(unknown("tag", &other)),
    })
}

fn b(s: &str) -> Cow<'_, str> {
    Cow::Borrowed(s)
}

fn reason(r: &AbortReason) -> Result<ReasonRecord<'_>, String> {
    Ok(match r {
        AbortReason::ToolFailed { tool, message } => {
            ReasonRecord::ToolFailed { tool: b(tool), message: b(message), unavailable: false }
        }
        AbortReason::ToolUnavailable { tool, message } => {
            ReasonRecord::ToolFailed { tool: b(tool), message: b(message), unavailable: true }
        }
        AbortReason::ReleaseFailed { tool, message } => {
            ReasonRecord::ReleaseFailed { tool: b(tool), message: b(message) }
        }
        AbortReason::Vetoed { hook, reason } => ReasonRecord::Vetoed { hook: b(hook), reason: b(reason) },
        AbortReason::LostBranch { winner } => ReasonRecord::LostBranch { winner: winner.0 },
        AbortReason::StaleRead { scope, read, current } => {
            ReasonRecord::StaleRead { scope: b(scope), read: *read, current: *current }
        }
        AbortReason::LeaseExpired => ReasonRecord::LeaseExpired,
        AbortReason::WaitTimeout => ReasonRecord::WaitTimeout,
        AbortReason::ProtocolViolation { what } => ReasonRecord::ProtocolViolation { what: b(what) },
        AbortReason::Explicit { reason } => ReasonRecord::Explicit { reason: b(reason) },
        AbortReason::WriteConflict { scope, snapshot, current } => {
            ReasonRecord::WriteConflict { scope: b(scope), snapshot: *snapshot, current: *current }
        }
        AbortReason::LockConflict { scope } => ReasonRecord::LockConflict { scope: b(scope) },
        AbortReason::CascadingAbort { predecessor } => ReasonRecord::CascadingAbort { predecessor: predecessor.0 },
        AbortReason::PhantomTool { tool, pinned, current } => {
            ReasonRecord::PhantomTool { tool: b(tool), pinned: *pinned, current: *current }
        }
        other => return Err(unknown("abort reason", other)),
    })
}

impl<'a> Record<'a> {
    /// The record form of `event`, borrowing its strings and values.
    pub(crate) fn of(event: &'a Event) -> Result<Record<'a>, String> {
        let s = |a: &'a Arc<str>| Cow::Borrowed(&**a);
        Ok(match event {
            Event::Begin { tx, epoch, agent, group, may_touch, lease_until } => Record::Begin {
                tx: tx.0,
                epoch: epoch.0,
                agent: s(agent),
                group: group.map(|g| g.0),
                may_touch: may_touch.as_deref().map(Cow::Borrowed),
                lease_until: lease_until.0,
            },
            Event::Read { tx, scope, version } => Record::Read { tx: tx.0, scope: s(scope), version: version.0 },
            Event::EffectRecorded {
                tx,
                effect,
                tool,
                class: c,
                scopes,
                key,
                args,
                compensable,
                adapter_key,
                compensation,
            } => Record::EffectRecorded {
                tx: tx.0,
                effect: effect.0,
                tool: s(tool),
                class: class(*c)?,
                scopes: scopes.iter().map(s).collect(),
                key: s(key),
                args: Cow::Borrowed(&**args),
                compensable: *compensable,
                adapter_key: *adapter_key,
                compensation: compensation.as_deref().map(Cow::Borrowed),
            },
            Event::EffectExecuted { tx, effect, output } => {
                Record::EffectExecuted { tx: tx.0, effect: effect.0, output: Cow::Borrowed(&**output) }
            }
            Event::EffectFailed { tx, effect, error, unknown } => {
                Record::EffectFailed { tx: tx.0, effect: effect.0, error: Cow::Borrowed(error), unknown: *unknown }
            }
            Event::Sealed { tx } => Record::Sealed { tx: tx.0 },
            Event::Decided { tx, commit, stamp, reason: r, at } => Record::Decided {
                tx: tx.0,
                commit: *commit,
                stamp: *stamp,
                reason: r.as_ref().map(reason).transpose()?,
                at: at.map(|t| t.0),
            },
            Event::ReleaseStarted { tx, effect } => Record::ReleaseStarted { tx: tx.0, effect: effect.0 },
            Event::Released { tx, effect, output, error, unknown } => Record::Released {
                tx: tx.0,
                effect: effect.0,
                output: output.as_deref().map(Cow::Borrowed),
                error: error.as_deref().map(Cow::Borrowed),
                unknown: *unknown,
            },
            Event::Compensated { tx, effect, residue, error } => Record::Compensated {
                tx: tx.0,
                effect: effect.0,
                residue: residue.as_deref().map(Cow::Borrowed),
                error: error.as_deref().map(Cow::Borrowed),
            },
            Event::Settled { tx, committed, effects } => Record::Settled {
                tx: tx.0,
                committed: *committed,
                effects: effects
                    .iter()
                    .map(|(id, d, t)| Ok((id.0, disposition(d)?, tag(*t)?)))
                    .collect::<Result<_, String>>()?,
            },
            Event::ToolChanged { tool, version, present } => {
                Record::ToolChanged { tool: s(tool), version: *version, present: *present }
            }
            Event::Extension { stream, body } => Record::Extension { stream: s(stream), body: Cow::Borrowed(&**body) },
            Event::Touched { scopes, undoes, effect, done } => Record::Touched {
                scopes: scopes.iter().map(s).collect(),
                undoes: undoes.0,
                effect: effect.0,
                done: *done,
            },
            other => return Err(unknown("event", other)),
        })
    }

    /// The engine's event.
    pub(crate) fn into_event(self) -> Event {
        let arc = |c: Cow<'_, str>| -> Arc<str> { Arc::from(c.as_ref()) };
        let value = |c: Cow<'_, Value>| Arc::new(c.into_owned());
        match self {
            Record::Begin { tx, epoch, agent, group, may_touch, lease_until } => Event::Begin {
                tx: TxId(tx),
                epoch: Epoch(epoch),
                agent: arc(agent),
                group: group.map(GroupId),
                may_touch: may_touch.map(Cow::into_owned),
                lease_until: Timestamp(lease_until),
            },
            Record::Read { tx, scope, version } => {
                Event::Read { tx: TxId(tx), scope: arc(scope), version: Version(version) }
            }
            Record::EffectRecorded {
                tx,
                effect,
                tool,
                class,
                scopes,
                key,
                args,
                compensable,
                adapter_key,
                compensation,
            } => Event::EffectRecorded {
                tx: TxId(tx),
                effect: EffectId(effect),
                tool: arc(tool),
                class: match class {
                    ClassRecord::Reversible => EffectClass::Reversible,
                    ClassRecord::ReversibleWithCost => EffectClass::ReversibleWithCost,
                    ClassRecord::Bufferable => EffectClass::Bufferable,
                    ClassRecord::Gated => EffectClass::Gated,
                    ClassRecord::Idempotent => EffectClass::Idempotent,
                },
                scopes: scopes.into_iter().map(arc).collect(),
                key: arc(key),
                args: value(args),
                compensable,
                adapter_key,
                compensation: compensation.map(value),
            },
            Record::EffectExecuted { tx, effect, output } => {
                Event::EffectExecuted { tx: TxId(tx), effect: EffectId(effect), output: value(output) }
            }
            Record::EffectFailed { tx, effect, error, unknown } => {
                Event::EffectFailed { tx: TxId(tx), effect: EffectId(effect), error: error.into_owned(), unknown }
            }
            Record::Sealed { tx } => Event::Sealed { tx: TxId(tx) },
            Record::Decided { tx, commit, stamp, reason, at } => Event::Decided {
                tx: TxId(tx),
                commit,
                stamp,
                reason: reason.map(ReasonRecord::into_reason),
                at: at.map(Timestamp),
            },
            Record::ReleaseStarted { tx, effect } => Event::ReleaseStarted { tx: TxId(tx), effect: EffectId(effect) },
            Record::Released { tx, effect, output, error, unknown } => Event::Released {
                tx: TxId(tx),
                effect: EffectId(effect),
                output: output.map(value),
                error: error.map(Cow::into_owned),
                unknown,
            },
            Record::Compensated { tx, effect, residue, error } => Event::Compensated {
                tx: TxId(tx),
                effect: EffectId(effect),
                residue: residue.map(Cow::into_owned),
                error: error.map(Cow::into_owned),
            },
            Record::Settled { tx, committed, effects } => Event::Settled {
                tx: TxId(tx),
                committed,
                effects: effects
                    .into_iter()
                    .map(|(id, d, t)| (EffectId(id), d.into_disposition(), t.into_tag()))
                    .collect(),
            },
            Record::ToolChanged { tool, version, present } => Event::ToolChanged { tool: arc(tool), version, present },
            Record::Extension { stream, body } => Event::Extension { stream: arc(stream), body: value(body) },
            Record::Touched { scopes, undoes, effect, done } => Event::Touched {
                scopes: scopes.into_iter().map(arc).collect(),
                undoes: TxId(undoes),
                effect: EffectId(effect),
                done,
            },
        }
    }
}

impl DispositionRecord {
    fn into_disposition(self) -> Disposition {
        match self {
            DispositionRecord::Accepted => Disposition::Accepted,
            DispositionRecord::Applied => Disposition::Applied,
            DispositionRecord::Fired => Disposition::Fired,
            DispositionRecord::Discarded => Disposition::Discarded,
            DispositionRecord::Compensated => Disposition::Compensated,
            DispositionRecord::CompensationFailed => Disposition::CompensationFailed,
            DispositionRecord::NotCompensable => Disposition::NotCompensable,
            DispositionRecord::ReleaseFailed => Disposition::ReleaseFailed,
            DispositionRecord::NotReleased => Disposition::NotReleased,
            DispositionRecord::Unknown => Disposition::Unknown,
            DispositionRecord::Replayed => Disposition::Replayed,
        }
    }
}

impl TagRecord {
    fn into_tag(self) -> Tag {
        match self {
            TagRecord::Clean => Tag::Clean,
            TagRecord::Leaked => Tag::Leaked,
            TagRecord::Unresolved => Tag::Unresolved,
            TagRecord::PartialCommit => Tag::PartialCommit,
        }
    }
}

impl ReasonRecord<'_> {
    fn into_reason(self) -> AbortReason {
        let o = Cow::into_owned;
        match self {
            ReasonRecord::ToolFailed { tool, message, unavailable: false } => {
                AbortReason::ToolFailed { tool: o(tool), message: o(message) }
            }
            ReasonRecord::ToolFailed { tool, message, unavailable: true } => {
                AbortReason::ToolUnavailable { tool: o(tool), message: o(message) }
            }
            ReasonRecord::ReleaseFailed { tool, message } => {
                AbortReason::ReleaseFailed { tool: o(tool), message: o(message) }
            }
            ReasonRecord::Vetoed { hook, reason } => AbortReason::Vetoed { hook: o(hook), reason: o(reason) },
            ReasonRecord::LostBranch { winner } => AbortReason::LostBranch { winner: TxId(winner) },
            ReasonRecord::StaleRead { scope, read, current } => {
                AbortReason::StaleRead { scope: o(scope), read, current }
            }
            ReasonRecord::LeaseExpired => AbortReason::LeaseExpired,
            ReasonRecord::WaitTimeout => AbortReason::WaitTimeout,
            ReasonRecord::ProtocolViolation { what } => AbortReason::ProtocolViolation { what: o(what) },
            ReasonRecord::Explicit { reason } => AbortReason::Explicit { reason: o(reason) },
            ReasonRecord::WriteConflict { scope, snapshot, current } => {
                AbortReason::WriteConflict { scope: o(scope), snapshot, current }
            }
            ReasonRecord::LockConflict { scope } => AbortReason::LockConflict { scope: o(scope) },
            ReasonRecord::CascadingAbort { predecessor } => {
                AbortReason::CascadingAbort { predecessor: TxId(predecessor) }
            }
            ReasonRecord::PhantomTool { tool, pinned, current } => {
                AbortReason::PhantomTool { tool: o(tool), pinned, current }
            }
        }
    }
}
