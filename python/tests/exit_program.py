"""Small programs that use the engine from asyncio and from LangGraph, then let the
interpreter exit; test_exit.py runs each many times in subprocesses and asserts exit status 0.

    python exit_program.py MODE [OUT] [--fork N]

With ``--fork N`` the program imports what MODE needs once, then forks N children (four at a
time) that each run MODE and exit through a normal interpreter exit (``Py_FinalizeEx``); the
parent prints one exit status per child (``status <code>``) and exits 0. That saves importing
LangGraph N times; each child still starts its own engine threads and finalises its own
interpreter, which is what is under test.

MODE:
* ``async_graph``: a LangGraph graph whose ToolNode is tidegate's, over async tools, run with
  ``asyncio.run(graph.ainvoke(...))`` (issue 13 item 1);
* ``sync_graph``: the same graph with sync tools and ``graph.invoke``;
* ``async_tx``: a plain ``async with tg.transaction()`` with coroutine tools;
* ``slow_resolve``: ``async_tx`` with the runtime thread that resolves the asyncio future held
  inside the interpreter (GIL released) for 0.3 s after it resolved it, so that the main thread
  reaches interpreter exit while it is there (deterministic form of the race behind item 1;
  a global whose ``__del__`` sleeps keeps finalisation going until that thread wakes up);
* ``lease_at_exit``: a transaction whose lease expires just before exit; its compensation
  (run by the engine's reaper on a runtime thread) is still sleeping when the main thread
  exits, and must finish (it writes ``compensated`` to OUT) before the process ends;
* ``cancelled``: an async call cancelled by a timeout while its coroutine tool runs, then exit.
"""

from __future__ import annotations

import asyncio
import sys
import time

import tidegate

class _Linger:
    """Keeps interpreter finalisation going for a while with the GIL released, so that a
    runtime thread that wakes up inside the interpreter meets a finalising interpreter. Its
    ``__del__`` runs when the modules are torn down (after finalisation began); it lives in a
    module of its own because ``__main__``'s dict stays referenced by the functions the engine
    holds and is never cleared."""

    def __del__(self, sleep=time.sleep) -> None:  # type: ignore[no-untyped-def]
        sleep(0.6)


def _linger_at_exit() -> None:
    import types

    m = types.ModuleType("_tidegate_exit_linger")
    m.linger = _Linger()  # type: ignore[attr-defined]
    sys.modules[m.__name__] = m


MODE = sys.argv[1]
OUT = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else None
ISSUED = ["a", "b", "c", "d"]
LATENCY = {"a": 0.004, "b": 0.001, "c": 0.002, "d": 0.0}


