"""The API reference (python/docs/api.html) is generated from the docstrings and current, and
the public API type-checks under mypy --strict (issue 13 item 7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def test_api_reference_is_generated_from_the_current_docstrings():
    pytest.importorskip("pdoc")
    r = subprocess.run(
        [sys.executable, os.path.join(PYTHON_DIR, "docs", "gen_api.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr


def test_public_api_and_a_typed_client_pass_mypy_strict():
    pytest.importorskip("mypy")
    pytest.importorskip("langgraph")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", os.path.join(PYTHON_DIR, "pyproject.toml")],
        capture_output=True, text=True, timeout=300, cwd=PYTHON_DIR,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_typed_client_runs():
    sys.path.insert(0, HERE)
    try:
        import typed_usage
    finally:
        sys.path.remove(HERE)
    tags = typed_usage.main()
    assert tags[-1] == "shop:order:W1" and tags[-2] == "planner"
