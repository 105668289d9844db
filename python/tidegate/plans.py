"""Plans: steps that all stand or are all undone, with compensations that outlive the process.

A plan groups steps (transactions). Each step's compensations are *descriptors*
(:class:`Compensate`: a capability name plus JSON arguments), written to the ledger with the
forward effect and *held* when the step commits. Committing the plan retires them all; failing
it (an exception in its block, :meth:`Plan.fail`, its deadline, a ``block`` verdict, a
predicate trigger) makes the engine's plan executor run them last-in-first-out, through the
handler registered for their capability (:meth:`tidegate.Tidegate.capability`), also in a
later process that opens the same data directory after this one is gone::

    tg = tidegate.open("data")

    @tg.capability("cancel_booking")
    def cancel_booking(req: tidegate.CapabilityRequest) -> None:
        travel.cancel(req.args["booking"], idempotency_key=req.key)

    @tidegate.tool(scope=lambda trip, **_: f"travel:booking:{trip}", effect="reversible",
                   compensate=tidegate.Compensate("cancel_booking",
                                                  args={"booking": tidegate.Compensate.output("/id")}))
    def book(trip: str) -> dict: ...

    with tg.plan(owner="ops", deadline=timedelta(days=3)) as plan:
        with plan.transaction(may_touch=["travel:booking:t1"]):
            book("t1")
        with plan.transaction(may_touch=["travel:booking:t2"]):
            book("t2")
    # leaving the block committed the plan; an exception would have failed it

docs/plans.md in the repository is the reference (rules, triggers, stuck plans, ledger records).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, TypeVar, Union

from . import _context, _native
from .errors import InvalidArgument, TidegateError, WrongState
from .transaction import Transaction, _seconds

if TYPE_CHECKING:
    from .engine import Tidegate

__all__ = [
    "CapabilityRequest",
    "Compensate",
    "Plan",
    "PlanDetail",
    "PlanInfo",
    "Registration",
    "StuckPlan",
    "Trigger",
]

#: How long leaving a ``with tg.plan(...)`` block by an exception waits for the unwind (s).
UNWIND_WAIT = 30.0


def _bad(argument: str, value: Any, expected: str) -> InvalidArgument:
    return InvalidArgument(
        f"invalid `{argument}` = {value!r}: expected {expected}", kind="invalid_argument", argument=argument
    )


def _name(value: Any, argument: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value.encode("utf-8", "surrogatepass")) <= 128:
        raise _bad(argument, value, "a capability name of 1 to 128 bytes (UTF-8)")
    return value


class Compensate:
    """A compensation descriptor: how to undo one call of a tool, as data that outlives the
    process (``@tidegate.tool(compensate=tidegate.Compensate(...))``).

    * ``capability``: the name of the handler that undoes the call
      (:meth:`tidegate.Tidegate.capability` registers one in the process that runs the engine).
    * ``args``: the JSON arguments the handler gets as ``req.args``. Anywhere inside them, a
      dict of exactly one member is a reference, resolved when the compensation fires:
      ``{"$output": "/id"}`` (:meth:`output`) is that part of the call's recorded output,
      ``{"$args": "/trip"}`` (:meth:`arg`) that part of its recorded arguments (a dict of
      the tool's parameters by name), and ``{"$literal": v}`` (:meth:`literal`) is ``v``
      as it is. Pointers are JSON pointers (RFC 6901; ``""`` is the whole value); one that
      names nothing makes the compensation fail and the plan wait for its owner. Default:
      ``{"$args": ""}``, the call's arguments as they were. At most 64 KiB of JSON.
    * ``key``: the compensation's idempotency key; default ``<the call's key>#compensate``
      (the call's key is the tool's ``key=`` when it has one). Every attempt carries it.
    * ``probe``: a capability asked (``req.operation == "probe"``, with the compensation's
      key) whether a compensation whose outcome is unknown took effect.
    * ``forward_probe``: a capability asked, with the call's key, whether the call itself
      took effect, when its outcome is unknown.

    Inside a plan step a reversible tool must have one (else :class:`MissingDescriptor`).
    Outside plans, and for a step that aborts, the engine compensates the call in this
    process through the same handler, with the same arguments and key.
    """

    __slots__ = ("capability", "args", "key", "probe", "forward_probe")

    capability: str
    args: Any
    key: Optional[str]
    probe: Optional[str]
    forward_probe: Optional[str]

    def __init__(
        self,
        capability: str,
        args: Any = None,
        *,
        key: Optional[str] = None,
        probe: Optional[str] = None,
        forward_probe: Optional[str] = None,
    ) -> None:
        self.capability = _name(capability, "capability")
        if args is None:
            args = {"$args": ""}
        _native.check_json("args", args)
        if key is not None and (not isinstance(key, str) or not key):
            raise _bad("key", key, "a non-empty str or None")
        self.args = args
        self.key = key
        self.probe = None if probe is None else _name(probe, "probe")
        self.forward_probe = None if forward_probe is None else _name(forward_probe, "forward_probe")

    @staticmethod
    def output(pointer: str = "") -> Dict[str, str]:
        """A reference to (part of) the call's recorded output: ``{"$output": pointer}``."""
        if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
            raise _bad("pointer", pointer, "a JSON pointer: '' or a str starting with '/'")
        return {"$output": pointer}

    @staticmethod
    def arg(name: str) -> Dict[str, str]:
        """A reference to one of the call's arguments by parameter name (``"trip"``), or to
        any part of them by JSON pointer (``"/items/0/sku"``): ``{"$args": "/trip"}``."""
        if not isinstance(name, str) or not name:
            raise _bad("name", name, "a parameter name or a JSON pointer")
        pointer = name if name.startswith("/") else "/" + name.replace("~", "~0").replace("/", "~1")
        return {"$args": pointer}

    @staticmethod
    def literal(value: Any) -> Dict[str, Any]:
        """``value`` sent as it is, even a one-member dict that would read as a reference."""
        return {"$literal": value}

    def _to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"capability": self.capability, "args": self.args}
        for k in ("key", "probe", "forward_probe"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compensate) and self._to_dict() == other._to_dict()

    def __hash__(self) -> int:
        return hash((self.capability, self.key, self.probe, self.forward_probe))

    def __repr__(self) -> str:
        return f"Compensate({self.capability!r}, args={self.args!r})"


