"""Shared fixtures: a fresh in-memory engine and an "outside world" that records effects."""

from __future__ import annotations

import threading
from typing import Any, List, Tuple

import pytest

import tidegate


class World:
    """What the outside world saw, in order (thread-safe)."""

    def __init__(self) -> None:
        self.events: List[Tuple[Any, ...]] = []
        self._lock = threading.Lock()

    def __call__(self, *event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def kinds(self) -> List[Any]:
        return [e[0] for e in self.events]

    def clear(self) -> None:
        with self._lock:
            self.events.clear()


@pytest.fixture
def tg() -> tidegate.Tidegate:
    engine = tidegate.open()
    yield engine
    engine.check_integrity()
    engine.close()


@pytest.fixture
def world() -> World:
    return World()
