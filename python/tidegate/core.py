"""The Python API: engines, transactions, tools, speculation, outcomes."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import time
from dataclasses import dataclass, field
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import _native
from .errors import Aborted, InvalidArgument, TidegateError, WrongState

__all__ = [
    "EFFECTS",
    "EffectOutcome",
    "Outcome",
    "ReadResult",
    "Held",
    "Happened",
    "RunResult",
    "SpeculationOutcome",
    "Tidegate",
    "Transaction",
    "Speculation",
    "Tool",
    "AsyncTool",
    "tool",
    "open",
    "current_transaction",
    "default_engine",
]

#: The effect classes a tool may declare.
EFFECTS: Tuple[str, ...] = ("reversible", "reversible_with_cost", "bufferable", "gated", "idempotent")

T = TypeVar("T")
ScopeSpec = Union[str, Sequence[str], Callable[..., Union[str, Sequence[str]]]]

_current: "contextvars.ContextVar[Optional[Transaction]]" = contextvars.ContextVar("tidegate_tx", default=None)
_default: Optional["Tidegate"] = None


def current_transaction() -> Optional["Transaction"]:
    """The transaction of the innermost ``with tg.transaction(...)`` block, if any."""
    return _current.get()


# --------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EffectOutcome:
    """How one effect settled.

    ``tag`` is ``"clean"`` (settled as intended), ``"leaked"`` (an irreversible effect left
    before the abort), ``"unresolved"`` (an operator must look: failed or missing compensation,
    residue, unknown outcome) or ``"partial-commit"``. ``disposition`` says what happened:
    ``accepted``, ``applied``, ``fired``, ``discarded``, ``compensated``, ``compensation_failed``,
    ``not_compensable``, ``release_failed``, ``not_released``, ``unknown``, ``replayed``.
    """

    id: int
    tool: str
    effect: str
    key: str
    disposition: str
    tag: str
    detail: Optional[str] = None


@dataclass(frozen=True)
class Outcome:
    """The settlement of a transaction: committed or not, why, and every effect in issuance
    order with its tag."""

    tx: int
    epoch: int
    agent: str
    committed: bool
    effects: Tuple[EffectOutcome, ...]
    reason: Optional[Dict[str, Any]] = None
    partial: Optional[Dict[str, Any]] = None

    @classmethod
    def _from_dict(cls, d: Dict[str, Any]) -> "Outcome":
        effects = tuple(
            EffectOutcome(
                id=e["id"],
                tool=e["tool"],
                effect=e["class"],
                key=e["key"],
                disposition=e["disposition"],
                tag=e["tag"],
                detail=e.get("detail"),
            )
            for e in d.get("effects", ())
        )
        return cls(
            tx=d["tx"],
            epoch=d["epoch"],
            agent=d["agent"],
            committed=d["committed"],
            effects=effects,
            reason=d.get("reason"),
            partial=d.get("partial"),
        )

    @property
    def is_clean(self) -> bool:
        """Whether every effect settled ``clean``."""
        return all(e.tag == "clean" for e in self.effects)

    @property
    def residue(self) -> Tuple[EffectOutcome, ...]:
        """Effects whose tag is not ``clean`` (what an operator must look at)."""
        return tuple(e for e in self.effects if e.tag != "clean")

    @property
    def tags(self) -> Dict[int, str]:
        """``{effect id: tag}``."""
        return {e.id: e.tag for e in self.effects}

    @property
    def reason_kind(self) -> Optional[str]:
        """The abort reason's machine name (``"stale_read"``, ``"vetoed"``...), if aborted."""
        return None if self.reason is None else self.reason.get("kind")


@dataclass(frozen=True)
class ReadResult:
    """A recorded read: the scope's committed ``version`` and, if this transaction staged a
    write to the scope (a bufferable effect), the ``staged`` arguments (read-your-writes)."""

    version: int
    staged: Any = None


