"""Randomized test: random transactions against a small Python model of the semantics.

The model: eager effects (reversible, reversible_with_cost, idempotent) reach the world when
called; held effects (bufferable, gated) reach it only at commit, in issuance order; a tool
failure or an exception aborts: held effects never leave, executed effects with a
compensation are undone in reverse issuance order, executed effects without one stand
(tagged unresolved). A failing eager call either refuses (`NotApplied`: nothing happened) or
raises an ordinary exception after its effect landed (an unknown outcome: compensated blind,
with `result` None, and tagged unresolved either way; issue 10 item 8). The engine must agree
on the world's history and on every tag.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import tidegate

CLASSES = ["reversible", "reversible_with_cost", "idempotent", "bufferable", "gated"]
EAGER = {"reversible", "reversible_with_cost", "idempotent"}

step = st.tuples(
    st.sampled_from(CLASSES),
    st.booleans(),  # has a compensation
    st.sampled_from([None, "refused", "after"]),  # how it fails (eager only)
)
ending = st.sampled_from(["commit", "raise", "abort"])


def model(steps, end):
    """Returns (world history, {index: (disposition, tag)}, committed)."""
    world, executed = [], []
    dispositions = {}
    failed_at = None
    for i, (cls, comp, fails) in enumerate(steps):
        if cls in EAGER:
            if fails:
                failed_at = i
                if fails == "after":
                    world.append(("do", i))
                    executed.append(i)
                break
            world.append(("do", i))
            executed.append(i)
    issued = steps if failed_at is None else steps[: failed_at + 1]
    if failed_at is None and end == "commit":
        for i, (cls, _, _) in enumerate(issued):
            if cls not in EAGER:
                world.append(("do", i))
                dispositions[i] = ("applied" if cls == "bufferable" else "fired", "clean")
            else:
                dispositions[i] = ("accepted", "clean")
        return world, dispositions, True
    for i in reversed(executed):
        if issued[i][1]:
            world.append(("undo", i))
    for i, (cls, comp, fails) in enumerate(issued):
        if cls not in EAGER:
            dispositions[i] = ("discarded", "clean")
        elif i == failed_at and fails == "after":
            dispositions[i] = ("compensated" if comp else "unknown", "unresolved")
        elif i == failed_at:
            dispositions[i] = (None, "clean")  # refused call: nothing to undo
        elif comp:
            dispositions[i] = ("compensated", "clean")
        else:
            dispositions[i] = ("not_compensable", "unresolved")
    return world, dispositions, False


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(step, min_size=0, max_size=8), end=ending)
def test_engine_agrees_with_the_model(steps, end):
    tg = tidegate.open()
    world = []
    tools = []
    for i, (cls, comp, fails) in enumerate(steps):

        def call(i=i, fails=fails if cls in EAGER else None):
            if fails == "refused":
                raise tidegate.NotApplied(f"tool {i} refused")
            world.append(("do", i))
            if fails == "after":
                raise TimeoutError(f"tool {i} timed out after its effect")
            return i

        def undo(result, i=i, blind=fails == "after" and cls in EAGER):
            assert result == (None if blind else i)
            world.append(("undo", i))

        tools.append(
            tidegate.tool(call, scope=f"kv:s{i % 3}", effect=cls, compensate=undo if comp else None, name=f"t{i}")
        )
    tx = tg.begin("model")
    error = None
    try:
        with tx._as_current():
            for t in tools:
                t()
        if end == "commit":
            tx.commit()
        elif end == "abort":
            tx.abort("model says abort")
        else:
            raise KeyError("body raised")
    except tidegate.ToolFailed as e:
        error = e
    except KeyError:
        tx.abort("body raised")
    want_world, want, committed = model(steps, end)
    assert world == want_world
    o = tx.outcome
    assert o is not None and o.committed == committed
    assert len(o.effects) == len(want)
    for e in o.effects:
        disp, tag = want[e.id]
        if disp is not None:
            assert (e.disposition, e.tag) == (disp, tag), (e, steps, end)
    if error is not None:
        assert o.reason_kind == "tool_failed"
    tg.check_integrity()
    assert tg.stats()["unfinished"] == 0
    tg.close()
