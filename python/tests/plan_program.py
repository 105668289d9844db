"""A process of the plan story (test_plans.py): ``agent DATA LOG DEADLINE`` runs a three-step
plan with a deadline and exits without committing it; ``executor DATA LOG`` opens the same
data directory, recovers, and waits until plan 1 has ended. Both register the compensation
capability, which appends one JSON line per call to LOG (the ground truth). The last line of
stdout is a JSON summary of plan 1."""

from __future__ import annotations

import json
import os
import sys
import time

import tidegate
from tidegate import CapabilityRequest, Compensate


@tidegate.tool(
    scope=lambda trip, **_: f"travel:booking:{trip}",
    effect="reversible",
    key=lambda trip, **_: f"book-{trip}",
    compensate=Compensate("cancel", args={"booking": Compensate.output("/booking")}),
)
def book(trip: str) -> dict:
    return {"booking": f"B-{trip}"}


def main() -> None:
    mode, data, log = sys.argv[1], sys.argv[2], sys.argv[3]
    tg = tidegate.open(data)

    @tg.capability("cancel")
    def cancel(req: CapabilityRequest) -> None:
        with open(log, "a") as f:
            f.write(json.dumps({"who": mode, "key": req.key, "booking": req.args["booking"]}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    tg.recover(book)
    if mode == "agent":
        plan = tg.open_plan("ops", deadline=float(sys.argv[4]))
        for trip in ("flight", "hotel", "car"):
            with plan.transaction(agent="agent", may_touch=[f"travel:booking:{trip}"]):
                book(trip)
        d = plan.detail()
    else:
        plan = tg.plan_by_id(1)
        d = plan.wait(60)
        time.sleep(0.3)  # anything fired twice would show in the log by now
    print(json.dumps({"status": d.status, "outcome": d.outcome, "held": d.held}))
    tg.close()


if __name__ == "__main__":
    main()
