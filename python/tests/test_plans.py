"""Plans from Python (issue 15, item 8): ``with tg.plan(...)``, steps as transactions,
compensation descriptors (``tidegate.Compensate``) run by capability handlers
(``tg.capability``), held until the plan commits and unwound last-in-first-out when it fails,
also by a later process that opens the same data directory."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, List, Tuple

import pytest

import tidegate
from tidegate import CapabilityRequest, Compensate

HERE = os.path.dirname(os.path.abspath(__file__))


class Sink:
    """What the capability saw: ``(operation, key, args, output)`` in order (thread-safe)."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, str, Any, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, req: CapabilityRequest) -> None:
        with self._lock:
            self.calls.append((req.operation, req.key, req.args, req.output))

    def bookings(self) -> List[str]:
        return [c[2]["booking"] for c in self.calls]

    def keys(self) -> List[str]:
        return [c[1] for c in self.calls]


booked: List[str] = []

CANCEL = Compensate("cancel", args={"booking": Compensate.output("/booking"), "trip": Compensate.arg("trip")})


@tidegate.tool(
    scope=lambda trip, **_: f"travel:booking:{trip}",
    effect="reversible",
    key=lambda trip, **_: f"book-{trip}",
    compensate=CANCEL,
)
def book(trip: str) -> dict:
    booked.append(trip)
    return {"booking": f"B-{trip}"}


@tidegate.tool(scope=lambda trip, **_: f"travel:booking:{trip}", effect="reversible", compensate=lambda r, **_: None)
def book_with_closure(trip: str) -> dict:
    booked.append(trip)
    return {"booking": f"B-{trip}"}


@tidegate.tool(scope=lambda to, **_: f"mail:to:{to}", effect="gated")
def notify(to: str) -> str:
    return "sent"


@pytest.fixture
def sink(tg: tidegate.Tidegate) -> Sink:
    s = Sink()
    tg.capability("cancel", s)
    booked.clear()
    return s


def step(plan: tidegate.Plan, *trips: str) -> tidegate.Transaction:
    with plan.transaction(agent="agent", may_touch=[f"travel:booking:{t}" for t in trips]) as tx:
        for t in trips:
            book(t)
    return tx


