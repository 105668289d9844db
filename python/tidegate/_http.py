"""The HTTP side of :func:`tidegate.connect` (internal): one connection to ``tidegate serve``
and what its answers mean in the package's terms. Problem documents (RFC 9457) become the
exceptions of :mod:`tidegate.errors`, the server's Transaction resource becomes an
:class:`~tidegate.Outcome`, and tool names of this process are mapped to names the server
takes and back."""

from __future__ import annotations

import hashlib
import re
import time
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple, Type

from .errors import (
    Aborted,
    CrossTenant,
    InvalidArgument,
    InvalidScope,
    KeyInUse,
    KeyUnresolved,
    LeaseExpired,
    LostBranch,
    MissingDescriptor,
    PartialCommit,
    PlanError,
    ProtocolViolation,
    ReleaseFailed,
    StaleRead,
    StoreError,
    TidegateError,
    ToolFailed,
    UnknownTool,
    Vetoed,
    WaitTimeout,
    WrongState,
)
from .outcome import Outcome
from .transaction import _seconds

if TYPE_CHECKING:
    import httpx

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


def _local_name(name: str) -> str:
    """The name a tool has in this process, from its server name."""
    return _LOCAL_NAMES.get(name, name)


def _serial(public_id: str) -> int:
    """``n`` of a server id ``<kind>_<tag>_<n>`` (``tx_...``, ``plan_...``); 0 if it has none."""
    try:
        return int(public_id.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return 0


def _outcome_dict(tx: Mapping[str, Any]) -> Dict[str, Any]:
    """The settlement in the form the engine reports it (what :class:`~tidegate.TidegateError`
    takes as ``outcome``), from the server's Transaction resource."""
    o = tx.get("outcome") or {}
    effects = [
        {
            "id": int(e["effect"]),
            "tool": _local_name(str(e["tool"])),
            "class": str(e.get("class") or ""),
            "key": str(e["key"]),
            "disposition": str(e.get("disposition") or e.get("status") or ""),
            "tag": str(e.get("tag") or "clean"),
            "detail": e.get("error") or e.get("residue"),
        }
        for e in tx.get("effects", ())
    ]
    reason = None
    if o.get("reason"):
        r = o["reason"]
        reason = {"kind": r.get("kind"), **(r.get("details") or {}), "message": r.get("message")}
    partial = None
    failed = [e for e in effects if e["tag"] == "partial-commit"]
    if o.get("committed") and failed:
        partial = {"failed": failed[0]["id"], "error": failed[0]["detail"]}
    return {
        "tx": _serial(str(tx.get("id", ""))),
        "epoch": int(tx.get("epoch", 0)),
        "agent": str(tx.get("agent", "")),
        "committed": bool(o.get("committed")),
        "reason": reason,
        "partial": partial,
        "effects": effects,
    }


def _outcome(tx: Mapping[str, Any]) -> Outcome:
    """An :class:`Outcome` from the server's Transaction resource (settled)."""
    return Outcome._from_dict(_outcome_dict(tx))


def _abort_error(tx: Mapping[str, Any]) -> TidegateError:
    """The exception for a settled transaction that did not commit (or committed in part)."""
    o = _outcome_dict(tx)
    if o["committed"]:
        return PartialCommit(
            f"transaction {tx.get('id')} committed only in part: {o['partial']}", kind="partial_commit", outcome=o
        )
    r = (tx.get("outcome") or {}).get("reason") or {}
    kind = str(r.get("kind") or "aborted")
    cls = _ABORTS.get(kind, Aborted)
    return cls(
        f"transaction {tx.get('id')} aborted: {r.get('message') or kind}",
        kind=kind,
        retryable=bool(r.get("retryable")),
        outcome=o,
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


class _Connection:
    """One API key's connection pool to the server; safe to use from many threads."""

    def __init__(self, url: str, api_key: str, timeout: float) -> None:
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
        #: Seconds each wait for the server may take (requests get 5 more).
        self.timeout = float(timeout)
        self.http: "httpx.Client" = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=httpx.Timeout(timeout + 5.0)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]] = None,
        *,
        params: Optional[Mapping[str, Any]] = None,
        ok: Sequence[int] = (200, 201),
        timeout: Optional[float] = None,
    ) -> Tuple[int, Any]:
        """One request; 429/503 are retried after ``Retry-After`` (up to 5 times). A 503 from a
        node of a cluster that does not serve the key's tenant names the node that does
        (``owner_address``): the connection moves there and sends the request again at once
        (docs/deployment.md, "Route a request"). A status not in ``ok`` raises the exception
        of its problem document; a transport failure :class:`~tidegate.TidegateError` with
        kind ``"unavailable"`` (retryable)."""
        for attempt in range(6):
            try:
                if timeout is None:  # the connection's default timeout
                    r = self.http.request(method, path, json=body, params=params)
                else:
                    t = self._httpx.Timeout(timeout + 5.0)
                    r = self.http.request(method, path, json=body, params=params, timeout=t)
            except self._httpx.HTTPError as e:
                raise TidegateError(
                    f"{method} {self.url}{path}: {type(e).__name__}: {e}", kind="unavailable", retryable=True
                ) from e
            if r.status_code == 503 and attempt < 5 and self._follow_owner(r):
                continue
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

    def _follow_owner(self, r: Any) -> bool:
        """Moves the connection to the node a ``503 tenant_unavailable`` names, if it names
        another ``http(s)://`` address than this one. The refusing node did nothing with the
        request, so sending it again there is safe."""
        try:
            doc = r.json()
        except ValueError:
            return False
        addr = doc.get("owner_address") if isinstance(doc, dict) else None
        if not isinstance(addr, str) or not addr.startswith(("http://", "https://")) or len(addr) > 2048:
            return False
        addr = addr.rstrip("/")
        if addr == self.url:
            return False
        self.url = addr
        self.http.base_url = addr
        return True

    def close(self) -> None:
        self.http.close()
