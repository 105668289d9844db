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

import datetime as _dt
import os
import socket
import urllib.parse
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .errors import InvalidArgument
from .plans import CapabilityRequest, _check_capability_handler, _name, _new_plan
from .tools import Tool
from ._http import _Connection
from ._http import _problem_error as _problem_error  # re-exported: it used to live here
from ._remote_plan import RemotePlan
from ._remote_tx import RemoteTransaction
from ._worker import _Worker
from ._worker import _run_capability as _run_capability  # re-exported: it used to live here

__all__ = ["Client", "RemotePlan", "RemoteTransaction", "connect"]


class Client:
    """A connection to ``tidegate serve``: begin transactions, call server tools and tools of
    this process. Create one with :func:`connect`. Safe to use from many threads."""

    def __init__(self, url: str, api_key: str, *, timeout: float = 60.0, worker: Optional[str] = None) -> None:
        conn = _Connection(url, api_key, timeout)
        self._conn = conn
        # The requests, the connection pool and the wait bound every part of the client uses.
        self._request = conn.request
        self._http = conn.http
        self._timeout = conn.timeout
        self._worker = _Worker(self, worker or f"py-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")

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
            self._worker.serve_capability(name, fn, deadline)
            return fn

        if handler is not None:
            return register(handler)
        return register

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
        self._worker.serve_tool(t, deadline)

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

    def batch(
        self,
        effects: Sequence[Mapping[str, Any]],
        *,
        reads: Sequence[str] = (),
        agent: Optional[str] = None,
        may_touch: Optional[Sequence[str]] = None,
        lease: Optional[float] = None,
        wait_timeout: Optional[float] = None,
    ) -> Dict[str, Any]:
        """A short transaction of server tools in one request (``POST /v1/batches``): the
        ``reads`` (scopes) are recorded, each effect (``{"tool": name, "args": {...}}``, with
        ``key`` and ``scopes`` optional) runs in order, then the transaction is sealed and
        committed. Returns the server's answer: ``transaction`` (settled unless still
        settling after ``wait_timeout`` seconds), ``reads`` and ``effects`` (each one's
        acknowledgement). A step that fails raises the package's exception with the
        transaction's ``outcome`` (everything before it compensated); a bad request raises
        :class:`InvalidArgument` naming the field (``effects[1].tool``) and begins nothing.
        At most 64 effects and 64 reads."""
        body: Dict[str, Any] = {"effects": [dict(e) for e in effects], "reads": list(reads)}
        if agent is not None:
            body["agent"] = agent
        if may_touch is not None:
            body["may_touch"] = list(may_touch)
        if lease is not None:
            body["lease_ms"] = max(1, int(lease * 1000))
        if wait_timeout is not None:
            body["wait_ms"] = max(0, int(wait_timeout * 1000))
        return dict(self._request("POST", "/v1/batches", body, ok=(200, 202))[1])

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
        return _new_plan(RemotePlan, self, owner, deadline, cascade_limit, triggers, unwind_wait)

    def open_plan(
        self,
        owner: str,
        *,
        deadline: Union[_dt.timedelta, float, None] = None,
        cascade_limit: Optional[int] = None,
        triggers: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> "RemotePlan":
        """Opens a plan now (end it with :meth:`RemotePlan.commit` / :meth:`RemotePlan.fail`)."""
        p = _new_plan(RemotePlan, self, owner, deadline, cascade_limit, triggers, None)
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
        self._worker.stop()
        self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def url(self) -> str:
        """The base URL of the node this client talks to: the one given to :func:`connect`,
        until a node of a cluster sends it to the node that serves its tenant."""
        return self._conn.url

    def __repr__(self) -> str:
        return f"<tidegate.Client {self.url}>"


def connect(url: str, api_key: str, *, timeout: float = 60.0, worker: Optional[str] = None) -> Client:
    """Connects to ``tidegate serve`` at ``url`` with an API key (``tgk_...``). ``timeout``
    (seconds) bounds each wait for the server; ``worker`` names this process's worker (default
    ``py-<host>-<pid>-<random>``). Nothing is sent until the first call."""
    return Client(url, api_key, timeout=timeout, worker=worker)
