"""Transactions held by ``tidegate serve`` (:class:`RemoteTransaction`, internal module; import
it from :mod:`tidegate` or :mod:`tidegate.client`). The ``with`` block, the argument checks,
``Held`` acknowledgements and the settlement's exceptions are :class:`tidegate.Transaction`'s;
what differs is the transport: each step is a request, and an eager tool of this process runs
here through the two-step ticket form (docs/server.md, "Client-executed effects")."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import Aborted, InvalidArgument, TidegateError, WrongState
from .outcome import Outcome, ReadResult, _ran
from .plans import _descriptor_arg
from .tools import Tool
from .transaction import Transaction, _already_begun, _not_begun
from ._http import _abort_error, _local_name, _outcome, _serial, _server_name
from ._worker import _failure, _invoke, _jsonable, _pack, _with_call_id

if TYPE_CHECKING:
    from ._remote_plan import RemotePlan
    from .client import Client

__all__ = ["RemoteTransaction"]

#: Classes whose calls execute at once (in the caller, through a ticket); the others are held
#: and released at commit by the client's worker thread.
_EAGER = frozenset({"reversible", "reversible_with_cost", "idempotent"})


class _Ticket:
    """A client-executed effect waiting for its result: effect number, key, where to report."""

    __slots__ = ("effect", "key", "url")

    def __init__(self, effect: int, key: str, url: str) -> None:
        self.effect, self.key, self.url = effect, key, url


class RemoteTransaction(Transaction):
    """A transaction held by the server. The API of :class:`tidegate.Transaction`: ``with`` and
    ``async with`` blocks, :meth:`read`, :meth:`call`, :meth:`seal`, :meth:`commit`,
    :meth:`abort`, ``outcome``. ``remote_id`` is the server's id (``tx_<tag>_<n>``); ``id`` is
    its ``n``."""

    #: The server's id, once begun.
    remote_id: Optional[str]

    _TOOL_EXPECTED = "a function declared with @tidegate.tool or a server tool's name"

    def __init__(
        self,
        client: "Client",
        agent: str,
        may_touch: Optional[Sequence[str]],
        lease: Optional[float],
        wait_timeout: Optional[float],
        plan: Optional["RemotePlan"] = None,
    ) -> None:
        self._setup(agent, may_touch, lease, wait_timeout)
        self._client = client
        self._branch = False
        self._plan = None  # the in-process plan of the base class: never one here
        self._remote_plan = plan
        self._view: Dict[str, Any] = {}
        self.remote_id = None

    # -- lifecycle ----------------------------------------------------------------------------

    def _begin(self) -> None:
        if self.remote_id is not None:
            raise _already_begun()
        body: Dict[str, Any] = {"agent": self._agent}
        if self._may_touch is not None:
            body["may_touch"] = self._may_touch
        if self._lease is not None:
            body["lease_ms"] = max(1, int(self._lease * 1000))
        if self._remote_plan is not None:
            body["plan"] = self._remote_plan._rid()
        _, v = self._client._request("POST", "/v1/transactions", body, ok=(201,))
        self._view = v
        self.remote_id = str(v["id"])

    @property
    def remote_plan(self) -> Optional["RemotePlan"]:
        """The plan this transaction is a step of, if any."""
        return self._remote_plan

    def _rid(self) -> str:
        if self.remote_id is None:
            raise _not_begun()
        return self.remote_id

    @property
    def id(self) -> int:
        """The transaction's number (``n`` of ``tx_<tag>_<n>``)."""
        return _serial(self._rid())

    @property
    def epoch(self) -> int:
        """The epoch."""
        self._rid()
        return int(self._view.get("epoch", 0))

    @property
    def state(self) -> Optional[str]:
        """``"open"``, ``"sealed"``, ``"waiting"``, ``"committing"``, ``"aborting"``, or
        ``None`` once settled (or before it began), as last seen from the server."""
        if self.remote_id is None or self.outcome is not None:
            return None
        s = self._view.get("state")
        return None if s in ("committed", "aborted") else (str(s) if s is not None else None)

    def refresh(self) -> Dict[str, Any]:
        """Reads the transaction from the server (``GET /v1/transactions/{id}``)."""
        self._view = self._client.get(self._rid())
        return self._view

    # -- reads and effects --------------------------------------------------------------------

    def _read(self, scope: str) -> ReadResult:
        _, r = self._request_aborting("POST", f"/v1/transactions/{self._rid()}/reads", {"scope": scope})
        return ReadResult(int(r["version"]), r.get("staged"))

    def call(self, tool: Union[Tool, str], *args: Any, **kwargs: Any) -> Any:
        """Calls a tool: a server tool by name (keyword arguments are its JSON arguments;
        ``_key=`` and ``_scopes=`` override its key and scopes; ``_compensate=`` gives a
        :class:`~tidegate.Compensate` descriptor, required for a reversible tool in a plan
        step), or a :func:`tidegate.tool`
        of this process (an eager one runs here, through a ticket; a held one is released
        at commit by this client's worker thread). Returns the output of an
        executed (or replayed) effect, a :class:`~tidegate.Held` for a staged or queued one."""
        if isinstance(tool, str):
            key = kwargs.pop("_key", None)
            scopes = kwargs.pop("_scopes", None)
            comp = _descriptor_arg(kwargs.pop("_compensate", None), "_compensate")
            if args:
                raise InvalidArgument(
                    f"invalid arguments of server tool `{tool}`: pass them by keyword (they are its JSON object)",
                    kind="invalid_argument",
                    argument="args",
                )
            return self._effect(tool, dict(kwargs), key, None if scopes is None else list(scopes), comp)
        return super().call(tool, *args, **kwargs)

    #: Alias of :meth:`call`.
    effect = call

    def _call(
        self,
        tool: Tool,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        scopes: Optional[List[str]],
        key: Optional[str] = None,
    ) -> Any:
        ticket = self._record(tool, args, kwargs, scopes, key)
        if not isinstance(ticket, _Ticket):
            return ticket
        while True:
            try:
                out = _invoke(tool.fn, args, _with_call_id(kwargs, tool._wants_call_id[0], ticket.key))
            except BaseException as e:  # noqa: BLE001 - reported, then raised as the engine would
                wait, taken = self._report(ticket, _failure(e), e)
                if wait is None:
                    return taken  # the probe said it happened: its output
            else:
                wait, _ = self._report(ticket, {"status": "done", "output": _jsonable(out)}, None)
                if wait is None:
                    return out
            time.sleep(wait)

    async def acall(self, tool: Union[Tool, str], *args: Any, **kwargs: Any) -> Any:
        """The asyncio form of :meth:`call`: a tool of this process runs in the caller's task
        (a coroutine function is awaited there), the requests on a thread."""
        if not isinstance(tool, Tool):
            return await asyncio.to_thread(self.call, tool, *args, **kwargs)
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
        ticket = await asyncio.to_thread(self._record, tool, args, kwargs, scopes, key)
        if not isinstance(ticket, _Ticket):
            return ticket
        while True:
            try:
                out = tool.fn(*args, **_with_call_id(kwargs, tool._wants_call_id[0], ticket.key))
                if inspect.isawaitable(out):
                    out = await out
            except BaseException as e:  # noqa: BLE001 - reported, then raised as the engine would
                wait, taken = await asyncio.to_thread(self._report, ticket, _failure(e), e)
                if wait is None:
                    return taken  # the probe said it happened: its output
            else:
                result = {"status": "done", "output": _jsonable(out)}
                wait, _ = await asyncio.to_thread(self._report, ticket, result, None)
                if wait is None:
                    return out
            await asyncio.sleep(wait)

    def _record(
        self,
        tool: Tool,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        scopes: Optional[List[str]],
        key: Optional[str],
    ) -> Any:
        """Records a call of a tool of this process: for an eager class, a ticket to run it
        here (or the output of a key that already executed); for a held one, the
        :class:`Held` (released at commit by the worker loop)."""
        self._client._ensure(tool)
        scopes, key = tool._footprint(args, kwargs, scopes, key)
        name = _server_name(tool.name)
        comp = tool.descriptor._to_dict() if tool.descriptor is not None else None
        if tool.effect not in _EAGER:
            return self._effect(name, _pack(args, kwargs), key, scopes, comp)
        r = self._post_effect(name, _pack(args, kwargs), key, scopes, client=True, compensate=comp)
        if str(r.get("ack")) != "execute":
            return self._acked(tool.name, r)
        effect = r["effect"]
        n = int(effect["effect"])
        url = str(r.get("result_url") or f"/v1/transactions/{self._rid()}/effects/{n}/result")
        return _Ticket(n, str(effect["key"]), url)

    def _report(
        self, ticket: "_Ticket", result: Dict[str, Any], exc: Optional[BaseException]
    ) -> Tuple[Optional[float], Any]:
        """Posts how a ticket's call ended. Returns ``(None, output)`` once the result is taken
        (the output the server recorded), or ``(seconds, None)``: wait, then run the call again
        (the server's policy has attempts left after a ``not_applied`` with ``retry``). Raises the abort's exception, with ``exc`` as
        its cause, when the call's failure aborted the transaction; ``exc`` itself, after the
        report, if it is not an ``Exception`` (KeyboardInterrupt, a cancellation); or the
        server's refusal (:class:`~tidegate.WrongState` for ``result_conflict``,
        ``ticket_expired``, ``not_client_executed``)."""
        answer: Any = None
        for attempt in range(6):
            try:
                _, answer = self._request_aborting("POST", ticket.url, result, ok=(200,))
                break
            except Aborted as e:
                if exc is not None and not isinstance(exc, Exception):
                    raise exc from e
                if exc is not None:
                    raise e from exc
                raise
            except TidegateError as e:
                if e.kind == "call_again":
                    return 0.05 * (2**attempt), None
                if e.kind in ("unavailable", "result_in_progress") and attempt < 5:
                    # The same result again gets the same answer: safe to repeat.
                    time.sleep(0.05 * (2**attempt))
                    continue
                if exc is not None:
                    raise e from exc
                raise
        if exc is not None and not isinstance(exc, Exception):
            raise exc
        return None, (answer or {}).get("output") if isinstance(answer, dict) else None

    def _post_effect(
        self,
        tool: str,
        payload: Dict[str, Any],
        key: Optional[str],
        scopes: Optional[List[str]],
        *,
        client: bool = False,
        compensate: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {"tool": tool, "args": payload}
        if compensate is not None:
            body["compensate"] = compensate
        if key is not None:
            body["key"] = key
        if scopes is not None:
            body["scopes"] = scopes
        if client:
            body["execute"] = "client"
        _, r = self._request_aborting("POST", f"/v1/transactions/{self._rid()}/effects", body)
        return dict(r)

    def _acked(self, tool: str, r: Mapping[str, Any]) -> Any:
        ack = str(r.get("ack"))
        if ack in ("executed", "replayed"):
            return r.get("output")
        return self._hold(tool, int(r["effect"]["effect"]), ack)

    def _effect(
        self,
        tool: str,
        payload: Dict[str, Any],
        key: Optional[str],
        scopes: Optional[List[str]],
        compensate: Optional[Dict[str, Any]] = None,
    ) -> Any:
        return self._acked(_local_name(tool), self._post_effect(tool, payload, key, scopes, compensate=compensate))

    def _request_aborting(
        self, method: str, path: str, body: Optional[Mapping[str, Any]] = None, ok: Sequence[int] = (200, 201)
    ) -> Tuple[int, Any]:
        """A request that may settle the transaction (a failed call, a protocol violation):
        the exception carries the outcome, which becomes this transaction's."""
        try:
            return self._client._request(method, path, body, ok=ok)
        except TidegateError as e:
            err = e
            if isinstance(e, Aborted) and e.outcome is None and e.kind == "protocol_violation":
                v = self._settle_view(self._client._timeout)
                if v.get("outcome"):
                    err = _abort_error(v)
            if err.outcome is not None:
                self._record_abort(err)
                self._view = {**self._view, "state": "committed" if err.outcome.committed else "aborted"}
            if err is e:
                raise
            raise err from e

    # -- settlement ---------------------------------------------------------------------------

    def seal(self) -> None:
        """Freezes the footprint (done by :meth:`commit` if needed)."""
        _, self._view = self._client._request("POST", f"/v1/transactions/{self._rid()}/seal")

    def add_hook(self, hook: Any, name: Optional[str] = None) -> None:
        """Pre-commit hooks run in the engine's process; over HTTP use the review endpoints
        (issue 16) instead. Raises :class:`~tidegate.WrongState`."""
        raise WrongState("pre-commit hooks are not available over HTTP", kind="wrong_state")

    def _settle_view(self, wait: Optional[float]) -> Dict[str, Any]:
        """Long-polls the outcome until the transaction settles (or ``wait`` seconds)."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = self._client._timeout if deadline is None else max(0.0, deadline - time.monotonic())
            ms = int(min(left, 30.0) * 1000)
            _, v = self._client._request(
                "GET", f"/v1/transactions/{self._rid()}/outcome", params={"timeout_ms": ms}, ok=(200, 202), timeout=ms / 1000
            )
            if v.get("outcome") is not None or (deadline is not None and time.monotonic() >= deadline):
                return dict(v)

    def _finish(self, v: Mapping[str, Any]) -> Outcome:
        self._view = dict(v)
        o = _outcome(v)
        self.outcome = o
        outputs = {int(e["effect"]): e.get("output") for e in v.get("effects", ())}
        for h in _ran(self._held, o):
            h._set(outputs.get(h.effect))
        if not o.committed or o.partial is not None:
            raise _abort_error(v)
        return o

    def request_commit(self, wait_timeout: Optional[float] = None) -> str:
        """Asks the server to commit and returns at once with the state (``"waiting"``,
        ``"committing"``, or settled ``"committed"``/``"aborted"``): the server finishes the
        commit (and releases held effects) whether or not this process is still there. Read
        the result later with :meth:`commit` (which joins the same commit) or
        :meth:`Client.get`."""
        body: Dict[str, Any] = {"seal": True, "wait_ms": 0}
        wt = self._commit_timeout(wait_timeout)
        if wt is not None:
            body["commit_timeout_ms"] = int(wt * 1000)
        _, v = self._client._request("POST", f"/v1/transactions/{self._rid()}/commit", body, ok=(200, 202))
        self._view = dict(v)
        return str(v.get("state"))

    def commit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """Seals (if open) and commits, waiting for the settlement (see
        :meth:`tidegate.Transaction.commit`). Raises the :class:`~tidegate.Aborted` subclass of
        the abort's reason, or :class:`~tidegate.PartialCommit`, with ``outcome``."""
        wt = self._commit_timeout(wait_timeout)
        body: Dict[str, Any] = {"seal": True, "wait_ms": int(min(self._client._timeout, 30.0) * 1000)}
        if wt is not None:
            body["commit_timeout_ms"] = int(wt * 1000)
        _, v = self._request_aborting("POST", f"/v1/transactions/{self._rid()}/commit", body, ok=(200, 202))
        if v.get("outcome") is None:
            v = self._settle_view(None)
        return self._finish(v)

    async def acommit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """The asyncio form of :meth:`commit` (runs the requests on a thread)."""
        return await asyncio.to_thread(self.commit, wait_timeout)

    def abort(self, reason: str = "aborted by the caller") -> Outcome:
        """Aborts: held effects are dropped, executed ones compensated by the server (also if
        this process goes away). Returns the outcome once the compensations ran."""
        body = {"reason": str(reason)[:1024], "wait_ms": int(min(self._client._timeout, 30.0) * 1000)}
        _, v = self._client._request("POST", f"/v1/transactions/{self._rid()}/abort", body, ok=(200, 202))
        if v.get("outcome") is None:
            v = self._settle_view(None)
        self._view = dict(v)
        self.outcome = _outcome(v)
        return self.outcome

    async def aabort(self, reason: str = "aborted by the caller") -> Outcome:
        """The asyncio form of :meth:`abort`."""
        return await asyncio.to_thread(self.abort, reason)

    def __repr__(self) -> str:
        if self.remote_id is None:
            return f"<tidegate.RemoteTransaction agent={self._agent!r} (not begun)>"
        return f"<tidegate.RemoteTransaction {self.remote_id} {self.state or 'settled'}>"
