"""The worker of :func:`tidegate.connect` (internal): what this process serves to the server's
pull-worker queues, and the thread that serves it.

Tools of this process are registered as server tools whose ``call``, ``compensate`` and
``probe`` capabilities are worker queues (``py.<tool>.call`` ...); capability handlers
(:meth:`tidegate.Client.capability`) are worker capabilities of their own name. One thread
long-polls every queue this client serves, runs the function a task names and reports the
result. A function's answer and its exceptions are read as the in-process engine reads them:
``NotApplied`` and ``TransientError`` say "did not happen" (``not_applied``; ``retry`` for
``NotApplied(retry=True)`` and ``TransientError``), any other exception "may have happened"
(``unknown``), and a probe's answer is ``True`` / ``Happened(output)`` / truthy (done),
``False`` / falsy (did not happen) or ``None`` (cannot tell)."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Tuple

from .errors import InvalidArgument, NotApplied, TidegateError, TransientError
from .outcome import Happened
from .plans import CapabilityRequest
from .tools import Tool, _check_tool
from .transaction import _seconds
from ._http import _server_name

if TYPE_CHECKING:
    from .client import Client

#: Longest error text of a ticket's or a task's result (the server takes at most 4096 bytes).
_MAX_ERROR_BYTES = 4000


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


def _probe_result(answer: Any) -> Dict[str, Any]:
    """A probe's answer as a task's result, read as the in-process engine reads it. For a
    probe, ``failed`` means "the call did not happen"."""
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


def _run(operation: str, fn: Callable[[], Any], read: Callable[[Any], Dict[str, Any]]) -> Dict[str, Any]:
    """Runs one task's function and returns its result: ``read`` of its answer, or what its
    exception says (a probe that raised cannot tell)."""
    try:
        answer = fn()
    except Exception as e:  # noqa: BLE001 - a function's failure is reported, not raised here
        if operation == "probe":
            return {"status": "unknown", "error": f"the probe raised {_error_text(e)}"}
        # NotApplied / TransientError: not_applied (with retry: queued again within the
        # capability's attempts); anything else: unknown.
        return _failure(e)
    return _probe_result(answer) if operation == "probe" else read(answer)


def _handler_compensation(answer: Any) -> Dict[str, Any]:
    """A capability handler's compensation answer: ``None`` done, a ``str`` done with that
    residue, any other value done with it as output (:class:`tidegate.CapabilityRequest`)."""
    if answer is None:
        return {"status": "done"}
    if isinstance(answer, str):
        return {"status": "done", "residue": answer}
    return {"status": "done", "output": _jsonable(answer)}


def _tool_compensation(answer: Any) -> Dict[str, Any]:
    """A tool's ``compensate`` answer: a non-empty ``str`` is residue, anything else a clean undo."""
    if isinstance(answer, str) and answer:
        return {"status": "done", "residue": answer}
    return {"status": "done"}


def _done(answer: Any) -> Dict[str, Any]:
    """A call's or a release's answer: done, with its output."""
    return {"status": "done", "output": _jsonable(answer)}


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
    return _run(op, lambda: _invoke(handler, (req,), {}), _handler_compensation)


def _run_tool(t: Tool, task: Mapping[str, Any]) -> Dict[str, Any]:
    """Runs a task of a tool of this process: its call (a release of a held effect), its
    compensation or its probe, from the call's recorded arguments."""
    op = str(task.get("operation"))
    args, kwargs = _unpack(task.get("args"))
    # The call id a tool function may take: the effect's key (a compensation's task key
    # is `<key>#compensate`), the same id the call ran under.
    call_id = str(task.get("key", "")).removesuffix("#compensate")
    if op in ("call", "release"):
        kw = _with_call_id(kwargs, t._wants_call_id[0], call_id)
        return _run(op, lambda: _invoke(t.fn, args, kw), _done)
    if op == "compensate" and t.compensate is not None:
        comp, kw = t.compensate, _with_call_id(kwargs, t._wants_call_id[1], call_id)
        return _run(op, lambda: _invoke(comp, (task.get("output"),) + args, kw), _tool_compensation)
    if op == "probe" and t.probe is not None:
        probe, kw = t.probe, _with_call_id(kwargs, t._wants_call_id[2], call_id)
        return _run(op, lambda: _invoke(probe, args, kw), _probe_result)
    if op == "probe":
        # For a probe, "failed" would mean "the call did not happen".
        return {"status": "unknown", "error": f"tool `{t.name}` has no probe function"}
    return {"status": "failed", "error": f"tool `{t.name}` has no {op} function"}


