"""The failure rule (issue 10 item 8, docs/engine.md "Failures" 11-13) on the Python side: only
an explicit "did not happen" (`NotApplied`, `TransientError`) says a call did not take effect.
Any other exception a tool raises, a `TimeoutError` after the provider applied the call
included, is an unknown outcome: the probe decides; without an answer a reversible effect is
compensated blind and a gated one tagged `unresolved`, never `clean`, and it is never called
again. The same through `tidegate.connect`'s worker loop is in test_client.py."""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest

import tidegate
from tidegate import Happened, NotApplied, ToolFailed


def booking(world: Any, exc: BaseException, *, compensate: bool = True, probe: Any = None) -> tidegate.Tool:
    """A reversible `book` whose effect lands, then the call raises `exc` (fault F2)."""

    def book(seat: str) -> str:
        world("do", seat)
        raise exc

    undo = (lambda result, seat: world("undo", seat, result)) if compensate else None
    return tidegate.tool(
        book, scope=lambda seat: f"air:seat:{seat}", effect="reversible", compensate=undo, probe=probe, name="book"
    )


AFTER_THE_EFFECT = [
    TimeoutError("read timed out"),
    ConnectionError("connection reset by peer"),
    KeyError("reply had no id"),
    tidegate.OutcomeUnknown("timeout after sending"),
]


@pytest.mark.parametrize("exc", AFTER_THE_EFFECT, ids=lambda e: type(e).__name__)
def test_an_ordinary_exception_after_the_effect_is_compensated_blind_and_never_clean(tg, world, exc):
    book = booking(world, exc)
    with pytest.raises(ToolFailed) as info:
        with tg.transaction() as tx:
            book("12A")
    e = info.value
    assert e.__cause__ is exc and e.reason["kind"] == "tool_failed" and not e.retryable
    # Called once (an unknown outcome is never called again without a probe), undone once.
    assert world.events == [("do", "12A"), ("undo", "12A", None)]
    [effect] = tx.outcome.effects
    assert (effect.disposition, effect.tag) == ("compensated", "unresolved"), effect
    assert "outcome was unknown" in (effect.detail or ""), effect
    assert not tx.outcome.is_clean and not tx.outcome.committed


def test_without_a_compensation_the_unknown_effect_stays_unresolved(tg, world):
    book = booking(world, TimeoutError("read timed out"), compensate=False)
    with pytest.raises(ToolFailed):
        with tg.transaction() as tx:
            book("12A")
    assert world.events == [("do", "12A")]
    [effect] = tx.outcome.effects
    assert (effect.disposition, effect.tag) == ("unknown", "unresolved"), effect


def test_the_probe_decides_an_ordinary_exception(tg, world):
    # It happened: the probe's output is the call's, the transaction goes on and commits clean.
    book = booking(world, TimeoutError("read timed out"), probe=lambda seat: Happened(f"PNR-{seat}"))
    with tg.transaction() as tx:
        assert book("12A") == "PNR-12A"
    assert tx.outcome.committed and tx.outcome.is_clean
    assert world.events == [("do", "12A")]

    # It did not happen: the call is retried in place and the transaction commits.
    calls: List[str] = []

    def flaky(seat: str) -> str:
        calls.append(seat)
        if len(calls) == 1:
            raise ConnectionError("reset before the request was read")
        return f"PNR-{seat}"

    hold = tidegate.tool(
        flaky, scope=lambda seat: f"air:seat:{seat}", effect="reversible", probe=lambda seat: len(calls) > 1, name="hold"
    )
    with tg.transaction() as tx2:
        assert hold("14C") == "PNR-14C"
    assert calls == ["14C", "14C"] and tx2.outcome.committed and tx2.outcome.is_clean


def test_not_applied_is_a_definite_failure_with_nothing_to_compensate(tg, world):
    @tidegate.tool(
        scope=lambda card: f"pay:card:{card}",
        effect="reversible",
        compensate=lambda result, card: world("refund", card),
        probe=lambda card: world("probe", card),
    )
    def charge(card: str) -> str:
        world("charge", card)
        raise NotApplied("card declined")

    with pytest.raises(ToolFailed) as info:
        with tg.transaction() as tx:
            charge("4242")
    e = info.value
    assert isinstance(e.__cause__, NotApplied) and "card declined" in str(e)
    assert e.reason["kind"] == "tool_failed" and not e.retryable
    assert world.events == [("charge", "4242")], "neither probed nor compensated nor retried"
    [effect] = tx.outcome.effects
    assert effect.tag == "clean" and effect.disposition not in ("compensated", "unknown"), effect
    assert tx.outcome.is_clean and not tx.outcome.committed


