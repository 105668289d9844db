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
