"""A tool that snapshots a row under its call id, and a compensation that restores the snapshot
by the same id; test_item8.py kills the first process after the call and lets a second one
recover (which compensates the orphaned call from the ledger, in a process that never saw it).

    python call_id_program.py DIR crash|recover
"""

from __future__ import annotations

import os
import signal
import sys

import tidegate

base, phase = sys.argv[1], sys.argv[2]


def world(line: str) -> None:
    with open(os.path.join(base, "world.log"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def restore(result, row, call_id):  # type: ignore[no-untyped-def]
    world(f"restore {call_id}")


@tidegate.tool(scope=lambda row: f"db:rows:{row}", effect="reversible", compensate=restore)
def update(row, call_id):  # type: ignore[no-untyped-def]
    world(f"snapshot {call_id}")
    return "updated"


tg = tidegate.open(os.path.join(base, "ledger"))
if phase == "crash":
    tx = tg.begin(agent="editor")
    tx.call(update, "r1")
    os.kill(os.getpid(), signal.SIGKILL)
else:
    report = tg.recover(update)
    assert report["orphans"], report
