"""The engine's options from Python (issue 13 item 5): consistency level and isolation, a
trace file `tidegate check` reads, per-transaction leases, and async speculation."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

import tidegate
from tidegate import InvalidArgument, ScopeType, StaleRead

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def stale_read(tg: tidegate.Tidegate, read_only: bool) -> tidegate.Transaction:
    """The writer (earlier epoch) and the reader begin; the reader reads kv:x; the writer
    commits a write to kv:x. Returns the reader, whose read is now stale."""
    w = tidegate.tool(lambda v: v, scope="kv:x", effect="bufferable", name=f"w{id(tg)}")
    writer = tg.begin(agent="writer", may_touch=["kv:x"])
    reader = tg.begin(agent="reader", may_touch=["kv:x", "kv:y"])
    reader.read("kv:x")
    writer.call(w, 1)
    assert writer.commit().committed
    if not read_only:
        reader.call(tidegate.tool(lambda v: v, scope="kv:y", effect="bufferable", name=f"y{id(tg)}"), 2)
    return reader


def test_level_and_isolation_are_options_and_change_what_commits():
    tg = tidegate.open(level="L0")
    assert (tg.level, tg.isolation) == ("L0", "serializable")
    assert stale_read(tg, read_only=False).commit().committed  # L0 checks nothing
    tg = tidegate.open(level="l1")
    assert tg.level == "L1"
    with pytest.raises(StaleRead):
        stale_read(tg, read_only=False).commit()
    # Snapshot isolation: a read-only transaction commits without validation (the bypass);
    # serializable validates it.
    si = tidegate.open(level="L1", isolation="snapshot")
    assert si.isolation == "snapshot"
    assert stale_read(si, read_only=True).commit().committed
    ser = tidegate.open(level="L1", isolation="serializable")
    with pytest.raises(StaleRead):
        stale_read(ser, read_only=True).commit()
    assert tidegate.open(isolation="pessimistic").isolation == "pessimistic"


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"level": "L9"}, "level"),
        ({"level": 1}, "level"),
        ({"isolation": "eventual"}, "isolation"),
        ({"trace": 5}, "trace"),
        ({"scope_types": ["github"]}, "scope_types"),
        ({"scope_types": {"github": {"style": "slash"}}}, "style"),
        ({"scope_types": {"github": {"case": "upper"}}}, "case"),
        ({"scope_types": {"github": {"sep": "/"}}}, "scope_types"),
        ({"scope_types": {"Git Hub": ScopeType()}}, "scope_types"),
    ],
)
def test_bad_options_name_the_option(kwargs, argument):
    with pytest.raises(InvalidArgument) as info:
        tidegate.open(**kwargs)
    assert info.value.argument == argument, str(info.value)


def test_trace_file_holds_one_record_per_transaction_and_tidegate_check_reads_it(tmp_path):
    path = tmp_path / "trace.jsonl"
    tg = tidegate.open(trace=path)
    assert tg.trace == str(path)
    put = tidegate.tool(lambda v: v, scope="kv:a", effect="bufferable", name="put")
    for i in range(3):
        with tg.transaction(agent=f"agent-{i}", may_touch=["kv:a"]) as tx:
            tx.read("kv:a")
            put(i)
    try:
        with tg.transaction(agent="failing", may_touch=["kv:a"]):
            put(9)
            raise RuntimeError("abort")
    except RuntimeError:
        pass
    tg.close()
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(records) == 4
    assert [r["agent"] for r in records] == ["agent-0", "agent-1", "agent-2", "failing"]
    assert [r.get("aborted", False) for r in records] == [False, False, False, True]
    binary = os.environ.get("TIDEGATE_BIN") or os.path.join(ROOT, "target", "debug", "tidegate")
    if not os.path.exists(binary):
        pytest.skip(f"no tidegate binary at {binary} (scripts/test.sh builds it; or set TIDEGATE_BIN)")
    r = subprocess.run([binary, "check", str(path), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["records"] == 4, report


def test_unwritable_trace_path_is_refused_naming_it(tmp_path):
    with pytest.raises(InvalidArgument) as info:
        tidegate.open(trace=tmp_path / "no" / "such" / "dir.jsonl")
    assert info.value.argument == "trace" and "dir.jsonl" in str(info.value)


def test_trace_is_flushed_at_interpreter_exit(tmp_path):
    path = tmp_path / "exit.jsonl"
    program = (
        "import tidegate\n"
        f"tg = tidegate.open(trace={str(path)!r})\n"
        "t = tidegate.tool(lambda: 1, scope='kv:a', effect='gated', name='t')\n"
        "with tg.transaction(may_touch=['kv:a']):\n"
        "    t()\n"
    )
    subprocess.run([os.sys.executable, "-c", program], check=True, timeout=60)
    assert len(path.read_text().splitlines()) == 1


def test_lease_per_transaction_expires_only_that_transaction():
    tg = tidegate.open(lease=30)
    undone = []
    put = tidegate.tool(
        lambda v: v, scope=lambda v: f"kv:{v}", effect="reversible", compensate=lambda r, v: undone.append(v), name="p"
    )
    short = tg.begin(agent="short", may_touch=["kv:s"], lease=0.2)
    long = tg.begin(agent="long", may_touch=["kv:l"])
    short.call(put, "s")
    long.call(put, "l")
    time.sleep(0.5)
    # The reaper aborted the expired transaction and compensated its call. (What a later call on
    # it raises is the engine's to say: today WrongState "already settled".)
    with pytest.raises(tidegate.TidegateError):
        short.call(put, "s")
    assert short.state is None and undone == ["s"]
    assert long.state == "open"
    assert long.commit().committed
    with pytest.raises(InvalidArgument) as bad:
        tg.transaction(lease=0)
    assert bad.value.argument == "lease"


def test_async_speculation_commits_one_branch_and_leaves_no_loser_residue():
    tg = tidegate.open()
    world = []

    async def undo(result, plan):
        world.append(("undo", plan))

    @tidegate.tool(scope=lambda plan: f"trip:hold:{plan}", effect="reversible", compensate=undo)
    async def hold(plan):
        world.append(("hold", plan))
        return plan

    @tidegate.tool(scope="mail:ann@example.com", effect="gated")
    async def mail(plan):
        world.append(("mail", plan))
        return f"sent {plan}"

    async def main():
        async with tg.speculate(3, agent="planner") as spec:
            for plan, branch in zip("abc", spec.branches):
                async with branch:
                    await hold(plan)
                    receipt = await mail(plan)
            assert isinstance(receipt, tidegate.Held)
            out = await spec.acommit(1)
        return out, spec

    out, spec = asyncio.run(main())
    assert out.winner.committed and len(out.losers) == 2
    assert ("mail", "b") in world and ("mail", "a") not in world and ("mail", "c") not in world
    assert sorted(p for k, p in world if k == "undo") == ["a", "c"]
    assert spec.branches[1].outcome is out.winner
    assert {b.outcome.reason_kind for i, b in enumerate(spec.branches) if i != 1} == {"lost_branch"}


def test_async_speculation_left_without_a_winner_aborts_every_branch():
    tg = tidegate.open()
    fired = []
    send = tidegate.tool(lambda x: fired.append(x), scope="mail:x@example.com", effect="gated", name="send")

    async def main():
        async with tg.speculate(2) as spec:
            async with spec.branches[0]:
                send(1)
        return spec

    spec = asyncio.run(main())
    assert fired == [] and all(b.outcome is not None and not b.outcome.committed for b in spec.branches)
    assert tg.stats()["unfinished"] == 0
