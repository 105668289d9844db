"""Stock LangGraph ToolNode vs tidegate's drop-in: which order do side effects reach the world?

    python python/examples/langgraph_ordering.py

The model issues four calls in one turn: post to a ledger "open", "debit", "credit", "close".
Each tool has a different latency. The stock node runs them concurrently, so the world sees
them in completion order (a close before the open). The drop-in runs the turn as one
transaction and externalises in issuance order, every time; the posts are declared gated, so
they only leave when the turn commits.
"""

from __future__ import annotations

import threading
import time

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode as StockToolNode

import tidegate
from tidegate.langgraph import ToolNode

LATENCY = {"open": 0.20, "debit": 0.05, "credit": 0.12, "close": 0.0}
world: list = []
lock = threading.Lock()


def make(step: str):
    @tool(f"post_{step}")
    def post(entry: str) -> str:
        """Post an entry to the ledger."""
        time.sleep(LATENCY[step])
        with lock:
            world.append(step)
        return f"posted {entry}"

    return post


TOOLS = [make(s) for s in LATENCY]
CALLS = [{"name": f"post_{s}", "args": {"entry": s}, "id": f"call_{s}", "type": "tool_call"} for s in LATENCY]


def build(node):
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
    return g.compile()


def main() -> None:
    print("issued by the model:      ", list(LATENCY))
    for label, node in [
        ("stock ToolNode", StockToolNode(TOOLS)),
        ("tidegate ToolNode", ToolNode(TOOLS, engine=tidegate.open(), effects={t.name: "gated" for t in TOOLS})),
    ]:
        for run in range(3):
            world.clear()
            result = build(node).invoke({"messages": []})
            msgs = [m.tool_call_id for m in result["messages"] if isinstance(m, ToolMessage)]
            print(f"{label:<18} run {run}: world saw {world}; ToolMessages {['_'.join(m.split('_')[1:]) for m in msgs]}")


if __name__ == "__main__":
    main()
