"""The core API: commit and abort per effect class, compensation order, stale reads and the
retry helper, speculation, hooks, idempotency keys, asyncio."""

from __future__ import annotations

import asyncio

import pytest

import tidegate
from tidegate import Held

EAGER = ["reversible", "reversible_with_cost", "idempotent"]
HELD = {"bufferable": "staged", "gated": "queued"}


def declare(world, effect, name="act", residue=None):
    def undo(result, order, **_):
        world("undo", order, result)
        return residue

    @tidegate.tool(scope=lambda order, **_: f"retail:order:{order}", effect=effect, compensate=undo, name=name)
    def act(order, amount=1):
        world("do", order, amount)
        return {"id": f"{name}-{order}", "amount": amount}

    return act


@pytest.mark.parametrize("effect", EAGER)
def test_eager_effect_executes_at_call_and_is_accepted_on_commit(tg, world, effect):
    act = declare(world, effect)
    with tg.transaction(agent="t", may_touch=["retail:order:W1"]) as tx:
        out = act("W1", amount=3)
        assert out == {"id": "act-W1", "amount": 3}
        assert world.events == [("do", "W1", 3)]  # already externalised
    assert tx.outcome is not None and tx.outcome.committed
    (e,) = tx.outcome.effects
    assert (e.tool, e.effect, e.disposition, e.tag) == ("act", effect, "accepted", "clean")
    assert world.events == [("do", "W1", 3)]


@pytest.mark.parametrize("effect", sorted(HELD))
def test_held_effect_fires_only_at_commit(tg, world, effect):
    act = declare(world, effect)
    with tg.transaction(agent="t") as tx:
        h = act("W1", amount=2)
        assert isinstance(h, Held) and h.kind == HELD[effect] and not h.released
        with pytest.raises(tidegate.WrongState):
            _ = h.result
        assert world.events == []  # nothing left yet
    assert world.events == [("do", "W1", 2)]
    assert h.released and h.result == {"id": "act-W1", "amount": 2}
    (e,) = tx.outcome.effects
    assert e.disposition == ("applied" if effect == "bufferable" else "fired")
    assert e.tag == "clean"


@pytest.mark.parametrize("effect", EAGER + sorted(HELD))
def test_exception_in_block_aborts_per_class(tg, world, effect):
    act = declare(world, effect)
    with pytest.raises(KeyError):
        with tg.transaction(agent="t") as tx:
            act("W1")
            raise KeyError("model changed its mind")
    o = tx.outcome
    assert o is not None and not o.committed and o.reason_kind == "explicit"
    (e,) = o.effects
    if effect in HELD:
        assert world.events == []
        assert (e.disposition, e.tag) == ("discarded", "clean")
    else:
        # The compensation got the live result object and the arguments by name.
        assert world.events == [("do", "W1", 1), ("undo", "W1", {"id": "act-W1", "amount": 1})]
        assert e.disposition == "compensated"


def test_residue_of_reversible_with_cost_is_reported(tg, world):
    act = declare(world, "reversible_with_cost", residue="cancellation fee 5 EUR")
    tx = tg.begin("t")
    with tx._as_current():
        act("W1")
    o = tx.abort("changed plan")
    (e,) = o.effects
    assert e.disposition == "compensated"
    assert "cancellation fee 5 EUR" in (e.detail or "")
    assert e.tag == "unresolved" and o.residue == (e,)


def test_compensations_run_in_reverse_issuance_order(tg, world):
    a, b, c = (declare(world, "reversible", name=n) for n in ("a", "b", "c"))
    with pytest.raises(RuntimeError):
        with tg.transaction() as tx:
            a("1")
            b("2")
            c("3")
            raise RuntimeError("abort")
    undo_order = [e[1] for e in world.events if e[0] == "undo"]
    assert undo_order == ["3", "2", "1"]
    assert [e.disposition for e in tx.outcome.effects] == ["compensated"] * 3


def test_failing_tool_aborts_compensates_and_chains_the_cause(tg, world):
    ok = declare(world, "reversible", name="ok")
    mail = declare(world, "gated", name="mail")

    @tidegate.tool(scope="retail:order:X", effect="reversible")
    def broken(order):
        raise ConnectionResetError(f"provider down for {order}")

    with pytest.raises(tidegate.ToolFailed) as info:
        with tg.transaction() as tx:
            ok("1")
            mail("2")
            broken("3")
    e = info.value
    assert isinstance(e.__cause__, ConnectionResetError)
    assert e.outcome is tx.outcome and e.reason["kind"] == "tool_failed"
    assert e.retryable is False
    assert [ev[0] for ev in world.events] == ["do", "undo"]  # mail never fired
    assert [x.disposition for x in tx.outcome.effects[:2]] == ["compensated", "discarded"]


