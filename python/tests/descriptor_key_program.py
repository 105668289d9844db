"""A descriptor tool with its own key (``key=``) whose call is orphaned: the first process is
killed with the transaction open after the call; the second recovers, and the abort runs the
descriptor's capability in a process that never saw the call. test_plans.py checks that the
capability got the forward call's key (``<key>#compensate``), read from the ledger.

    python descriptor_key_program.py DIR crash|recover
"""

from __future__ import annotations

import os
import signal
import sys

import tidegate
from tidegate import CapabilityRequest, Compensate

base, phase = sys.argv[1], sys.argv[2]


def world(line: str) -> None:
    with open(os.path.join(base, "world.log"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tidegate.tool(
    scope=lambda trip: f"travel:booking:{trip}",
    effect="reversible",
    key=lambda trip: f"book-{trip}",
    compensate=Compensate("cancel", args={"booking": Compensate.output("/booking")}),
)
def book(trip: str) -> dict:
    world(f"book {trip}")
    return {"booking": f"B-{trip}"}


def cancel(req: CapabilityRequest) -> None:
    world(f"cancel {req.args['booking']} {req.key}")


tg = tidegate.open(os.path.join(base, "ledger"))
tg.capability("cancel", cancel)
if phase == "crash":
    tx = tg.begin(agent="agent")
    tx.call(book, "r1")
    os.kill(os.getpid(), signal.SIGKILL)
else:
    report = tg.recover(book)
    assert report["orphans"], report
