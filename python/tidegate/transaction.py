"""Transactions: the ``with`` / ``async with`` block, its calls, its settlement."""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _context
from .errors import InvalidArgument, PartialCommit, TidegateError, WrongState
from .outcome import Held, Outcome, ReadResult, _fill_held
from .tools import Tool, _check_callable, _check_tool, _is_async

if TYPE_CHECKING:
    from .engine import Tidegate
    from .plans import Plan

__all__ = ["Transaction", "current_transaction"]


def current_transaction() -> Optional["Transaction"]:
    """The transaction of the innermost ``with tg.transaction(...)`` block, if any."""
    return _context.current.get()


def _check_agent(agent: Any) -> None:
    if not isinstance(agent, str):
        raise InvalidArgument(f"invalid `agent` = {agent!r}: expected a str", kind="invalid_argument", argument="agent")


def _scopes_arg(may_touch: Optional[Sequence[str]]) -> Optional[List[str]]:
    if may_touch is None:
        return None
    if isinstance(may_touch, str) or not all(isinstance(s, str) for s in may_touch):
        raise InvalidArgument(
            f"invalid `may_touch` = {may_touch!r}: expected a list of scope strings like 'stripe:charge:ch_1'",
            kind="invalid_argument",
            argument="may_touch",
        )
    return list(may_touch)


def _seconds(value: Any, argument: str, positive: bool) -> None:
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0)
    if bad:
        what = "a positive" if positive else "a non-negative"
        raise InvalidArgument(
            f"invalid `{argument}` = {value!r}: expected {what} number of seconds", kind="invalid_argument", argument=argument
        )


def _already_begun() -> WrongState:
    return WrongState("the transaction has already begun; use a new tg.transaction(...)", kind="wrong_state")


def _not_begun() -> WrongState:
    return WrongState(
        "the transaction has not begun: use it in a `with`/`async with` block or get one from tg.begin()",
        kind="wrong_state",
    )


def _partial_message(o: Outcome) -> str:
    p = o.partial or {}
    names = {e.id: e.tool for e in o.effects}

    def name(i: Any) -> str:
        return f"#{i} `{names.get(i, '?')}`"

    released = ", ".join(name(i) for i in p.get("released", ())) or "none"
    later = ", ".join(name(i) for i in p.get("not_attempted", ())) or "none"
    return (
        f"transaction {o.tx} committed only in part: the release of effect {name(p.get('failed'))} failed after "
        f"retries ({p.get('error')}); released before it: {released}; never attempted: {later}"
    )


