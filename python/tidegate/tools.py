"""Tools: functions declared as Tidegate adapters with :func:`tool`."""

from __future__ import annotations

import functools
import inspect
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from . import _context
from ._context import current as _current
from .errors import InvalidArgument
from .outcome import Held

if TYPE_CHECKING:
    from .engine import Tidegate
    from .plans import Compensate

__all__ = ["EFFECTS", "ScopeSpec", "Tool", "AsyncTool", "tool"]

#: The effect classes a tool may declare.
EFFECTS: Tuple[str, ...] = ("reversible", "reversible_with_cost", "bufferable", "gated", "idempotent")

#: What ``scope=`` accepts: a scope string, a list of them, or a function of the tool's
#: arguments (by name) returning either.
ScopeSpec = Union[str, Sequence[str], Callable[..., Union[str, Sequence[str]]]]

#: The keyword through which a tool, its compensation and its probe receive the call's id.
CALL_ID = "call_id"

F = TypeVar("F", bound=Callable[..., Any])


def _positional_names(fn: Callable[..., Any]) -> Tuple[str, ...]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()
    names = []
    for p in sig.parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or p.name == CALL_ID:
            break
        names.append(p.name)
    return tuple(names)


def _takes_call_id(fn: Optional[Callable[..., Any]]) -> bool:
    """Whether ``fn`` declares a ``call_id`` parameter that can be passed by keyword."""
    if fn is None:
        return False
    try:
        p = inspect.signature(fn).parameters.get(CALL_ID)
    except (TypeError, ValueError):
        return False
    return p is not None and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


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


def _check_tool(value: Any, expected: str = "a function declared with @tidegate.tool") -> None:
    """Refuses anything but a :class:`Tool` where one is called or registered; ``expected`` says
    what else the caller would take (e.g. a server tool's name)."""
    if not isinstance(value, Tool):
        raise InvalidArgument(f"invalid `tool` = {value!r}: expected {expected}", kind="invalid_argument", argument="tool")


