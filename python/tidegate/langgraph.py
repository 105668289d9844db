"""A drop-in for LangGraph's ``ToolNode`` that runs each assistant turn as one transaction.

Replace ``from langgraph.prebuilt import ToolNode`` with ``from tidegate.langgraph import
ToolNode``. The node takes the same arguments, plus:

* ``engine``: the :class:`tidegate.Tidegate` to use (default: :func:`tidegate.default_engine`),
  or a :class:`tidegate.Client` from :func:`tidegate.connect` to run the turns on
  ``tidegate serve`` (eager calls run in this process through tickets; held calls, and
  compensations after an abort, are released by the client's worker thread);
* ``effects``: ``{tool_name: declaration}`` where a declaration is an effect class string
  (``"gated"``), a dict / :func:`effect` with ``effect``, ``scope``, ``compensate``, ``key``,
  ``probe``. Tools declared with ``@tidegate.tool`` need no entry;
* ``approve``: a human approval of the turn before any of its calls runs, through LangGraph's
  ``interrupt()``: ``True`` (every turn with tool calls), a collection of tool names (turns
  calling one of them), or your own function ``fn(view) -> bool | str | None`` (it may call
  ``interrupt()`` itself; ``view`` is described at :meth:`ToolNode.plan_view`).

Semantics of one turn (the tool calls of the last AI message):

* one transaction; the tool calls are issued to the engine in the order the model issued
  them, and their side effects reach the outside world in that order: eager tools (declared
  reversible/idempotent, and undeclared tools) execute one after another in issuance order;
  gated and bufferable tools are held and fire only when the turn commits, in issuance order,
  after every eager call of the turn. The stock node runs calls concurrently and externalises
  them in completion order;
* returned ``ToolMessage``\\ s keep issuance order; held calls report their result after the
  commit;
* a failing tool aborts the turn: what ran is compensated in reverse order, held calls never
  fire, and every ``ToolMessage`` reports the failure (status ``"error"``);
* a commit that fires some held calls and then fails to release another (after retries) is a
  partial commit: the fired calls report their results, the failed and later ones an error;
* **approval runs before anything executes.** LangGraph re-runs an interrupted node from its
  start when the graph resumes, so the node asks for approval first: the first pass calls
  ``interrupt()`` with the planned calls (names, arguments, effect classes, scopes) and nothing
  has run when it suspends; the resumed pass gets the answer, and an approved turn then runs
  once, a rejected one not at all. Eager effects are therefore never executed twice across an
  approval, even if the process restarts between the interrupt and the resume (the engine holds
  no transaction open across the interrupt). The price: the approver sees what the turn will
  do, not the outputs of its eager calls;
* idempotency keys are ``"lg:{thread_id}:{tool_call_id}"``: a graph resumed from a checkpoint
  after a crash gets the recorded output of a call that already committed instead of firing it
  again. Keys are engine-wide: the same thread and tool call id on the same engine replay;
* undeclared tools run eagerly in issuance order; on abort they cannot be undone and are
  tagged ``unresolved``, with a one-time warning naming them.
* a declaration's ``compensate`` and ``probe`` that take a ``call_id`` keyword get the tool call's
  id (also when recovery runs them in a later process).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple, Union

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list, set_config_context
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode as _StockToolNode
from langgraph.prebuilt.tool_node import ToolRuntime
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from .client import Client
from .engine import Tidegate, default_engine
from .errors import Aborted, InvalidArgument, KeyUnresolved, PartialCommit, TidegateError, ToolFailed
from .outcome import Held
from .tools import EFFECTS, Tool, _takes_call_id
from .transaction import Transaction

__all__ = ["ToolNode", "Declaration", "effect"]

ScopeDecl = Union[None, str, Sequence[str], Callable[..., Any]]
Approver = Callable[[Dict[str, Any]], Any]


@dataclass(frozen=True)
class Declaration:
    """How a LangGraph tool's calls settle. ``scope``, ``key`` and ``probe`` are called with
    the tool call's arguments by name; ``compensate(result, **args)`` gets the tool's output
    (the ``ToolMessage`` content). ``compensate`` and ``probe`` also get ``call_id=<tool call
    id>`` if they declare that keyword."""

    effect: str
    scope: ScopeDecl = None
    compensate: Optional[Callable[..., Any]] = None
    key: Optional[Callable[..., str]] = None
    probe: Optional[Callable[..., Any]] = None


def effect(
    effect: str,
    *,
    scope: ScopeDecl = None,
    compensate: Optional[Callable[..., Any]] = None,
    key: Optional[Callable[..., str]] = None,
    probe: Optional[Callable[..., Any]] = None,
) -> Declaration:
    """A declaration for ``ToolNode(effects={name: effect(...)})``."""
    return _declaration("effect", {"effect": effect, "scope": scope, "compensate": compensate, "key": key, "probe": probe})


def _invalid(message: str, argument: str = "effects") -> InvalidArgument:
    return InvalidArgument(message, kind="invalid_argument", argument=argument)


def _declaration(name: str, d: Any) -> Declaration:
    if isinstance(d, Declaration):
        return d
    if isinstance(d, str):
        d = {"effect": d}
    if not isinstance(d, Mapping):
        raise _invalid(
            f"invalid `effects[{name!r}]` = {d!r}: expected an effect class string, a dict or tidegate.langgraph.effect(...)"
        )
    unknown = set(d) - {"effect", "scope", "compensate", "key", "probe"}
    if unknown:
        raise _invalid(f"invalid `effects[{name!r}]`: unknown fields {sorted(unknown)}; expected effect, scope, compensate, key, probe")
    eff = d.get("effect")
    if eff not in EFFECTS:
        raise _invalid(f"invalid `effects[{name!r}].effect` = {eff!r}: expected one of {', '.join(map(repr, EFFECTS))}")
    scope = d.get("scope")
    if scope is not None and not (isinstance(scope, (str, list, tuple)) or callable(scope)):
        raise _invalid(f"invalid `effects[{name!r}].scope` = {scope!r}: expected a str, a list of str or a function")
    for f in ("compensate", "key", "probe"):
        v = d.get(f)
        if v is not None and not callable(v):
            raise _invalid(f"invalid `effects[{name!r}].{f}` = {v!r}: expected a callable or None")
    return Declaration(str(eff), scope, d.get("compensate"), d.get("key"), d.get("probe"))


class _Turn:
    """Per-turn state the adapters read (through a context variable)."""

    def __init__(self, node: "ToolNode", input_type: str, runtimes: Dict[str, Any], aio: bool) -> None:
        self.node = node
        self.input_type = input_type
        self.runtimes = runtimes
        self.aio = aio
        self.live: Dict[str, Any] = {}


class _Planned(NamedTuple):
    """One tool call of the turn: the adapter is ``None`` for a tool the node does not have."""

    call: Dict[str, Any]
    adapter: Optional[Tool]
    scopes: List[str]
    key: Optional[str]


_turn: "contextvars.ContextVar[Optional[_Turn]]" = contextvars.ContextVar("tidegate_lg_turn", default=None)

_warned: Set[Tuple[str, str]] = set()
_nodes: Dict[str, "ToolNode"] = {}


def _node(full: str) -> "ToolNode":
    turn = _turn.get()
    if turn is not None and full.startswith(f"{turn.node.name}/"):
        return turn.node
    return _nodes[full]


def _run_adapter(full: str, name: str, call: Dict[str, Any]) -> Any:
    node = _node(full)
    turn = _turn.get()
    cid = call.get("id")
    if turn is None or cid not in turn.runtimes:
        # Recovery after a crash: no turn context; run the tool directly.
        return _content(node.tools_by_name[name].invoke({**call, "type": "tool_call"}))
    rt = turn.runtimes[cid]
    if turn.aio:
        return node._afinish(turn, str(cid), node._arun_one(call, turn.input_type, rt))  # type: ignore[arg-type]
    return node._finish(turn, str(cid), node._run_one(call, turn.input_type, rt))  # type: ignore[arg-type]


def _with_call_id(fn: Callable[..., Any], call: Dict[str, Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    if _takes_call_id(fn):
        return {**kwargs, "call_id": call.get("id")}
    return kwargs


def _compensate_adapter(full: str, name: str, result: Any, call: Dict[str, Any]) -> Any:
    comp = _node(full)._decls[name].compensate
    assert comp is not None
    content = result.get("content") if isinstance(result, dict) else result
    return comp(content, **_with_call_id(comp, call, call.get("args", {})))


def _probe_adapter(full: str, name: str, call: Dict[str, Any]) -> Any:
    probe = _node(full)._decls[name].probe
    assert probe is not None
    return probe(**_with_call_id(probe, call, call.get("args", {})))


def _content(msg: Any) -> Dict[str, Any]:
    if isinstance(msg, ToolMessage):
        content = msg.content if isinstance(msg.content, str) else str(msg.content)
        return {"content": content, "status": msg.status}
    return {"content": str(msg), "status": "success"}


class _Unknown:
    """A call whose earlier execution has an unknown outcome (see ``KeyUnresolved``)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail


