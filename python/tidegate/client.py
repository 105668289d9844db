"""A client of ``tidegate serve`` (docs/server.md) with the transaction and tool API of
:func:`tidegate.open`, in pure Python over HTTP::

    import tidegate

    tg = tidegate.connect("http://127.0.0.1:7878", api_key="tgk_...")

    with tg.transaction(agent="support", may_touch=["mail:to:ann"]) as tx:
        held = tx.call("send_email", to="ann", body="hi")     # a tool registered on the server
        refund("W1", 20)                                       # a @tidegate.tool of this process
    print(tx.outcome.is_clean, held.result)

Two kinds of tools:

* **Server tools** (registered with ``PUT /v1/tools/{name}``, e.g. by
  :meth:`Client.define_tool`), called by name: ``tx.call("send_email", **args)``. Their calls,
  releases and compensations are dispatched by the server to webhooks or workers and need
  nothing from this process: a held effect is released, and a compensation runs, also after
  this process is gone.
* **Tools of this process**, declared with :func:`tidegate.tool` as for :func:`tidegate.open`.
  On first use the client registers each as a server tool whose ``call``, ``compensate`` and
  ``probe`` capabilities are pull-worker queues (``py.<tool>.call`` ...). An eager call
  (reversible, idempotent) runs in the caller through the two-step ticket form: the effect is
  recorded with ``"execute": "client"``, the function runs under the returned key, and its
  result is posted (``done``, ``not_applied``, ``unknown``). Releases of held effects,
  compensations and probes are served by a worker thread in this process that long-polls the
  queues, runs the function and reports; while no process serves the queue, they wait in it
  (their capability's ``deadline_ms`` decides). Scopes and keys are computed here and sent
  with each call.

Errors are the package's exception types (:mod:`tidegate.errors`): an abort raises the
:class:`~tidegate.Aborted` subclass of its reason with ``outcome``; bad input raises
:class:`~tidegate.InvalidArgument` naming the field; a request the server refused for
another reason raises :class:`~tidegate.TidegateError` whose ``kind`` is the problem's
``code``. Transport failures raise :class:`~tidegate.TidegateError` with kind
``"unavailable"`` (retryable).

Tools of this process follow the engine's failure rule, in the caller and in the worker
thread alike: ``NotApplied`` and ``TransientError`` are reported as ``not_applied`` (certainly
not done; ``retry`` for ``NotApplied(retry=True)`` and ``TransientError``, retried under the
capability's policy), any other exception as ``unknown`` (the server asks the probe, else
compensates blind or tags the effect ``unresolved``, never ``clean``). An eager call whose
failure aborts the transaction raises :class:`~tidegate.ToolFailed` with the tool's exception
as ``__cause__``, as in process.

Not (yet) available over HTTP: pre-commit hooks, ``read``'s staged value for server tools'
bufferable effects beyond what the server returns, and speculation groups from this client
(use the ``/v1/groups`` API directly).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import hashlib
import inspect
import json
import os
import re
import socket
import threading
import time
import urllib.parse
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from . import _context
from .errors import (
    Aborted,
    InvalidArgument,
    InvalidScope,
    KeyInUse,
    KeyUnresolved,
    LeaseExpired,
    LostBranch,
    MissingDescriptor,
    NotApplied,
    PartialCommit,
    PlanError,
    ProtocolViolation,
    ReleaseFailed,
    StaleRead,
    StoreError,
    CrossTenant,
    TidegateError,
    ToolFailed,
    TransientError,
    UnknownTool,
    Vetoed,
    WaitTimeout,
    WrongState,
)
from .outcome import EffectOutcome, Happened, Held, Outcome, ReadResult
from .plans import CapabilityRequest, Compensate, _bad, _check_capability_handler, _choice, _name, _plan_args, _reason
from .tools import Tool
from .transaction import Transaction, _check_agent, _scopes_arg, _seconds

if TYPE_CHECKING:
    import httpx

__all__ = ["Client", "RemotePlan", "RemoteTransaction", "connect"]

#: Abort reasons (the server's ``outcome.reason.kind``) and the exception each raises.
_ABORTS: Dict[str, Type[Aborted]] = {
    "stale_read": StaleRead,
    "vetoed": Vetoed,
    "protocol_violation": ProtocolViolation,
    "tool_failed": ToolFailed,
    "release_failed": ReleaseFailed,
    "lost_branch": LostBranch,
    "lost_speculation": LostBranch,
    "lease_expired": LeaseExpired,
    "wait_timeout": WaitTimeout,
    "tool_unavailable": ToolFailed,
}

#: Problem codes (RFC 9457 ``code``) and the exception each raises.
_CODES: Dict[str, Type[TidegateError]] = {
    "wrong_state": WrongState,
    "not_resumable": WrongState,
    "branch_of_group": WrongState,
    "key_in_use": KeyInUse,
    "key_unresolved": KeyUnresolved,
    "protocol_violation": ProtocolViolation,
    "store_unavailable": StoreError,
    # A ticket's result that does not fit its state (docs/server.md, "Client-executed effects").
    "result_conflict": WrongState,
    "ticket_expired": WrongState,
    "not_client_executed": WrongState,
    "result_in_progress": WrongState,
}

#: Classes whose calls execute at once (in the caller, through a ticket); the others are held
#: and released at commit by the worker loop.
_EAGER = frozenset({"reversible", "reversible_with_cost", "idempotent"})

#: Longest error text of a ticket's result (the server takes at most 4096 bytes).
_MAX_ERROR_BYTES = 4000

_NAME_OK = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
#: Server tool name -> the name the process declared (when they differ).
_LOCAL_NAMES: Dict[str, str] = {}


def _server_name(name: str) -> str:
    """The server's name for a tool of this process: the same name when the server takes it
    (``[A-Za-z0-9_.:-]``), else one made of the allowed characters plus a hash of the name
    (``tools/search`` -> ``tools.search-1a2b3c4d``), so two names never meet."""
    if _NAME_OK.fullmatch(name):
        return name
    safe = re.sub(r"[^A-Za-z0-9_.:-]", ".", name)[:100]
    served = f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    _LOCAL_NAMES[served] = name
    return served


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    b = text.encode()
    return text if len(b) <= _MAX_ERROR_BYTES else b[:_MAX_ERROR_BYTES].decode(errors="ignore") + "..."


def _failure(e: BaseException) -> Dict[str, Any]:
    """A tool's exception as a ticket's or a task's result (the failure rule)."""
    if isinstance(e, NotApplied):
        return {"status": "not_applied", "error": _error_text(e), "retry": bool(e.retry)}
    if isinstance(e, TransientError):
        return {"status": "not_applied", "error": _error_text(e), "retry": True}
    # Anything else (OutcomeUnknown, a TimeoutError after the provider applied the call) may
    # have taken effect: the server asks the probe, never takes it as "not done"
    # (docs/engine.md, Failures 11).
    return {"status": "unknown", "error": _error_text(e)}


