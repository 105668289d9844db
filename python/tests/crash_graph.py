"""A LangGraph program that books a room and pays, with a persistent engine and a SQLite
checkpointer; test_crash.py runs it as a subprocess and kills it mid-turn.

    python crash_graph.py DIR CRASH_AT
CRASH_AT: "none", "eager" (SIGKILL inside the third call, before the commit), or "release"
(SIGKILL while the turn's commit releases its second gated effect, after the first fired).
The outside world is DIR/world.log, one fsync'd line per effect.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

import tidegate
from tidegate.langgraph import ToolNode

base, crash_at = sys.argv[1], sys.argv[2]


def world(line: str) -> None:
    with open(os.path.join(base, "world.log"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@lc_tool
def book(room: str) -> str:
    """Hold a room."""
    world(f"book {room}")
    return f"hold-{room}"


@lc_tool
def pay(amount: int) -> str:
    """Charge the card."""
    world(f"pay {amount}")
    return f"paid {amount}"


@lc_tool
def check(room: str) -> str:
    """Check the room (no side effect)."""
    if crash_at == "eager":
        die()
    return "ok"


@lc_tool
def receipt(to: str) -> str:
    """Email a receipt."""
    if crash_at == "release":
        die()
    world(f"receipt {to}")
    return "sent"


tg = tidegate.open(os.path.join(base, "ledger"))
node = ToolNode(
    [book, pay, check, receipt],
    engine=tg,
    effects={
        "book": {"effect": "reversible", "compensate": lambda result, room: world(f"cancel {room}")},
        "pay": "gated",
        # A read-only check: its probe knows it never has an effect.
        "check": {"effect": "idempotent", "probe": lambda room: False},
        "receipt": "gated",
    },
)
report = tg.recover(*node.adapters())
print("recovered", report, flush=True)

CALLS = [
    {"name": "book", "args": {"room": "7"}, "id": "c1", "type": "tool_call"},
    {"name": "pay", "args": {"amount": 99}, "id": "c2", "type": "tool_call"},
    {"name": "check", "args": {"room": "7"}, "id": "c3", "type": "tool_call"},
    {"name": "receipt", "args": {"to": "ann"}, "id": "c4", "type": "tool_call"},
]


def agent(state):
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

state = graph.get_state(cfg)
result = graph.invoke(None if state.next else {"messages": []}, cfg)
for m in result["messages"]:
    if isinstance(m, ToolMessage):
        print("tool", m.tool_call_id, m.status, m.content.replace("\n", " "), flush=True)
print("final", result["messages"][-1].content, flush=True)
