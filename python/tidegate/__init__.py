"""Tidegate: safe side effects for AI agents.

Tool calls run inside transactions: reversible effects execute at once and are compensated if
the transaction aborts; bufferable and gated (irreversible) effects are held and released in
issuance order only when it commits; stale reads, vetoes and failures abort with every effect
tagged. This package binds the Rust engine (``tidegate._native``) and adds a Pythonic layer::

    import tidegate

    tg = tidegate.open()                      # in memory; tidegate.open("data") persists

    @tidegate.tool(scope=lambda order_id, **_: f"retail:order:{order_id}",
                   effect="reversible", compensate=lambda result, order_id, **_: cancel(result))
    def refund(order_id: str, amount: int) -> dict: ...

    with tg.transaction(agent="support", may_touch=["retail:order:W1"]) as tx:
        tx.read("retail:order:W1")
        refund("W1", 20)
    print(tx.outcome.is_clean)

See ``tidegate.langgraph`` for the LangGraph ``ToolNode`` drop-in.
"""

from .core import (
    EFFECTS,
    AsyncTool,
    EffectOutcome,
    Happened,
    Held,
    Outcome,
    ReadResult,
    RunResult,
    Speculation,
    SpeculationOutcome,
    Tidegate,
    Tool,
    Transaction,
    current_transaction,
    default_engine,
    open,
    tool,
)
from .errors import (
    Aborted,
    InvalidArgument,
    InvalidScope,
    KeyInUse,
    KeyUnresolved,
    LeaseExpired,
    LostBranch,
    OutcomeUnknown,
    ProtocolViolation,
    ReleaseFailed,
    SpeculationError,
    StaleRead,
    StoreError,
    TidegateError,
    ToolFailed,
    TransientError,
    UnknownTool,
    Vetoed,
    WaitTimeout,
    WrongState,
)

__version__ = "0.1.0"

__all__ = [
    "EFFECTS",
    "AsyncTool",
    "EffectOutcome",
    "Happened",
    "Held",
    "Outcome",
    "ReadResult",
    "RunResult",
    "Speculation",
    "SpeculationOutcome",
    "Tidegate",
    "Tool",
    "Transaction",
    "current_transaction",
    "default_engine",
    "open",
    "tool",
    "Aborted",
    "InvalidArgument",
    "InvalidScope",
    "KeyInUse",
    "KeyUnresolved",
    "LeaseExpired",
    "LostBranch",
    "OutcomeUnknown",
    "ProtocolViolation",
    "ReleaseFailed",
    "SpeculationError",
    "StaleRead",
    "StoreError",
    "TidegateError",
    "ToolFailed",
    "TransientError",
    "UnknownTool",
    "Vetoed",
    "WaitTimeout",
    "WrongState",
]
