"""A client of the public API, type-checked with mypy --strict (tests/test_docs.py): the
annotations a user sees must let typed code use the package without casts."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import List, Optional

import tidegate
from tidegate import (
    CapabilityRequest,
    Compensate,
    Held,
    Outcome,
    PartialCommit,
    PlanDetail,
    PlanInfo,
    RunResult,
    ScopeType,
    SpeculationOutcome,
    StuckPlan,
    Tidegate,
    Tool,
)


def refund(order_id: str, amount: int) -> str:
    if amount <= 0:
        raise tidegate.NotApplied(f"nothing to refund on {order_id}", retry=False)
    return f"R-{order_id}-{amount}"


def cancel(result: str, order_id: str, amount: int, call_id: str) -> Optional[str]:
    return None


refund_tool: Tool = tidegate.tool(refund, scope=lambda order_id, **_: f"shop:order:{order_id}", effect="reversible", compensate=cancel)


@tidegate.tool(scope="mail:ann@example.com", effect="gated")
def send(body: str) -> str:
    return body


def sync_client(tg: Tidegate) -> Outcome:
    with tg.transaction(agent="support", may_touch=["shop:order:W1", "mail:ann@example.com"], lease=5.0) as tx:
        tx.read("shop:order:W1")
        tx.call(refund_tool, "W1", 20)
        receipt = send("refunded")
        assert isinstance(receipt, Held)
    assert tx.outcome is not None
    return tx.outcome


def book(trip: str) -> dict[str, str]:
    return {"id": f"B-{trip}"}


book_tool: Tool = tidegate.tool(
    book,
    scope=lambda trip, **_: f"travel:booking:{trip}",
    effect="reversible",
    compensate=Compensate("cancel_booking", args={"booking": Compensate.output("/id"), "trip": Compensate.arg("trip")}),
)


def plan_client(tg: Tidegate) -> PlanDetail:
    @tg.capability("cancel_booking")
    def cancel_booking(req: CapabilityRequest) -> Optional[str]:
        return None

    with tg.plan("ops", deadline=timedelta(minutes=5), cascade_limit=2) as plan:
        with plan.transaction(agent="planner", may_touch=["travel:booking:t1"]) as tx:
            tx.call(book_tool, "t1")
        held: PlanDetail = plan.detail()
        assert [r.tool for r in held.held_compensations] == ["book"]
    infos: List[PlanInfo] = tg.plans()
    stuck: List[StuckPlan] = tg.stuck_plans()
    assert infos[-1].status == "ended" and not stuck
    return plan.detail()


def run_client(tg: Tidegate) -> int:
    result: RunResult[int] = tg.run(lambda tx: 3, agent="runner", attempts=2)
    return result.value + result.attempts


async def async_client(tg: Tidegate) -> SpeculationOutcome:
    # One order per branch: a branch may not run an eager effect on a scope where a sibling
    # holds an uncommitted one (docs/engine.md, "Speculation and eager effects").
    async with tg.speculate(2, agent="planner") as spec:
        for i, branch in enumerate(spec.branches):
            async with branch:
                await branch.acall(refund_tool, f"W{2 + i}", 1)
        return await spec.acommit(0)


def main() -> List[str]:
    tg = tidegate.open(level="L3", isolation="serializable", trace=None, scope_types={"shop": ScopeType(case="sensitive")})
    try:
        outcome = sync_client(tg)
    except PartialCommit as e:
        assert e.outcome is not None
        outcome = e.outcome
    run_client(tg)
    assert plan_client(tg).outcome == "committed"
    won = asyncio.run(async_client(tg))
    return [e.tag for e in outcome.effects] + [won.winner.agent, tg.canonical_scope("Shop:order:W1")]