@dataclass(frozen=True)
class CapabilityRequest:
    """What a capability handler gets: one compensation or probe to run.

    The handler of a compensation returns ``None`` (done), a ``str`` (done, leaving that
    residue: a fee), or any other JSON value (done, its output); it raises
    :class:`~tidegate.NotApplied` if the compensation certainly did not take effect, and any
    other exception if it may have (the plan waits for its owner unless a ``probe`` can tell).
    A probe handler returns ``True`` or ``Happened(output)`` (took effect), ``False`` (did
    not) or ``None`` (cannot tell). Handlers must be idempotent per ``key``: after a crash
    the executor may send the same compensation again, with the same key, once a probe said
    the earlier attempt did not take effect.
    """

    #: The capability's name.
    capability: str
    #: ``"compensate"`` or ``"probe"``.
    operation: str
    #: The tool of the forward call.
    tool: str
    #: The idempotency key of every attempt (a probe: the key of what it asks about).
    key: str
    #: The descriptor's arguments, references resolved.
    args: Any
    #: The forward call's recorded output, if known.
    output: Any = None


@dataclass(frozen=True)
class PlanInfo:
    """A plan as :meth:`tidegate.Tidegate.plans` lists it."""

    #: The plan's id.
    plan: int
    #: Who answers for it.
    owner: str
    #: ``"open"``, ``"failing"`` (unwinding), ``"stuck"`` (waiting for its owner) or ``"ended"``.
    status: str
    #: Its steps' transaction ids, in order.
    steps: List[int]
    #: Compensations still held (not yet run, skipped or retired).
    held: int
    #: For ``"ended"``: ``"committed"``, ``"unwound"`` or ``"accepted"``.
    outcome: Optional[str] = None
    #: For ``"stuck"``: why, ``{"kind": "irreversible"|"compensation_failed"|..., ...}``.
    stuck: Optional[Dict[str, Any]] = None
    #: The cascade depth of a failing or stuck plan's unwind.
    depth: Optional[int] = None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> "PlanInfo":
        return cls(
            plan=int(d["plan"]),
            owner=str(d["owner"]),
            status=str(d["status"]),
            steps=[int(s) for s in d["steps"]],
            held=int(d["held"]),
            outcome=d.get("outcome"),
            stuck=d.get("stuck"),
            depth=d.get("depth"),
        )


