"""The plan story in Python: a trip booked over several days, undone as a whole when it fails,
even by a process that did not book it.

    python python/examples/trip_plan.py

Act 1: the flight and the hotel are booked in two steps of a plan; the plan commits, and the
held cancellations are retired without ever running.
Act 2: the visa is refused after the flight, hotel and car steps committed: the plan fails and
the cancellations run last booked, first cancelled.
Act 3: the agent books and its process goes away; the plan's deadline passes and another
process, opening the same data directory, cancels the bookings on its own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile

import tidegate
from tidegate import CapabilityRequest, Compensate


def say(who: str, what: str) -> None:
    print(f"    {who:<10} {what}", flush=True)


@tidegate.tool(
    scope=lambda kind, trip, **_: f"travel:{kind}:{trip}",
    effect="reversible",
    key=lambda kind, trip, **_: f"{kind}-{trip}",
    compensate=Compensate("cancel_booking", args={"booking": Compensate.output("/ref"), "kind": Compensate.arg("kind")}),
)
def book(kind: str, trip: str) -> dict:
    ref = f"{kind[:3].upper()}-{trip}"
    say("provider", f"books {kind} {ref}")
    return {"ref": ref}


def engine(data_dir: "str | None" = None) -> tidegate.Tidegate:
    tg = tidegate.open(data_dir)

    @tg.capability("cancel_booking")
    def cancel_booking(req: CapabilityRequest) -> None:
        say("provider", f"cancels {req.args['kind']} {req.args['booking']} (key {req.key})")

    tg.recover(book)  # starts the plan executor when the data directory holds plans
    return tg


def steps(plan: tidegate.Plan, trip: str, kinds: "list[str]") -> None:
    for kind in kinds:
        with plan.transaction(agent="travel-agent", may_touch=[f"travel:{kind}:{trip}"]):
            book(kind, trip)


def act1() -> None:
    print("Act 1: the plan commits")
    tg = engine()
    with tg.plan(owner="ops") as plan:
        steps(plan, "T1", ["flight", "hotel"])
        say("plan", f"holds {plan.detail().held} cancellations")
    say("plan", f"{plan.detail().outcome.upper()}")


def act2() -> None:
    print("Act 2: the visa is refused")
    tg = engine()
    try:
        with tg.plan(owner="ops") as plan:
            steps(plan, "T2", ["flight", "hotel", "car"])
            raise RuntimeError("visa refused")
    except RuntimeError as e:
        say("agent", f"gave up: {e}")
    say("plan", f"{plan.detail().outcome.upper()}")


def act3() -> None:
    print("Act 3: the agent is gone when the deadline passes")
    data = tempfile.mkdtemp(prefix="tidegate-trip-")
    try:
        subprocess.run([sys.executable, __file__, "agent", data], check=True)
        say("agent", "process exited")
        tg = engine(data)
        d = tg.plan_by_id(1).wait(30)
        say("plan", f"{d.outcome.upper()} ({d.failure['cause']['kind']}) by another process")
        tg.close()
    finally:
        shutil.rmtree(data, ignore_errors=True)


def agent(data: str) -> None:
    tg = engine(data)
    plan = tg.open_plan("ops", deadline=2.0)
    steps(plan, "T3", ["flight", "hotel"])
    say("agent", f"leaves with the plan {plan.status} and its deadline ahead")
    tg.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "agent":
        agent(sys.argv[2])
    else:
        act1()
        act2()
        act3()