class Transaction:
    """A transaction. Use it as ``with tg.transaction(...) as tx:`` or ``async with``.

    Inside the block, calls of declared tools go through the engine. ``outcome`` holds the
    settlement (every effect with its tag) once the transaction has committed or aborted.
    """

    #: The settlement, once committed or aborted.
    outcome: Optional[Outcome]

    #: What :meth:`call` takes as its tool (the message of its refusal).
    _TOOL_EXPECTED = "a function declared with @tidegate.tool"

    def __init__(
        self,
        engine: "Tidegate",
        agent: str,
        may_touch: Optional[Sequence[str]],
        lease: Optional[float],
        wait_timeout: Optional[float],
        native: Any = None,
        branch: bool = False,
        plan: Optional["Plan"] = None,
    ) -> None:
        self._setup(agent, may_touch, lease, wait_timeout)
        self._engine = engine
        self._native = native
        self._branch = branch
        self._plan = plan

    def _setup(
        self, agent: str, may_touch: Optional[Sequence[str]], lease: Optional[float], wait_timeout: Optional[float]
    ) -> None:
        """Checks and keeps the arguments every transaction takes (in process and over HTTP)."""
        _check_agent(agent)
        self._agent = agent
        self._may_touch = _scopes_arg(may_touch)
        if lease is not None:
            _seconds(lease, "lease", positive=True)
        if wait_timeout is not None:
            _seconds(wait_timeout, "wait_timeout", positive=False)
        self._lease = lease
        self._wait_timeout = wait_timeout
        self._held: List[Held] = []
        self._tokens: List["contextvars.Token[Optional[Transaction]]"] = []
        self.outcome = None

    # -- lifecycle ----------------------------------------------------------------------------

    def _begin(self) -> None:
        if self._native is not None:
            raise _already_begun()
        if self._plan is not None:
            self._native = self._plan._begin_native(self._agent, self._may_touch, self._lease)
        else:
            self._native = self._engine._native.begin(self._agent, self._may_touch, self._lease)

    async def _abegin(self) -> None:
        if self._native is not None:
            raise _already_begun()
        if self._plan is not None:
            self._native = await self._plan._abegin_native(self._agent, self._may_touch, self._lease)
        else:
            self._native = self._engine._native.begin(self._agent, self._may_touch, self._lease)

    def _tx(self) -> Any:
        n = self._native
        if n is None:
            raise _not_begun()
        return n

    @property
    def plan(self) -> Optional["Plan"]:
        """The plan this transaction is a step of, if any."""
        return self._plan

    @property
    def id(self) -> int:
        """The transaction id."""
        return int(self._tx().id)

    @property
    def epoch(self) -> int:
        """The epoch (commit order of transactions that touch the same scopes)."""
        return int(self._tx().epoch)

    @property
    def state(self) -> Optional[str]:
        """``"open"``, ``"sealed"``, ``"waiting"``, ``"committing"``, ``"aborting"``, or
        ``None`` once settled (or before it began)."""
        if self._native is None:
            return None
        state: Optional[str] = self._native.state
        return state

    def _as_current(self) -> "_CurrentGuard":
        return _CurrentGuard(self)

    def __enter__(self) -> "Transaction":
        if not self._branch:
            self._begin()
        self._tokens.append(_context.current.set(self))
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _context.current.reset(self._tokens.pop())
        if self._branch:
            return
        if exc is None:
            if self.state is not None:
                self.commit()
            return
        if self._settled_by(exc):
            return
        if self.state in ("open", "sealed"):
            try:
                self.abort(f"exception in the transaction block: {type(exc).__name__}: {exc}")
            except TidegateError:
                pass  # the engine settled it meanwhile (a protocol violation aborts at once)

    async def __aenter__(self) -> "Transaction":
        if self._plan is None or self._branch:
            return self.__enter__()
        await self._abegin()
        self._tokens.append(_context.current.set(self))
        return self

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _context.current.reset(self._tokens.pop())
        if self._branch:
            return
        if exc is None:
            if self.state is not None:
                await self.acommit()
            return
        if self._settled_by(exc):
            return
        if self.state in ("open", "sealed"):
            try:
                await self.aabort(f"exception in the transaction block: {type(exc).__name__}: {exc}")
            except TidegateError:
                pass  # the engine settled it meanwhile (a protocol violation aborts at once)

    def _settled_by(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the engine's report that this transaction already settled."""
        if isinstance(exc, TidegateError) and exc.outcome is not None and self.state is None:
            self.outcome = exc.outcome
            return True
        return False

    # -- reads and effects --------------------------------------------------------------------

    def read(self, scope: str) -> ReadResult:
        """Records a read of ``scope``: the commit aborts with :class:`StaleRead` if another
        transaction commits a write to it first."""
        if not isinstance(scope, str):
            raise InvalidArgument(f"invalid `scope` = {scope!r}: expected a str", kind="invalid_argument", argument="scope")
        return self._read(scope)

    def _read(self, scope: str) -> ReadResult:
        version, staged = self._tx().read(scope)
        return ReadResult(version, staged)

    def call(self, tool: Tool, *args: Any, **kwargs: Any) -> Any:
        """Calls ``tool(*args, **kwargs)`` through the engine. Returns the tool's result for
        executed (or replayed) effects, a :class:`Held` for staged/queued ones."""
        _check_tool(tool, self._TOOL_EXPECTED)
        args, kwargs = tool._bind(args, kwargs)
        return self._call(tool, args, kwargs, None)

    #: Alias of :meth:`call`.
    effect = call

    def _call_tool(self, tool: Tool, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """A declared tool called inside this transaction's block (``Tool.__call__``)."""
        args, kwargs = tool._bind(args, kwargs)
        return self._call(tool, args, kwargs, None)

    def _prepare(
        self,
        tool: Tool,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        scopes: Optional[List[str]],
        key: Optional[str],
    ) -> Tuple[Any, Any, List[str], Optional[str], Optional[str]]:
        # In front of every call of every tool: `_tx`, `_handle` and `Tool._footprint` written
        # out (each frame costs about a tenth of a microsecond here).
        native = self._native
        if native is None:
            raise _not_begun()
        handle = self._engine._handles.get(tool)
        if handle is None:
            handle = self._engine.register(tool)
        if scopes is None:
            scopes = tool._const_scopes
            if scopes is None:
                scopes = tool._scopes(args, kwargs)
        if key is None and tool.key is not None:
            key = tool._key(args, kwargs)
        call_id = (key or uuid.uuid4().hex) if tool._any_call_id else None
        return native, handle, scopes, key, call_id

    def _call(
        self,
        tool: Tool,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        scopes: Optional[List[str]],
        key: Optional[str] = None,
    ) -> Any:
        native, handle, scopes, key, call_id = self._prepare(tool, args, kwargs, scopes, key)
        try:
            ack = native.call(handle, args, kwargs or None, scopes, key, call_id)
        except TidegateError as e:
            self._record_abort(e)
            raise
        return self._answer(tool.name, ack)

    def _answer(self, tool_name: str, ack: Any) -> Any:
        """The agent's answer to a call: the output of an executed or replayed call, else a
        :class:`Held` (filled in when the commit releases it)."""
        if not ack.held:
            return ack.output
        return self._hold(tool_name, ack.effect, ack.kind)

    def _hold(self, tool_name: str, effect: int, kind: str) -> Held:
        """The :class:`Held` of a staged or queued effect, filled in when the commit releases it."""
        held = Held(tool_name, effect, kind)
        self._held.append(held)
        return held

    async def acall(self, tool: Tool, *args: Any, **kwargs: Any) -> Any:
        """The asyncio form of :meth:`call` (coroutine tools are awaited on this loop)."""
        _check_tool(tool, self._TOOL_EXPECTED)
        args, kwargs = tool._bind(args, kwargs)
        return await self._acall(tool, args, kwargs, None)

    async def _acall(
        self,
        tool: Tool,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        scopes: Optional[List[str]],
        key: Optional[str] = None,
    ) -> Any:
        native, handle, scopes, key, call_id = self._prepare(tool, args, kwargs, scopes, key)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        native.call_async(handle, args, kwargs or None, scopes, key, call_id, loop, contextvars.copy_context(), fut)
        try:
            ack = await fut
        except TidegateError as e:
            self._record_abort(e)
            raise
        return self._answer(tool.name, ack)

    # -- settlement ---------------------------------------------------------------------------

    def seal(self) -> None:
        """Freezes the footprint (done by :meth:`commit` if needed)."""
        self._tx().seal()

    def add_hook(self, hook: Callable[[Dict[str, Any]], Any], name: Optional[str] = None) -> None:
        """Adds a pre-commit hook for this transaction only (see :meth:`Tidegate.add_hook`)."""
        _check_callable(hook, "hook", name or "hook", optional=False)
        self._tx().add_hook(name or getattr(hook, "__name__", "hook"), hook, _is_async(hook))

    def _settled(self, settled: Any) -> Outcome:
        self.outcome = Outcome._from_dict(settled.outcome)
        if self._held:
            _fill_held(self._held, self.outcome, list(settled.released))
        if self.outcome.partial is not None:
            raise PartialCommit(
                _partial_message(self.outcome), kind="partial_commit", retryable=False, outcome=settled.outcome
            )
        return self.outcome

    def _record_abort(self, e: TidegateError) -> None:
        if e.outcome is not None:
            self.outcome = e.outcome

    def _commit_timeout(self, wait_timeout: Optional[float]) -> Optional[float]:
        """A commit's ``wait_timeout``: the argument, else the transaction's."""
        return self._wait_timeout if wait_timeout is None else wait_timeout

    def commit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """Seals (if open) and commits: runs pre-commit hooks, waits for earlier transactions
        on the same scopes, validates reads, releases held effects in issuance order. Raises an
        :class:`Aborted` subclass (with ``outcome``) if the transaction aborts instead, and
        :class:`PartialCommit` (with ``outcome``) if a held effect could not be released after
        earlier ones fired."""
        wt = self._commit_timeout(wait_timeout)
        try:
            return self._settled(self._tx().commit(wt))
        except TidegateError as e:
            self._record_abort(e)
            raise

    async def acommit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """The asyncio form of :meth:`commit`."""
        wt = self._commit_timeout(wait_timeout)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._tx().commit_async(wt, loop, contextvars.copy_context(), fut)
        try:
            return self._settled(await fut)
        except TidegateError as e:
            self._record_abort(e)
            raise

    def abort(self, reason: str = "aborted by the caller") -> Outcome:
        """Aborts: held effects are dropped, executed ones compensated in reverse issuance
        order. Returns the outcome."""
        return self._settled(self._tx().abort(str(reason)))

    async def aabort(self, reason: str = "aborted by the caller") -> Outcome:
        """The asyncio form of :meth:`abort`."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._tx().abort_async(str(reason), loop, contextvars.copy_context(), fut)
        return self._settled(await fut)

    def __repr__(self) -> str:
        if self._native is None:
            return f"<tidegate.Transaction agent={self._agent!r} (not begun)>"
        return f"<tidegate.Transaction {self.id} epoch={self.epoch} {self.state or 'settled'}>"


class _CurrentGuard:
    def __init__(self, tx: Transaction) -> None:
        self._tx = tx
        self._token: "Optional[contextvars.Token[Optional[Transaction]]]" = None

    def __enter__(self) -> Transaction:
        self._token = _context.current.set(self._tx)
        return self._tx

    def __exit__(self, *exc: Any) -> None:
        if self._token is not None:
            _context.current.reset(self._token)
