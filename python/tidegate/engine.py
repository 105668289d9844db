"""Engines: :func:`open`, :class:`Tidegate` and its options."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
import datetime as _dt
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union, overload

from . import _context
from . import _native
from .errors import InvalidArgument, TidegateError
from .outcome import RunResult
from .plans import Plan, PlanDetail, PlanInfo, StuckPlan, _check_capability_handler, _name, _new_plan
from .speculation import Speculation
from .tools import Tool, _check_callable, _check_tool, _is_async
from .transaction import Transaction, _check_agent, _scopes_arg

__all__ = ["LEVELS", "ISOLATIONS", "ScopeType", "Tidegate", "open", "default_engine"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: The consistency levels (docs/levels.md): each adds one discipline to the one before.
LEVELS: Tuple[str, ...] = ("L0", "L1", "L2", "L3", "L4")

#: How L1 and above prevent stale generation.
ISOLATIONS: Tuple[str, ...] = ("serializable", "snapshot", "pessimistic")


@dataclass(frozen=True)
class ScopeType:
    """How scopes of one type are canonicalised (``tidegate.open(scope_types={...})``).

    * ``style="colon"``: segments separated by ``:`` (the rule of every type nobody
      registered); ``style="posix"``: an absolute ``/`` path, with ``\\`` read as ``/`` and
      ``.`` and ``..`` resolved.
    * ``case="sensitive"`` (default) or ``"insensitive"`` (the path is lowercased, as for e-mail
      addresses or SQL identifiers).

    Registering a type changes only how its scopes are canonicalised; every well-formed
    ``type:path`` is accepted whether its type is registered or not.
    """

    style: str = "colon"
    case: str = "sensitive"

    def __post_init__(self) -> None:
        if self.style not in ("colon", "posix"):
            raise InvalidArgument(
                f"invalid `style` = {self.style!r}: expected 'colon' or 'posix'", kind="invalid_argument", argument="style"
            )
        if self.case not in ("sensitive", "insensitive"):
            raise InvalidArgument(
                f"invalid `case` = {self.case!r}: expected 'sensitive' or 'insensitive'",
                kind="invalid_argument",
                argument="case",
            )


def _scope_types(types: Optional[Mapping[str, Union[ScopeType, Mapping[str, str]]]]) -> List[Tuple[str, str, str]]:
    if types is None:
        return []
    if not isinstance(types, Mapping):
        raise InvalidArgument(
            f"invalid `scope_types` = {types!r}: expected a mapping of type name to tidegate.ScopeType",
            kind="invalid_argument",
            argument="scope_types",
        )
    out = []
    for name, t in types.items():
        if not isinstance(name, str):
            raise InvalidArgument(
                f"invalid `scope_types` key {name!r}: expected a str", kind="invalid_argument", argument="scope_types"
            )
        if isinstance(t, Mapping):
            unknown = set(t) - {"style", "case"}
            if unknown:
                raise InvalidArgument(
                    f"invalid `scope_types[{name!r}]`: unknown fields {sorted(unknown)}; expected style, case",
                    kind="invalid_argument",
                    argument="scope_types",
                )
            t = ScopeType(**t)
        if not isinstance(t, ScopeType):
            raise InvalidArgument(
                f"invalid `scope_types[{name!r}]` = {t!r}: expected a tidegate.ScopeType or a dict with style, case",
                kind="invalid_argument",
                argument="scope_types",
            )
        out.append((name, t.style, t.case))
    return out


def _check_attempts(attempts: Any) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidArgument(
            f"invalid `attempts` = {attempts!r}: expected an int >= 1", kind="invalid_argument", argument="attempts"
        )


class Tidegate:
    """An engine: begin transactions and speculation groups, register hooks, recover.

    Create one with :func:`open`. Safe to use from many threads and asyncio tasks at once.
    """

    #: The data directory, or ``None`` in memory.
    data_dir: Optional[str]
    #: The trace file (operation records for ``tidegate check``), or ``None``.
    trace: Optional[str]

    def __init__(self, native: Any, data_dir: Optional[str] = None, trace: Optional[str] = None) -> None:
        self._native = native
        self._handles: Dict[Tool, Any] = {}
        self._names: Dict[str, Tool] = {}
        self.data_dir = data_dir
        self.trace = trace

    @property
    def level(self) -> str:
        """The consistency level, ``"L0"`` … ``"L4"``."""
        return str(self._native.settings()[0])

    @property
    def isolation(self) -> str:
        """The isolation strategy of L1 and above: ``"serializable"``, ``"snapshot"`` or
        ``"pessimistic"``."""
        return str(self._native.settings()[1])

    # -- tools --------------------------------------------------------------------------------

    def _handle(self, t: Tool) -> Any:
        h = self._handles.get(t)
        if h is not None:
            return h
        return self.register(t)

    def register(self, t: Tool) -> Any:
        """Registers a tool with this engine (done on first use; needed before :meth:`recover`).
        Refuses a different tool under a name already taken."""
        _check_tool(t)
        h = self._handles.get(t)
        if h is not None:
            return h
        other = self._names.get(t.name)
        if other is not None and other.fn is not t.fn:
            raise InvalidArgument(
                f"invalid tool `name` = {t.name!r}: already registered on this engine for {other.fn!r}; "
                "pass name=... to tell them apart",
                kind="invalid_argument",
                argument="name",
            )
        if other is not None:
            # The same function bound to another engine handle (Tool.on): share the handle.
            h = self._handles[other]
        else:
            h = self._native.tool(
                t.name,
                t.effect,
                t.fn,
                list(t._names),
                call_async=_is_async(t.fn),
                compensate=t.compensate,
                compensate_async=_is_async(t.compensate),
                probe=t.probe,
                probe_async=_is_async(t.probe),
                wants_call_id=t._wants_call_id,
                descriptor=None if t.descriptor is None else t.descriptor._to_dict(),
            )
            self._names[t.name] = t
        self._handles[t] = h
        return h

    # -- transactions -------------------------------------------------------------------------

    def transaction(
        self,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        *,
        lease: Optional[float] = None,
        wait_timeout: Optional[float] = None,
    ) -> Transaction:
        """A transaction, begun when its ``with`` / ``async with`` block is entered. Leaving the
        block seals and commits it; an exception aborts it (compensating what ran) and
        propagates. ``may_touch`` declares the scopes it may touch: transactions on other
        scopes then need not wait for it, and touching anything else aborts it. ``lease``
        (seconds) overrides the engine's lease for this transaction: if it is still open when
        the lease ends, it is aborted. ``wait_timeout`` bounds how long its commit may wait for
        earlier transactions (``WaitTimeout``, retryable)."""
        return Transaction(self, agent, may_touch, lease, wait_timeout)

    def begin(
        self, agent: str = "agent", may_touch: Optional[Sequence[str]] = None, *, lease: Optional[float] = None
    ) -> Transaction:
        """Begins a transaction now (for explicit ``commit()``/``abort()`` without ``with``)."""
        tx = Transaction(self, agent, may_touch, lease, None)
        tx._begin()
        return tx

    def speculate(
        self,
        branches: int,
        *,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        lease: Optional[float] = None,
    ) -> Speculation:
        """A speculation group of ``branches`` transactions sharing one epoch. Run each
        alternative in a branch, then ``spec.commit(winner)`` (``await spec.acommit(winner)``
        with asyncio): the others abort and leave no bufferable or gated residue (their
        executed effects are compensated). Usable as ``with`` and ``async with``."""
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise InvalidArgument(
                f"invalid `branches` = {branches!r}: expected an int >= 1", kind="invalid_argument", argument="branches"
            )
        _check_agent(agent)
        if lease is not None:
            Transaction(self, agent, None, lease, None)  # validates the lease
        return Speculation(self, self._native.speculate(branches, agent, _scopes_arg(may_touch), lease))

    def run(
        self,
        body: Callable[[Transaction], T],
        *,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        attempts: int = 5,
        backoff: float = 0.02,
        lease: Optional[float] = None,
    ) -> RunResult[T]:
        """Runs ``body(tx)`` in a transaction and commits it; on a retryable abort (a stale
        read, an expired lease, a wait timeout) runs it again in a new transaction at a fresh
        epoch, up to ``attempts`` times in all (the engine's ``Tidegate::run``). If ``body``
        raises, the transaction aborts and the exception propagates (retried only if it is a
        retryable Tidegate error)."""
        _check_attempts(attempts)
        attempt = 1
        while True:
            tx = self.begin(agent, may_touch, lease=lease)
            try:
                with tx._as_current():
                    value = body(tx)
                outcome = tx.commit()
                return RunResult(value, outcome, attempt)
            except TidegateError as e:
                if tx.state is not None:
                    tx.abort(f"transaction body failed: {e}")
                if e.retryable and attempt < attempts:
                    time.sleep(min(backoff * (2 ** (attempt - 1)), 1.0))
                    attempt += 1
                    continue
                raise
            except BaseException as e:
                if tx.state is not None:
                    tx.abort(f"transaction body failed: {type(e).__name__}: {e}")
                raise

    async def arun(
        self,
        body: Callable[[Transaction], Awaitable[T]],
        *,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        attempts: int = 5,
        backoff: float = 0.02,
        lease: Optional[float] = None,
    ) -> RunResult[T]:
        """The asyncio form of :meth:`run`: ``body`` is a coroutine function."""
        _check_attempts(attempts)
        attempt = 1
        while True:
            tx = self.begin(agent, may_touch, lease=lease)
            try:
                with tx._as_current():
                    value = await body(tx)
                outcome = await tx.acommit()
                return RunResult(value, outcome, attempt)
            except TidegateError as e:
                if tx.state is not None:
                    await tx.aabort(f"transaction body failed: {e}")
                if e.retryable and attempt < attempts:
                    await asyncio.sleep(min(backoff * (2 ** (attempt - 1)), 1.0))
                    attempt += 1
                    continue
                raise
            except BaseException as e:
                if tx.state is not None:
                    await tx.aabort(f"transaction body failed: {type(e).__name__}: {e}")
                raise

    # -- plans -----------------------------------------------------------------------------------

    def plan(
        self,
        owner: str,
        *,
        deadline: Union[_dt.timedelta, float, None] = None,
        cascade_limit: Optional[int] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
        unwind_wait: Optional[float] = 30.0,
    ) -> Plan:
        """A plan (:class:`tidegate.Plan`), opened when its ``with`` / ``async with`` block is
        entered: run its steps with ``plan.transaction(...)``. Leaving the block commits it
        (every held compensation retired); an exception fails it: the held compensations run
        last-in-first-out, and the block waits up to ``unwind_wait`` seconds for that before
        the exception propagates (``None`` or ``0``: no wait).

        * ``owner``: who answers for the plan (1 to 256 characters).
        * ``deadline``: a ``timedelta`` or seconds from now; the plan fails if it has not
          committed by then, also if this process is gone (the next process that opens the
          data directory fires it).
        * ``cascade_limit``: how deep a cascade of compensations triggering other plans may
          go before this plan waits for its owner instead (0 to 64, default 3).
        * ``triggers``: predicate triggers (JSON, docs/plans.md "Predicates").
        """
        return _new_plan(Plan, self, owner, deadline, cascade_limit, triggers, unwind_wait)

    def open_plan(
        self,
        owner: str,
        *,
        deadline: Union[_dt.timedelta, float, None] = None,
        cascade_limit: Optional[int] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> Plan:
        """Opens a plan now (for an explicit ``commit()``/``fail()`` without ``with``); the
        arguments are :meth:`plan`'s."""
        p = _new_plan(Plan, self, owner, deadline, cascade_limit, triggers, None)
        p._open()
        return p

    async def aopen_plan(
        self,
        owner: str,
        *,
        deadline: Union[_dt.timedelta, float, None] = None,
        cascade_limit: Optional[int] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> Plan:
        """The asyncio form of :meth:`open_plan`."""
        p = _new_plan(Plan, self, owner, deadline, cascade_limit, triggers, None)
        await p._aopen()
        return p

    def plan_by_id(self, plan: int) -> Plan:
        """A handle on plan ``plan`` of this engine (opened by this process or an earlier
        one): to resolve, signal or inspect it. Raises :class:`PlanError` if there is none."""
        if isinstance(plan, bool) or not isinstance(plan, int) or plan < 0:
            raise InvalidArgument(
                f"invalid `plan` = {plan!r}: expected a plan id (an int)", kind="invalid_argument", argument="plan"
            )
        native = self._native.plan_by_id(plan)
        d = PlanDetail._from_dict(native.detail())
        return Plan(self, d.owner, None, d.cascade_limit, [], None, native=native)

    def plans(self) -> List[PlanInfo]:
        """Every plan of this engine (in its data directory), by id."""
        return [PlanInfo._from_dict(d) for d in self._native.plans()]

    def stuck_plans(self) -> List[StuckPlan]:
        """The owner-intervention queue: plans the executor will not finish on its own (a
        non-compensable effect fired before the plan failed, a compensation failed or has an
        unknown outcome, a cascade went too deep), with why. Resolve each with
        ``tg.plan_by_id(p.plan).resolve("retry" | "accept" | "unwind")``."""
        return [StuckPlan(int(p), dict(r)) for p, r in self._native.stuck_plans()]

    @overload
    def capability(self, name: str) -> Callable[[F], F]: ...

    @overload
    def capability(self, name: str, handler: F) -> F: ...

    def capability(self, name: str, handler: Optional[F] = None) -> Any:
        """Registers the handler of capability ``name`` (a decorator, or called with the
        handler)::

            @tg.capability("cancel_booking")
            def cancel_booking(req: tidegate.CapabilityRequest) -> None: ...

        The plan executor sends it the compensations and probes of descriptors naming
        ``name`` (:class:`tidegate.Compensate`); calls of a descriptor tool that abort are
        compensated through it too. ``handler(req)`` gets a :class:`tidegate.CapabilityRequest`
        (see there for what to return and raise); coroutine functions are run to completion
        on an event loop of their own (the executor serves no caller's loop). Register
        every capability before :meth:`recover`: the executor starts there and fires what is
        due at once. Replaces an earlier handler of the same name."""
        _name(name, "name")

        def register(fn: F) -> F:
            _check_capability_handler(fn, name)
            self._native.capability(name, fn, _is_async(fn))
            return fn

        if handler is not None:
            return register(handler)
        return register

    # -- hooks, recovery, inspection ----------------------------------------------------------

    def add_hook(self, hook: Callable[[Dict[str, Any]], Any], name: Optional[str] = None) -> None:
        """Adds a pre-commit hook run on every transaction's sealed footprint. ``hook(view)``
        gets ``{"tx", "epoch", "agent", "reads", "effects"}`` and returns ``True``/``None`` to
        approve, ``False`` or a reason (str) to veto; an exception vetoes (it becomes the
        ``Vetoed`` error's cause). Coroutine functions are awaited."""
        _check_callable(hook, "hook", name or "hook", optional=False)
        self._native.add_hook(name or getattr(hook, "__name__", "hook"), hook, _is_async(hook))

    def recover(self, *tools: Tool) -> Dict[str, Any]:
        """Registers ``tools`` and finishes what a previous process left in this engine's data
        directory: in-doubt calls are resolved through probes (never re-executed), interrupted
        commits and aborts completed, orphaned open transactions aborted (compensated).
        Register every tool the ledger names first, and every capability plans use
        (:meth:`capability`): if the ledger holds plans, their executor starts here and runs
        what is due (deadlines that passed while no process was running). Returns a report."""
        for t in tools:
            self.register(t)
        return dict(self._native.recover())

    def version(self, scope: str) -> int:
        """The committed version of ``scope`` (advances on every committed write)."""
        return int(self._native.version(scope))

    def canonical_scope(self, scope: str) -> str:
        """The canonical form of ``scope``, as the engine records and compares it; raises
        :class:`InvalidScope` naming the rule it breaks."""
        return str(self._native.canonical_scope(scope))

    def stats(self) -> Dict[str, int]:
        """Counters: ``unfinished``, ``waiting``, ``committed``, ``aborted``, ``keys``."""
        return dict(self._native.stats())

    def check_integrity(self) -> None:
        """Runs the engine's integrity check; raises :class:`TidegateError` if it fails."""
        self._native.check_integrity()

    def flush_trace(self) -> None:
        """Writes buffered operation records to the trace file (done by :meth:`close` and at
        interpreter exit)."""
        self._native.flush_trace()

    def close(self) -> None:
        """Releases this handle (the data directory closes once no transaction uses it) and
        flushes the trace file."""
        self._native.close()
        if _context.default is self:
            _context.default = None

    def __enter__(self) -> "Tidegate":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.data_dir or "memory"
        return f"<tidegate.Tidegate {where} {self.level}>"


def open(  # noqa: A001 - mirrors the builtin on purpose: tidegate.open(...)
    data_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    level: str = "L4",
    isolation: str = "serializable",
    lease: float = 30.0,
    trace: Optional[Union[str, "os.PathLike[str]"]] = None,
    scope_types: Optional[Mapping[str, Union[ScopeType, Mapping[str, str]]]] = None,
    first_committer_wins: bool = False,
    retry_attempts: int = 4,
    retry_backoff: float = 0.02,
) -> Tidegate:
    """Opens an engine: in memory when ``data_dir`` is ``None``, otherwise on the embedded
    SQLite ledger in ``data_dir`` (created if needed; the directory is locked while open).
    ``data_dir`` may also be a store URL, read as the server and the CLI read one:
    ``"memory:"``, ``"sqlite:DIR"`` (another ``scheme:`` is refused naming ``store``).

    * ``level``: the consistency level, ``"L0"`` … ``"L4"`` (default ``"L4"``, every
      discipline; see docs/levels.md): L1 validates reads at commit, L2 adds cascading aborts
      over what was read, L3 externalises effects in issuance order, L4 pins tool signatures.
      L0 checks nothing (for measurement).
    * ``isolation``: how L1 and above prevent stale generation: ``"serializable"`` (every read
      validated at commit), ``"snapshot"`` (snapshot isolation with its read-only bypass) or
      ``"pessimistic"`` (no-wait locks on may-touch scopes).
    * ``lease``: seconds an open transaction may live before it is aborted (override per
      transaction with ``tg.transaction(lease=...)``).
    * ``trace``: a file to write one operation record per finished transaction to (JSON Lines,
      created or truncated), which ``tidegate check FILE`` reads to prove which anomalies
      occurred. Flushed by ``close()`` and at interpreter exit.
    * ``scope_types``: ``{type name: ScopeType(...)}`` for types that need a rule other than
      the default. Every well-formed ``type:path`` is a scope whether its type is registered
      or not: by default the path is ``:``-separated and case-sensitive; ``fs`` (a POSIX path)
      and ``mail``, ``db`` (case-insensitive) are built in. Scopes are at most 4,096 bytes and
      256 segments.
    * ``first_committer_wins``: let later transactions commit first and abort earlier ones on
      stale reads instead of waiting in epoch order;
    * ``retry_attempts`` / ``retry_backoff``: bounded retry of releases, compensations,
      tool calls that raise :class:`~tidegate.TransientError` or
      ``NotApplied(retry=True)``, and calls whose probe says they did not happen. A call
      that raised anything else is never called again without its probe's word.

    The engine becomes the :func:`default_engine` for tool calls made outside a transaction.
    """
    for argname, v in (("lease", lease), ("retry_backoff", retry_backoff)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise InvalidArgument(
                f"invalid `{argname}` = {v!r}: expected a non-negative number of seconds",
                kind="invalid_argument",
                argument=argname,
            )
    if isinstance(retry_attempts, bool) or not isinstance(retry_attempts, int) or retry_attempts < 1:
        raise InvalidArgument(
            f"invalid `retry_attempts` = {retry_attempts!r}: expected an int >= 1",
            kind="invalid_argument",
            argument="retry_attempts",
        )
    for argname, p in (("data_dir", data_dir), ("trace", trace)):
        if p is not None and not isinstance(p, (str, os.PathLike)):
            raise InvalidArgument(
                f"invalid `{argname}` = {p!r}: expected a path or None", kind="invalid_argument", argument=argname
            )
    if not isinstance(level, str) or level.strip().upper() not in LEVELS:
        raise InvalidArgument(
            f"invalid `level` = {level!r}: expected one of {', '.join(LEVELS)}", kind="invalid_argument", argument="level"
        )
    if not isinstance(isolation, str) or isolation.strip().lower() not in ISOLATIONS:
        raise InvalidArgument(
            f"invalid `isolation` = {isolation!r}: expected one of {', '.join(ISOLATIONS)}",
            kind="invalid_argument",
            argument="isolation",
        )
    types = _scope_types(scope_types)
    path = None if data_dir is None else os.fspath(data_dir)
    trace_path = None if trace is None else os.fspath(trace)
    native = _native.Engine(
        path,
        float(lease),
        bool(first_committer_wins),
        retry_attempts,
        float(retry_backoff),
        level.strip().upper(),
        isolation.strip().lower(),
        trace_path,
        types,
    )
    tg = Tidegate(native, path, trace_path)
    _context.default = tg
    return tg


def default_engine() -> Tidegate:
    """The engine tool calls outside any transaction use: the last one :func:`open` returned
    (an in-memory engine is opened on first need)."""
    if _context.default is None:
        _context.default = open()
    return _context.default