class Tool:
    """A function turned into a Tidegate adapter by :func:`tool`.

    Called inside a ``with tg.transaction(...)`` block, the call is routed through the engine:
    executed now and its compensation registered (reversible, idempotent), or held until
    commit (bufferable: staged, gated: queued; the call returns a :class:`Held`). Called
    outside any transaction, it runs as a one-call transaction: a step of the plan of the
    enclosing ``with tg.plan(...)`` block if there is one, else on :func:`default_engine`
    (or the engine given to :meth:`on`).
    """

    fn: Callable[..., Any]
    name: str
    effect: str
    scope: ScopeSpec
    compensate: Optional[Callable[..., Any]]
    #: The compensation descriptor (``compensate=tidegate.Compensate(...)``), else ``None``.
    descriptor: Optional["Compensate"]
    key: Optional[Callable[..., str]]
    probe: Optional[Callable[..., Any]]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        scope: ScopeSpec,
        effect: str,
        compensate: Union[Callable[..., Any], "Compensate", None] = None,
        key: Optional[Callable[..., str]] = None,
        probe: Optional[Callable[..., Any]] = None,
        name: Optional[str] = None,
    ) -> None:
        from .plans import Compensate

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
        const: Optional[List[str]]
        if isinstance(scope, str):
            const = [scope]
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
        descriptor: Optional[Compensate] = None
        if isinstance(compensate, Compensate):
            if effect == "gated":
                raise InvalidArgument(
                    f"invalid `compensate` = {compensate!r} for gated tool `{tool_name}`: expected none, a gated "
                    "effect is irreversible (inside a plan it is recorded as non-compensable)",
                    kind="invalid_argument",
                    argument="compensate",
                )
            descriptor, compensate = compensate, None
        elif compensate is not None and not callable(compensate):
            raise InvalidArgument(
                f"invalid `compensate` = {compensate!r} for tool `{tool_name}`: expected a callable, "
                "a tidegate.Compensate descriptor, or None",
                kind="invalid_argument",
                argument="compensate",
            )
        _check_callable(key, "key", tool_name)
        _check_callable(probe, "probe", tool_name)
        self.fn = fn
        self.name = tool_name
        self.effect = effect
        self.scope = scope
        self.compensate = compensate
        self.descriptor = descriptor
        self.key = key
        self.probe = probe
        self._const_scopes = const
        self._names = _positional_names(fn)
        #: Which of (fn, compensate, probe) take ``call_id``.
        self._wants_call_id = (_takes_call_id(fn), _takes_call_id(compensate), _takes_call_id(probe))
        #: Whether any of them does (read on every call).
        self._any_call_id = any(self._wants_call_id)
        self._engine: Optional[Tidegate] = None
        functools.update_wrapper(self, fn)

    # -- internals ---------------------------------------------------------------------------

    def _bind(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """Binds positional arguments to parameter names, so that the scope, key, probe and
        compensation functions receive them by name (``lambda order_id, **_: ...``)."""
        if kwargs and self._any_call_id and CALL_ID in kwargs:
            raise InvalidArgument(
                f"invalid `call_id` passed to tool `{self.name}`: Tidegate supplies the call id; do not pass it",
                kind="invalid_argument",
                argument="call_id",
            )
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

    def _scopes(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[str]:
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

    def _key(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[str]:
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

    def _footprint(
        self, args: Tuple[Any, ...], kwargs: Dict[str, Any], scopes: Optional[List[str]], key: Optional[str]
    ) -> Tuple[List[str], Optional[str]]:
        """The scopes and the key of one call: those given, else what the tool's scope and key
        functions say (no key when the tool has no key function)."""
        if scopes is None:
            scopes = self._scopes(args, kwargs)
        if key is None and self.key is not None:
            key = self._key(args, kwargs)
        return scopes, key

    def on(self, engine: "Tidegate") -> "Tool":
        """Returns this tool bound to ``engine`` for calls made outside any transaction."""
        bound = type(self).__new__(type(self))
        bound.__dict__.update(self.__dict__)
        bound._engine = engine
        return bound

    def _outside_engine(self) -> "Tidegate":
        if self._engine is not None:
            return self._engine
        from .engine import default_engine

        return default_engine()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tx = _current.get()
        if tx is not None:
            # Not `tx.call(self, *args, **kwargs)`: this path is in front of every call, and the
            # arguments would be unpacked and packed again (`_call_tool` reaches a remote
            # transaction's own `_call` the same way).
            return tx._call_tool(self, args, kwargs)
        args, kwargs = self._bind(args, kwargs)
        scopes = self._scopes(args, kwargs)
        plan = _context.plan.get()
        if plan is not None:
            with plan.transaction(agent=f"tool:{self.name}", may_touch=scopes) as tx:
                r = tx._call(self, args, kwargs, scopes)
        else:
            with self._outside_engine().transaction(agent=f"tool:{self.name}", may_touch=scopes) as tx:
                r = tx._call(self, args, kwargs, scopes)
        return r.result if isinstance(r, Held) else r

    def __repr__(self) -> str:
        return f"<tidegate.tool {self.name} ({self.effect})>"


class AsyncTool(Tool):
    """A :class:`Tool` wrapping a coroutine function: ``await`` its calls."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tx = _context.current.get()
        if tx is not None:
            return await tx.acall(self, *args, **kwargs)
        args, kwargs = self._bind(args, kwargs)
        scopes = self._scopes(args, kwargs)
        plan = _context.plan.get()
        if plan is not None:
            async with plan.transaction(agent=f"tool:{self.name}", may_touch=scopes) as tx:
                r = await tx._acall(self, args, kwargs, scopes)
        else:
            async with self._outside_engine().transaction(agent=f"tool:{self.name}", may_touch=scopes) as tx:
                r = await tx._acall(self, args, kwargs, scopes)
        return r.result if isinstance(r, Held) else r


@overload
def tool(
    fn: Callable[..., Any],
    *,
    scope: ScopeSpec,
    effect: str,
    compensate: Union[Callable[..., Any], "Compensate", None] = ...,
    key: Optional[Callable[..., str]] = ...,
    probe: Optional[Callable[..., Any]] = ...,
    name: Optional[str] = ...,
) -> Tool: ...


@overload
def tool(
    fn: None = ...,
    *,
    scope: ScopeSpec,
    effect: str,
    compensate: Union[Callable[..., Any], "Compensate", None] = ...,
    key: Optional[Callable[..., str]] = ...,
    probe: Optional[Callable[..., Any]] = ...,
    name: Optional[str] = ...,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Optional[Callable[..., Any]] = None,
    *,
    scope: ScopeSpec,
    effect: str,
    compensate: Union[Callable[..., Any], "Compensate", None] = None,
    key: Optional[Callable[..., str]] = None,
    probe: Optional[Callable[..., Any]] = None,
    name: Optional[str] = None,
) -> Union[Tool, Callable[[Callable[..., Any]], Tool]]:
    """Declares a function as a Tidegate tool (an adapter)::

        @tidegate.tool(scope=lambda order_id, **_: f"stripe:refund:{order_id}",
                       effect="reversible", compensate=cancel_refund)
        def refund(order_id: str, amount: int) -> dict: ...

    * ``scope``: the scope(s) a call may touch: a str, a list of str, or a function called with
      the tool's own arguments returning them. Any ``type:path`` is a scope (see
      :func:`tidegate.open` for the rules).
    * ``effect``: one of :data:`EFFECTS`.
    * ``compensate``: undoes an executed call; called as ``compensate(result, *args, **kwargs)``.
      Return ``None`` for a clean undo or a str describing residue (a fee); raise if it failed.
      Or a :class:`tidegate.Compensate` descriptor: the undo as data (a capability name and
      JSON arguments that may reference the call's output), which a plan holds in the ledger
      and runs after this process is gone; calls of a reversible tool inside a plan step need
      one (:class:`MissingDescriptor` otherwise). Outside plans the engine runs it in this
      process through the capability's handler (:meth:`Tidegate.capability`).
    * ``key``: the idempotency key, a function of the tool's arguments returning a str. Keys
      are engine-wide: a key that already committed (in any transaction, also after a restart
      with a data directory) returns the recorded output instead of calling the tool again.
    * ``probe``: asks the provider whether a call whose outcome is unknown took effect
      (``probe(*args, **kwargs)`` returns ``True``/``Happened(output)``, ``False``, or ``None``
      for still unknown).
    * ``name``: defaults to the function's ``__name__``.

    **Call ids.** If the tool function, its compensation or its probe declares a ``call_id``
    parameter (keyword-capable), Tidegate passes the call's id: its idempotency key when it has
    one, else a fresh unique id. The id is recorded with the call's arguments (under
    ``"$call_id"``), so a compensation or probe run by recovery in a later process gets the same
    id. Use it to correlate a call with its undo (a snapshot taken by the call, restored by the
    compensation) or to ask the provider about it, without adding an argument of your own.

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