def test_transient_errors_are_retried(tg, world):
    attempts = []

    @tidegate.tool(scope="kv:flaky", effect="reversible")
    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise tidegate.TransientError("503 before processing")
        return "ok"

    with tg.transaction():
        assert flaky() == "ok"
    assert len(attempts) == 3


def test_stale_read_aborts_and_is_retryable(tg, world):
    write = declare(world, "reversible", name="write")
    writer = tg.begin("writer", may_touch=["retail:order:W1"])  # earlier epoch
    reader = tg.begin("reader", may_touch=["retail:order:W1"])
    assert reader.read("retail:order:W1").version == 0
    with writer._as_current():
        write("W1")
    writer.commit()
    assert tg.version("retail:order:W1") == 1
    with pytest.raises(tidegate.StaleRead) as info:
        reader.commit()
    assert info.value.retryable is True
    assert info.value.reason["kind"] == "stale_read"
    assert reader.outcome is not None and not reader.outcome.committed


def test_run_retries_a_stale_read_at_a_fresh_epoch(world):
    tg = tidegate.open(first_committer_wins=True)
    write = declare(world, "reversible", name="write")
    attempts = []

    def body(tx):
        attempts.append(tx.epoch)
        v = tx.read("retail:order:W1").version
        if len(attempts) == 1:
            # Someone else commits a write to what we read.
            with tg.transaction("other") as other:
                write("W1")
            assert other.outcome.committed
        return v

    result = tg.run(body, agent="reader", attempts=3)
    assert result.attempts == 2 and result.value == 1
    assert attempts[1] > attempts[0]  # a fresh epoch
    assert result.outcome.committed
    tg.close()


def test_run_gives_up_after_attempts(world):
    tg = tidegate.open(first_committer_wins=True)
    write = declare(world, "reversible", name="write")

    def body(tx):
        tx.read("retail:order:W1")
        with tg.transaction("other"):
            write("W1")

    with pytest.raises(tidegate.StaleRead):
        tg.run(body, attempts=2, backoff=0.001)
    tg.close()


def test_speculation_leaves_no_residue(tg, world):
    hold = declare(world, "reversible", name="hold")
    mail = declare(world, "gated", name="mail")
    stage = declare(world, "bufferable", name="stage")
    with tg.speculate(3, agent="planner") as spec:
        for i, branch in enumerate(spec.branches):
            with branch:
                hold(f"h{i}")
                mail(f"m{i}")
                stage(f"s{i}")
        out = spec.commit(1)
    assert out.winner.committed
    assert len(out.losers) == 3 - 1
    assert all(lo.reason_kind == "lost_branch" for lo in out.losers)
    fired = [e for e in world.events if e[0] == "do" and e[1][0] in "ms"]
    assert sorted(e[1] for e in fired) == ["m1", "s1"]  # only the winner's held effects
    undone = sorted(e[1] for e in world.events if e[0] == "undo")
    assert undone == ["h0", "h2"]  # the losers' executed effects were compensated
    for lo in out.losers:
        assert {e.disposition for e in lo.effects} == {"compensated", "discarded"}


def test_speculation_left_without_winner_aborts_every_branch(tg, world):
    mail = declare(world, "gated", name="mail")
    with tg.speculate(2) as spec:
        for b in spec:
            with b:
                mail("x")
    assert world.events == []
    assert all(b.state is None for b in spec.branches)


def test_hooks_veto_with_reason_or_exception(tg, world):
    mail = declare(world, "gated", name="mail")
    with pytest.raises(tidegate.Vetoed) as info:
        with tg.transaction() as tx:
            tx.add_hook(lambda view: f"{len(view['effects'])} effects need review", name="review")
            mail("1")
    assert "1 effects need review" in str(info.value)
    assert world.events == []

    def explode(view):
        raise PermissionError("policy says no")

    with pytest.raises(tidegate.Vetoed) as info:
        with tg.transaction() as tx:
            tx.add_hook(explode)
            mail("2")
    assert isinstance(info.value.__cause__, PermissionError)
    seen = []
    tg.add_hook(lambda view: seen.append([e["tool"] for e in view["effects"]]) or True, name="audit")
    with tg.transaction():
        mail("3")
    assert seen == [["mail"]] and world.events == [("do", "3", 1)]


