"""Approval through interrupt() never executes an eager effect twice (issue 13 item 4).

LangGraph re-runs an interrupted node from its start when the graph resumes. The node asks for
approval before any call of the turn runs, so the first pass executes nothing and the resumed
pass runs the approved turn once. Checked across a process restart with the SQLite
checkpointer and a persistent engine, counting effects in the tools' own log.

Regression: the approval used to be a pre-commit hook: the first pass booked the room, the
interrupt aborted the turn (the booking was compensated) and the resumed pass booked again.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite")

HERE = os.path.dirname(os.path.abspath(__file__))


def run(base, *args):
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "approval_graph.py"), str(base), *args],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def world(base):
    path = os.path.join(base, "world.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_approved_turn_runs_each_eager_effect_once_across_a_restart(tmp_path, mode):
    first = run(tmp_path, "start")
    assert "interrupt ['book', 'check', 'pay']" in first
    assert world(tmp_path) == []  # nothing ran before the approval
    assert "unfinished 0" in first  # and no transaction is held open across the interrupt
    second = run(tmp_path, "resume", "yes", mode)
    assert world(tmp_path) == ["book 7", "check 7", "pay 99"]  # each effect exactly once
    assert "tool c1 success hold-7" in second and "tool c3 success paid 99" in second
    assert "final done" in second and "unfinished 0" in second
    # A third process resuming the finished thread changes nothing.
    run(tmp_path, "resume", "yes", mode)
    assert world(tmp_path) == ["book 7", "check 7", "pay 99"]


def test_rejected_turn_runs_nothing_across_a_restart(tmp_path):
    run(tmp_path, "start")
    second = run(tmp_path, "resume", "no")
    assert world(tmp_path) == []
    assert second.count("error Not applied: the turn was rejected") == 3
    assert "final done" in second