@dataclass(frozen=True)
class RunResult(Generic[T]):
    """What :meth:`Tidegate.run` returns: the body's value, the committed outcome, and how
    many attempts it took."""

    value: T
    outcome: Outcome
    attempts: int


@dataclass(frozen=True)
class SpeculationOutcome:
    """The settlement of a speculation group: the winner's outcome and the losers'."""

    winner: Outcome
    losers: Tuple[Outcome, ...]


class Happened:
    """A probe's answer that the call took effect, with its output."""

    __slots__ = ("output",)

    def __init__(self, output: Any = None) -> None:
        self.output = output

    @property
    def _tidegate_happened(self) -> Any:
        return self.output

    def __repr__(self) -> str:
        return f"Happened({self.output!r})"


class Held:
    """The acknowledgement of a held effect: ``kind`` is ``"staged"`` (bufferable) or
    ``"queued"`` (gated). The tool has not run; it runs when the transaction commits, after
    which ``result`` holds its return value."""

    __slots__ = ("tool", "effect", "kind", "_result", "_done")

    def __init__(self, tool: str, effect: int, kind: str) -> None:
        self.tool = tool
        self.effect = effect
        self.kind = kind
        self._result: Any = None
        self._done = False

    @property
    def released(self) -> bool:
        """Whether the effect has been released (the tool ran at commit)."""
        return self._done

    @property
    def result(self) -> Any:
        """The tool's return value once released; raises :class:`WrongState` before."""
        if not self._done:
            raise WrongState(
                f"effect {self.effect} of tool `{self.tool}` is {self.kind}; it runs at commit",
                kind="wrong_state",
            )
        return self._result

    def __repr__(self) -> str:
        state = f"result={self._result!r}" if self._done else self.kind
        return f"<Held {self.tool}#{self.effect} {state}>"


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


