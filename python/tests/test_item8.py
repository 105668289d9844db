"""What a tau-bench replay found (issue 13 item 8): a partial commit cannot go unnoticed, and
compensations and probes receive the call's id."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

import tidegate
from tidegate import Held, OutcomeUnknown, PartialCommit, ReleaseFailed

HERE = os.path.dirname(os.path.abspath(__file__))


def senders(fired):  # type: ignore[no-untyped-def]
    def send(to):  # type: ignore[no-untyped-def]
        if to == "bad":
            raise tidegate.NotApplied("mail server refused")
        fired.append(to)
        return f"sent to {to}"

    return tidegate.tool(send, scope=lambda to: f"mail:{to}", effect="gated", name="send")


def test_partial_commit_raises_with_the_outcome_attached():
    tg = tidegate.open(retry_attempts=1)
    fired = []
    send = senders(fired)
    with pytest.raises(PartialCommit) as info:
        with tg.transaction(agent="notify") as tx:
            a = send("ann")
            b = send("bad")
            c = send("cy")
    e = info.value
    assert fired == ["ann"] and not e.retryable and e.kind == "partial_commit"
    assert e.outcome is tx.outcome or e.outcome == tx.outcome
    assert tx.outcome.committed and tx.outcome.partial is not None
    assert tx.outcome.partial["released"] == [a.effect] and tx.outcome.partial["failed"] == b.effect
    assert tx.outcome.partial["not_attempted"] == [c.effect]
    # The fired effect settled as intended; the failed and the never-attempted ones are tagged.
    assert [ef.tag for ef in tx.outcome.effects] == ["clean", "partial-commit", "partial-commit"], tx.outcome
    assert "mail server refused" in str(e) and "`send`" in str(e)
    # What fired is reported through its acknowledgement; what did not, says so.
    assert isinstance(a, Held) and a.released and a.result == "sent to ann"
    assert not b.released and not c.released


def test_partial_commit_raises_from_commit_and_acommit_and_run():
    tg = tidegate.open(retry_attempts=1)
    send = senders([])
    tx = tg.begin()
    tx.call(send, "ann")
    tx.call(send, "bad")
    with pytest.raises(PartialCommit):
        tx.commit()

    async def main():
        async with tg.transaction():
            send("ann")
            send("bad")

    with pytest.raises(PartialCommit):
        asyncio.run(main())

    def body(tx):  # type: ignore[no-untyped-def]
        send("ann")
        send("bad")

    with pytest.raises(PartialCommit):
        tg.run(body, attempts=3)  # not retryable: what fired stays fired


def test_a_first_release_failing_is_an_abort_not_a_partial_commit():
    tg = tidegate.open(retry_attempts=1)
    fired = []
    send = senders(fired)
    with pytest.raises(ReleaseFailed) as info:
        with tg.transaction():
            send("bad")
            send("ann")
    assert fired == [] and not info.value.outcome.committed


def test_tool_compensation_and_probe_receive_the_same_call_id():
    tg = tidegate.open()
    seen = []

    def undo(result, row, call_id):  # type: ignore[no-untyped-def]
        seen.append(("undo", row, call_id))

    @tidegate.tool(scope=lambda row, **_: f"db:t:{row}", effect="reversible", compensate=undo)
    def update(row, *, call_id):  # type: ignore[no-untyped-def]
        seen.append(("update", row, call_id))
        return "ok"

    try:
        with tg.transaction():
            update("r1")
            update("r2")
            raise RuntimeError("abort")
    except RuntimeError:
        pass
    ids = {row: cid for kind, row, cid in seen if kind == "update"}
    assert len(set(ids.values())) == 2 and all(isinstance(i, str) and len(i) >= 16 for i in ids.values())
    assert [s for s in seen if s[0] == "undo"] == [("undo", "r2", ids["r2"]), ("undo", "r1", ids["r1"])]
    # With a key, the call id is the key.
    keyed = tidegate.tool(lambda row, call_id: call_id, scope="kv:k", effect="idempotent", key=lambda row: f"k-{row}", name="keyed")
    with tg.transaction():
        assert keyed("r9") == "k-r9"
    # A tool that takes no call_id is called as before, and a caller cannot pass one.
    with pytest.raises(tidegate.InvalidArgument) as info:
        with tg.transaction():
            update("r3", call_id="mine")
    assert info.value.argument == "call_id"


def test_probe_receives_the_call_id_the_tool_got():
    tg = tidegate.open()
    sent = {}

    def probe(to, call_id):  # type: ignore[no-untyped-def]
        return tidegate.Happened(sent[call_id]) if call_id in sent else False

    @tidegate.tool(scope="mail:x@example.com", effect="idempotent", probe=probe)
    def send(to, call_id):  # type: ignore[no-untyped-def]
        sent[call_id] = f"msg-{len(sent)}"
        raise OutcomeUnknown("timeout after sending")

    with tg.transaction() as tx:
        out = send("x")
    assert out == "msg-0" and tx.outcome.committed


def test_recovery_in_a_new_process_gives_the_compensation_the_recorded_call_id(tmp_path):
    program = os.path.join(HERE, "call_id_program.py")
    first = subprocess.run([sys.executable, program, str(tmp_path), "crash"], capture_output=True, text=True, timeout=60)
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = subprocess.run([sys.executable, program, str(tmp_path), "recover"], capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    log = (tmp_path / "world.log").read_text().split()
    # "snapshot <id>" by the tool before the crash, "restore <id>" by the compensation that
    # recovery ran in the second process: the same id.
    assert len(log) == 4 and log[0] == "snapshot" and log[2] == "restore" and log[1] == log[3]
