"""Plans held by ``tidegate serve`` (:class:`RemotePlan`, internal module; import it from
:mod:`tidegate` or :mod:`tidegate.client`). The argument checks, the end of the ``with`` block
and waiting are :class:`tidegate.Plan`'s (:mod:`tidegate.plans`); each command is a request on
``/v1/plans`` (docs/plans.md, docs/server.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

from .errors import InvalidArgument, PlanError, TidegateError
from .plans import _bad, _choice, _effect_verdict, _end_block, _not_open, _already_open, _reason, _wait_settled
from ._http import _serial
from ._remote_tx import RemoteTransaction

if TYPE_CHECKING:
    from .client import Client

__all__ = ["RemotePlan"]

#: Plan states (the server's ``state``) in which a plan waits for nobody but its owner.
_PLAN_SETTLED = ("committed", "unwound", "accepted", "stuck")


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
        client: "Client",
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
            raise _already_open("client.plan(...)")
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
            raise _not_open("a `with` block or get one from client.open_plan()")
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
        return _serial(self._rid())

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
        effect, verdict = _effect_verdict(effect, verdict)
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
        return _wait_settled(self.detail, lambda d: d.get("state") in _PLAN_SETTLED, timeout, poll)

    # -- the with block --------------------------------------------------------------------------

    def __enter__(self) -> "RemotePlan":
        self._open()
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        _end_block(self, exc)

    def __repr__(self) -> str:
        if self.remote_id is None:
            return f"<tidegate.RemotePlan owner={self._owner!r} (not open)>"
        return f"<tidegate.RemotePlan {self.remote_id} owner={self._owner!r}>"