@dataclass(frozen=True)
class Registration:
    """One held compensation of a plan (a registration): the forward call and its undo."""

    #: Its position in the plan (issuance order across steps; the unwind runs highest first).
    seq: int
    #: The step's transaction id.
    tx: int
    #: The effect's id within that transaction.
    effect: int
    #: The forward call's tool.
    tool: str
    #: The forward call's idempotency key.
    key: str
    #: The descriptor (``None``: non-compensable, a gated effect).
    descriptor: Optional[Dict[str, Any]]
    #: The forward call's state: ``"pending"``, ``"externalised"``, ``"not_applied"``, ``"in_doubt"``.
    forward: str
    #: ``"held"``, ``"in_flight"``, ``"in_doubt"``, ``"failed"``, ``"done"``, ``"skipped"`` or
    #: ``"step_aborted"`` (its step aborted: the engine undid it; not counted as held).
    state: str
    #: A verdict posted about it (``"block"`` / ``"allow"``).
    verdict: Optional[str]
    #: Compensation attempts so far.
    attempts: int


@dataclass(frozen=True)
class Trigger:
    """A trigger of a plan and its value now: the plan fails when one becomes ``"true"``;
    ``"unknown"`` waits; ``"false"`` never fires."""

    #: ``"deadline"``, ``"signal"`` or ``"predicate"``.
    kind: str
    #: ``"true"``, ``"unknown"`` or ``"false"``.
    value: str
    #: The deadline (engine milliseconds) or the predicate.
    detail: Any = None


@dataclass(frozen=True)
class PlanDetail(PlanInfo):
    """A plan in full (:meth:`Plan.detail`)."""

    #: The deadline, engine clock milliseconds since the Unix epoch.
    deadline_ms: Optional[int] = None
    #: How deep a cascade may unwind this plan.
    cascade_limit: int = 3
    #: Why it failed: ``{"cause": {"kind": "deadline"|"signal"|"predicate", ...}, "depth": d}``.
    failure: Optional[Dict[str, Any]] = None
    #: Every registration, in unwind order (highest ``seq`` first).
    registrations: List[Registration] = field(default_factory=list)
    #: The deadline, signal and predicate triggers with their values.
    triggers: List[Trigger] = field(default_factory=list)

    @property
    def deadline(self) -> Optional[_dt.datetime]:
        """The deadline as a UTC datetime."""
        if self.deadline_ms is None:
            return None
        return _dt.datetime.fromtimestamp(self.deadline_ms / 1000, tz=_dt.timezone.utc)

    @property
    def held_compensations(self) -> List[Registration]:
        """The compensations still held, in the order an unwind would run them."""
        return [r for r in self.registrations if r.state == "held" and r.descriptor is not None]

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> "PlanDetail":
        info = PlanInfo._from_dict(d)
        return cls(
            plan=info.plan,
            owner=info.owner,
            status=info.status,
            steps=info.steps,
            held=info.held,
            outcome=info.outcome,
            stuck=info.stuck,
            depth=info.depth,
            deadline_ms=d.get("deadline_ms"),
            cascade_limit=int(d["cascade_limit"]),
            failure=d.get("failure"),
            registrations=[Registration(**r) for r in d["registrations"]],
            triggers=[Trigger(kind=t["kind"], value=t["value"], detail=t.get("detail")) for t in d["triggers"]],
        )


