"""Exceptions raised by Tidegate. They mirror the Rust engine's error kinds.

Every exception derives from :class:`TidegateError` and carries:

* ``kind``: the engine's machine name (``"stale_read"``, ``"vetoed"``, ``"invalid_argument"``...);
* ``retryable``: whether running the same work again (in a new transaction, for aborts) may
  succeed;
* ``outcome``: for aborts and partial commits, the :class:`~tidegate.Outcome` with every
  effect's settlement tag.

Aborts derive from :class:`Aborted`; a commit that released only some of its held effects
raises :class:`PartialCommit`. Bad input derives from :class:`InvalidArgument`, which is
also a :class:`ValueError` and names the argument.

A tool tells the engine how its call failed by what it raises. :class:`NotApplied` (and
:class:`TransientError`, its retryable form) says the call certainly did not take effect;
any other exception, :class:`OutcomeUnknown` included, says it may have: the engine asks the
tool's probe, and without an answer compensates it blind (reversible) or tags it
``unresolved`` (gated); such an effect is never ``clean``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from .outcome import Outcome

__all__ = [
    "TidegateError",
    "Aborted",
    "StaleRead",
    "Vetoed",
    "ProtocolViolation",
    "ToolFailed",
    "ReleaseFailed",
    "LostBranch",
    "LeaseExpired",
    "WaitTimeout",
    "PartialCommit",
    "InvalidArgument",
    "InvalidScope",
    "WrongState",
    "KeyInUse",
    "KeyUnresolved",
    "SpeculationError",
    "StoreError",
    "UnknownTool",
    "PlanError",
    "CrossTenant",
    "MissingDescriptor",
    "NotApplied",
    "TransientError",
    "OutcomeUnknown",
]


class TidegateError(Exception):
    """Base class of every error the engine reports."""

    kind: str
    retryable: bool
    outcome: Optional["Outcome"]
    argument: Optional[str]

    def __init__(
        self,
        message: str,
        *,
        kind: str = "engine",
        retryable: bool = False,
        outcome: Optional[Dict[str, Any]] = None,
        argument: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.argument = argument
        if outcome is not None:
            from .outcome import Outcome

            self.outcome = Outcome._from_dict(outcome)
        else:
            self.outcome = None

    @property
    def reason(self) -> Optional[Dict[str, Any]]:
        """The abort reason as the engine records it (``{"kind": ..., ...}``), for aborts."""
        return self.outcome.reason if self.outcome is not None else None


class Aborted(TidegateError):
    """The transaction aborted. ``outcome`` holds every effect's settlement: held effects were
    discarded, executed ones compensated in reverse issuance order."""


class StaleRead(Aborted):
    """A scope the transaction read was overwritten by a commit before it could commit.
    Retryable: run the work again in a new transaction (``Tidegate.run`` does it for you)."""


class Vetoed(Aborted):
    """A pre-commit hook (a validator, a human approval) vetoed the commit. If the hook raised,
    its exception is this one's ``__cause__``."""


class ProtocolViolation(Aborted):
    """The transaction broke the protocol (an effect outside its ``may_touch`` set, an effect
    after sealing); it has been aborted."""


class ToolFailed(Aborted):
    """A tool call failed, so the transaction aborted. The tool's exception is ``__cause__``."""


class ReleaseFailed(Aborted):
    """A held effect could not be released at commit before anything had been released."""


class LostBranch(Aborted):
    """Another branch of the speculation group won."""


class LeaseExpired(Aborted):
    """The transaction's lease expired while it was open. Retryable."""


class WaitTimeout(Aborted):
    """The commit could not be decided within ``wait_timeout``. Retryable."""