def wait_for(what: str, done: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_committed_plan_retires_its_held_compensations_and_never_calls_the_handler(tg, sink):
    with tg.plan("ops", deadline=timedelta(seconds=60)) as plan:
        step(plan, "f1")
        step(plan, "h1", "c1")
        d = plan.detail()
        assert d.status == "open" and d.held == 3, d
        # Held in unwind order: the last call first.
        assert [r.seq for r in d.registrations] == [2, 1, 0]
        assert [r.key for r in d.held_compensations] == ["book-c1", "book-h1", "book-f1"]
        assert d.registrations[0].descriptor == {
            "capability": "cancel",
            "args": {"booking": {"$output": "/booking"}, "trip": {"$args": "/trip"}},
        }
        assert all(r.forward == "externalised" for r in d.registrations)
        assert [(t.kind, t.value) for t in d.triggers] == [("deadline", "unknown")]
        assert d.deadline is not None and d.deadline_ms is not None
    d = plan.detail()
    assert (d.status, d.outcome, d.held) == ("ended", "committed", 0), d
    assert [(t.kind, t.value) for t in d.triggers] == [("deadline", "false")]
    time.sleep(0.2)
    assert sink.calls == [], "a committed plan's compensations never run"
    assert booked == ["f1", "h1", "c1"]
    with pytest.raises(tidegate.PlanError) as e:
        plan.fail("too late")
    assert e.value.kind == "plan_state" and e.value.plan == plan.id
    assert [p.status for p in tg.plans()] == ["ended"]


def test_an_exception_in_the_plan_block_unwinds_three_steps_last_in_first_out(tg, sink):
    with pytest.raises(RuntimeError, match="visa refused"):
        with tg.plan("ops") as plan:
            step(plan, "flight")
            step(plan, "hotel")
            step(plan, "car")
            raise RuntimeError("visa refused")
    # The block's exit waited for the unwind.
    assert sink.bookings() == ["B-car", "B-hotel", "B-flight"], sink.calls
    assert sink.keys() == ["book-car#compensate", "book-hotel#compensate", "book-flight#compensate"]
    assert [c[2]["trip"] for c in sink.calls] == ["car", "hotel", "flight"]
    assert [c[3] for c in sink.calls] == [{"booking": "B-car"}, {"booking": "B-hotel"}, {"booking": "B-flight"}]
    d = plan.detail()
    assert (d.status, d.outcome) == ("ended", "unwound"), d
    assert d.failure is not None and d.failure["cause"]["kind"] == "signal"
    assert "visa refused" in d.failure["cause"]["reason"]
    assert d.held == 0 and d.registrations == [], "an ended plan keeps no registrations"
    time.sleep(0.2)
    assert len(sink.calls) == 3, "each compensation ran once"
    assert booked == ["flight", "hotel", "car"], "each forward call ran once"


def test_the_deadline_fails_the_plan_and_fires_the_compensations(tg, sink):
    plan = tg.open_plan("ops", deadline=0.8)
    step(plan, "f1")
    step(plan, "h1")
    assert plan.detail().triggers[0].value == "unknown"
    assert sink.calls == [], "nothing before the deadline"
    d = plan.wait(10)
    assert (d.status, d.outcome) == ("ended", "unwound"), d
    assert d.failure is not None and d.failure["cause"] == {"kind": "deadline"}
    assert d.triggers[0].value == "true"
    assert sink.keys() == ["book-h1#compensate", "book-f1#compensate"]
    with pytest.raises(tidegate.PlanError) as e:
        plan.commit()
    assert e.value.kind == "plan_state"
    # A block whose plan's deadline passed inside it cannot commit: leaving it raises.
    with pytest.raises(tidegate.PlanError) as e2:
        with tg.plan("ops", deadline=timedelta(milliseconds=300)) as late:
            step(late, "x1")
            late.wait(10)
    assert e2.value.kind == "plan_state" and late.detail().outcome == "unwound"
    assert sink.keys()[-1] == "book-x1#compensate"


def test_a_reversible_call_in_a_plan_without_a_descriptor_is_refused_naming_the_tool(tg, sink):
    plan = tg.open_plan("ops")
    with pytest.raises(tidegate.MissingDescriptor) as e:
        with plan.transaction(may_touch=["travel:booking:x"]) as tx:
            book_with_closure("x")
    err = e.value
    assert err.tool == "book_with_closure" and err.plan == plan.id
    assert "`book_with_closure`" in str(err) and "tidegate.Compensate" in str(err)
    assert isinstance(err, tidegate.InvalidArgument) and err.argument == "compensate" and not err.retryable
    assert booked == [], "nothing ran"
    assert tx.outcome is not None and tx.outcome.effects == ()
    # Outside a plan the same tool needs none.
    with tg.transaction(may_touch=["travel:booking:y"]):
        book_with_closure("y")
    assert booked == ["y"]
    # A gated tool cannot carry a descriptor at all.
    with pytest.raises(tidegate.InvalidArgument) as e2:
        tidegate.tool(lambda to: to, scope="mail:to:x", effect="gated", compensate=Compensate("recall"))
    assert e2.value.argument == "compensate" and "gated" in str(e2.value)
    plan.commit()


def test_an_aborted_step_is_compensated_by_the_engine_through_the_capability_and_never_again(tg, sink):
    with pytest.raises(RuntimeError):
        with tg.plan("ops") as plan:
            step(plan, "f1")
            with pytest.raises(ValueError):
                with plan.transaction(may_touch=["travel:booking:h1"]):
                    book("h1")
                    raise ValueError("the hotel step changed its mind")
            # The engine's abort ran the descriptor's capability in this process, at once.
            assert sink.keys() == ["book-h1#compensate"]
            step(plan, "c1")
            raise RuntimeError("give up")
    # The unwind skips the aborted step's effect (the engine compensated it already).
    assert sink.bookings() == ["B-h1", "B-c1", "B-f1"], sink.calls
    assert plan.detail().outcome == "unwound"


def test_a_descriptor_tool_outside_plans_is_compensated_through_its_capability(tg, sink):
    with pytest.raises(KeyError):
        with tg.transaction(may_touch=["travel:booking:z"]) as tx:
            book("z")
            raise KeyError("no")
    assert sink.calls == [("compensate", "book-z#compensate", {"booking": "B-z", "trip": "z"}, {"booking": "B-z"})]
    assert tx.outcome is not None and [e.tag for e in tx.outcome.effects] == ["clean"]


def test_a_missing_capability_handler_fails_the_compensation_and_the_plan_waits_for_its_owner(tg):
    booked.clear()
    with pytest.raises(RuntimeError):
        with tg.plan("ops", unwind_wait=10) as plan:
            step(plan, "f1")
            raise RuntimeError("stop")
    d = plan.detail()
    assert d.status == "stuck" and d.stuck is not None and d.stuck["kind"] == "compensation_failed", d
    assert "cancel" in d.stuck["error"]
    assert [(s.plan, s.reason["kind"]) for s in tg.stuck_plans()] == [(plan.id, "compensation_failed")]
    # The owner registers the capability and retries.
    sink = Sink()
    tg.capability("cancel", sink)
    tg.plan_by_id(plan.id).resolve("retry")
    d = plan.wait(10)
    assert (d.status, d.outcome) == ("ended", "unwound") and sink.keys() == ["book-f1#compensate"]
    assert tg.stuck_plans() == []


def test_a_gated_effect_makes_a_failed_plan_stuck_and_the_owner_unwinds_the_rest(tg, sink):
    plan = tg.open_plan("ops")
    step(plan, "f1")
    with plan.transaction(may_touch=["mail:to:bob"]):
        notify("bob")
    plan.fail("refused")
    d = plan.wait(10)
    assert d.status == "stuck" and d.stuck == {"kind": "irreversible", "seqs": [1]}, d
    assert sink.calls == [], "nothing compensated while stuck"
    with pytest.raises(tidegate.InvalidArgument) as e:
        plan.resolve("undo")
    assert e.value.argument == "choice"
    plan.resolve("unwind")
    d = plan.wait(10)
    assert (d.status, d.outcome) == ("ended", "unwound") and sink.keys() == ["book-f1#compensate"]


def test_a_block_verdict_compensates_one_effect_and_the_plan_stays_open(tg, sink):
    with tg.plan("ops") as plan:
        step(plan, "f1")
        tx = step(plan, "h1")
        assert tx.outcome is not None
        plan.verdict(tx, tx.outcome.effects[0].id, "block")
        # The sink sees the compensation's call before the executor records it finished: wait
        # for both (under load the gap is long enough for the commit below to find it running).
        wait_for(
            "the blocked effect's compensation",
            lambda: sink.bookings() == ["B-h1"]
            and all(r.state not in ("in_flight", "in_doubt") for r in plan.detail().registrations),
        )
        assert plan.status == "open"
        with pytest.raises(tidegate.InvalidArgument) as e:
            plan.verdict(tx, 0, "maybe")
        assert e.value.argument == "verdict"
    assert plan.detail().outcome == "committed" and sink.bookings() == ["B-h1"]


def test_triggers_naming_another_tenant_are_refused(tg):
    plan = tg.open_plan("ops")
    other = {"tagged": {"tenant": "globex", "tx": 1, "effect": 0, "tag": "leaked"}}
    with pytest.raises(tidegate.CrossTenant) as e:
        plan.arm(other)
    assert "globex" in str(e.value) and isinstance(e.value, tidegate.PlanError)
    plan.arm({"tagged": {"tx": 1, "effect": 0, "tag": "leaked"}})
    with pytest.raises(tidegate.CrossTenant):
        with tg.plan("ops", triggers=[other]):
            pass
    with pytest.raises(tidegate.InvalidArgument) as e2:
        plan.arm({"tagged": {"tx": "one"}})
    assert e2.value.argument == "predicate"
    plan.commit()


def test_a_tool_called_in_a_plan_block_outside_any_transaction_is_a_step_of_its_own(tg, sink):
    with pytest.raises(RuntimeError):
        with tg.plan("ops") as plan:
            assert book("a") == {"booking": "B-a"}
            with plan.transaction(may_touch=["travel:booking:b", "travel:booking:c"]):
                book("b")
                book("c")
            with tg.transaction(may_touch=["travel:booking:free"]):
                book("free")  # not a step: committed on its own, never unwound by the plan
            raise RuntimeError("stop")
    assert len(plan.detail().steps) == 2
    assert sink.bookings() == ["B-c", "B-b", "B-a"]
    # Outside the block a tool call is not a step again.
    book("after")
    assert len(plan.detail().steps) == 2


def test_bad_arguments_are_refused_naming_them(tg):
    cases = [
        (lambda: tg.plan(""), "owner"),
        (lambda: tg.plan("ops", deadline=-1), "deadline"),
        (lambda: tg.plan("ops", deadline="soon"), "deadline"),
        (lambda: tg.plan("ops", cascade_limit=65), "cascade_limit"),
        (lambda: tg.plan("ops", triggers={"all": []}), "triggers"),
        (lambda: tg.capability("", lambda r: None), "name"),
        (lambda: tg.capability("x", 3), "handler"),  # type: ignore[arg-type]
        (lambda: Compensate(""), "capability"),
        (lambda: Compensate("é" * 65), "capability"),
        (lambda: tidegate.tool(lambda trip: trip, scope="t:x", effect="reversible",
                               compensate=Compensate("c", args="x" * 70_000)).on(tg)("y"), "compensate"),
        (lambda: Compensate("c", args={"x": object()}), "args"),
        (lambda: Compensate.output("booking"), "pointer"),
        (lambda: tg.plan_by_id(-1), "plan"),
    ]
    for make, argument in cases:
        with pytest.raises(tidegate.InvalidArgument) as e:
            make()
        assert e.value.argument == argument, (argument, e.value)
    with pytest.raises(tidegate.PlanError) as e3:
        tg.plan_by_id(99)
    assert e3.value.kind == "unknown_plan"
    assert Compensate.arg("a/b") == {"$args": "/a~1b"} and Compensate.literal({"$output": 1}) == {
        "$literal": {"$output": 1}
    }


def test_the_asyncio_forms(tg):
    seen: List[str] = []

    @tg.capability("cancel")
    async def cancel(req: CapabilityRequest) -> str:
        await asyncio.sleep(0)
        seen.append(req.key)
        return "fee: 2 EUR"

    async def main() -> tidegate.Plan:
        with pytest.raises(LookupError):
            async with tg.plan("ops") as plan:
                for trip in ("a", "b"):
                    async with plan.transaction(may_touch=[f"travel:booking:{trip}"]):
                        await asyncio.sleep(0)
                        book(trip)
                raise LookupError("no visa")
        return plan

    plan = asyncio.run(main())
    assert seen == ["book-b#compensate", "book-a#compensate"]
    assert plan.detail().outcome == "unwound"

    async def committed() -> str:
        async with tg.plan("ops") as p:
            tx = await p.abegin(may_touch=["travel:booking:c"])
            await tx.acall(book, "c")
            await tx.acommit()
        return p.detail().outcome or ""

    assert asyncio.run(committed()) == "committed"


def _run(*args: str) -> dict:
    r = subprocess.run([sys.executable, os.path.join(HERE, "plan_program.py"), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_later_process_fires_the_held_compensations_after_the_agent_exited_exactly_once_lifo(tmp_path):
    data = str(tmp_path / "data")
    log = str(tmp_path / "sink.log")
    # The agent runs a three-step plan with a deadline and exits before it passes.
    agent = _run("agent", data, log, "4.0")
    assert agent["status"] == "open" and agent["held"] == 3, agent
    assert not os.path.exists(log) or open(log).read() == "", "the agent fired nothing"
    # Another process opens the data directory: its executor rebuilds the plan from the
    # ledger, re-arms the deadline and fires the three compensations, last in first out.
    first = _run("executor", data, log)
    assert (first["status"], first["outcome"]) == ("ended", "unwound"), first
    lines = [json.loads(line) for line in open(log).read().splitlines()]
    assert [(x["who"], x["key"], x["booking"]) for x in lines] == [
        ("executor", "book-car#compensate", "B-car"),
        ("executor", "book-hotel#compensate", "B-hotel"),
        ("executor", "book-flight#compensate", "B-flight"),
    ]
    # A third process finds nothing left to do.
    second = _run("executor", data, log)
    assert (second["status"], second["outcome"]) == ("ended", "unwound")
    again = [json.loads(line) for line in open(log).read().splitlines()]
    assert len(again) == 3 and len({x["key"] for x in again}) == 3, "exactly once per key"


def test_recovery_in_a_new_process_gives_a_descriptor_capability_the_tools_own_key(tmp_path: Any) -> None:
    program = os.path.join(HERE, "descriptor_key_program.py")
    first = subprocess.run([sys.executable, program, str(tmp_path), "crash"], capture_output=True, text=True, timeout=60)
    assert first.returncode == -9, first.stderr
    second = subprocess.run(
        [sys.executable, program, str(tmp_path), "recover"], capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr
    log = (tmp_path / "world.log").read_text().splitlines()
    # The key recovery gives the capability is the call's own (`key=`), read from the ledger,
    # not the engine's derived `<tool>:<tx>:<effect>`.
    assert log == ["book r1", "cancel B-r1 book-r1#compensate"], log