@dataclass(frozen=True)
class StuckPlan:
    """A plan in the owner-intervention queue (:meth:`tidegate.Tidegate.stuck_plans`): resolve
    it with ``tg.plan_by_id(plan).resolve("retry" | "accept" | "unwind")``."""

    #: The plan's id.
    plan: int
    #: Why it is stuck: ``{"kind": "irreversible", "seqs": [...]}``, ``{"kind":
    #: "compensation_failed", "seq", "error"}``, ``"compensation_in_doubt"``,
    #: ``"forward_in_doubt"``, ``{"kind": "cascade_limit", "depth", "limit"}``.
    reason: Dict[str, Any]


_VERDICTS = ("block", "allow")
_CHOICES = ("retry", "accept", "unwind")
_SETTLED = ("stuck", "ended")


def _deadline_seconds(deadline: Any) -> Optional[float]:
    if deadline is None:
        return None
    if isinstance(deadline, _dt.timedelta):
        seconds = deadline.total_seconds()
    elif isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
        seconds = float(deadline)
    else:
        raise _bad("deadline", deadline, "a datetime.timedelta or a number of seconds")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise _bad("deadline", deadline, "a non-negative, finite duration")
    return seconds


def _aio() -> Any:
    loop = asyncio.get_running_loop()
    return loop, contextvars.copy_context(), loop.create_future()


