"""A small client of the review middleware of ``tidegate serve`` (``/v1/review``, docs/review.md
and docs/server.md "Review"), in pure Python over HTTP (the standard library only)::

    from tidegate.review import ReviewClient

    ops = ReviewClient("http://127.0.0.1:7878", api_key=operator_key)
    ops.register(template_set, schema="CREATE TABLE IF NOT EXISTS account (...)")

    agent = ReviewClient("http://127.0.0.1:7878", api_key=agent_key)
    tx = agent.request("withdraw", {"id": 1, "amount": 70}, sender="llm-7", suspicious=True)
    tx["status"]                      # "awaiting_review"

    reviewer = ReviewClient("http://127.0.0.1:7878", api_key=reviewer_key)
    for t in reviewer.queue()["data"]:
        print(t["id"], t["sql"], t["params"], t["sender"], t["waited_by"], t["removal_cascade"])
    reviewer.remove(tx["id"])["cascaded"]   # what the removal took with it

Transactions are the server's JSON objects (``id``, ``template``, ``sql``, ``params``,
``sender``, ``suspicious``, ``status``, ``reviewable``, ``review``, ``waits_for``,
``waited_by``, ``removal_cascade``, ``cascaded_from``, ``error``). Refusals raise the package's
exceptions: :class:`~tidegate.InvalidArgument` naming the field (``argument``) for bad input,
:class:`~tidegate.TidegateError` with the problem's ``code`` as ``kind`` otherwise (e.g.
``not_reviewable``, ``not_found``, ``forbidden``); transport failures raise
:class:`~tidegate.TidegateError` with kind ``"unavailable"`` (retryable).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Mapping, Optional

from .errors import InvalidArgument, TidegateError

__all__ = ["ReviewClient"]


def _error(status: int, doc: Mapping[str, Any]) -> TidegateError:
    code = str(doc.get("code") or f"http_{status}")
    detail = str(doc.get("detail") or doc.get("title") or f"HTTP {status}")
    if code in ("invalid_field", "missing_field", "unknown_field", "invalid_json", "invalid_query"):
        field = doc.get("field")
        return InvalidArgument(detail, kind="invalid_argument", argument=None if field is None else str(field))
    return TidegateError(detail, kind=code, retryable=bool(doc.get("retryable")))


class ReviewClient:
    """The ``/v1/review`` endpoints of one tenant, with one API key. Which calls succeed
    depends on the key's role: ``register`` needs operator or admin, ``request`` agent or
    admin, ``accept`` and ``remove`` reviewer or admin; reading works with any key."""

    #: The server's base URL.
    url: str

    def __init__(self, url: str, api_key: str, *, timeout: float = 60.0) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"invalid `url` = {url!r}: expected an http:// or https:// URL", kind="invalid_argument", argument="url"
            )
        if not isinstance(api_key, str) or not api_key:
            raise InvalidArgument(
                "invalid `api_key`: expected the key as a non-empty str", kind="invalid_argument", argument="api_key"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidArgument(
                f"invalid `timeout` = {timeout!r}: expected a positive number of seconds",
                kind="invalid_argument",
                argument="timeout",
            )
        self.url = url.rstrip("/")
        self._key = api_key
        self._timeout = float(timeout)

    def _call(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(6):
            req = urllib.request.Request(self.url + path, data=data, method=method)
            req.add_header("Authorization", "Bearer " + self._key)
            req.add_header("Accept", "application/json")
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=self._timeout) as r:
                    raw = r.read()
                    return dict(json.loads(raw)) if raw else {}
            except urllib.error.HTTPError as e:
                raw = e.read()
                try:
                    doc = json.loads(raw) if raw else {}
                except ValueError:
                    doc = {"detail": raw.decode(errors="replace")}
                if e.code in (429, 503) and attempt < 5:
                    try:
                        wait = float(e.headers.get("retry-after", "1"))
                    except ValueError:
                        wait = 1.0
                    time.sleep(min(max(wait, 0.05), 5.0))
                    continue
                raise _error(e.code, doc if isinstance(doc, dict) else {}) from None
            except (urllib.error.URLError, OSError) as e:
                raise TidegateError(
                    f"{method} {self.url}{path}: {type(e).__name__}: {e}", kind="unavailable", retryable=True
                ) from e
        raise TidegateError(f"{method} {path}: still overloaded", kind="too_many_requests", retryable=True)

    @staticmethod
    def _id(transaction: Any) -> str:
        tid = transaction.get("id") if isinstance(transaction, Mapping) else transaction
        if not isinstance(tid, str) or not tid:
            raise InvalidArgument(
                f"invalid `id` = {tid!r}: expected a review transaction id (`rv_<tag>_<n>`) or a transaction dict",
                kind="invalid_argument",
                argument="id",
            )
        return urllib.parse.quote(tid, safe="")

    def register(self, template_set: Mapping[str, Any], *, schema: Optional[str] = None) -> Dict[str, Any]:
        """Registers templates (``{"tables", "invariants", "templates"}``, the format of
        docs/review.md) after running ``schema`` (SQL) on the tenant's review database.
        Returns ``{"added", "templates", "strategy", "granularity"}``."""
        body: Dict[str, Any] = {"set": dict(template_set)}
        if schema is not None:
            body["schema"] = schema
        return self._call("POST", "/v1/review/templates", body)

    def templates(self) -> Dict[str, Any]:
        """The registered templates' names, the strategy and the granularity."""
        return self._call("GET", "/v1/review/templates")

    def request(
        self,
        template: str,
        params: Mapping[str, Any],
        *,
        sender: Optional[str] = None,
        suspicious: bool = False,
    ) -> Dict[str, Any]:
        """Requests a transaction of ``template`` with ``params``; returns it with its ``id``
        and ``status`` (``committed`` when it ran at once, ``awaiting_review``, ``held``,
        ``executed_awaiting_review``, ``failed``). ``sender`` defaults to the key's id."""
        body: Dict[str, Any] = {"template": template, "params": dict(params), "suspicious": bool(suspicious)}
        if sender is not None:
            body["sender"] = sender
        return self._call("POST", "/v1/review/transactions", body)

    def status(self, transaction: Any) -> Dict[str, Any]:
        """A transaction (by id or as returned by another call), as it stands now."""
        return self._call("GET", f"/v1/review/transactions/{self._id(transaction)}")

    def accept(self, transaction: Any) -> Dict[str, Any]:
        """Accepts a suspicious transaction. Returns ``{"transaction", "cascaded"}``."""
        return self._call("POST", f"/v1/review/transactions/{self._id(transaction)}/accept")

    def remove(self, transaction: Any) -> Dict[str, Any]:
        """Removes a suspicious transaction and everything that builds on it. Returns
        ``{"transaction", "cascaded"}``, ``cascaded`` naming what went with it."""
        return self._call("POST", f"/v1/review/transactions/{self._id(transaction)}/remove")

    def queue(self) -> Dict[str, Any]:
        """The buffer: ``{"data": [transactions, oldest first], "total", "reviewable"}``."""
        return self._call("GET", "/v1/review/queue")

    def __repr__(self) -> str:
        return f"ReviewClient({self.url!r})"
