"""The LangGraph drop-in against the real, pinned langgraph (see run-tests.sh)."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import pytest

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool as lc_tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode as StockToolNode  # noqa: E402
from langgraph.types import Command  # noqa: E402

import tidegate  # noqa: E402
from tidegate.langgraph import ToolNode  # noqa: E402

LATENCY = {"a": 0.20, "b": 0.05, "c": 0.12, "d": 0.0}
ISSUED = ["a", "b", "c", "d"]
COMPLETION = sorted(ISSUED, key=LATENCY.get)


class Outside:
    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()

    def __call__(self, x):
        with self.lock:
            self.seen.append(x)


def sync_tools(out):
    def mk(name):
        @lc_tool(name)
        def t(x: str) -> str:
            """Send x somewhere."""
            time.sleep(LATENCY[name])
            out(name)
            return f"{name}:{x}"

        return t

    return [mk(n) for n in ISSUED]


def async_tools(out):
    def mk(name):
        @lc_tool(name)
        async def t(x: str) -> str:
            """Send x somewhere."""
            await asyncio.sleep(LATENCY[name])
            out(name)
            return f"{name}:{x}"

        return t

    return [mk(n) for n in ISSUED]


def turn(names, prefix="call"):
    return [{"name": n, "args": {"x": n}, "id": f"{prefix}_{n}", "type": "tool_call"} for n in names]


def graph(node, calls, checkpointer=None):
    def agent(state):
        if not state["messages"] or not any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage(content="", tool_calls=calls)]}
        return {"messages": [AIMessage(content="done")]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=checkpointer)


def tool_messages(result):
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def test_stock_node_externalises_in_completion_order():
    out = Outside()
    result = graph(StockToolNode(sync_tools(out)), turn(ISSUED)).invoke({"messages": []})
    assert out.seen == COMPLETION != ISSUED
    assert [m.content for m in tool_messages(result)] == [f"{n}:{n}" for n in ISSUED]


def test_stock_node_async_path_externalises_in_completion_order():
    out = Outside()
    asyncio.run(graph(StockToolNode(async_tools(out)), turn(ISSUED)).ainvoke({"messages": []}))
    assert out.seen == COMPLETION


@pytest.mark.parametrize("run", range(3))
def test_dropin_externalises_in_issuance_order_every_run(run):
    tg = tidegate.open()
    out = Outside()
    result = graph(ToolNode(sync_tools(out), engine=tg), turn(ISSUED)).invoke({"messages": []})
    assert out.seen == ISSUED
    assert [m.content for m in tool_messages(result)] == [f"{n}:{n}" for n in ISSUED]
    out2 = Outside()
    asyncio.run(graph(ToolNode(async_tools(out2), engine=tg), turn(ISSUED)).ainvoke({"messages": []}))
    assert out2.seen == ISSUED
    assert tg.stats()["committed"] == 2


def test_gated_tools_fire_only_at_commit_and_a_failure_aborts_the_turn():
    tg = tidegate.open()
    fired, booked, cancelled = [], [], []

    @lc_tool
    def book(room: str) -> str:
        """Hold a room."""
        booked.append(room)
        return f"hold-{room}"

    @lc_tool
    def email(to: str) -> str:
        """Send an email."""
        fired.append(to)
        return "sent"

    @lc_tool
    def charge(amount: int) -> str:
        """Charge a card."""
        raise tidegate.NotApplied("card declined")

    node = ToolNode(
        [book, email, charge],
        engine=tg,
        effects={
            "book": {"effect": "reversible", "scope": lambda room: f"travel:room:{room}",
                     "compensate": lambda result, room: cancelled.append(result)},
            "email": "gated",
            "charge": tidegate.langgraph.effect("reversible", scope="retail:card"),
        },
    )
    calls = [
        {"name": "book", "args": {"room": "12"}, "id": "c1", "type": "tool_call"},
        {"name": "email", "args": {"to": "bob"}, "id": "c2", "type": "tool_call"},
        {"name": "charge", "args": {"amount": 30}, "id": "c3", "type": "tool_call"},
    ]
    result = graph(node, calls).invoke({"messages": []})
    msgs = tool_messages(result)
    assert [m.tool_call_id for m in msgs] == ["c1", "c2", "c3"]
    assert all(m.status == "error" for m in msgs)
    assert "card declined" in msgs[2].content
    assert "aborted" in msgs[0].content
    assert booked == ["12"] and cancelled == ["hold-12"] and fired == []

    # Without the failing call the gated email fires at commit, after the booking.
    fired.clear()
    result = graph(node, calls[:2]).invoke({"messages": []})
    assert fired == ["bob"]
    assert [m.content for m in tool_messages(result)] == ["hold-12", "sent"]


def test_undeclared_tools_are_tagged_unresolved_with_one_warning():
    tg = tidegate.open()
    ran = []

    @lc_tool
    def note(text: str) -> str:
        """Write a note."""
        ran.append(text)
        return "ok"

    @lc_tool
    def fail(text: str) -> str:
        """Always refused: it did nothing, so it is not left unresolved (an ordinary exception
        would be an unknown outcome and be named in the warning too)."""
        raise tidegate.NotApplied("nope")

    node = ToolNode([note, fail], engine=tg, name="notes_node")
    calls = [{"name": "note", "args": {"text": "x"}, "id": "n1", "type": "tool_call"},
             {"name": "fail", "args": {"text": "y"}, "id": "n2", "type": "tool_call"}]
    with pytest.warns(RuntimeWarning, match=r"undeclared tools \['note'\]"):
        graph(node, calls).invoke({"messages": []})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph(node, [dict(c, id=c["id"] + "b") for c in calls]).invoke({"messages": []})  # no second warning
    assert ran == ["x", "x"]


def approval_graph(tg, fired, booked, cancelled):
    @lc_tool
    def book(room: str) -> str:
        """Hold a room."""
        booked.append(room)
        return f"hold-{room}"

    @lc_tool
    def pay(amount: int) -> str:
        """Pay."""
        fired.append(amount)
        return "paid"

    node = ToolNode(
        [book, pay],
        engine=tg,
        effects={"book": {"effect": "reversible", "compensate": lambda result, room: cancelled.append(result)},
                 "pay": "gated"},
        approve={"pay"},
    )
    calls = [{"name": "book", "args": {"room": "7"}, "id": "k1", "type": "tool_call"},
             {"name": "pay", "args": {"amount": 99}, "id": "k2", "type": "tool_call"}]
    return graph(node, calls, checkpointer=InMemorySaver())


def test_rejected_interrupt_leaves_no_effect():
    tg = tidegate.open()
    fired, booked, cancelled = [], [], []
    g = approval_graph(tg, fired, booked, cancelled)
    cfg = {"configurable": {"thread_id": "t-reject"}}
    first = g.invoke({"messages": []}, cfg)
    assert "__interrupt__" in first
    payload = first["__interrupt__"][0].value
    assert payload["tidegate"] == "approve_turn" and [c["name"] for c in payload["calls"]] == ["book", "pay"]
    assert fired == []
    assert booked == []  # approval comes before anything runs
    result = g.invoke(Command(resume=False), cfg)
    assert fired == [] and booked == [] and cancelled == []  # a rejected turn runs nothing
    assert all(m.status == "error" and "rejected" in m.content for m in tool_messages(result))
    assert tg.stats()["unfinished"] == 0


def test_approved_interrupt_commits_once():
    tg = tidegate.open()
    fired, booked, cancelled = [], [], []
    g = approval_graph(tg, fired, booked, cancelled)
    cfg = {"configurable": {"thread_id": "t-approve"}}
    g.invoke({"messages": []}, cfg)
    assert booked == [] and fired == []
    result = g.invoke(Command(resume=True), cfg)
    assert fired == [99]
    assert booked == ["7"] and cancelled == []  # the eager call ran once, after approval
    assert [m.content for m in tool_messages(result)] == ["hold-7", "paid"]


def test_works_with_the_prebuilt_agent():
    from langgraph.prebuilt import create_react_agent

    class FakeModel(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    tg = tidegate.open()
    sent = []

    @lc_tool
    def send(to: str) -> str:
        """Send a message."""
        sent.append(to)
        return "sent"

    model = FakeModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "send", "args": {"to": "ann"}, "id": "s1", "type": "tool_call"}]),
        AIMessage(content="done"),
    ]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(model, ToolNode([send], engine=tg, effects={"send": "gated"}))
    result = agent.invoke({"messages": [("user", "send ann a note")]})
    assert sent == ["ann"]
    assert result["messages"][-1].content == "done"
    assert tg.stats()["committed"] == 1


def test_resumed_turn_replays_committed_calls_by_key():
    tg = tidegate.open()
    fired = []

    @lc_tool
    def pay(amount: int) -> str:
        """Pay."""
        fired.append(amount)
        return f"paid {amount}"

    node = ToolNode([pay], engine=tg, effects={"pay": "gated"})
    calls = [{"name": "pay", "args": {"amount": 5}, "id": "p1", "type": "tool_call"}]
    cfg = {"configurable": {"thread_id": "T"}}
    r1 = graph(node, calls, checkpointer=InMemorySaver()).invoke({"messages": []}, cfg)
    # The same turn again (as after a restart from an older checkpoint): same thread, same call id.
    r2 = graph(node, calls, checkpointer=InMemorySaver()).invoke({"messages": []}, cfg)
    assert fired == [5]
    assert tool_messages(r1)[0].content == tool_messages(r2)[0].content == "paid 5"
    # Another thread is another key.
    graph(node, calls, checkpointer=InMemorySaver()).invoke({"messages": []}, {"configurable": {"thread_id": "U"}})
    assert fired == [5, 5]


def test_async_path_rejected_interrupt_and_failure():
    tg = tidegate.open()
    fired, booked, cancelled = [], [], []
    g = approval_graph(tg, fired, booked, cancelled)
    cfg = {"configurable": {"thread_id": "t-async"}}

    async def main():
        first = await g.ainvoke({"messages": []}, cfg)
        assert "__interrupt__" in first
        return await g.ainvoke(Command(resume="no"), cfg)

    result = asyncio.run(main())
    assert fired == [] and booked == [] and cancelled == []
    msgs = tool_messages(result)
    assert [m.status for m in msgs] == ["error", "error"]
    assert "rejected" in msgs[0].content