def _positional_names(fn: Callable[..., Any]) -> Tuple[str, ...]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()
    names = []
    for p in sig.parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            break
        names.append(p.name)
    return tuple(names)


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _check_callable(value: Any, argument: str, tool_name: str, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise InvalidArgument(
            f"invalid `{argument}` = {value!r} for tool `{tool_name}`: expected a callable"
            + (" or None" if optional else ""),
            kind="invalid_argument",
            argument=argument,
        )


class Tool:
    """A function turned into a Tidegate adapter by :func:`tool`.

    Called inside a ``with tg.transaction(...)`` block, the call is routed through the engine:
    executed now and its compensation registered (reversible, idempotent), or held until
    commit (bufferable: staged, gated: queued; the call returns a :class:`Held`). Called
    outside any transaction, it runs as a one-call transaction on :func:`default_engine`
    (or the engine given to :meth:`on`).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        scope: ScopeSpec,
        effect: str,
        compensate: Optional[Callable[..., Any]] = None,
        key: Optional[Callable[..., str]] = None,
        probe: Optional[Callable[..., Any]] = None,
        name: Optional[str] = None,
    ) -> None:
        if not callable(fn):
            raise InvalidArgument(f"invalid `fn` = {fn!r}: expected a callable", kind="invalid_argument", argument="fn")
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tool_name, str) or not tool_name.strip():
            raise InvalidArgument(
                f"invalid `name` = {tool_name!r}: expected a non-empty str", kind="invalid_argument", argument="name"
            )
        if not isinstance(effect, str) or effect not in EFFECTS:
            raise InvalidArgument(
                f"invalid `effect` = {effect!r} for tool `{tool_name}`: expected one of {', '.join(map(repr, EFFECTS))}",
                kind="invalid_argument",
                argument="effect",
            )
        if isinstance(scope, str):
            const: Optional[List[str]] = [scope]
        elif isinstance(scope, (list, tuple)):
            if not scope or not all(isinstance(s, str) for s in scope):
                raise InvalidArgument(
                    f"invalid `scope` = {scope!r} for tool `{tool_name}`: expected a non-empty list of str",
                    kind="invalid_argument",
                    argument="scope",
                )
            const = list(scope)
        elif callable(scope):
            const = None
        else:
            raise InvalidArgument(
                f"invalid `scope` = {scope!r} for tool `{tool_name}`: expected a str, a list of str, "
                "or a function of the tool's arguments returning them",
                kind="invalid_argument",
                argument="scope",
            )
        _check_callable(compensate, "compensate", tool_name)
        _check_callable(key, "key", tool_name)
        _check_callable(probe, "probe", tool_name)
        self.fn = fn
        self.name: str = tool_name
        self.effect: str = effect
        self.scope = scope
        self.compensate = compensate
        self.key = key
        self.probe = probe
        self._const_scopes = const
        self._names = _positional_names(fn)
        self._engine: Optional[Tidegate] = None
        functools.update_wrapper(self, fn)

    # -- internals ---------------------------------------------------------------------------

    def _bind(self, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
        """Binds positional arguments to parameter names, so that the scope, key, probe and
        compensation functions receive them by name (``lambda order_id, **_: ...``)."""
        names = self._names
        if not args or len(args) > len(names):
            return args, kwargs
        bound = dict(zip(names, args))
        if kwargs:
            for k in kwargs:
                if k in bound:
                    raise TypeError(f"{self.name}() got multiple values for argument {k!r}")
            bound.update(kwargs)
        return (), bound

    def _scopes(self, args: tuple, kwargs: dict) -> List[str]:
        if self._const_scopes is not None:
            return self._const_scopes
        try:
            s = self.scope(*args, **kwargs)  # type: ignore[operator]
        except Exception as e:
            raise InvalidArgument(
                f"invalid `scope` of tool `{self.name}`: the scope function raised {type(e).__name__}: {e} "
                f"for arguments {args!r} {kwargs!r}; nothing was recorded",
                kind="invalid_argument",
                argument="scope",
            ) from e
        if isinstance(s, str):
            return [s]
        if isinstance(s, (list, tuple)) and s and all(isinstance(x, str) for x in s):
            return list(s)
        raise InvalidArgument(
            f"invalid `scope` of tool `{self.name}` = {s!r}: expected the scope function to return a str "
            "or a non-empty list of str",
            kind="invalid_argument",
            argument="scope",
        )

    def _key(self, args: tuple, kwargs: dict) -> Optional[str]:
        if self.key is None:
            return None
        try:
            k = self.key(*args, **kwargs)
        except Exception as e:
            raise InvalidArgument(
                f"invalid `key` of tool `{self.name}`: the key function raised {type(e).__name__}: {e}",
                kind="invalid_argument",
                argument="key",
            ) from e
        if not isinstance(k, str) or not k:
            raise InvalidArgument(
                f"invalid `key` of tool `{self.name}` = {k!r}: expected the key function to return a non-empty str",
                kind="invalid_argument",
                argument="key",
            )
        return k

    def on(self, engine: "Tidegate") -> "Tool":
        """Returns this tool bound to ``engine`` for calls made outside any transaction."""
        bound = type(self).__new__(type(self))
        bound.__dict__.update(self.__dict__)
        bound._engine = engine
        return bound

    def _outside_engine(self) -> "Tidegate":
        return self._engine if self._engine is not None else default_engine()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tx = _current.get()
        if tx is not None:
            return tx.call(self, *args, **kwargs)
        engine = self._outside_engine()
        args, kwargs = self._bind(args, kwargs)
        scopes = self._scopes(args, kwargs)
        with engine.transaction(agent=f"tool:{self.name}", may_touch=scopes) as tx:
            r = tx._call(self, args, kwargs, scopes)
        return r.result if isinstance(r, Held) else r

    def __repr__(self) -> str:
        return f"<tidegate.tool {self.name} ({self.effect})>"


class AsyncTool(Tool):
    """A :class:`Tool` wrapping a coroutine function: ``await`` its calls."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        tx = _current.get()
        if tx is not None:
            return await tx.acall(self, *args, **kwargs)
        engine = self._outside_engine()
        args, kwargs = self._bind(args, kwargs)
        scopes = self._scopes(args, kwargs)
        async with engine.transaction(agent=f"tool:{self.name}", may_touch=scopes) as tx:
            r = await tx._acall(self, args, kwargs, scopes)
        return r.result if isinstance(r, Held) else r


def tool(
    fn: Optional[Callable[..., Any]] = None,
    *,
    scope: ScopeSpec,
    effect: str,
    compensate: Optional[Callable[..., Any]] = None,
    key: Optional[Callable[..., str]] = None,
    probe: Optional[Callable[..., Any]] = None,
    name: Optional[str] = None,
) -> Any:
    """Declares a function as a Tidegate tool (an adapter)::

        @tidegate.tool(scope=lambda order_id, **_: f"retail:order:{order_id}",
                       effect="reversible", compensate=cancel_refund)
        def refund(order_id: str, amount: int) -> dict: ...

    * ``scope``: the scope(s) a call may touch: a str, a list of str, or a function called with
      the tool's own arguments returning them.
    * ``effect``: one of :data:`EFFECTS`.
    * ``compensate``: undoes an executed call; called as ``compensate(result, *args, **kwargs)``.
      Return ``None`` for a clean undo or a str describing residue (a fee); raise if it failed.
    * ``key``: the idempotency key, a function of the tool's arguments returning a str. Keys
      are global: a key that already committed returns the recorded output instead of calling
      the tool again (also after a restart with a data directory).
    * ``probe``: asks the provider whether a call whose outcome is unknown took effect
      (``probe(*args, **kwargs)`` returns ``True``/``Happened(output)``, ``False``, or ``None``
      for still unknown).
    * ``name``: defaults to the function's ``__name__``.

    Arguments of calls must be JSON values (the ledger records them). Coroutine functions
    give an :class:`AsyncTool`. Bad declarations raise :class:`InvalidArgument` naming the
    argument.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        cls = AsyncTool if _is_async(f) else Tool
        return cls(f, scope=scope, effect=effect, compensate=compensate, key=key, probe=probe, name=name)

    if fn is not None:
        return wrap(fn)
    return wrap


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------


class Tidegate:
    """An engine: begin transactions and speculation groups, register hooks, recover.

    Create one with :func:`open`. Safe to use from many threads and asyncio tasks at once.
    """

    def __init__(self, native: Any, data_dir: Optional[str] = None) -> None:
        self._native = native
        self._handles: Dict[Tool, Any] = {}
        self._names: Dict[str, Tool] = {}
        self.data_dir = data_dir

    # -- tools --------------------------------------------------------------------------------

    def _handle(self, t: Tool) -> Any:
        h = self._handles.get(t)
        if h is not None:
            return h
        return self.register(t)

    def register(self, t: Tool) -> Any:
        """Registers a tool with this engine (done on first use; needed before :meth:`recover`).
        Refuses a different tool under a name already taken."""
        if not isinstance(t, Tool):
            raise InvalidArgument(
                f"invalid `tool` = {t!r}: expected a function declared with @tidegate.tool",
                kind="invalid_argument",
                argument="tool",
            )
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
    ) -> "Transaction":
        """A transaction, begun when its ``with`` / ``async with`` block is entered. Leaving the
        block seals and commits it; an exception aborts it (compensating what ran) and
        propagates. ``may_touch`` declares the scopes it may touch: transactions on other
        scopes then need not wait for it, and touching anything else aborts it."""
        return Transaction(self, agent, may_touch, lease, wait_timeout)

    def begin(
        self, agent: str = "agent", may_touch: Optional[Sequence[str]] = None, *, lease: Optional[float] = None
    ) -> "Transaction":
        """Begins a transaction now (for explicit ``commit()``/``abort()`` without ``with``)."""
        tx = Transaction(self, agent, may_touch, lease, None)
        tx._begin()
        return tx

    def speculate(
        self, branches: int, *, agent: str = "agent", may_touch: Optional[Sequence[str]] = None
    ) -> "Speculation":
        """A speculation group of ``branches`` transactions sharing one epoch. Run each
        alternative in a branch, then ``spec.commit(winner)``: the others abort and leave no
        bufferable or gated residue (their executed effects are compensated)."""
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise InvalidArgument(
                f"invalid `branches` = {branches!r}: expected an int >= 1", kind="invalid_argument", argument="branches"
            )
        _check_agent(agent)
        return Speculation(self, self._native.speculate(branches, agent, _scopes_arg(may_touch)))

    def run(
        self,
        body: Callable[["Transaction"], T],
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
        body: Callable[["Transaction"], Awaitable[T]],
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
        Register every tool the ledger names first. Returns a report."""
        for t in tools:
            self.register(t)
        return dict(self._native.recover())

    def version(self, scope: str) -> int:
        """The committed version of ``scope`` (advances on every committed write)."""
        return self._native.version(scope)

    def stats(self) -> Dict[str, int]:
        """Counters: ``unfinished``, ``waiting``, ``committed``, ``aborted``, ``keys``."""
        return dict(self._native.stats())

    def check_integrity(self) -> None:
        """Runs the engine's integrity check; raises :class:`TidegateError` if it fails."""
        self._native.check_integrity()

    def close(self) -> None:
        """Releases this handle (the data directory closes once no transaction uses it)."""
        global _default
        self._native.close()
        if _default is self:
            _default = None

    def __enter__(self) -> "Tidegate":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.data_dir or "memory"
        return f"<tidegate.Tidegate {where}>"


def _check_attempts(attempts: Any) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidArgument(
            f"invalid `attempts` = {attempts!r}: expected an int >= 1", kind="invalid_argument", argument="attempts"
        )


def _check_agent(agent: Any) -> None:
    if not isinstance(agent, str):
        raise InvalidArgument(f"invalid `agent` = {agent!r}: expected a str", kind="invalid_argument", argument="agent")


def _scopes_arg(may_touch: Optional[Sequence[str]]) -> Optional[List[str]]:
    if may_touch is None:
        return None
    if isinstance(may_touch, str) or not all(isinstance(s, str) for s in may_touch):
        raise InvalidArgument(
            f"invalid `may_touch` = {may_touch!r}: expected a list of scope strings like 'retail:order:W1'",
            kind="invalid_argument",
            argument="may_touch",
        )
    return list(may_touch)


def open(  # noqa: A001 - mirrors the builtin on purpose: tidegate.open(...)
    data_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    lease: float = 30.0,
    first_committer_wins: bool = False,
    retry_attempts: int = 4,
    retry_backoff: float = 0.02,
) -> Tidegate:
    """Opens an engine: in memory when ``data_dir`` is ``None``, otherwise on the embedded
    SQLite ledger in ``data_dir`` (created if needed; the directory is locked while open).

    * ``lease``: seconds an open transaction may live before it is aborted;
    * ``first_committer_wins``: let later transactions commit first and abort earlier ones on
      stale reads instead of waiting in epoch order;
    * ``retry_attempts`` / ``retry_backoff``: bounded retry of releases, compensations and
      tool calls that raise :class:`~tidegate.TransientError`.

    The engine becomes the :func:`default_engine` for tool calls made outside a transaction.
    """
    global _default
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
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise InvalidArgument(
            f"invalid `data_dir` = {data_dir!r}: expected a path or None",
            kind="invalid_argument",
            argument="data_dir",
        )
    path = None if data_dir is None else os.fspath(data_dir)
    native = _native.Engine(path, float(lease), bool(first_committer_wins), retry_attempts, float(retry_backoff))
    tg = Tidegate(native, path)
    _default = tg
    return tg


def default_engine() -> Tidegate:
    """The engine tool calls outside any transaction use: the last one :func:`open` returned
    (an in-memory engine is opened on first need)."""
    global _default
    if _default is None:
        _default = open()
    return _default


# --------------------------------------------------------------------------------------------
# Transactions
# --------------------------------------------------------------------------------------------


_KINDS = ("executed", "staged", "queued", "replayed")


class Transaction:
    """A transaction. Use it as ``with tg.transaction(...) as tx:`` or ``async with``.

    Inside the block, calls of declared tools go through the engine. ``outcome`` holds the
    settlement (every effect with its tag) once the transaction has committed or aborted.
    """

    def __init__(
        self,
        engine: Tidegate,
        agent: str,
        may_touch: Optional[Sequence[str]],
        lease: Optional[float],
        wait_timeout: Optional[float],
        native: Any = None,
        branch: bool = False,
    ) -> None:
        _check_agent(agent)
        self._engine = engine
        self._agent = agent
        self._may_touch = _scopes_arg(may_touch)
        if lease is not None and (isinstance(lease, bool) or not isinstance(lease, (int, float)) or lease <= 0):
            raise InvalidArgument(
                f"invalid `lease` = {lease!r}: expected a positive number of seconds", kind="invalid_argument", argument="lease"
            )
        if wait_timeout is not None and (
            isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)) or wait_timeout < 0
        ):
            raise InvalidArgument(
                f"invalid `wait_timeout` = {wait_timeout!r}: expected a non-negative number of seconds",
                kind="invalid_argument",
                argument="wait_timeout",
            )
        self._lease = lease
        self._wait_timeout = wait_timeout
        self._native = native
        self._branch = branch
        self._held: List[Held] = []
        self._tokens: List[contextvars.Token] = []
        #: The settlement, once committed or aborted.
        self.outcome: Optional[Outcome] = None

    # -- lifecycle ----------------------------------------------------------------------------

    def _begin(self) -> None:
        if self._native is not None:
            raise WrongState("the transaction has already begun; use a new tg.transaction(...)", kind="wrong_state")
        self._native = self._engine._native.begin(self._agent, self._may_touch, self._lease)

    def _tx(self) -> Any:
        n = self._native
        if n is None:
            raise WrongState(
                "the transaction has not begun: use it in a `with`/`async with` block or get one from tg.begin()",
                kind="wrong_state",
            )
        return n

    @property
    def id(self) -> int:
        """The transaction id."""
        return self._tx().id

    @property
    def epoch(self) -> int:
        """The epoch (commit order of transactions that touch the same scopes)."""
        return self._tx().epoch

    @property
    def state(self) -> Optional[str]:
        """``"open"``, ``"sealed"``, ``"waiting"``, ``"committing"``, ``"aborting"``, or
        ``None`` once settled (or before it began)."""
        return None if self._native is None else self._native.state

    def _as_current(self) -> "_CurrentGuard":
        return _CurrentGuard(self)

    def __enter__(self) -> "Transaction":
        if not self._branch:
            self._begin()
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _current.reset(self._tokens.pop())
        if self._branch:
            return
        self._settle_on_exit(exc)

    async def __aenter__(self) -> "Transaction":
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _current.reset(self._tokens.pop())
        if self._branch:
            return
        if exc is None:
            if self.state is not None:
                await self.acommit()
            return
        if isinstance(exc, TidegateError) and exc.outcome is not None and self.state is None:
            self.outcome = exc.outcome
            return
        if self.state in ("open", "sealed"):
            try:
                await self.aabort(f"exception in the transaction block: {type(exc).__name__}: {exc}")
            except TidegateError:
                pass  # the engine settled it meanwhile (a protocol violation aborts at once)

    def _settle_on_exit(self, exc: Optional[BaseException]) -> None:
        if exc is None:
            if self.state is not None:
                self.commit()
            return
        if isinstance(exc, TidegateError) and exc.outcome is not None and self.state is None:
            self.outcome = exc.outcome
            return
        if self.state in ("open", "sealed"):
            try:
                self.abort(f"exception in the transaction block: {type(exc).__name__}: {exc}")
            except TidegateError:
                pass  # the engine settled it meanwhile (a protocol violation aborts at once)

    # -- reads and effects --------------------------------------------------------------------

    def read(self, scope: str) -> ReadResult:
        """Records a read of ``scope``: the commit aborts with :class:`StaleRead` if another
        transaction commits a write to it first."""
        if not isinstance(scope, str):
            raise InvalidArgument(f"invalid `scope` = {scope!r}: expected a str", kind="invalid_argument", argument="scope")
        version, staged = self._tx().read(scope)
        return ReadResult(version, staged)

    def call(self, tool: Tool, *args: Any, **kwargs: Any) -> Any:
        """Calls ``tool(*args, **kwargs)`` through the engine. Returns the tool's result for
        executed (or replayed) effects, a :class:`Held` for staged/queued ones."""
        if not isinstance(tool, Tool):
            raise InvalidArgument(
                f"invalid `tool` = {tool!r}: expected a function declared with @tidegate.tool",
                kind="invalid_argument",
                argument="tool",
            )
        args, kwargs = tool._bind(args, kwargs)
        return self._call(tool, args, kwargs, None)

    #: Alias of :meth:`call`.
    effect = call

    def _call(self, tool: Tool, args: tuple, kwargs: dict, scopes: Optional[List[str]]) -> Any:
        native = self._tx()
        h = self._engine._handles.get(tool) or self._engine.register(tool)
        if scopes is None:
            scopes = tool._scopes(args, kwargs)
        key = tool._key(args, kwargs) if tool.key is not None else None
        try:
            kind, eff, out = native.call(h, args, kwargs or None, scopes, key)
        except TidegateError as e:
            self._record_abort(e)
            raise
        return self._ack(tool, kind, eff, out)

    def _ack(self, tool: Tool, kind: int, eff: int, out: Any) -> Any:
        """The agent's answer: the output of an executed or replayed call, else a :class:`Held`."""
        if kind == 0 or kind == 3:
            return out
        held = Held(tool.name, eff, _KINDS[kind])
        self._held.append(held)
        return held

    async def acall(self, tool: Tool, *args: Any, **kwargs: Any) -> Any:
        """The asyncio form of :meth:`call` (coroutine tools are awaited on this loop)."""
        if not isinstance(tool, Tool):
            raise InvalidArgument(
                f"invalid `tool` = {tool!r}: expected a function declared with @tidegate.tool",
                kind="invalid_argument",
                argument="tool",
            )
        args, kwargs = tool._bind(args, kwargs)
        return await self._acall(tool, args, kwargs, None)

    async def _acall(self, tool: Tool, args: tuple, kwargs: dict, scopes: Optional[List[str]]) -> Any:
        native = self._tx()
        h = self._engine._handles.get(tool) or self._engine.register(tool)
        if scopes is None:
            scopes = tool._scopes(args, kwargs)
        key = tool._key(args, kwargs) if tool.key is not None else None
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        native.call_async(h, args, kwargs or None, scopes, key, loop, contextvars.copy_context(), fut)
        try:
            kind, eff, out = await fut
        except TidegateError as e:
            self._record_abort(e)
            raise
        return self._ack(tool, kind, eff, out)

    # -- settlement ---------------------------------------------------------------------------

    def seal(self) -> None:
        """Freezes the footprint (done by :meth:`commit` if needed)."""
        self._tx().seal()

    def add_hook(self, hook: Callable[[Dict[str, Any]], Any], name: Optional[str] = None) -> None:
        """Adds a pre-commit hook for this transaction only (see :meth:`Tidegate.add_hook`)."""
        _check_callable(hook, "hook", name or "hook", optional=False)
        self._tx().add_hook(name or getattr(hook, "__name__", "hook"), hook, _is_async(hook))

    def _settled(self, result: Any) -> Outcome:
        outcome_d, released = result
        self.outcome = Outcome._from_dict(outcome_d)
        self._fill_held(released)
        return self.outcome

    def _fill_held(self, released: List[Any]) -> None:
        for h, r in zip(self._held, released):
            h._result = r
            h._done = True

    def _record_abort(self, e: TidegateError) -> None:
        if e.outcome is not None:
            self.outcome = e.outcome

    def commit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """Seals (if open) and commits: runs pre-commit hooks, waits for earlier transactions
        on the same scopes, validates reads, releases held effects in issuance order. Raises an
        :class:`Aborted` subclass (with ``outcome``) if the transaction aborts instead."""
        wt = self._wait_timeout if wait_timeout is None else wait_timeout
        try:
            return self._settled(self._tx().commit(wt))
        except TidegateError as e:
            self._record_abort(e)
            raise

    async def acommit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """The asyncio form of :meth:`commit`."""
        wt = self._wait_timeout if wait_timeout is None else wait_timeout
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
        self._token: Optional[contextvars.Token] = None

    def __enter__(self) -> Transaction:
        self._token = _current.set(self._tx)
        return self._tx

    def __exit__(self, *exc: Any) -> None:
        if self._token is not None:
            _current.reset(self._token)