def test_not_applied_with_retry_is_retried_under_the_policy():
    tg = tidegate.open(retry_attempts=3, retry_backoff=0)
    calls: List[int] = []

    @tidegate.tool(scope="kv:gateway", effect="reversible")
    def push(n: int) -> int:
        calls.append(n)
        if len(calls) < 3:
            raise NotApplied("503 before processing", retry=True)
        return n

    with tg.transaction() as tx:
        assert push(7) == 7
    assert calls == [7, 7, 7] and tx.outcome.is_clean

    # Refused at every attempt: the abort is retryable (the call never took effect).
    calls.clear()

    @tidegate.tool(scope="kv:gateway", effect="reversible", name="down")
    def down(n: int) -> int:
        calls.append(n)
        raise NotApplied("503 before processing", retry=True)

    with pytest.raises(ToolFailed) as info:
        with tg.transaction():
            down(8)
    assert calls == [8, 8, 8] and info.value.retryable and info.value.reason["kind"] == "tool_unavailable"
    tg.close()


def test_not_applied_carries_retry_and_is_a_tidegate_error():
    e = NotApplied("no seats left")
    assert isinstance(e, tidegate.TidegateError) and e.retry is False and e.kind == "not_applied"
    assert not e.retryable and str(e) == "no seats left"
    r = NotApplied("busy", retry=True)
    assert r.retry and r.retryable


def senders(world: Any, exc: BaseException, probe: Any = None) -> tidegate.Tool:
    """A gated `send` whose release at commit delivers, then raises `exc`."""

    def send(to: str) -> str:
        world("send", to)
        raise exc

    return tidegate.tool(send, scope=lambda to: f"mail:{to}", effect="gated", probe=probe, name="send")


def test_an_ordinary_exception_at_release_is_never_fired_twice_nor_clean(tg, world):
    # The commit stands (the release may have fired), the release is never fired again, and
    # the commit cannot go unnoticed: it raises PartialCommit, as a failed release does.
    send = senders(world, TimeoutError("SMTP reply timed out"))
    after = tidegate.tool(lambda to: world("after", to), scope=lambda to: f"mail:{to}", effect="gated", name="after")
    with pytest.raises(tidegate.PartialCommit) as info:
        with tg.transaction() as tx:
            send("ann")
            after("bob")
    assert world.events == [("send", "ann")], "fired once, never again; nothing released after it"
    o = info.value.outcome
    assert o is not None and o.committed and not o.is_clean and tx.outcome == o
    first, second = o.effects
    assert (first.disposition, first.tag) == ("unknown", "unresolved"), first
    assert "SMTP reply timed out" in (first.detail or "")
    assert o.partial is not None and o.partial["failed"] == first.id and o.partial["not_attempted"] == [second.id]


def test_the_probe_decides_an_exception_at_release(tg, world):
    send = senders(world, ConnectionError("reset after sending"), probe=lambda to: Happened(f"msg-{to}"))
    after = tidegate.tool(lambda to: f"after-{to}", scope=lambda to: f"mail:{to}", effect="gated", name="after")
    with tg.transaction() as tx:
        first = after("amy")
        held = send("ann")
        last = after("bob")
    assert world.events == [("send", "ann")]
    assert tx.outcome.committed and tx.outcome.is_clean
    # Each acknowledgement gets its own release's output; the probed one gets the probe's.
    assert (first.result, held.result, last.result) == ("after-amy", "msg-ann", "after-bob")


def test_not_applied_at_the_first_release_aborts(tg, world):
    send = senders(world, NotApplied("mailbox does not exist"))
    with pytest.raises(tidegate.ReleaseFailed) as info:
        with tg.transaction():
            send("nobody")
    assert world.events == [("send", "nobody")], "not retried"
    assert not info.value.outcome.committed


def test_asyncio_tools_follow_the_same_rule(tg, world):
    async def book(seat: str) -> str:
        world("do", seat)
        raise asyncio.TimeoutError("no reply")

    async def undo(result: Any, seat: str) -> None:
        world("undo", seat)

    async def refuse(seat: str) -> str:
        world("refused", seat)
        raise NotApplied("sold out")

    abook = tidegate.tool(book, scope=lambda seat: f"air:seat:{seat}", effect="reversible", compensate=undo, name="abook")
    arefuse = tidegate.tool(refuse, scope=lambda seat: f"air:seat:{seat}", effect="reversible", compensate=undo, name="arefuse")

    async def main(t: Any, seat: str) -> Any:
        try:
            async with tg.transaction() as tx:
                await t(seat)
        except ToolFailed:
            return tx.outcome
        raise AssertionError("the call did not fail")

    unknown = asyncio.run(main(abook, "1A"))
    refused = asyncio.run(main(arefuse, "2B"))
    assert world.events == [("do", "1A"), ("undo", "1A"), ("refused", "2B")]
    assert unknown.effects[0].tag == "unresolved" and refused.effects[0].tag == "clean"
