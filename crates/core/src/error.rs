//! Errors of the engine's operations.

use crate::ids::{EffectId, GroupId, TxId};
use crate::scope::ScopeError;

/// The lifecycle state of a transaction, as reported in errors and views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxState {
    /// Accepting reads and effects.
    Open,
    /// Footprint frozen; commit not yet requested.
    Sealed,
    /// Commit requested: hooks running or waiting for earlier work on its scopes.
    Waiting,
    /// Commit decided; held effects being released.
    Committing,
    /// Abort decided; compensations running.
    Aborting,
}

impl std::fmt::Display for TxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TxState::Open => "open",
            TxState::Sealed => "sealed",
            TxState::Waiting => "waiting",
            TxState::Committing => "committing",
            TxState::Aborting => "aborting",
        })
    }
}

/// Why an engine operation was refused. The engine's state is unchanged by a refusal unless
/// the variant says the transaction was aborted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A scope could not be canonicalised.
    #[error("invalid scope in `{field}`: {source}")]
    Scope {
        /// Which argument held it (`read`, `may_touch`, `effect scope of tool X`).
        field: String,
        /// The canonicalisation error.
        #[source]
        source: ScopeError,
    },
    /// The id was never issued by this engine.
    #[error("unknown transaction {tx}: this engine never issued it")]
    UnknownTx {
        /// The id.
        tx: TxId,
    },
    /// The transaction has already settled (committed or aborted) and been reclaimed.
    #[error("transaction {tx} has already settled")]
    Settled {
        /// The id.
        tx: TxId,
    },
    /// The operation is not allowed in the transaction's current state.
    #[error("cannot {op} transaction {tx}: it is {state}{hint}")]
    WrongState {
        /// The id.
        tx: TxId,
        /// The operation attempted.
        op: &'static str,
        /// Its state.
        state: TxState,
        /// What to do instead, if anything.
        hint: &'static str,
    },
    /// The transaction broke the protocol and has been aborted.
    #[error("protocol violation in {tx}, transaction aborted: {what}")]
    ProtocolViolation {
        /// The id.
        tx: TxId,
        /// What happened.
        what: String,
    },
    /// Calls of the transaction are still running.
    #[error("cannot seal {tx}: effects {effects:?} are still executing; seal after every call returned")]
    InFlight {
        /// The id.
        tx: TxId,
        /// Effects in flight.
        effects: Vec<EffectId>,
    },
    /// Another unfinished transaction holds the idempotency key.
    #[error("idempotency key `{key}` is held by unfinished transaction {holder}; retry after it settles")]
    KeyInUse {
        /// The key.
        key: String,
        /// The transaction holding it.
        holder: TxId,
    },
    /// The key's earlier execution has an unknown or unresolved outcome; it will not run again.
    #[error("idempotency key `{key}` has an unresolved earlier execution; an operator must resolve it")]
    KeyUnresolved {
        /// The key.
        key: String,
    },
    /// The idempotency key was first used for a different call: another tool, or the same
    /// tool with other arguments. Nothing ran; use a fresh key for a different call.
    #[error(
        "idempotency key `{key}` was first used for {first}; this call ({this}) differs in {differs}: \
         a key names one call, use a new key for a different one"
    )]
    KeyReused {
        /// The key.
        key: String,
        /// The first use: tool and arguments (or their hash once its transaction settled).
        first: String,
        /// This call: tool and arguments.
        this: String,
        /// What differs: `tool`, or `arguments` with the differing fields when known.
        differs: String,
    },
    /// A malformed argument.
    #[error("invalid `{field}` = {value}: expected {expected}")]
    InvalidArgument {
        /// The argument.
        field: &'static str,
        /// The value given, rendered.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The group id was never issued, or the group has settled.
    #[error("unknown or settled speculation group {group}")]
    UnknownGroup {
        /// The id.
        group: GroupId,
    },
    /// The transaction is not a branch of the group.
    #[error("{tx} is not a branch of {group}; branches are {branches:?}")]
    NotInGroup {
        /// The id.
        tx: TxId,
        /// The group.
        group: GroupId,
        /// Its branches.
        branches: Vec<TxId>,
    },
    /// A branch must be settled through its group.
    #[error("{tx} is a branch of {group}: settle it with the group's commit (choose a winner) or abort")]
    BranchOfGroup {
        /// The id.
        tx: TxId,
        /// The group.
        group: GroupId,
    },
    /// Another unfinished transaction holds the scope (pessimistic locking: an earlier claim;
    /// at L1 and above: an uncommitted eager write, or a held write that would interleave with
    /// one); this one was aborted.
    #[error(
        "lock conflict in {tx}, transaction aborted: another unfinished transaction holds `{scope}` (an earlier \
         claim or an uncommitted eager write); retry it"
    )]
    LockConflict {
        /// The id.
        tx: TxId,
        /// The scope.
        scope: String,
    },
    /// An eager effect of a speculation branch on a scope where a sibling branch of the same
    /// group holds an executed (or running) eager effect with a compensation. Whichever branch
    /// wins, the loser's compensation would restore a value over the winner's write (a lost
    /// update), so the call is refused before anything runs; the branch stays open. Not
    /// retryable while the group is unsettled: give the branches disjoint scopes, or make
    /// the effect bufferable or gated (held effects of a winner are released only after every
    /// loser's compensations settled).
    #[error(
        "speculation branch {tx} may not run an eager effect on `{scope}`: sibling branch {sibling} already has an \
         uncommitted eager write there whose compensation would overwrite this one if {tx} wins; nothing was run \
         (use disjoint scopes per branch, or a held effect class)"
    )]
    SiblingConflict {
        /// The branch whose call was refused.
        tx: TxId,
        /// The sibling branch holding the eager write.
        sibling: TxId,
        /// The scope of the refused call.
        scope: String,
    },
    /// A group was asked to settle before a winner was chosen.
    #[error("speculation group {group} has no winner chosen; choose one of {branches:?} or abort the group")]
    NoWinner {
        /// The group.
        group: GroupId,
        /// Its branches still open.
        branches: Vec<TxId>,
    },
    /// An effect's arguments are larger than the engine accepts (`CoreConfig::max_args_bytes`).
    /// Nothing was recorded; the transaction is unchanged.
    #[error(
        "arguments of tool `{tool}` are {bytes} bytes of JSON, over the limit of {limit} bytes; pass a \
         reference (a file or object id) instead of the data, or raise the limit (max_args_bytes)"
    )]
    ArgsTooLarge {
        /// The tool.
        tool: String,
        /// The size of the arguments' JSON.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// An allocator reached the end of its range: ids, epochs, stamps and registry versions
    /// are `u64` and never wrap. Only a ledger holding values no real history reaches (edited
    /// or forged near `u64::MAX`) gets here; restore the ledger from a backup.
    #[error(
        "the {counter} allocator is exhausted (at {value}; the next value would pass u64::MAX): the ledger \
         holds values no real history reaches; restore it from a backup"
    )]
    Exhausted {
        /// Which allocator: `"transaction id"`, `"epoch"`, `"group id"`, `"commit stamp"`,
        /// `"tool registry version"`.
        counter: &'static str,
        /// Its current value.
        value: u64,
    },
}

impl EngineError {
    /// Whether retrying the same call later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, EngineError::KeyInUse { .. } | EngineError::LockConflict { .. })
    }
}