class Plan:
    """A plan: use it as ``with tg.plan(owner=...) as plan:`` (or ``async with``), or open it
    with :meth:`tidegate.Tidegate.open_plan` and end it with :meth:`commit` / :meth:`fail`.

    Steps are transactions begun with :meth:`transaction` (or :meth:`begin`); inside the
    ``with`` block, a tool called outside any transaction runs as a one-call step of its own
    (``tg.transaction(...)`` still begins a transaction that is not a step). Leaving the
    ``with`` block normally commits the plan (every held compensation retired at once); an
    exception fails it: the executor unwinds every committed step's compensations
    last-in-first-out, and the block's exit waits for that (up to ``unwind_wait`` seconds)
    before the exception propagates. The plan itself is durable: it outlives this handle and
    the process, and its deadline and triggers keep running in whichever process opens the
    data directory next.
    """

    def __init__(
        self,
        engine: "Tidegate",
        owner: str,
        deadline: Optional[float],
        cascade_limit: Optional[int],
        triggers: Sequence[Mapping[str, Any]],
        unwind_wait: Optional[float],
        native: Any = None,
    ) -> None:
        self._engine = engine
        self._owner = owner
        self._deadline = deadline
        self._cascade_limit = cascade_limit
        self._triggers = list(triggers)
        self._unwind_wait = unwind_wait
        self._native = native
        self._tokens: List["contextvars.Token[Optional[Plan]]"] = []

    # -- opening -----------------------------------------------------------------------------

    def _open(self) -> None:
        if self._native is not None:
            raise _already_open("tg.plan(...)")
        self._native = self._engine._native.plan(self._owner, self._deadline, self._cascade_limit, self._triggers)

    async def _aopen(self) -> None:
        if self._native is not None:
            raise _already_open("tg.plan(...)")
        loop, ctx, fut = _aio()
        self._engine._native.plan(
            self._owner, self._deadline, self._cascade_limit, self._triggers, (loop, ctx, fut)
        )
        self._native = await fut

    def _plan(self) -> Any:
        if self._native is None:
            raise _not_open("a `with`/`async with` block or get one from tg.open_plan()")
        return self._native

    @property
    def id(self) -> int:
        """The plan's id (dense per engine, from 1)."""
        return int(self._plan().id)

    # -- steps ---------------------------------------------------------------------------------

    def transaction(
        self,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        *,
        lease: Optional[float] = None,
        wait_timeout: Optional[float] = None,
    ) -> Transaction:
        """A transaction that is the plan's next step, begun when its ``with`` / ``async
        with`` block is entered (the arguments are :meth:`tidegate.Tidegate.transaction`'s).
        Its own commit and abort work as always; when it commits, the compensations of its
        calls are held until the plan ends. A reversible tool called in it needs a
        :class:`Compensate` descriptor."""
        return Transaction(self._engine, agent, may_touch, lease, wait_timeout, plan=self)

    def begin(
        self, agent: str = "agent", may_touch: Optional[Sequence[str]] = None, *, lease: Optional[float] = None
    ) -> Transaction:
        """Begins the plan's next step now (for explicit ``commit()``/``abort()``)."""
        tx = Transaction(self._engine, agent, may_touch, lease, None, plan=self)
        tx._begin()
        return tx

    async def abegin(
        self, agent: str = "agent", may_touch: Optional[Sequence[str]] = None, *, lease: Optional[float] = None
    ) -> Transaction:
        """The asyncio form of :meth:`begin`."""
        tx = Transaction(self._engine, agent, may_touch, lease, None, plan=self)
        await tx._abegin()
        return tx

    def _begin_native(self, agent: str, may_touch: Optional[List[str]], lease: Optional[float]) -> Any:
        return self._plan().begin(agent, may_touch, lease)

    async def _abegin_native(self, agent: str, may_touch: Optional[List[str]], lease: Optional[float]) -> Any:
        loop, ctx, fut = _aio()
        self._plan().begin(agent, may_touch, lease, (loop, ctx, fut))
        return await fut

    # -- ending and signals --------------------------------------------------------------------

    def commit(self) -> None:
        """Commits the plan: every held compensation is retired at once. Raises
        :class:`PlanError` if a step has not settled or the plan already failed (its
        deadline passed, a trigger fired)."""
        self._plan().commit()

    async def acommit(self) -> None:
        """The asyncio form of :meth:`commit`."""
        loop, ctx, fut = _aio()
        self._plan().commit((loop, ctx, fut))
        await fut

    def fail(self, reason: str) -> None:
        """Fails the plan (an explicit failure signal): the executor unwinds it
        last-in-first-out. Returns at once; :meth:`wait` waits for the unwind."""
        self._plan().fail(_reason(reason))

    async def afail(self, reason: str) -> None:
        """The asyncio form of :meth:`fail`."""
        loop, ctx, fut = _aio()
        self._plan().fail(_reason(reason), (loop, ctx, fut))
        await fut

    #: Alias of :meth:`fail` (the failure *signal* of docs/plans.md).
    signal = fail
    #: Alias of :meth:`afail`.
    asignal = afail

    def verdict(self, tx: Union[Transaction, int], effect: int, verdict: str) -> None:
        """Posts a compliance verdict about effect ``effect`` (its id, as in
        ``tx.outcome.effects``) of step ``tx``: ``"block"`` compensates that effect now (the
        plan stays open; a non-compensable one fails the plan), ``"allow"`` lets it stand."""
        self._plan().verdict(*_verdict_args(tx, effect, verdict))

    async def averdict(self, tx: Union[Transaction, int], effect: int, verdict: str) -> None:
        """The asyncio form of :meth:`verdict`."""
        loop, ctx, fut = _aio()
        self._plan().verdict(*_verdict_args(tx, effect, verdict), (loop, ctx, fut))
        await fut

    def resolve(self, choice: str) -> None:
        """Resolves a stuck plan with its owner's choice: ``"retry"`` (reopen it, or try the
        compensation it stopped at again), ``"accept"`` (keep the partial outcome) or
        ``"unwind"`` (compensate what can be, skipping what cannot)."""
        self._plan().resolve(_choice(choice))

    async def aresolve(self, choice: str) -> None:
        """The asyncio form of :meth:`resolve`."""
        loop, ctx, fut = _aio()
        self._plan().resolve(_choice(choice), (loop, ctx, fut))
        await fut

    def arm(self, predicate: Mapping[str, Any]) -> None:
        """Arms a predicate trigger (a JSON predicate of docs/plans.md, e.g. ``{"tagged":
        {"tx": 3, "effect": 0, "tag": "leaked"}}``): the plan fails when it becomes true.
        One naming another tenant is refused with :class:`CrossTenant`."""
        self._plan().arm(predicate)

    # -- inspection ------------------------------------------------------------------------------

    def detail(self) -> PlanDetail:
        """The plan in full: status, steps, held compensations in unwind order, triggers."""
        return PlanDetail._from_dict(self._plan().detail())

    @property
    def status(self) -> str:
        """``"open"``, ``"failing"``, ``"stuck"`` or ``"ended"``."""
        return self.detail().status

    def wait(self, timeout: Optional[float] = None, *, poll: float = 0.02) -> PlanDetail:
        """Waits until the plan has ended or is stuck (at most ``timeout`` seconds) and
        returns its detail, whatever the state then."""
        return _wait_settled(self.detail, lambda d: d.status in _SETTLED, timeout, poll)

    async def await_settled(self, timeout: Optional[float] = None, *, poll: float = 0.02) -> PlanDetail:
        """The asyncio form of :meth:`wait`."""
        if timeout is not None:
            _seconds(timeout, "timeout", positive=False)
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            d = self.detail()
            if d.status in _SETTLED or (end is not None and loop.time() >= end):
                return d
            await asyncio.sleep(poll)

    # -- the with block --------------------------------------------------------------------------

    def __enter__(self) -> "Plan":
        self._open()
        self._tokens.append(_context.plan.set(self))
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _context.plan.reset(self._tokens.pop())
        _end_block(self, exc)

    async def __aenter__(self) -> "Plan":
        await self._aopen()
        self._tokens.append(_context.plan.set(self))
        return self

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _context.plan.reset(self._tokens.pop())
        if exc is None:
            await self.acommit()
            return
        try:
            await self.afail(_block_failure(exc))
        except TidegateError:
            return  # already failed (its deadline, a trigger) or ended
        if self._unwind_wait:
            await self.await_settled(self._unwind_wait)

    def __repr__(self) -> str:
        if self._native is None:
            return f"<tidegate.Plan owner={self._owner!r} (not open)>"
        return f"<tidegate.Plan {self.id} owner={self._owner!r}>"