def test_protocol_violation_outside_may_touch(tg, world):
    act = declare(world, "reversible")
    with pytest.raises(tidegate.ProtocolViolation) as info:
        with tg.transaction(may_touch=["retail:order:W1"]):
            act("W2")
    assert info.value.retryable is False
    assert world.events == []


def test_idempotency_key_replays_a_committed_call(tg, world):
    @tidegate.tool(scope="retail:pay:P1", effect="idempotent", key=lambda payment, **_: f"pay-{payment}")
    def pay(payment, amount):
        world("pay", payment, amount)
        return {"charged": amount}

    with tg.transaction():
        assert pay("P1", 10) == {"charged": 10}
    with tg.transaction() as tx2:
        assert pay("P1", 10) == {"charged": 10}
    assert world.events == [("pay", "P1", 10)]
    assert tx2.outcome.effects[0].disposition == "replayed"


def test_tool_outside_a_transaction_is_a_one_call_transaction(tg, world):
    mail = declare(world, "gated", name="mail").on(tg)
    assert mail("W1", amount=4) == {"id": "mail-W1", "amount": 4}
    assert world.events == [("do", "W1", 4)]
    assert tg.stats()["committed"] == 1


def test_read_your_staged_writes(tg, world):
    stage = declare(world, "bufferable", name="stage")
    with tg.transaction() as tx:
        stage("W1", amount=7)
        r = tx.read("retail:order:W1")
        assert r.staged == {"order": "W1", "amount": 7}


def test_settled_transaction_refuses_more_work(tg, world):
    act = declare(world, "reversible")
    with tg.transaction() as tx:
        act("1")
    with pytest.raises(tidegate.WrongState):
        tx.call(act, "2")
    assert tx.state is None


def test_async_transaction_with_async_tools(tg, world):
    async def undo(result, order, **_):
        await asyncio.sleep(0)
        world("undo", order, result)

    @tidegate.tool(scope=lambda order, **_: f"retail:order:{order}", effect="reversible", compensate=undo)
    async def book(order):
        await asyncio.sleep(0.001)
        world("book", order)
        return f"B-{order}"

    @tidegate.tool(scope="mail:out", effect="gated")
    async def mail(to):
        world("mail", to)
        return "sent"

    async def main():
        async with tg.transaction() as tx:
            assert await book("1") == "B-1"
            h = await mail("bob")
            assert isinstance(h, Held) and world.kinds() == ["book"]
        assert tx.outcome.committed and h.result == "sent"
        with pytest.raises(ValueError):
            async with tg.transaction() as tx2:
                await book("2")
                await mail("eve")
                raise ValueError("no")
        return tx2

    tx2 = asyncio.run(main())
    assert world.events == [("book", "1"), ("mail", "bob"), ("book", "2"), ("undo", "2", "B-2")]
    assert [e.disposition for e in tx2.outcome.effects] == ["compensated", "discarded"]


def test_async_hook_and_arun(tg, world):
    mail = declare(world, "gated", name="mail")

    async def review(view):
        await asyncio.sleep(0)
        return "rejected by async review"

    async def main():
        with pytest.raises(tidegate.Vetoed):
            async with tg.transaction() as tx:
                tx.add_hook(review)
                mail("1")

        async def body(tx):
            mail("2")
            return 42

        return await tg.arun(body)

    r = asyncio.run(main())
    assert r.value == 42 and r.attempts == 1
    assert world.events == [("do", "2", 1)]


def test_an_outcome_from_the_engine_is_the_dataclass_the_constructor_makes(tg, world):
    """`Outcome._from_dict` fills the frozen dataclasses' fields directly (it runs once per
    settled transaction): a field added to either class and not filled there would be missing
    here, and equality, repr and immutability must be those of the constructor's objects."""
    import dataclasses

    from tidegate.outcome import EffectOutcome, Outcome

    act = declare(world, "reversible")
    with tg.transaction("agent") as tx:
        act("A1")
        act("A2", 3)
    out = tx.outcome
    assert out is not None and len(out.effects) == 2
    rebuilt = Outcome(**{f.name: getattr(out, f.name) for f in dataclasses.fields(Outcome)})
    assert out == rebuilt and repr(out) == repr(rebuilt)
    for e in out.effects:
        assert set(vars(e)) == {f.name for f in dataclasses.fields(EffectOutcome)}
        assert e == EffectOutcome(**{f.name: getattr(e, f.name) for f in dataclasses.fields(EffectOutcome)})
        with pytest.raises(dataclasses.FrozenInstanceError):
            e.tag = "leaked"  # type: ignore[misc]
    assert set(vars(out)) == {f.name for f in dataclasses.fields(Outcome)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.committed = False  # type: ignore[misc]