class Speculation:
    """A speculation group: alternative branches of one decision, run as transactions sharing
    one epoch. Run work in a branch with ``with spec.branches[i]:`` (entering a branch does not
    commit it), then ``spec.commit(i)``. Leaving the ``with tg.speculate(...)`` block without a
    commit, or with an exception, aborts every branch."""

    def __init__(self, engine: Tidegate, native: Any) -> None:
        self._engine = engine
        self._native = native
        #: The branches, one transaction each.
        self.branches: Tuple[Transaction, ...] = tuple(
            Transaction(engine, "branch", None, None, None, native=n, branch=True) for n in native.branches()
        )
        self.outcome: Optional[SpeculationOutcome] = None
        self._aborted: Optional[Tuple[Outcome, ...]] = None

    def __iter__(self) -> Iterator[Transaction]:
        return iter(self.branches)

    def __len__(self) -> int:
        return len(self.branches)

    def commit(self, winner: Union[int, Transaction]) -> SpeculationOutcome:
        """Chooses ``winner`` (a branch or its index), aborts the other branches (compensating
        what they executed, dropping what they held), then commits the winner."""
        if isinstance(winner, Transaction):
            try:
                index = self.branches.index(winner)
            except ValueError:
                raise InvalidArgument(
                    f"invalid `winner` = {winner!r}: expected one of this group's branches",
                    kind="invalid_argument",
                    argument="winner",
                ) from None
        elif isinstance(winner, int) and not isinstance(winner, bool):
            index = winner
            if index < 0:
                index += len(self.branches)
        else:
            raise InvalidArgument(
                f"invalid `winner` = {winner!r}: expected a branch index or a branch",
                kind="invalid_argument",
                argument="winner",
            )
        if not 0 <= index < len(self.branches):
            raise InvalidArgument(
                f"invalid `winner` = {winner!r}: expected an index below {len(self.branches)}",
                kind="invalid_argument",
                argument="winner",
            )
        try:
            w, losers, released = self._native.commit(index)
        except TidegateError as e:
            if e.outcome is not None:
                self.branches[index].outcome = e.outcome
            raise
        win = Outcome._from_dict(w)
        self.branches[index].outcome = win
        self.branches[index]._fill_held(released)
        lo = tuple(Outcome._from_dict(x) for x in losers)
        self.outcome = SpeculationOutcome(win, lo)
        return self.outcome

    def abort(self, reason: str = "speculation abandoned") -> Tuple[Outcome, ...]:
        """Aborts every branch."""
        outs = tuple(Outcome._from_dict(x) for x in self._native.abort(str(reason)))
        self._aborted = outs
        return outs

    def __enter__(self) -> "Speculation":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if self.outcome is None and self._aborted is None:
            try:
                self.abort("speculation block left without a winner" if exc is None else f"exception: {exc!r}")
            except TidegateError:
                if exc is None:
                    raise