_EFFECT_CLASSES = {
    "reversible": "reversible",
    "reversible_with_cost": "reversible_with_cost",
    "bufferable": "bufferable",
    "gated": "gated",
    "idempotent": "idempotent",
}


def _tx_number(public_id: str) -> int:
    """``n`` of ``tx_<tag>_<n>``."""
    try:
        return int(public_id.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return 0


def _outcome(tx: Mapping[str, Any]) -> Outcome:
    """An :class:`Outcome` from the server's Transaction resource (settled)."""
    o = tx.get("outcome") or {}
    effects = tuple(
        EffectOutcome(
            id=int(e["effect"]),
            tool=_LOCAL_NAMES.get(str(e["tool"]), str(e["tool"])),
            effect=str(e.get("class") or ""),
            key=str(e["key"]),
            disposition=str(e.get("disposition") or e.get("status") or ""),
            tag=str(e.get("tag") or "clean"),
            detail=e.get("error") or e.get("residue"),
        )
        for e in tx.get("effects", ())
    )
    reason = None
    if o.get("reason"):
        r = o["reason"]
        reason = {"kind": r.get("kind"), **(r.get("details") or {}), "message": r.get("message")}
    partial = None
    if o.get("committed") and any(e.tag == "partial-commit" for e in effects):
        partial = {
            "failed": next((e.id for e in effects if e.tag == "partial-commit"), None),
            "error": next((e.detail for e in effects if e.tag == "partial-commit"), None),
        }
    return Outcome(
        tx=_tx_number(str(tx.get("id", ""))),
        epoch=int(tx.get("epoch", 0)),
        agent=str(tx.get("agent", "")),
        committed=bool(o.get("committed")),
        effects=effects,
        reason=reason,
        partial=partial,
    )


def _outcome_dict(o: Outcome) -> Dict[str, Any]:
    """The dict form :class:`TidegateError` takes for ``outcome``."""
    return {
        "tx": o.tx,
        "epoch": o.epoch,
        "agent": o.agent,
        "committed": o.committed,
        "reason": o.reason,
        "partial": o.partial,
        "effects": [
            {"id": e.id, "tool": e.tool, "class": e.effect, "key": e.key, "disposition": e.disposition, "tag": e.tag, "detail": e.detail}
            for e in o.effects
        ],
    }


def _abort_error(tx: Mapping[str, Any]) -> TidegateError:
    """The exception for a settled transaction that did not commit (or committed in part)."""
    o = _outcome(tx)
    if o.committed:
        return PartialCommit(
            f"transaction {tx.get('id')} committed only in part: {o.partial}",
            kind="partial_commit",
            outcome=_outcome_dict(o),
        )
    r = (tx.get("outcome") or {}).get("reason") or {}
    kind = str(r.get("kind") or "aborted")
    cls = _ABORTS.get(kind, Aborted)
    return cls(
        f"transaction {tx.get('id')} aborted: {r.get('message') or kind}",
        kind=kind,
        retryable=bool(r.get("retryable")),
        outcome=_outcome_dict(o),
    )


def _problem_error(status: int, doc: Mapping[str, Any]) -> TidegateError:
    """The exception for a problem document."""
    code = str(doc.get("code") or f"http_{status}")
    detail = str(doc.get("detail") or doc.get("title") or f"HTTP {status}")
    retryable = bool(doc.get("retryable"))
    if code == "transaction_aborted" and isinstance(doc.get("transaction"), dict):
        return _abort_error(doc["transaction"])
    field = doc.get("field")
    if code in ("invalid_field", "missing_field", "unknown_field", "invalid_json", "invalid_query"):
        if field == "tool" and "registered" in str(doc.get("expected", "")):
            return UnknownTool(detail, kind="unknown_tool")
        arg = str(field) if field is not None else None
        cls: Type[InvalidArgument] = InvalidArgument
        if arg is not None and ("scope" in arg or "may_touch" in arg):
            cls = InvalidScope
        return cls(detail, kind="invalid_argument", argument=arg)
    if code == "missing_descriptor":
        return MissingDescriptor(detail, kind="missing_descriptor", argument="compensate")
    if code == "cross_tenant":
        return CrossTenant(detail, kind="cross_tenant", argument=str(field) if field is not None else None)
    if code == "plan_refused":
        return PlanError(detail, kind="plan_state")
    if status >= 500 and code not in _CODES:
        return StoreError(detail, kind=code, retryable=True)
    return _CODES.get(code, TidegateError)(detail, kind=code, retryable=retryable)


class Client:
    """A connection to ``tidegate serve``: begin transactions, call server tools and tools of
    this process. Create one with :func:`connect`. Safe to use from many threads."""

    #: The server's base URL.
    url: str

    def __init__(self, url: str, api_key: str, *, timeout: float = 60.0, worker: Optional[str] = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgument(f"invalid `url` = {url!r}: expected an http:// or https:// URL", kind="invalid_argument", argument="url")
        if not isinstance(api_key, str) or not api_key:
            raise InvalidArgument("invalid `api_key`: expected the key as a non-empty str", kind="invalid_argument", argument="api_key")
        _seconds(timeout, "timeout", positive=True)
        try:
            import httpx
        except ImportError as e:  # pragma: no cover - httpx is a dependency of the package
            raise TidegateError(
                "tidegate.connect needs httpx: pip install 'httpx>=0.27'", kind="missing_dependency"
            ) from e
        self._httpx = httpx
        self.url = url.rstrip("/")
        self._timeout = float(timeout)
        self._http: "httpx.Client" = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=httpx.Timeout(timeout + 5.0)
        )
        self._worker_name = worker or f"py-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._tools: Dict[str, Tool] = {}
        self._tool_caps: Dict[str, Tool] = {}
        self._cap_handlers: Dict[str, Callable[[CapabilityRequest], Any]] = {}
        self._lock = threading.Lock()
        self._worker: Optional[threading.Thread] = None
        self._stop = threading.Event()

    # -- HTTP ---------------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]] = None,
        *,
        params: Optional[Mapping[str, Any]] = None,
        ok: Sequence[int] = (200, 201),
        timeout: Optional[float] = None,
    ) -> Tuple[int, Any]:
        """One request; 429/503 are retried after ``Retry-After`` (up to 5 times)."""
        for attempt in range(6):
            try:
                if timeout is None:  # the client's default timeout
                    r = self._http.request(method, path, json=body, params=params)
                else:
                    t = self._httpx.Timeout(timeout + 5.0)
                    r = self._http.request(method, path, json=body, params=params, timeout=t)
            except self._httpx.HTTPError as e:
                raise TidegateError(
                    f"{method} {self.url}{path}: {type(e).__name__}: {e}", kind="unavailable", retryable=True
                ) from e
            if r.status_code in (429, 503) and attempt < 5:
                try:
                    wait = float(r.headers.get("retry-after", "1"))
                except ValueError:
                    wait = 1.0
                time.sleep(min(max(wait, 0.05), 5.0))
                continue
            try:
                doc = r.json() if r.content else None
            except ValueError:
                doc = r.text
            if r.status_code in ok:
                return r.status_code, doc
            raise _problem_error(r.status_code, doc if isinstance(doc, dict) else {"detail": str(doc)})
        raise TidegateError(f"{method} {path}: still overloaded", kind="too_many_requests", retryable=True)

    def whoami(self) -> Dict[str, Any]:
        """The caller: ``{"tenant", "role", "key_id"}``."""
        return dict(self._request("GET", "/v1/whoami")[1])

    # -- registry -----------------------------------------------------------------------------

    def define_capability(self, name: str, spec: Mapping[str, Any]) -> Dict[str, Any]:
        """Defines (or redefines) a capability: ``{"kind": "webhook", "url": ...}`` or
        ``{"kind": "worker", ...}`` (docs/server.md). Needs an operator or admin key."""
        return dict(self._request("PUT", f"/v1/capabilities/{urllib.parse.quote(name, safe='')}", dict(spec))[1])

    def capability(
        self, name: str, handler: Optional[Callable[[CapabilityRequest], Any]] = None, *, deadline: Optional[float] = None
    ) -> Any:
        """Serves capability ``name`` from this process (a decorator, or called with the
        handler), as :meth:`tidegate.Tidegate.capability` does in process::

            @client.capability("cancel_booking")
            def cancel_booking(req: tidegate.CapabilityRequest) -> None: ...

        Defines ``name`` on the server as a worker capability (replacing an earlier
        definition of that name, a webhook's too) and runs ``handler(req)`` on this client's
        worker thread for every task of it: the compensations and probes of descriptors naming
        it (:class:`tidegate.Compensate`) that the server's plan executor fires, also for plans
        whose agent is gone, as long as some process serves the capability. The handler's
        contract is :class:`tidegate.CapabilityRequest`'s; in addition, raising
        ``NotApplied(retry=True)`` or :class:`~tidegate.TransientError` queues the operation
        again within the capability's attempts. ``deadline`` (seconds) settles a task no
        worker took in time. Needs a key with ``registry.write`` and ``tasks.work``."""
        _name(name, "name")

        def register(fn: Callable[[CapabilityRequest], Any]) -> Callable[[CapabilityRequest], Any]:
            _check_capability_handler(fn, name)
            self._check_not_a_tool_capability(name)
            spec: Dict[str, Any] = {"kind": "worker"}
            if deadline is not None:
                _seconds(deadline, "deadline", positive=True)
                spec["deadline_ms"] = int(deadline * 1000)
            self.define_capability(name, spec)
            with self._lock:
                self._check_not_a_tool_capability(name)
                self._cap_handlers[name] = fn
                self._start_worker()
            return fn

        if handler is not None:
            return register(handler)
        return register

    def _check_not_a_tool_capability(self, name: str) -> None:
        t = self._tool_caps.get(name)
        if t is not None:
            raise InvalidArgument(
                f"invalid `name` = {name!r}: the capability serves tool `{t.name}` of this client",
                kind="invalid_argument",
                argument="name",
            )

    def define_tool(self, name: str, definition: Mapping[str, Any]) -> Dict[str, Any]:
        """Defines (or redefines) a server tool: ``{"class", "scopes", "call", "compensate"?,
        "probe"?, "key"?}`` (docs/server.md). Needs an operator or admin key."""
        return dict(self._request("PUT", f"/v1/tools/{name}", dict(definition))[1])

    def serve(self, *tools: Tool, deadline: Optional[float] = None) -> None:
        """Registers tools of this process on the server (worker capabilities
        ``py.<tool>.call|compensate|probe`` and a server tool of the same name) and starts the
        worker thread that serves them. Done on first use of a tool; call it up front so that
        releases and compensations of earlier runs find a worker at once. ``deadline``
        (seconds) settles a task no worker took in time (``deadline_ms``). Needs a key with
        ``registry.write`` and ``tasks.work`` (admin, or an operator key)."""
        for t in tools:
            self._ensure(t, deadline)

    def register(self, *tools: Tool) -> None:
        """The same as :meth:`serve` (the name :meth:`tidegate.Tidegate.register` has, so that
        code written for an engine, such as :class:`tidegate.langgraph.ToolNode`, registers
        its tools here unchanged)."""
        self.serve(*tools)

    def _ensure(self, t: Tool, deadline: Optional[float] = None) -> None:
        if not isinstance(t, Tool):
            raise InvalidArgument(
                f"invalid `tool` = {t!r}: expected a function declared with @tidegate.tool or a server tool's name",
                kind="invalid_argument",
                argument="tool",
            )
        with self._lock:
            known = self._tools.get(t.name)
            if known is t:
                return
            if known is not None:
                raise InvalidArgument(
                    f"invalid `tool` = {t!r}: another tool is already served under the name `{t.name}`",
                    kind="invalid_argument",
                    argument="tool",
                )
        spec: Dict[str, Any] = {"kind": "worker"}
        if deadline is not None:
            _seconds(deadline, "deadline", positive=True)
            spec["deadline_ms"] = int(deadline * 1000)
        name = _server_name(t.name)
        caps = {"call": f"py.{name}.call"}
        if t.compensate is not None:
            caps["compensate"] = f"py.{name}.compensate"
        if t.probe is not None:
            caps["probe"] = f"py.{name}.probe"
        taken = [c for c in caps.values() if c in self._cap_handlers]
        if taken:
            raise InvalidArgument(
                f"invalid `tool` = {t!r}: its capability `{taken[0]}` is served by a capability handler of this client",
                kind="invalid_argument",
                argument="tool",
            )
        for cap in caps.values():
            self.define_capability(cap, spec)
        # Calls from this client always send their scopes; the template only answers callers
        # that send none (and names the argument they must then pass).
        scopes = t._const_scopes or [f"kv:py.{name}:{{_scope}}"]
        definition: Dict[str, Any] = {
            "class": _EFFECT_CLASSES.get(t.effect, t.effect),
            "scopes": scopes,
            "description": f"served by Python worker processes ({_where(t.fn)})",
            **caps,
        }
        self.define_tool(name, definition)
        with self._lock:
            if any(c in self._cap_handlers for c in caps.values()):
                raise InvalidArgument(
                    f"invalid `tool` = {t!r}: a capability handler of this client took one of its capabilities",
                    kind="invalid_argument",
                    argument="tool",
                )
            self._tools[t.name] = t
            for cap in caps.values():
                self._tool_caps[cap] = t
            self._start_worker()

    def _start_worker(self) -> None:
        """Starts the worker thread unless it runs (called with the lock held)."""
        if self._worker is None or not self._worker.is_alive():
            self._stop.clear()
            self._worker = threading.Thread(target=self._work, name=f"tidegate-worker-{self._worker_name}", daemon=True)
            self._worker.start()

    # -- the worker loop ----------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                caps = sorted({*self._tool_caps, *self._cap_handlers})
            try:
                _, r = self._request(
                    "POST",
                    "/v1/tasks/poll",
                    {"worker": self._worker_name, "capabilities": caps, "max_tasks": 8, "wait_ms": 2000},
                    ok=(200,),
                    timeout=5.0,
                )
            except TidegateError:
                if self._stop.wait(0.5):
                    return
                continue
            for task in r.get("tasks", ()):
                if self._stop.is_set():
                    return  # leased tasks not run go back to the queue when their lease ends
                self._run_task(task)

    def _run_task(self, task: Mapping[str, Any]) -> None:
        handler = self._cap_handlers.get(str(task.get("capability")))
        if handler is not None:
            self._report(task, _run_capability(handler, task))
            return
        t = self._tool_caps.get(str(task.get("capability")))
        op = str(task.get("operation"))
        args, kwargs = _unpack(task.get("args"))
        # The call id a tool function may take: the effect's key (a compensation's task key
        # is `<key>#compensate`), the same id the call ran under.
        call_id = str(task.get("key", "")).removesuffix("#compensate")
        result: Dict[str, Any]
        try:
            if t is None:
                result = {"status": "failed", "error": f"no tool of this worker serves {task.get('capability')}"}
            elif op in ("call", "release"):
                out = _invoke(t.fn, args, _with_call_id(kwargs, t._wants_call_id[0], call_id))
                result = {"status": "done", "output": _jsonable(out)}
            elif op == "compensate" and t.compensate is not None:
                kw = _with_call_id(kwargs, t._wants_call_id[1], call_id)
                residue = _invoke(t.compensate, (task.get("output"),) + args, kw)
                result = {"status": "done"}
                if isinstance(residue, str) and residue:
                    result["residue"] = residue
            elif op == "probe" and t.probe is not None:
                answer = _invoke(t.probe, args, _with_call_id(kwargs, t._wants_call_id[2], call_id))
                if isinstance(answer, Happened):
                    result = {"status": "done", "output": _jsonable(answer.output)}
                elif answer is True:
                    result = {"status": "done"}
                elif answer is False:
                    result = {"status": "failed", "error": "the probe says the call did not happen"}
                else:
                    result = {"status": "unknown", "error": "the probe cannot tell"}
            elif op == "probe":
                # For a probe, "failed" would mean "the call did not happen".
                result = {"status": "unknown", "error": f"tool `{t.name}` has no probe function"}
            else:
                result = {"status": "failed", "error": f"tool `{t.name}` has no {op} function"}
        except Exception as e:  # noqa: BLE001 - a tool's failure is reported, not raised here
            if op == "probe":
                result = {"status": "unknown", "error": f"the probe raised {_error_text(e)}"}
            else:
                # NotApplied / TransientError: not_applied (with retry: queued again within the
                # capability's attempts); anything else: unknown.
                result = _failure(e)
        self._report(task, result)

    def _report(self, task: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        try:
            self._request("POST", f"/v1/tasks/{task['id']}/report", {"worker": self._worker_name, "result": result}, ok=(200, 409))
        except Exception:  # noqa: BLE001 - also a client closed under the worker (RuntimeError)
            pass  # the lease runs out and the task is offered again under the same key

    # -- transactions -------------------------------------------------------------------------

    def transaction(
        self,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        *,
        lease: Optional[float] = None,
        wait_timeout: Optional[float] = None,
    ) -> "RemoteTransaction":
        """A transaction on the server, begun when its ``with`` block is entered (as
        :meth:`tidegate.Tidegate.transaction`)."""
        return RemoteTransaction(self, agent, may_touch, lease, wait_timeout)

    def begin(
        self, agent: str = "agent", may_touch: Optional[Sequence[str]] = None, *, lease: Optional[float] = None
    ) -> "RemoteTransaction":
        """Begins a transaction now (explicit ``commit()``/``abort()``)."""
        tx = RemoteTransaction(self, agent, may_touch, lease, None)
        tx._begin()
        return tx

    def get(self, transaction_id: str) -> Dict[str, Any]:
        """The server's view of a transaction (``GET /v1/transactions/{id}``)."""
        return dict(self._request("GET", f"/v1/transactions/{transaction_id}")[1])

    # -- plans ----------------------------------------------------------------------------------

    def plan(
        self,
        owner: str,
        *,
        deadline: Union[_dt.timedelta, float, None] = None,
        cascade_limit: Optional[int] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
        unwind_wait: Optional[float] = 30.0,
    ) -> "RemotePlan":
        """A plan held by the server (:class:`RemotePlan`), opened when its ``with`` block is
        entered; the arguments are :meth:`tidegate.Tidegate.plan`'s. The server's executor
        keeps its held compensations, deadline and triggers after this process is gone."""
        return _remote_plan(self, owner, deadline, cascade_limit, triggers, unwind_wait)

    def open_plan(
        self,
        owner: str,
        *,
        deadline: Union[_dt.timedelta, float, None] = None,
        cascade_limit: Optional[int] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "RemotePlan":
        """Opens a plan now (end it with :meth:`RemotePlan.commit` / :meth:`RemotePlan.fail`)."""
        p = _remote_plan(self, owner, deadline, cascade_limit, triggers, None)
        p._open()
        return p

    def get_plan(self, plan_id: str) -> "RemotePlan":
        """A handle on an existing plan (``plan_<tag>_<n>``), e.g. one an agent that has
        exited opened: post a signal, a verdict or an owner's choice, or read its detail."""
        if not isinstance(plan_id, str) or not plan_id:
            raise InvalidArgument(
                f"invalid `plan_id` = {plan_id!r}: expected a plan id such as `plan_<tag>_<n>`",
                kind="invalid_argument",
                argument="plan_id",
            )
        p = RemotePlan(self, "", None, None, [], None)
        p.remote_id = plan_id
        p._view = p.detail()
        return p

    def plans(self, *, stuck: bool = False) -> List[Dict[str, Any]]:
        """The tenant's plans (``GET /v1/plans``), or only the owner-intervention queue
        (``stuck=True``, ``GET /v1/plans/stuck``), as the server's JSON."""
        _, v = self._request("GET", "/v1/plans/stuck" if stuck else "/v1/plans")
        return [dict(x) for x in v["stuck" if stuck else "plans"]]

    def close(self) -> None:
        """Stops the worker thread and closes the connection pool."""
        self._stop.set()
        w = self._worker
        if w is not None and w is not threading.current_thread():
            w.join(timeout=10)
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tidegate.Client {self.url}>"


def _descriptor_arg(comp: Any) -> Optional[Dict[str, Any]]:
    """The ``_compensate=`` of a server tool's call as the wire's ``compensate`` object."""
    if comp is None:
        return None
    if not isinstance(comp, Compensate):
        raise InvalidArgument(
            f"invalid `_compensate` = {comp!r}: expected a tidegate.Compensate descriptor",
            kind="invalid_argument",
            argument="_compensate",
        )
    return comp._to_dict()


def _run_capability(handler: Callable[[CapabilityRequest], Any], task: Mapping[str, Any]) -> Dict[str, Any]:
    """Runs a capability handler for a worker task; its answer as the task's result, read as
    the in-process engine reads it (:class:`tidegate.CapabilityRequest`)."""
    op = str(task.get("operation"))
    if op not in ("compensate", "probe"):
        # A tool defined elsewhere that names this capability for its calls: a compensation
        # handler must not run (and report `done`) for a forward call.
        return {"status": "failed", "error": f"capability `{task.get('capability')}` serves compensations and probes, not `{op}`"}
    req = CapabilityRequest(
        capability=str(task.get("capability")),
        operation=op,
        tool=str(task.get("tool", "")),
        key=str(task.get("key", "")),
        args=task.get("args"),
        output=task.get("output"),
    )
    try:
        answer = _invoke(handler, (req,), {})
    except Exception as e:  # noqa: BLE001 - a handler's failure is reported, not raised here
        if op == "probe":
            return {"status": "unknown", "error": f"the probe raised {_error_text(e)}"}
        return _failure(e)
    if op == "probe":
        if answer is None:
            return {"status": "unknown", "error": "the probe could not tell (returned None)"}
        if isinstance(answer, Happened):
            return {"status": "done", "output": _jsonable(answer.output)}
        try:
            happened = bool(answer)
        except Exception as e:  # noqa: BLE001 - an answer without a truth value
            return {"status": "unknown", "error": f"the probe's answer has no truth value: {_error_text(e)}"}
        if happened:
            return {"status": "done"}
        return {"status": "failed", "error": "the probe says it did not take effect"}
    if answer is None:
        return {"status": "done"}
    if isinstance(answer, str):
        return {"status": "done", "residue": answer}
    return {"status": "done", "output": _jsonable(answer)}


def _unpack(payload: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """Positional and keyword arguments from a call's recorded arguments."""
    if not isinstance(payload, dict):
        return (payload,), {}
    kwargs = {k: v for k, v in payload.items() if k != "$args"}
    args = tuple(payload.get("$args") or ())
    return args, kwargs


def _pack(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    payload: Dict[str, Any] = dict(kwargs)
    if args:
        payload["$args"] = list(args)
    return payload


def _where(fn: Any) -> str:
    """``module.qualname`` of a tool function (a ``functools.partial`` names its function)."""
    inner = getattr(fn, "func", fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def _with_call_id(kwargs: Dict[str, Any], wants: bool, call_id: str) -> Dict[str, Any]:
    return {**kwargs, "call_id": call_id} if wants and call_id else kwargs


def _invoke(fn: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    r = fn(*args, **kwargs)
    if inspect.isawaitable(r):
        return asyncio.run(_await(r))
    return r


async def _await(r: Any) -> Any:
    return await r


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return repr(v)


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

    def __init__(
        self,
        client: Client,
        agent: str,
        may_touch: Optional[Sequence[str]],
        lease: Optional[float],
        wait_timeout: Optional[float],
        plan: Optional["RemotePlan"] = None,
    ) -> None:
        _check_agent(agent)
        if lease is not None:
            _seconds(lease, "lease", positive=True)
        if wait_timeout is not None:
            _seconds(wait_timeout, "wait_timeout", positive=False)
        self._client = client
        self._agent = agent
        self._may_touch = _scopes_arg(may_touch)
        self._lease = lease
        self._wait_timeout = wait_timeout
        self._branch = False
        self._plan = None  # the in-process plan of the base class: never one here
        self._remote_plan = plan
        self._held: List[Held] = []
        self._tokens = []
        self._view: Dict[str, Any] = {}
        self.remote_id = None
        self.outcome = None

    # -- lifecycle ----------------------------------------------------------------------------

    def _begin(self) -> None:
        if self.remote_id is not None:
            raise WrongState("the transaction has already begun; use a new tg.transaction(...)", kind="wrong_state")
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
            raise WrongState(
                "the transaction has not begun: use it in a `with` block or get one from tg.begin()", kind="wrong_state"
            )
        return self.remote_id

    @property
    def id(self) -> int:
        """The transaction's number (``n`` of ``tx_<tag>_<n>``)."""
        return _tx_number(self._rid())

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

    def read(self, scope: str) -> ReadResult:
        """Records a read of ``scope`` (see :meth:`tidegate.Transaction.read`)."""
        if not isinstance(scope, str):
            raise InvalidArgument(f"invalid `scope` = {scope!r}: expected a str", kind="invalid_argument", argument="scope")
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
            comp = _descriptor_arg(kwargs.pop("_compensate", None))
            if args:
                raise InvalidArgument(
                    f"invalid arguments of server tool `{tool}`: pass them by keyword (they are its JSON object)",
                    kind="invalid_argument",
                    argument="args",
                )
            return self._effect(tool, dict(kwargs), key, None if scopes is None else list(scopes), comp)
        if not isinstance(tool, Tool):
            raise InvalidArgument(
                f"invalid `tool` = {tool!r}: expected a function declared with @tidegate.tool or a server tool's name",
                kind="invalid_argument",
                argument="tool",
            )
        args, kwargs = tool._bind(args, kwargs)
        return self._call(tool, args, kwargs, None)

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
        if scopes is None:
            scopes = tool._scopes(args, kwargs)
        if key is None and tool.key is not None:
            key = tool._key(args, kwargs)
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
        held = Held(tool, int(r["effect"]["effect"]), ack)
        self._held.append(held)
        return held

    def _effect(
        self,
        tool: str,
        payload: Dict[str, Any],
        key: Optional[str],
        scopes: Optional[List[str]],
        compensate: Optional[Dict[str, Any]] = None,
    ) -> Any:
        return self._acked(
            _LOCAL_NAMES.get(tool, tool), self._post_effect(tool, payload, key, scopes, compensate=compensate)
        )

    def _request_aborting(
        self, method: str, path: str, body: Optional[Mapping[str, Any]] = None, ok: Sequence[int] = (200, 201)
    ) -> Tuple[int, Any]:
        """A request that may abort the transaction (a failed call, a protocol violation):
        the abort's exception carries the outcome."""
        try:
            return self._client._request(method, path, body, ok=ok)
        except Aborted as e:
            if e.outcome is None and e.kind == "protocol_violation":
                v = self._settle_view(self._client._timeout)
                if v.get("outcome"):
                    raise _abort_error(v) from e
            if e.outcome is not None:
                self.outcome = e.outcome
                self._view = {**self._view, "state": "aborted"}
            raise

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
        for h in self._held:
            e = o.effect(h.effect)
            if e is not None and e.disposition in ("applied", "fired", "accepted"):
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
        wt = self._wait_timeout if wait_timeout is None else wait_timeout
        if wt is not None:
            body["commit_timeout_ms"] = int(wt * 1000)
        _, v = self._client._request("POST", f"/v1/transactions/{self._rid()}/commit", body, ok=(200, 202))
        self._view = dict(v)
        return str(v.get("state"))

    def commit(self, wait_timeout: Optional[float] = None) -> Outcome:
        """Seals (if open) and commits, waiting for the settlement (see
        :meth:`tidegate.Transaction.commit`). Raises the :class:`~tidegate.Aborted` subclass of
        the abort's reason, or :class:`~tidegate.PartialCommit`, with ``outcome``."""
        wt = self._wait_timeout if wait_timeout is None else wait_timeout
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

    def _settled_by(self, exc: BaseException) -> bool:
        if isinstance(exc, TidegateError) and exc.outcome is not None:
            self.outcome = exc.outcome
            return True
        return False

    def __repr__(self) -> str:
        if self.remote_id is None:
            return f"<tidegate.RemoteTransaction agent={self._agent!r} (not begun)>"
        return f"<tidegate.RemoteTransaction {self.remote_id} {self.state or 'settled'}>"


#: Plan states (the server's ``state``) in which a plan waits for nobody but its owner.
_PLAN_SETTLED = ("committed", "unwound", "accepted", "stuck")


def _remote_plan(
    client: Client, owner: Any, deadline: Any, cascade_limit: Any, triggers: Any, unwind_wait: Any
) -> "RemotePlan":
    return RemotePlan(client, *_plan_args(owner, deadline, cascade_limit, triggers, unwind_wait))


class RemotePlan:
    """A plan held by the server (``/v1/plans``, docs/plans.md): the API of
    :class:`tidegate.Plan` over HTTP. Use it as ``with client.plan(owner=...) as plan:``;
    steps are ``plan.transaction(...)`` (or :meth:`begin`), transactions of the server whose
    effects need a :class:`~tidegate.Compensate` descriptor when reversible (a tool's
    ``compensate=`` descriptor, or ``_compensate=`` for a server tool by name). Leaving the
    block commits the plan; an exception fails it and waits up to ``unwind_wait`` seconds for
    the server's executor to unwind it. The compensations run on the server, dispatched by
    capability (webhooks, pull workers): they need nothing of this process, which may exit.

    ``remote_id`` is the server's id (``plan_<tag>_<n>``); :meth:`detail` returns the server's
    JSON view (``state``: ``open``, ``failing``, ``stuck``, ``committed``, ``unwound`` or
    ``accepted``)."""

    #: The server's id, once opened.
    remote_id: Optional[str]

    def __init__(
        self,
        client: Client,
        owner: str,
        deadline: Optional[float],
        cascade_limit: Optional[int],
        triggers: List[Mapping[str, Any]],
        unwind_wait: Optional[float],
    ) -> None:
        self._client = client
        self._owner = owner
        self._deadline = deadline
        self._cascade_limit = cascade_limit
        self._triggers = triggers
        self._unwind_wait = unwind_wait
        self._view: Dict[str, Any] = {}
        self.remote_id = None

    def _open(self) -> None:
        if self.remote_id is not None:
            raise WrongState("the plan is already open; use a new client.plan(...)", kind="wrong_state")
        body: Dict[str, Any] = {"owner": self._owner}
        if self._deadline is not None:
            body["deadline_in_ms"] = max(1, int(self._deadline * 1000))
        if self._cascade_limit is not None:
            body["cascade_limit"] = self._cascade_limit
        if self._triggers:
            body["triggers"] = [dict(t) for t in self._triggers]
        _, v = self._client._request("POST", "/v1/plans", body, ok=(201,))
        self._view = dict(v)
        self.remote_id = str(v["id"])

    def _rid(self) -> str:
        if self.remote_id is None:
            raise WrongState(
                "the plan is not open: use it in a `with` block or get one from client.open_plan()",
                kind="wrong_state",
            )
        return self.remote_id

    def _post(self, action: str, body: Mapping[str, Any]) -> Dict[str, Any]:
        """A command on the plan; the server's refusals as :class:`PlanError` (kind
        ``unknown_plan``, ``plan_state``, ``step_unsettled``) like the in-process binding."""
        rid = self._rid()
        try:
            _, v = self._client._request("POST", f"/v1/plans/{rid}/{action}", body, ok=(200, 201, 202))
        except (PlanError, InvalidArgument):
            raise
        except TidegateError as e:
            if e.kind == "not_found":
                raise PlanError(str(e), kind="unknown_plan") from e
            if e.kind == "wrong_state":
                kind = "step_unsettled" if "unsettled" in str(e) else "plan_state"
                raise PlanError(str(e), kind=kind) from e
            raise
        self._view = dict(v) if isinstance(v, dict) else self._view
        return self._view

    @property
    def id(self) -> int:
        """The plan's number (``n`` of ``plan_<tag>_<n>``)."""
        return int(self._rid().rsplit("_", 1)[-1])

    # -- steps ---------------------------------------------------------------------------------

    def transaction(
        self,
        agent: str = "agent",
        may_touch: Optional[Sequence[str]] = None,
        *,
        lease: Optional[float] = None,
        wait_timeout: Optional[float] = None,
    ) -> RemoteTransaction:
        """A transaction that is the plan's next step, begun when its ``with`` block is
        entered (the arguments are :meth:`Client.transaction`'s)."""
        return RemoteTransaction(self._client, agent, may_touch, lease, wait_timeout, plan=self)

    def begin(
        self, agent: str = "agent", may_touch: Optional[Sequence[str]] = None, *, lease: Optional[float] = None
    ) -> RemoteTransaction:
        """Begins the plan's next step now (explicit ``commit()``/``abort()``)."""
        tx = RemoteTransaction(self._client, agent, may_touch, lease, None, plan=self)
        tx._begin()
        return tx

    # -- ending and signals --------------------------------------------------------------------

    def commit(self) -> None:
        """Commits the plan: every held compensation is retired at once. Raises
        :class:`PlanError` if a step has not settled or the plan already failed."""
        self._post("commit", {})

    def fail(self, reason: str) -> None:
        """Fails the plan: the server's executor unwinds it last-in-first-out. Returns at
        once; :meth:`wait` waits for the unwind."""
        self._post("fail", {"reason": _reason(reason)})

    #: Alias of :meth:`fail`.
    signal = fail

    def verdict(self, tx: Union[RemoteTransaction, str], effect: int, verdict: str) -> None:
        """Posts a compliance verdict about effect ``effect`` of step ``tx`` (the transaction
        or its ``remote_id``): ``"block"`` compensates it, ``"allow"`` lets it stand."""
        rid = tx._rid() if isinstance(tx, RemoteTransaction) else tx
        if not isinstance(rid, str):
            raise _bad("tx", tx, "a RemoteTransaction or its remote_id")
        if isinstance(effect, bool) or not isinstance(effect, int) or effect < 0:
            raise _bad("effect", effect, "an effect number (int, from 0)")
        if verdict not in ("block", "allow"):
            raise _bad("verdict", verdict, '"block" or "allow"')
        self._post("verdict", {"transaction": rid, "effect": effect, "verdict": verdict})

    def resolve(self, choice: str) -> None:
        """Resolves a stuck plan with its owner's choice: ``"retry"``, ``"accept"`` or
        ``"unwind"``."""
        self._post("resolve", {"choice": _choice(choice)})

    def arm(self, predicate: Mapping[str, Any]) -> None:
        """Arms a predicate trigger (docs/plans.md "Predicates")."""
        if not isinstance(predicate, Mapping):
            raise _bad("predicate", predicate, "a predicate dict")
        self._post("triggers", {"predicate": dict(predicate)})

    # -- inspection ------------------------------------------------------------------------------

    def detail(self) -> Dict[str, Any]:
        """The server's view of the plan (``GET /v1/plans/{id}``): state, steps, held
        compensations in unwind order, triggers with their values."""
        rid = self._rid()
        try:
            _, v = self._client._request("GET", f"/v1/plans/{rid}")
        except TidegateError as e:
            if e.kind == "not_found":
                raise PlanError(str(e), kind="unknown_plan") from e
            raise
        self._view = dict(v)
        return self._view

    @property
    def state(self) -> str:
        """The plan's state now (one request)."""
        return str(self.detail()["state"])

    def wait(self, timeout: Optional[float] = None, *, poll: float = 0.05) -> Dict[str, Any]:
        """Waits until the plan has ended or is stuck (at most ``timeout`` seconds) and returns
        its detail, whatever the state then."""
        if timeout is not None:
            _seconds(timeout, "timeout", positive=False)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            d = self.detail()
            if d.get("state") in _PLAN_SETTLED or (end is not None and time.monotonic() >= end):
                return d
            time.sleep(poll)

    # -- the with block --------------------------------------------------------------------------

    def __enter__(self) -> "RemotePlan":
        self._open()
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if exc is None:
            self.commit()
            return
        try:
            self.fail(f"exception in the plan block: {type(exc).__name__}: {exc}")
        except TidegateError:
            return  # already failed (its deadline, a trigger) or ended
        if self._unwind_wait:
            self.wait(self._unwind_wait)

    def __repr__(self) -> str:
        if self.remote_id is None:
            return f"<tidegate.RemotePlan owner={self._owner!r} (not open)>"
        return f"<tidegate.RemotePlan {self.remote_id} owner={self._owner!r}>"


def connect(url: str, api_key: str, *, timeout: float = 60.0, worker: Optional[str] = None) -> Client:
    """Connects to ``tidegate serve`` at ``url`` with an API key (``tgk_...``). ``timeout``
    (seconds) bounds each wait for the server; ``worker`` names this process's worker (default
    ``py-<host>-<pid>-<random>``). Nothing is sent until the first call."""
    return Client(url, api_key, timeout=timeout, worker=worker)
