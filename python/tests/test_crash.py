"""A process killed mid-turn and resumed from a SQLite checkpointer fires no effect twice.

crash_graph.py runs a LangGraph graph (SqliteSaver checkpointer, persistent Tidegate engine) whose
one turn books a room (reversible), pays (gated), runs a check (idempotent) and emails a receipt
(gated). The first process is SIGKILLed mid-turn; a second process recovers the engine and
resumes the graph from its checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite")

HERE = os.path.dirname(os.path.abspath(__file__))


def run(base, crash_at):
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "crash_graph.py"), str(base), crash_at],
        capture_output=True, text=True, timeout=120,
    )


def world(base):
    with open(os.path.join(base, "world.log")) as f:
        return [line.strip() for line in f if line.strip()]


def test_killed_before_commit_resumes_without_double_effects(tmp_path):
    first = run(tmp_path, "eager")
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert world(tmp_path) == ["book 7"]  # killed inside the third call, before the commit
    second = run(tmp_path, "none")
    assert second.returncode == 0, second.stderr
    assert "final done" in second.stdout
    w = Counter(world(tmp_path))
    # The orphaned turn was aborted on recovery (its booking compensated), the resumed turn ran
    # again and committed: one booking stands, one payment, one receipt.
    assert w["book 7"] - w["cancel 7"] == 1
    assert w["pay 99"] == 1 and w["receipt ann"] == 1
    assert world(tmp_path).index("cancel 7") < world(tmp_path).index("pay 99")


def test_killed_during_commit_resumes_without_firing_twice(tmp_path):
    first = run(tmp_path, "release")
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert world(tmp_path) == ["book 7", "pay 99"]  # killed releasing the receipt
    second = run(tmp_path, "none")
    assert second.returncode == 0, second.stderr
    assert "commits_resumed': [1]" in second.stdout
    # The resumed graph re-ran the turn: the committed calls were replayed by their keys
    # (thread id + tool-call id), not fired again; the interrupted receipt has an unknown outcome
    # and is reported, never repeated.
    assert world(tmp_path) == ["book 7", "pay 99"]
    assert "tool c2 success paid 99" in second.stdout
    assert "tool c4 error Outcome unknown" in second.stdout
    assert "final done" in second.stdout
    # A third run changes nothing.
    third = run(tmp_path, "none")
    assert third.returncode == 0 and world(tmp_path) == ["book 7", "pay 99"]
