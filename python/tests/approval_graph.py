"""A LangGraph program whose ToolNode asks for approval before a turn that books a room
(reversible), checks it (idempotent) and pays (gated), with a persistent engine and a SQLite
checkpointer; test_approval.py runs it in two processes.

    python approval_graph.py DIR start                # runs until the approval interrupt
    python approval_graph.py DIR resume yes|no [async]  # a new process resumes with the answer

The outside world is DIR/world.log, one fsync'd line per effect (the tools' own log).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

import tidegate
from tidegate.langgraph import ToolNode

base, phase = sys.argv[1], sys.argv[2]


def world(line: str) -> None:
    with open(os.path.join(base, "world.log"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@lc_tool
def book(room: str) -> str:
    """Hold a room."""
    world(f"book {room}")
    return f"hold-{room}"


@lc_tool
def check(room: str) -> str:
    """Check the hold."""
    world(f"check {room}")
    return "ok"


@lc_tool
def pay(amount: int) -> str:
    """Charge the card."""
    world(f"pay {amount}")
    return f"paid {amount}"


def cancel(result: str, room: str, call_id: str) -> None:
    world(f"cancel {room} {call_id}")


tg = tidegate.open(os.path.join(base, "ledger"))
node = ToolNode(
    [book, check, pay],
    engine=tg,
    effects={
        "book": {"effect": "reversible", "compensate": cancel},
        "check": "idempotent",
        "pay": "gated",
    },
    approve={"pay"},
)
print("recovered", tg.recover(*node.adapters()), flush=True)

CALLS = [
    {"name": "book", "args": {"room": "7"}, "id": "c1", "type": "tool_call"},
    {"name": "check", "args": {"room": "7"}, "id": "c2", "type": "tool_call"},
    {"name": "pay", "args": {"amount": 99}, "id": "c3", "type": "tool_call"},
]


def agent(state):  # type: ignore[no-untyped-def]
    if not any(isinstance(m, ToolMessage) for m in state["messages"]):
        return {"messages": [AIMessage(content="", tool_calls=CALLS)]}
    return {"messages": [AIMessage(content="done")]}


g = StateGraph(MessagesState)
g.add_node("agent", agent)
g.add_node("tools", node)
g.add_edge(START, "agent")
g.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)
g.add_edge("tools", "agent")
conn = sqlite3.connect(os.path.join(base, "checkpoints.db"), check_same_thread=False)
graph = g.compile(checkpointer=SqliteSaver(conn))
cfg = {"configurable": {"thread_id": "trip-1"}}

if phase == "start":
    result = graph.invoke({"messages": []}, cfg)
    for i in result.get("__interrupt__", ()):
        print("interrupt", [c["name"] for c in i.value["calls"]], flush=True)
else:
    answer = sys.argv[3] == "yes"
    if len(sys.argv) > 4 and sys.argv[4] == "async":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async def resume():  # type: ignore[no-untyped-def]
            async with AsyncSqliteSaver.from_conn_string(os.path.join(base, "checkpoints.db")) as saver:
                return await g.compile(checkpointer=saver).ainvoke(Command(resume=answer), cfg)

        result = asyncio.run(resume())
    else:
        result = graph.invoke(Command(resume=answer), cfg)
    for m in result["messages"]:
        if isinstance(m, ToolMessage):
            print("tool", m.tool_call_id, m.status, m.content.replace("\n", " "), flush=True)
    print("final", result["messages"][-1].content, flush=True)
print("unfinished", tg.stats()["unfinished"], flush=True)