class _Rejected(Exception):
    """The turn's approval was refused; nothing ran."""


class _ToolError(Exception):
    """A tool reported an error (a ToolMessage with status "error")."""


def _verdict(answer: Any) -> Union[bool, str]:
    """An approver's answer: ``True`` approves; ``False`` or a reason (str) rejects."""
    if answer is None or answer is True:
        return True
    if isinstance(answer, dict):
        answer = answer.get("approved", answer.get("approve"))
    if isinstance(answer, str):
        return True if answer.strip().lower() in ("y", "yes", "approve", "approved", "ok") else f"rejected: {answer}"
    return True if bool(answer) else "rejected"


class ToolNode(_StockToolNode):
    """LangGraph's ``ToolNode`` with each turn's tool calls under one Tidegate transaction.
    See the module documentation for the semantics."""

    def __init__(
        self,
        tools: Sequence[Union[BaseTool, Callable[..., Any]]],
        *,
        engine: Optional[Union[Tidegate, Client]] = None,
        effects: Optional[Mapping[str, Any]] = None,
        approve: Union[None, bool, Collection[str], Approver] = None,
        **kwargs: Any,
    ) -> None:
        decls: Dict[str, Declaration] = {}
        plain: List[Any] = []
        for t in tools:
            if isinstance(t, Tool):
                decls[t.name] = Declaration(t.effect, t.scope, t.compensate, t.key, t.probe)
                plain.append(t.fn)
            else:
                plain.append(t)
        super().__init__(plain, **kwargs)
        if effects is not None:
            if not isinstance(effects, Mapping):
                raise _invalid(f"invalid `effects` = {effects!r}: expected a mapping of tool name to declaration")
            for name, d in effects.items():
                if name not in self.tools_by_name:
                    raise _invalid(f"invalid `effects` key {name!r}: no such tool; tools are {sorted(self.tools_by_name)}")
                decls[name] = _declaration(name, d)
        if engine is not None and not isinstance(engine, (Tidegate, Client)):
            raise _invalid(
                f"invalid `engine` = {engine!r}: expected a tidegate.Tidegate or a tidegate.Client", "engine"
            )
        if approve is not None and not (isinstance(approve, bool) or callable(approve) or isinstance(approve, Collection)):
            raise _invalid(
                f"invalid `approve` = {approve!r}: expected True, a collection of tool names or a function", "approve"
            )
        if isinstance(approve, str):
            approve = {approve}
        self._engine = engine
        self._decls = decls
        self._approve = approve

    # -- adapters -----------------------------------------------------------------------------

    @property
    def engine(self) -> Union[Tidegate, Client]:
        """The engine this node settles turns with."""
        return self._engine if self._engine is not None else default_engine()

    def adapters(self, engine: Optional[Union[Tidegate, Client]] = None) -> List[Tool]:
        """The Tidegate tools this node registers, named ``"{node name}/{tool name}"`` (pass
        them to ``engine.recover(*node.adapters())`` after a restart)."""
        engine = engine if engine is not None else self.engine
        return [self._adapter(engine, name) for name in self.tools_by_name]

    def _adapter(self, engine: Union[Tidegate, Client], name: str) -> Tool:
        full = f"{self.name}/{name}"
        _nodes[full] = self
        cache: Dict[str, Tool] = engine.__dict__.setdefault("_lg_adapters", {})
        decl = self._decls.get(name)
        eff = decl.effect if decl is not None else "reversible"
        has_comp = decl is not None and decl.compensate is not None
        has_probe = decl is not None and decl.probe is not None
        t = cache.get(full)
        if t is not None:
            if (t.effect, t.compensate is not None, t.probe is not None) != (eff, has_comp, has_probe):
                raise _invalid(
                    f"invalid `effects[{name!r}]`: tool `{full}` is already registered on this engine as "
                    f"{t.effect!r} by another ToolNode named {self.name!r}; give this node another name=..."
                )
            return t
        t = Tool(
            functools.partial(_run_adapter, full, name),
            scope=f"tool:{name}",
            effect=eff,
            compensate=functools.partial(_compensate_adapter, full, name) if has_comp else None,
            probe=functools.partial(_probe_adapter, full, name) if has_probe else None,
            name=full,
        )
        t._names = ("call",)
        engine.register(t)
        cache[full] = t
        return t

    def _finish(self, turn: _Turn, cid: str, msg: Any) -> Dict[str, Any]:
        turn.live[cid] = msg
        out = _content(msg)
        if out["status"] == "error":
            raise _ToolError(out["content"])
        return out

    async def _afinish(self, turn: _Turn, cid: str, coro: Any) -> Dict[str, Any]:
        return self._finish(turn, cid, await coro)

    # -- one turn -----------------------------------------------------------------------------

    def _scopes(self, name: str, args: Dict[str, Any]) -> List[str]:
        decl = self._decls.get(name)
        scope = decl.scope if decl is not None else None
        if scope is None:
            return [f"tool:{name}"]
        if isinstance(scope, str):
            return [scope]
        if not callable(scope):
            return list(scope)
        try:
            s = scope(**args)
        except Exception as e:
            raise _invalid(
                f"invalid `scope` of tool `{name}`: the scope function raised {type(e).__name__}: {e}", "scope"
            ) from e
        return [s] if isinstance(s, str) else list(s)

    def _key(self, name: str, call: Mapping[str, Any], config: Any) -> Optional[str]:
        decl = self._decls.get(name)
        if decl is not None and decl.key is not None:
            return str(decl.key(**call.get("args", {})))
        thread = (config or {}).get("configurable", {}).get("thread_id")
        if thread is None or not call.get("id"):
            return None
        return f"lg:{thread}:{call['id']}"

    def _prepare(self, input: Any, config: Any, runtime: Any, aio: bool) -> Tuple[List[Any], str, _Turn, List[_Planned], List[str]]:
        tool_calls, input_type = self._parse_input(input)
        config_list = get_config_list(config, len(tool_calls))
        runtimes: Dict[str, Any] = {}
        for call, cfg in zip(tool_calls, config_list):
            state = self._extract_state(input, cfg)
            runtimes[call["id"] or ""] = ToolRuntime(
                state=state,
                tool_call_id=call["id"],
                config=cfg,
                context=runtime.context,
                store=runtime.store,
                stream_writer=runtime.stream_writer,
                tools=list(self.tools_by_name.values()),
                execution_info=runtime.execution_info,
                server_info=runtime.server_info,
            )
        turn = _Turn(self, input_type, runtimes, aio)
        engine = self.engine
        plan: List[_Planned] = []
        for tc in tool_calls:
            c: Dict[str, Any] = dict(tc)
            name = c["name"]
            if name not in self.tools_by_name:
                plan.append(_Planned(c, None, [], None))
                continue
            plan.append(_Planned(c, self._adapter(engine, name), self._scopes(name, c.get("args", {})), self._key(name, c, config)))
        may_touch = sorted({s for p in plan if p.adapter is not None for s in p.scopes})
        return list(tool_calls), input_type, turn, plan, may_touch

    def plan_view(self, plan: Sequence[Any]) -> Dict[str, Any]:
        """What an approver judges, before anything runs: ``{"tidegate": "approve_turn",
        "agent": node name, "calls": [{"name", "args", "id"}], "effects": [{"tool", "effect",
        "scopes", "args", "id"}]}`` (``effects`` lists the calls of tools the node has, with
        their declared effect class; undeclared tools are ``"reversible"`` and cannot be
        undone)."""
        return {
            "tidegate": "approve_turn",
            "agent": self.name,
            "calls": [{"name": p.call["name"], "args": p.call.get("args", {}), "id": p.call.get("id")} for p in plan],
            "effects": [
                {
                    "tool": p.call["name"],
                    "effect": p.adapter.effect,
                    "scopes": list(p.scopes),
                    "args": p.call.get("args", {}),
                    "id": p.call.get("id"),
                }
                for p in plan
                if p.adapter is not None
            ],
        }

    def _approver(self, plan: List[_Planned]) -> Optional[Approver]:
        a = self._approve
        if a is None or a is False or not any(p.adapter is not None for p in plan):
            return None
        if callable(a):
            return a
        names = {p.call["name"] for p in plan if p.adapter is not None}
        if a is not True and not (names & set(a)):
            return None
        return interrupt

    def _approve_turn(self, plan: List[_Planned]) -> None:
        approver = self._approver(plan)
        if approver is None:
            return
        answer = approver(self.plan_view(plan))
        if inspect.isawaitable(answer):
            from ._bridge import run_blocking

            async def wait() -> Any:
                return await answer

            answer = run_blocking(wait, (), None)
        verdict = _verdict(answer)
        if verdict is not True:
            raise _Rejected(str(verdict))

    async def _aapprove_turn(self, plan: List[_Planned], config: RunnableConfig) -> None:
        approver = self._approver(plan)
        if approver is None:
            return
        if sys.version_info < (3, 11):
            # Before 3.11 asyncio tasks cannot carry LangGraph's config context, so interrupt()
            # cannot find it (stock LangGraph's async interrupt fails the same way); give it
            # the node's config explicitly.
            with set_config_context(config) as ctx:
                answer = ctx.run(approver, self.plan_view(plan))
        else:
            answer = approver(self.plan_view(plan))
        if inspect.isawaitable(answer):
            answer = await answer
        verdict = _verdict(answer)
        if verdict is not True:
            raise _Rejected(str(verdict))

    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        tool_calls, input_type, turn, plan, may_touch = self._prepare(input, config, runtime, aio=False)
        try:
            self._approve_turn(plan)  # may raise GraphInterrupt: nothing has run yet
        except _Rejected as r:
            return self._combine_tool_outputs(self._rejected(plan, str(r)), input_type)  # type: ignore[arg-type]
        token = _turn.set(turn)
        acks: List[Any] = []
        failure: Optional[BaseException] = None
        try:
            tx = self.engine.begin(agent=self.name or "tools", may_touch=may_touch)
            for p in plan:
                if p.adapter is None:
                    acks.append(None)
                    continue
                try:
                    acks.append(tx._call(p.adapter, (), {"call": _json_call(p.call)}, p.scopes, p.key))
                except KeyUnresolved as e:
                    # Interrupted by a crash with an unknown outcome: never repeated.
                    acks.append(_Unknown(str(e)))
                except Aborted as e:
                    failure = e
                    break
                except BaseException:
                    if tx.state in ("open", "sealed"):
                        tx.abort("the tool node failed")
                    raise
            if failure is None:
                try:
                    tx.commit()
                except (Aborted, PartialCommit) as e:
                    failure = e
            elif tx.state is not None:
                tx.abort(f"{failure}")
        finally:
            _turn.reset(token)
        outputs = self._messages(plan, acks, turn, tx, failure)
        return self._combine_tool_outputs(outputs, input_type)  # type: ignore[arg-type]

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        tool_calls, input_type, turn, plan, may_touch = self._prepare(input, config, runtime, aio=True)
        try:
            await self._aapprove_turn(plan, config)  # may raise GraphInterrupt: nothing has run yet
        except _Rejected as r:
            return self._combine_tool_outputs(self._rejected(plan, str(r)), input_type)  # type: ignore[arg-type]
        token = _turn.set(turn)
        acks: List[Any] = []
        failure: Optional[BaseException] = None
        try:
            tx = self.engine.begin(agent=self.name or "tools", may_touch=may_touch)
            for p in plan:
                if p.adapter is None:
                    acks.append(None)
                    continue
                try:
                    acks.append(await tx._acall(p.adapter, (), {"call": _json_call(p.call)}, p.scopes, p.key))
                except KeyUnresolved as e:
                    acks.append(_Unknown(str(e)))
                except Aborted as e:
                    failure = e
                    break
                except BaseException:
                    if tx.state in ("open", "sealed"):
                        await tx.aabort("the tool node failed")
                    raise
            if failure is None:
                try:
                    await tx.acommit()
                except (Aborted, PartialCommit) as e:
                    failure = e
            elif tx.state is not None:
                await tx.aabort(f"{failure}")
        finally:
            _turn.reset(token)
        outputs = self._messages(plan, acks, turn, tx, failure)
        return self._combine_tool_outputs(outputs, input_type)  # type: ignore[arg-type]

    def _rejected(self, plan: List[_Planned], reason: str) -> List[Any]:
        out: List[Any] = []
        for p in plan:
            if p.adapter is None:
                msg = self._validate_tool_call(p.call)  # type: ignore[arg-type]
                out.append(msg if msg is not None else _error_msg(p.call, f"Tool {p.call['name']} is not available"))
            else:
                out.append(_error_msg(p.call, f"Not applied: the turn was {reason}; none of its calls ran."))
        return out

    def _warn_undeclared(self, tx: Transaction) -> None:
        outcome = tx.outcome
        if outcome is None:
            return
        undeclared = sorted(
            {
                e.tool.split("/", 1)[-1]
                for e in outcome.effects
                if e.tag == "unresolved" and e.tool.split("/", 1)[-1] not in self._decls
            }
        )
        fresh = [n for n in undeclared if (self.name or "", n) not in _warned]
        if fresh:
            _warned.update((self.name or "", n) for n in fresh)
            warnings.warn(
                f"tidegate ToolNode {self.name!r}: undeclared tools {fresh} ran eagerly and could not be undone "
                "when the turn aborted (tagged 'unresolved'); declare them with effects={...}",
                RuntimeWarning,
                stacklevel=4,
            )

    def _messages(
        self, plan: List[_Planned], acks: List[Any], turn: _Turn, tx: Transaction, failure: Optional[BaseException]
    ) -> List[Any]:
        aborted = failure is not None and not isinstance(failure, PartialCommit)
        if aborted:
            self._warn_undeclared(tx)
        failed_id = None
        if isinstance(failure, ToolFailed) and len(acks) < len(plan):
            # The failing call is the first one without an acknowledgement.
            failed_id = plan[len(acks)].call.get("id")
        out: List[Any] = []
        for i, p in enumerate(plan):
            call = p.call
            cid = call.get("id")
            if p.adapter is None:
                msg = self._validate_tool_call(call)  # type: ignore[arg-type]
                out.append(msg if msg is not None else _error_msg(call, f"Tool {call['name']} is not available"))
                continue
            if aborted:
                assert failure is not None
                if cid == failed_id:
                    live = turn.live.get(str(cid))
                    text = live.content if isinstance(live, ToolMessage) else _cause_text(failure)
                    out.append(_error_msg(call, f"Error: {text}\nThe turn was aborted; effects of the other calls were undone."))
                else:
                    out.append(
                        _error_msg(
                            call,
                            f"Not applied: the turn was aborted ({_failure_text(failure)}); this call's effect was undone or never fired.",
                        )
                    )
                continue
            ack = acks[i]
            if isinstance(ack, _Unknown):
                out.append(
                    _error_msg(
                        call,
                        f"Outcome unknown: this call was interrupted by a crash and is not repeated ({ack.detail}). An operator must resolve it.",
                    )
                )
                continue
            if isinstance(ack, Held) and not ack.released:
                # Only after a partial commit: this held call failed to release or never was.
                e = tx.outcome.effect(ack.effect) if tx.outcome is not None else None
                what = e.disposition if e is not None else "not released"
                out.append(
                    _error_msg(
                        call,
                        f"Not applied: the turn committed only in part ({what.replace('_', ' ')}: {_partial_text(failure)}); "
                        "calls reported without an error did take effect.",
                    )
                )
                continue
            live = turn.live.get(str(cid))
            if isinstance(live, (ToolMessage, list)) or (live is not None and not isinstance(live, dict)):
                out.append(live)
                continue
            value = ack.result if isinstance(ack, Held) else ack
            if isinstance(value, dict) and "content" in value:
                out.append(
                    ToolMessage(content=value["content"], name=call["name"], tool_call_id=cid, status=value.get("status", "success"))
                )
            else:
                out.append(ToolMessage(content=str(value), name=call["name"], tool_call_id=cid))
        return out


def _json_call(call: Mapping[str, Any]) -> Dict[str, Any]:
    return {"name": call["name"], "args": call.get("args", {}), "id": call.get("id"), "type": "tool_call"}


def _error_msg(call: Mapping[str, Any], text: str) -> ToolMessage:
    return ToolMessage(content=text, name=call["name"], tool_call_id=call.get("id"), status="error")


def _cause_text(e: BaseException) -> str:
    c = e.__cause__
    return str(c) if c is not None else str(e)


def _partial_text(e: Optional[BaseException]) -> str:
    if isinstance(e, TidegateError) and e.outcome is not None and e.outcome.partial:
        return str(e.outcome.partial.get("error"))
    return str(e)


def _failure_text(e: BaseException) -> str:
    if isinstance(e, TidegateError) and e.outcome is not None and e.outcome.reason:
        r = e.outcome.reason
        if r.get("kind") == "tool_failed":
            return f"tool `{str(r.get('tool', '')).split('/', 1)[-1]}` failed"
        if r.get("kind") == "vetoed":
            return f"rejected: {r.get('reason')}"
        return str(r.get("kind"))
    return str(e)

