"""How turns end besides tidegate_commit and tidegate_abort: the idle timer, per-call mode,
and a gateway killed mid-turn (its successor aborts the turn when its lease ends)."""

import signal
import time

import pytest

from conftest import log_upstream, put_hold_and_kill, read_log, stdio_session, text, wait_for, write_policy
from test_log_upstream import RULES

pytestmark = pytest.mark.anyio



@pytest.mark.parametrize("on_idle", ["abort", "commit"])
async def test_an_idle_turn_ends_by_its_policy(workdir, on_idle):
    log = workdir / "log.jsonl"
    turn = f'[turn]\nidle_ms = 300\non_idle = "{on_idle}"\n'
    policy = write_policy(workdir, turn + log_upstream(log) + RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("put", {"key": "a", "value": "1"})
        await s.call_tool("send", {"to": "ops", "text": "held"})
        expected = ["put", "unput"] if on_idle == "abort" else ["put", "send"]
        assert await wait_for(lambda: [e["op"] for e in read_log(log)] == expected, 10), read_log(log)
        r = await s.call_tool("tidegate_status", {})
        assert "no turn is open" in text(r)


async def test_per_call_mode_commits_each_call(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, '[turn]\nmode = "per_call"\n' + log_upstream(log) + RULES)
    async with stdio_session(policy) as s:
        r = await s.call_tool("put", {"key": "a", "value": "1"})
        assert not r.is_error and "stored" in text(r), text(r)
        r = await s.call_tool("send", {"to": "ops", "text": "now"})
        assert not r.is_error and r.structured_content["committed"] is True, text(r)
        assert [e["op"] for e in read_log(log)] == ["put", "send"], "the held call ran at its own commit"
        r = await s.call_tool("fail", {"key": "z"})
        assert r.is_error
        r = await s.call_tool("tidegate_abort", {})
        assert "nothing to abort" in text(r)
    assert [e["op"] for e in read_log(log)] == ["put", "send"]


async def test_a_gateway_killed_mid_turn_is_settled_by_the_next_one(workdir):
    log = workdir / "log.jsonl"
    body = "[turn]\nidle_ms = 100\n" + log_upstream(log) + RULES
    policy = write_policy(workdir, body, call_timeout_ms=1000)
    # The first gateway runs a put and holds a send, then dies without a word (SIGKILL).
    put_hold_and_kill(policy)
    assert [e["op"] for e in read_log(log)] == ["put"]

    # The next gateway on the same ledger finds the turn open; when its lease ends the turn is
    # aborted: the put is compensated through the (new) upstream, the send never runs.
    started = time.time()
    async with stdio_session(policy) as s:
        assert await wait_for(lambda: [e["op"] for e in read_log(log)] == ["put", "unput"], 20), read_log(log)
        r = await s.call_tool("tidegate_status", {})
        assert "no turn is open" in text(r)
    assert time.time() - started < 20


async def test_a_gateway_stopped_with_sigterm_aborts_every_open_turn_first(workdir):
    from conftest import HttpGateway, http_session

    log = workdir / "log.jsonl"
    gw = HttpGateway(write_policy(workdir, log_upstream(log) + RULES))
    try:
        async with http_session(gw.url) as a, http_session(gw.url) as b:
            await a.call_tool("put", {"key": "a", "value": "1"})
            await b.call_tool("put", {"key": "b", "value": "2"})
            await b.call_tool("send", {"to": "x", "text": "never"})
            gw.proc.send_signal(signal.SIGTERM)
            assert gw.proc.wait(timeout=30) == 0
    except BaseException as e:  # the sessions' own close fails once the server is gone
        if gw.proc.poll() is None:
            raise
        del e
    finally:
        gw.stop()
    ops = sorted((e["op"], e["key"]) for e in read_log(log) if e["op"] in ("put", "unput", "send"))
    assert ops == [("put", "a"), ("put", "b"), ("unput", "a"), ("unput", "b")], read_log(log)


async def test_an_http_session_that_ends_mid_turn_is_aborted(workdir):
    from conftest import HttpGateway, http_session

    log = workdir / "log.jsonl"
    gw = HttpGateway(write_policy(workdir, log_upstream(log) + RULES))
    try:
        async with http_session(gw.url) as s:
            await s.call_tool("put", {"key": "a", "value": "1"})
            await s.call_tool("send", {"to": "x", "text": "never"})
        # The client ended its session (DELETE); the gateway goes on serving others.
        ok = await wait_for(lambda: [e["op"] for e in read_log(log)] == ["put", "unput"], 20)
        assert ok, read_log(log)
        async with http_session(gw.url) as s:
            r = await s.call_tool("tidegate_status", {})
            assert "no turn is open" in text(r)
    finally:
        gw.stop()
