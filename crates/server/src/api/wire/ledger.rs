//! Ledger queries (`/v1/ledger/events`, `/v1/ledger/export`, a transaction's timeline page).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// Query of a ledger page.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LedgerQuery {
    /// Events after this LSN (default 0).
    pub after_lsn: Option<u64>,
    /// Page size (default 50).
    pub limit: Option<usize>,
}

impl LedgerQuery {
    /// The first LSN to return. LSNs are below 2^63 (the ledger stores them as SQLite
    /// integers), which is also what the document's `int64` promises; a larger `after_lsn` is
    /// refused rather than silently answered with nothing (found by scripts/fuzz-api.sh).
    pub fn from_lsn(&self) -> Result<u64, crate::api::problem::ApiError> {
        match self.after_lsn {
            None => Ok(1),
            Some(n) if n < i64::MAX as u64 => Ok(n + 1),
            Some(n) => Err(crate::api::problem::ApiError::invalid("after_lsn", n.to_string(), "an LSN below 2^63 - 1")),
        }
    }
}

/// Query of the ledger's events (and of its JSON Lines export). The transaction filters
/// select transactions; their events are returned, and engine-wide events (registry changes,
/// extension records) only when no transaction filter is given.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LedgerEventsQuery {
    /// Events after this LSN (default 0).
    pub after_lsn: Option<u64>,
    /// Page size (default 50; the export: every matching event, at most 100000).
    pub limit: Option<usize>,
    /// Only events of this transaction (`tx_<tag>_<n>`); an id never issued to this tenant
    /// (another tenant's included) matches nothing.
    pub transaction: Option<String>,
    /// Only events of transactions begun by this agent.
    pub agent: Option<String>,
    /// Only events of transactions whose may-touch set, reads or effects overlap this scope.
    pub scope: Option<String>,
    /// Only events of transactions that `committed`, `aborted` or are `unfinished`.
    pub outcome: Option<String>,
    /// Only events of transactions whose begin-time lease deadline (`lease_expires_at_ms`,
    /// the one clock reading the ledger keeps) is at or after this Unix millisecond.
    pub from_ms: Option<u64>,
    /// ... and at or before this one.
    pub to_ms: Option<u64>,
    /// Only events of this kind (`begin`, `read`, `effect_recorded`, `decided`, `settled`, ...).
    pub event: Option<String>,
}

impl LedgerEventsQuery {
    /// The first LSN to return (as [`LedgerQuery::from_lsn`]).
    pub fn from_lsn(&self) -> Result<u64, crate::api::problem::ApiError> {
        LedgerQuery { after_lsn: self.after_lsn, limit: None }.from_lsn()
    }
}

/// One ledger event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LedgerEventOut {
    /// Its position.
    pub lsn: u64,
    /// The event kind (`begin`, `read`, `effect_recorded`, `decided`, `settled`, ...).
    pub event: String,
    /// The transaction it belongs to (none for registry changes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction: Option<String>,
    /// The event's fields as the ledger holds them (docs/ledger.md); transaction numbers
    /// inside are the `<n>` of `tx_<tag>_<n>`.
    #[schema(value_type = Object)]
    pub data: Value,
}

list_type!(LedgerEventList, LedgerEventOut, "A page of ledger events.");