class PartialCommit(TidegateError):
    """The transaction committed, but only part of its held effects reached the world: a
    release failed after retries once earlier ones had fired (an irreversible effect cannot be
    taken back). ``outcome.partial`` names what was released, what failed and what was never
    attempted; the failed effect and those after it are tagged ``partial-commit``. Not
    retryable: what fired stays fired.
    Raised by ``commit()`` and when a ``with`` block commits, as an abort would be, so that it
    cannot go unnoticed."""


class InvalidArgument(TidegateError, ValueError):
    """A malformed argument; ``argument`` names it. Nothing was registered or recorded."""


class InvalidScope(InvalidArgument):
    """A scope could not be canonicalised (empty, no type, control characters, too long or
    too deep, ``..`` above the root); the message names the scope and the rule."""


class WrongState(TidegateError):
    """The operation is not allowed in the transaction's state (e.g. it has already settled)."""


class KeyInUse(TidegateError):
    """Another unfinished transaction holds the idempotency key. Retryable after it settles."""


class KeyUnresolved(TidegateError):
    """The key's earlier execution has an unknown outcome; an operator must resolve it."""


class SpeculationError(TidegateError):
    """Misuse of a speculation group (no winner chosen, a transaction not in the group)."""


class StoreError(TidegateError):
    """The ledger store failed (or the engine was closed)."""


class UnknownTool(TidegateError):
    """A tool named in the ledger is not registered with this engine (register it before
    ``recover()``)."""


class NotApplied(TidegateError):
    """Raise from a tool (or its release at commit) to say the call certainly did NOT take
    effect: the provider refused it (a declined card, no seats left, a validation error
    returned before anything was written). The engine records the call as not executed and
    compensates nothing for it; an eager call aborts its transaction with :class:`ToolFailed`.

    With ``retry=True`` the refusal is transient (a refused connection, a 503 before
    processing): the engine calls again with backoff, up to its ``retry_attempts``, as for
    :class:`TransientError`. Never use it for a timeout or anything raised after the request
    may have reached the provider: that is an unknown outcome (any other exception).

    Only this class and :class:`TransientError` say "did not happen". Any other exception a
    tool raises is taken as an unknown outcome: the probe decides; without one the effect is
    compensated blind (reversible) or tagged ``unresolved`` (gated), never ``clean``."""

    retry: bool

    def __init__(self, message: str = "the call did not take effect", *, retry: bool = False) -> None:
        super().__init__(message, kind="not_applied", retryable=retry)
        self.retry = retry


class TransientError(Exception):
    """Raise from a tool to say the call did NOT take effect and may be retried (a refused
    connection, a 503 before processing). The engine retries it with backoff. The same as
    ``NotApplied(message, retry=True)``."""


class OutcomeUnknown(Exception):
    """Raise from a tool to say the call MAY have taken effect (a timeout after sending). Any
    exception other than :class:`NotApplied` and :class:`TransientError` is taken the same way;
    this one says so explicitly. The engine asks the tool's probe; without an answer the effect
    is compensated blind (reversible) or tagged ``unresolved`` (gated)."""


class PlanError(TidegateError):
    """A plan operation was refused: ``kind`` is ``"unknown_plan"`` (no such plan),
    ``"plan_state"`` (the plan is not in a state that allows it: committing a plan that
    already failed, failing one that ended), ``"step_unsettled"`` (committing a plan while a
    step is still open) or ``"newer_format"`` (a ledger written by a newer Tidegate).
    ``plan`` is the plan's id when the refusal names one. Not retryable as such."""

    plan: Optional[int] = None


class CrossTenant(PlanError, InvalidArgument):
    """A trigger or command named another tenant than the one the plan executor serves;
    refused, never evaluated. ``argument`` names the field."""


class MissingDescriptor(InvalidArgument):
    """A reversible tool was called inside a plan step without a compensation descriptor:
    declare it with ``@tidegate.tool(compensate=tidegate.Compensate(...))``. ``tool`` names
    the tool, ``plan`` the plan. Nothing was recorded; the step stays open."""

    tool: Optional[str] = None
    plan: Optional[int] = None