def _already_open(use: str) -> WrongState:
    return WrongState(f"the plan is already open; use a new {use}", kind="wrong_state")


def _not_open(how: str) -> WrongState:
    return WrongState(f"the plan is not open: use it in {how}", kind="wrong_state")


class _Ending(Protocol):
    """What ending a plan's ``with`` block needs of a plan handle (in process and over HTTP)."""

    _unwind_wait: Optional[float]

    def commit(self) -> None: ...

    def fail(self, reason: str) -> None: ...

    def wait(self, timeout: Optional[float] = None) -> Any: ...


def _block_failure(exc: BaseException) -> str:
    return f"exception in the plan block: {type(exc).__name__}: {exc}"


def _end_block(plan: _Ending, exc: Optional[BaseException]) -> None:
    """Leaves a plan's ``with`` block: commits the plan, or on an exception fails it and waits
    up to its ``unwind_wait`` seconds for the unwind (not if it had failed or ended already)."""
    if exc is None:
        plan.commit()
        return
    try:
        plan.fail(_block_failure(exc))
    except TidegateError:
        return  # already failed (its deadline, a trigger) or ended
    if plan._unwind_wait:
        plan.wait(plan._unwind_wait)


D = TypeVar("D")


def _wait_settled(detail: Callable[[], D], settled: Callable[[D], bool], timeout: Optional[float], poll: float) -> D:
    """Reads a plan's detail every ``poll`` seconds until ``settled`` says it ended or is
    stuck, or ``timeout`` seconds passed; returns the last detail read."""
    if timeout is not None:
        _seconds(timeout, "timeout", positive=False)
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        d = detail()
        if settled(d) or (end is not None and time.monotonic() >= end):
            return d
        time.sleep(poll)