def graph(node):  # type: ignore[no-untyped-def]
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    calls = [{"name": n, "args": {"x": n}, "id": f"c_{n}", "type": "tool_call"} for n in ISSUED]

    def agent(state):  # type: ignore[no-untyped-def]
        if not any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage(content="", tool_calls=calls)]}
        return {"messages": [AIMessage(content="done")]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    g.add_edge("tools", "agent")
    return g.compile()


def lg_tools(seen, is_async):  # type: ignore[no-untyped-def]
    from langchain_core.tools import tool as lc_tool

    def mk(name):  # type: ignore[no-untyped-def]
        if is_async:

            @lc_tool(name)
            async def t(x: str) -> str:
                """Send x."""
                await asyncio.sleep(LATENCY[name])
                seen.append(name)
                return f"{name}:{x}"

        else:

            @lc_tool(name)
            def t(x: str) -> str:
                """Send x."""
                time.sleep(LATENCY[name])
                seen.append(name)
                return f"{name}:{x}"

        return t

    return [mk(n) for n in ISSUED]


def warm_up_langgraph() -> None:
    """Runs the graph once with LangGraph's stock node (no Tidegate engine, so no engine
    thread), so that forked children do not each pay for LangGraph's first-run setup."""
    import threading

    from langgraph.prebuilt import ToolNode as StockToolNode

    seen: list = []
    asyncio.run(graph(StockToolNode(lg_tools(seen, True))).ainvoke({"messages": []}))
    graph(StockToolNode(lg_tools(seen, False))).invoke({"messages": []})
    assert threading.active_count() == 1, "no thread may run when the program forks"


def run_graph(is_async: bool) -> None:
    from tidegate.langgraph import ToolNode

    seen: list = []
    effects = {"a": "reversible", "b": "gated", "c": "bufferable"}  # "d" undeclared
    node = ToolNode(lg_tools(seen, is_async), engine=tidegate.open(), effects=effects)
    g = graph(node)
    if is_async:
        asyncio.run(g.ainvoke({"messages": []}))
    else:
        g.invoke({"messages": []})
    assert seen == ["a", "d", "b", "c"], seen  # eager in issuance order, then held at commit


async def plain_tx() -> None:
    tg = tidegate.open()
    undone = []

    async def undo(result, x):  # type: ignore[no-untyped-def]
        undone.append(x)

    @tidegate.tool(scope=lambda x: f"demo:item:{x}", effect="reversible", compensate=undo)
    async def put(x: str) -> str:
        await asyncio.sleep(0.001)
        return x

    @tidegate.tool(scope="mail:ann@example.com", effect="gated")
    async def send(x: str) -> str:
        return f"sent {x}"

    async with tg.transaction(agent="exit") as tx:
        await put("1")
        await put("2")
        await send("hello")
    assert tx.outcome is not None and tx.outcome.committed
    try:
        async with tg.transaction(agent="exit"):
            await put("3")
            raise RuntimeError("abort this one")
    except RuntimeError:
        pass
    assert undone == ["3"], undone


def slow_resolve() -> None:
    from tidegate import _bridge

    real = _bridge.resolve_threadsafe

    def resolve_then_linger(*args):  # type: ignore[no-untyped-def]
        real(*args)
        time.sleep(0.3)  # inside the interpreter, GIL released, on a runtime thread

    _bridge.resolve_threadsafe = resolve_then_linger
    asyncio.run(plain_tx())


def lease_at_exit() -> None:
    assert OUT is not None
    tg = tidegate.open()

    def undo(result, x):  # type: ignore[no-untyped-def]
        time.sleep(0.5)  # still running when the main thread exits
        with open(OUT, "a") as f:
            f.write("compensated\n")

    @tidegate.tool(scope="demo:x", effect="reversible", compensate=undo)
    def put(x: str) -> str:
        return x

    tx = tg.begin(agent="exit", lease=0.2)
    tx.call(put, "1")
    time.sleep(0.4)  # the lease ends at 0.2 s; the reaper starts the compensation


def cancelled() -> None:
    tg = tidegate.open()

    @tidegate.tool(scope="demo:slow", effect="reversible", compensate=lambda result, **_: None)
    async def slow() -> str:
        await asyncio.sleep(0.2)
        return "done"

    async def main() -> None:
        tx = tg.begin(agent="exit")
        try:
            await asyncio.wait_for(tx.acall(slow), 0.05)
        except asyncio.TimeoutError:
            pass

    asyncio.run(main())


MODES = {
    "async_graph": lambda: run_graph(is_async=True),
    "sync_graph": lambda: run_graph(is_async=False),
    "async_tx": lambda: asyncio.run(plain_tx()),
    "slow_resolve": slow_resolve,
    "lease_at_exit": lease_at_exit,
    "cancelled": cancelled,
}


def run_mode() -> None:
    if MODE in ("slow_resolve", "lease_at_exit"):
        _linger_at_exit()
    MODES[MODE]()


def forked(n: int, parallel: int = 4) -> bool:
    """Runs MODE in ``n`` forked children; returns True in a child (which then exits)."""
    import os

    if "graph" in MODE:
        # Imported once, before forking (no engine thread exists yet: the runtime starts on
        # the first tidegate.open()).
        import langchain_core.messages  # noqa: F401
        import langchain_core.tools  # noqa: F401
        import langgraph.graph  # noqa: F401

        import tidegate.langgraph  # noqa: F401

        warm_up_langgraph()
    statuses = []
    running = 0
    for _ in range(n):
        while running >= parallel:
            _, st = os.wait()
            statuses.append(os.waitstatus_to_exitcode(st))
            running -= 1
        if os.fork() == 0:
            run_mode()
            return True
        running += 1
    while running:
        _, st = os.wait()
        statuses.append(os.waitstatus_to_exitcode(st))
        running -= 1
    for code in statuses:
        print(f"status {code}", flush=True)
    return False


if MODE not in MODES:
    raise SystemExit(f"unknown mode {MODE!r}; expected one of {sorted(MODES)}")
if "--fork" in sys.argv:
    forked(int(sys.argv[sys.argv.index("--fork") + 1]))
else:
    run_mode()