def _unpack(payload: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """Positional and keyword arguments from a call's recorded arguments."""
    if not isinstance(payload, dict):
        return (payload,), {}
    kwargs = {k: v for k, v in payload.items() if k != "$args"}
    args = tuple(payload.get("$args") or ())
    return args, kwargs


def _pack(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """A call's arguments as the JSON object a server tool takes (positional ones under ``$args``)."""
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
    """Calls ``fn``; a coroutine it returns is run to completion on an event loop of its own."""
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


#: Effect classes of tools of this process and the server's class of each.
_EFFECT_CLASSES = {
    "reversible": "reversible",
    "reversible_with_cost": "reversible_with_cost",
    "bufferable": "bufferable",
    "gated": "gated",
    "idempotent": "idempotent",
}


def _worker_capability(deadline: Optional[float]) -> Dict[str, Any]:
    """The definition of a worker capability; ``deadline`` (seconds) settles a task no worker
    took in time."""
    spec: Dict[str, Any] = {"kind": "worker"}
    if deadline is not None:
        _seconds(deadline, "deadline", positive=True)
        spec["deadline_ms"] = int(deadline * 1000)
    return spec


class _Worker:
    """What one client serves (tools of this process, capability handlers) and the thread that
    serves it. A capability is served by a tool or by a handler, never both."""

    def __init__(self, client: "Client", name: str) -> None:
        self._client = client
        self.name = name
        self._tools: Dict[str, Tool] = {}
        self._tool_caps: Dict[str, Tool] = {}
        self._cap_handlers: Dict[str, Callable[[CapabilityRequest], Any]] = {}
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    # -- what is served ----------------------------------------------------------------------

    def serve_capability(
        self, name: str, handler: Callable[[CapabilityRequest], Any], deadline: Optional[float]
    ) -> None:
        """Defines ``name`` as a worker capability and serves it with ``handler``."""
        self._check_not_a_tool_capability(name)
        self._client.define_capability(name, _worker_capability(deadline))
        with self._lock:
            self._check_not_a_tool_capability(name)
            self._cap_handlers[name] = handler
            self._start()

    def _check_not_a_tool_capability(self, name: str) -> None:
        t = self._tool_caps.get(name)
        if t is not None:
            raise InvalidArgument(
                f"invalid `name` = {name!r}: the capability serves tool `{t.name}` of this client",
                kind="invalid_argument",
                argument="name",
            )

    def serve_tool(self, t: Tool, deadline: Optional[float] = None) -> None:
        """Registers tool ``t`` on the server (its worker capabilities and a server tool of its
        name) unless this worker serves it already, and serves it."""
        _check_tool(t, "a function declared with @tidegate.tool or a server tool's name")
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
        spec = _worker_capability(deadline)
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
            self._client.define_capability(cap, spec)
        # Calls from this client always send their scopes; the template only answers callers
        # that send none (and names the argument they must then pass).
        scopes = t._const_scopes or [f"kv:py.{name}:{{_scope}}"]
        definition: Dict[str, Any] = {
            "class": _EFFECT_CLASSES.get(t.effect, t.effect),
            "scopes": scopes,
            "description": f"served by Python worker processes ({_where(t.fn)})",
            **caps,
        }
        self._client.define_tool(name, definition)
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
            self._start()

    # -- the thread ---------------------------------------------------------------------------

    def _start(self) -> None:
        """Starts the thread unless it runs (called with the lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._work, name=f"tidegate-worker-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops the thread after its current long poll and the tasks that poll leased, which
        it runs and reports (a leased task left unrun would wait for its lease to run out before
        any worker could take it), and waits for it, up to 10 s, unless called from it. A task
        still running then is reported if the connection is still open, or offered again when
        its lease ends."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                caps = sorted({*self._tool_caps, *self._cap_handlers})
            try:
                _, r = self._client._request(
                    "POST",
                    "/v1/tasks/poll",
                    {"worker": self.name, "capabilities": caps, "max_tasks": 8, "wait_ms": 2000},
                    ok=(200,),
                    timeout=5.0,
                )
            except TidegateError:
                if self._stop.wait(0.5):
                    return
                continue
            # Tasks leased to this worker are run even when it is stopping: only their lease
            # would give them back, so another worker could take them only after it ran out.
            for task in r.get("tasks", ()):
                self._run_task(task)

    def _run_task(self, task: Mapping[str, Any]) -> None:
        cap = str(task.get("capability"))
        handler = self._cap_handlers.get(cap)
        t = self._tool_caps.get(cap)
        if handler is not None:
            result = _run_capability(handler, task)
        elif t is not None:
            result = _run_tool(t, task)
        else:
            result = {"status": "failed", "error": f"no tool of this worker serves {cap}"}
        try:
            self._client._request(
                "POST", f"/v1/tasks/{task['id']}/report", {"worker": self.name, "result": result}, ok=(200, 409)
            )
        except Exception:  # noqa: BLE001 - also a client closed under the worker (RuntimeError)
            pass  # the lease runs out and the task is offered again under the same key
