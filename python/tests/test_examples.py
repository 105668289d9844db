"""The examples run and tell the story they claim."""

from __future__ import annotations

import os
import subprocess
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def run(name):
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_booking_agent():
    out = run("booking_agent.py")
    act2 = out.split("Act 2")[1].split("Act 3")[0]
    assert "charges" not in act2 and "sends to" not in act2  # held effects never left
    assert act2.index("cancels CAR-T2") < act2.index("cancels HTL-T2")  # reverse order
    assert out.count("COMMITTED") == 2 and "ABORTED (lost_branch)" in out


def test_langgraph_ordering():
    out = run("langgraph_ordering.py")
    issued = "['open', 'debit', 'credit', 'close']"
    ours = [line for line in out.splitlines() if line.startswith("tidegate ToolNode")]
    stock = [line for line in out.splitlines() if line.startswith("stock ToolNode")]
    assert len(ours) == 3 and all(f"world saw {issued}" in line for line in ours)
    assert all(f"world saw {issued}" not in line for line in stock)


def test_trip_plan():
    out = run("trip_plan.py")
    act1, rest = out.split("Act 2")
    act2, act3 = rest.split("Act 3")
    assert "cancels" not in act1 and "COMMITTED" in act1  # held cancellations retired unrun
    assert act2.index("cancels car") < act2.index("cancels hotel") < act2.index("cancels flight")
    assert act2.count("cancels") == 3 and "UNWOUND" in act2
    assert "leaves with the plan open" in act3
    after = act3.split("process exited")[1]  # the cancellations ran in the later process
    assert after.index("cancels hotel HOT-T3") < after.index("cancels flight FLI-T3")
    assert act3.count("cancels") == 2 and "UNWOUND (deadline) by another process" in act3
