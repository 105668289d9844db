"""Tidegate: safe side effects for AI agents.

Tool calls run inside transactions: reversible effects execute at once and are compensated if
the transaction aborts; bufferable and gated (irreversible) effects are held and released in
issuance order only when it commits; stale reads, vetoes and failures abort with every effect
tagged. This package binds the Rust engine (``tidegate._native``) and adds a Pythonic layer::

    import tidegate

    tg = tidegate.open()                      # in memory; tidegate.open("data") persists

    @tidegate.tool(scope=lambda order_id, **_: f"shop:order:{order_id}",
                   effect="reversible", compensate=lambda result, order_id, **_: cancel(result))
    def refund(order_id: str, amount: int) -> dict: ...

    with tg.transaction(agent="support", may_touch=["shop:order:W1"]) as tx:
        tx.read("shop:order:W1")
        refund("W1", 20)
    print(tx.outcome.is_clean)

Modules: :mod:`tidegate.engine` (``open``, ``Tidegate``), :mod:`tidegate.transaction`,
:mod:`tidegate.tools` (``tool``), :mod:`tidegate.plans` (``Plan``, ``Compensate``),
:mod:`tidegate.speculation`, :mod:`tidegate.outcome`,
:mod:`tidegate.errors`; :mod:`tidegate.langgraph` for the LangGraph ``ToolNode`` drop-in;
:mod:`tidegate.client` (``connect``) for the same API against ``tidegate serve``;
:mod:`tidegate.review` (``ReviewClient``) for its review middleware (``/v1/review``).
Everything public is re-exported here.
"""

from .client import Client, RemotePlan, RemoteTransaction, connect
from .engine import ISOLATIONS, LEVELS, ScopeType, Tidegate, default_engine, open
from .errors import (
    Aborted,
    InvalidArgument,
    InvalidScope,
    KeyInUse,
    KeyUnresolved,
    LeaseExpired,
    LostBranch,
    NotApplied,
    OutcomeUnknown,
    PartialCommit,
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
    PlanError,
    CrossTenant,
    MissingDescriptor,
)
from .plans import CapabilityRequest, Compensate, Plan, PlanDetail, PlanInfo, Registration, StuckPlan, Trigger
from .outcome import EffectOutcome, Happened, Held, Outcome, ReadResult, RunResult, SpeculationOutcome
from .review import ReviewClient
from .speculation import Speculation
from .tools import EFFECTS, AsyncTool, Tool, tool
from .transaction import Transaction, current_transaction

__version__ = "0.1.0"

__all__ = [
    "EFFECTS",
    "LEVELS",
    "ISOLATIONS",
    "AsyncTool",
    "CapabilityRequest",
    "Compensate",
    "Plan",
    "PlanDetail",
    "PlanInfo",
    "Registration",
    "StuckPlan",
    "Trigger",
    "PlanError",
    "CrossTenant",
    "MissingDescriptor",
    "Client",
    "RemoteTransaction",
    "RemotePlan",
    "ReviewClient",
    "connect",
    "EffectOutcome",
    "Happened",
    "Held",
    "Outcome",
    "ReadResult",
    "RunResult",
    "ScopeType",
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
    "NotApplied",
    "OutcomeUnknown",
    "PartialCommit",
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