def _reason(reason: Any) -> str:
    if not isinstance(reason, str):
        raise _bad("reason", reason, "a str")
    return reason


def _choice(choice: Any) -> str:
    if choice not in _CHOICES:
        raise _bad("choice", choice, "'retry', 'accept' or 'unwind'")
    return str(choice)


def _verdict_args(tx: Any, effect: Any, verdict: Any) -> Any:
    if isinstance(tx, Transaction):
        tx = tx.id
    if isinstance(tx, bool) or not isinstance(tx, int) or tx < 0:
        raise _bad("tx", tx, "a step's Transaction or its id")
    return (tx, *_effect_verdict(effect, verdict))


def _effect_verdict(effect: Any, verdict: Any) -> Tuple[int, str]:
    """The checked effect and verdict of a compliance verdict (in process and over HTTP)."""
    if isinstance(effect, bool) or not isinstance(effect, int) or not 0 <= effect < 2**32:
        raise _bad("effect", effect, "an effect id (an int, as in tx.outcome.effects)")
    if verdict not in _VERDICTS:
        raise _bad("verdict", verdict, "'block' or 'allow'")
    return effect, str(verdict)


P = TypeVar("P")


def _new_plan(
    make: Callable[[Any, str, Optional[float], Optional[int], List[Mapping[str, Any]], Optional[float]], P],
    host: Any,
    owner: Any,
    deadline: Any,
    cascade_limit: Any,
    triggers: Any,
    unwind_wait: Any,
) -> P:
    """A plan handle (``make``: :class:`Plan` on an engine, :class:`tidegate.RemotePlan` on a
    client) with its arguments checked."""
    return make(host, *_plan_args(owner, deadline, cascade_limit, triggers, unwind_wait))


def _plan_args(
    owner: Any, deadline: Any, cascade_limit: Any, triggers: Any, unwind_wait: Any
) -> Tuple[str, Optional[float], Optional[int], List[Mapping[str, Any]], Optional[float]]:
    """The checked arguments of a plan (in process and over HTTP)."""
    if not isinstance(owner, str) or not 1 <= len(owner) <= 256:
        raise _bad("owner", owner, "a str of 1 to 256 characters")
    seconds = _deadline_seconds(deadline)
    if cascade_limit is not None and (
        isinstance(cascade_limit, bool) or not isinstance(cascade_limit, int) or not 0 <= cascade_limit <= 64
    ):
        raise _bad("cascade_limit", cascade_limit, "an int from 0 to 64 (default 3)")
    if triggers is None:
        triggers = []
    if isinstance(triggers, (str, bytes, Mapping)) or not isinstance(triggers, Sequence):
        raise _bad("triggers", triggers, "a list of predicate dicts")
    if unwind_wait is not None:
        _seconds(unwind_wait, "unwind_wait", positive=False)
    return owner, seconds, cascade_limit, list(triggers), unwind_wait


def _descriptor_arg(value: Any, argument: str) -> Optional[Dict[str, Any]]:
    """A compensation descriptor given as an argument (``None`` or a :class:`Compensate`), as
    the dict the engine and the server take."""
    if value is None:
        return None
    if not isinstance(value, Compensate):
        raise _bad(argument, value, "a tidegate.Compensate descriptor")
    return value._to_dict()


def _check_capability_handler(fn: Any, name: str) -> None:
    """A capability's handler as ``capability(name, handler)`` takes it (engine and HTTP client)."""
    if not callable(fn):
        raise _bad("handler", fn, f"a callable (the handler of capability `{name}`)")
