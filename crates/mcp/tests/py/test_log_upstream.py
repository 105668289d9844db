"""The gateway in front of an upstream written for the tests (log_upstream.py), whose
append-only log is the ground truth of what reached it."""

import subprocess

import pytest

from conftest import BIN, log_upstream, read_log, stdio_session, text, write_policy

pytestmark = pytest.mark.anyio

RULES = """
[[tools]]
upstream = "log"
match = "put"
class = "reversible"
scopes = ["kv:{args.key}"]
compensate = { tool = "unput", args = { key = "{args.key}" } }

[[tools]]
upstream = "log"
match = "{fail,die}"
class = "reversible"
scopes = ["kv:{args.key}"]
compensate = { tool = "unput", args = { key = "{args.key}" } }

[[tools]]
upstream = "log"
match = "send"
class = "gated"
scopes = ["mail:{args.to}"]
"""


async def test_an_abort_compensates_newest_first(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES)
    async with stdio_session(policy) as s:
        for k in ("a", "b", "c"):
            assert not (await s.call_tool("put", {"key": k, "value": k.upper()})).is_error
        await s.call_tool("send", {"to": "ops", "text": "done"})
        r = await s.call_tool("tidegate_abort", {})
        assert not r.is_error, text(r)
    ops = [(e["op"], e.get("key")) for e in read_log(log)]
    assert ops == [("put", "a"), ("put", "b"), ("put", "c"), ("unput", "c"), ("unput", "b"), ("unput", "a")]


async def test_held_calls_fire_once_in_order_at_commit(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("send", {"to": "a", "text": "1"})
        await s.call_tool("put", {"key": "k", "value": "v"})
        await s.call_tool("send", {"to": "b", "text": "2"})
        assert [e["op"] for e in read_log(log)] == ["put"]
        r = await s.call_tool("tidegate_commit", {})
        assert not r.is_error, text(r)
        assert [(e["op"], e.get("to")) for e in read_log(log)] == [("put", None), ("send", "a"), ("send", "b")]
        # A second commit has nothing to release.
        await s.call_tool("tidegate_commit", {})
    assert len([e for e in read_log(log) if e["op"] == "send"]) == 2


async def test_a_failing_call_aborts_the_turn_and_says_so(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("put", {"key": "a", "value": "1"})
        await s.call_tool("send", {"to": "x", "text": "never"})
        r = await s.call_tool("fail", {"key": "z"})
        assert r.is_error
        assert "this turn was aborted" in text(r) and "refusing z" in text(r)
        assert "Undone: log.put" in text(r) and "Never run: log.send" in text(r)
    ops = [e["op"] for e in read_log(log)]
    assert ops == ["put", "unput"], "the failed call did nothing, the put is undone, the send never ran"


async def test_an_upstream_that_dies_mid_call_is_a_tool_error_and_the_turn_settles(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("put", {"key": "a", "value": "1"})
        r = await s.call_tool("die", {"key": "d"})
        assert r.is_error
        t = text(r)
        assert "this turn was aborted" in t, t
        # The upstream is gone, so neither the unknown call nor the put can be undone: the
        # gateway says so instead of claiming they were.
        assert "needs attention" in t and "unresolved" in t, t
        # The gateway itself is still serving.
        r = await s.call_tool("tidegate_status", {})
        assert "no turn is open" in text(r)
    assert [e["op"] for e in read_log(log)] == ["put", "die"]


def run_check(policy):
    return subprocess.run([BIN, "check", "--policy", str(policy)], capture_output=True, text=True, timeout=60)


def test_a_policy_with_an_unknown_key_is_refused_with_file_line_and_key(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES.replace('match = "send"', 'match = "send"\nheld = true'))
    out = run_check(policy)
    assert out.returncode != 0
    line = policy.read_text().splitlines().index("held = true") + 1
    assert f"policy.toml:{line}" in out.stderr and "held" in out.stderr, out.stderr


def test_a_template_naming_a_missing_argument_is_refused_at_start(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES.replace("kv:{args.key}", "kv:{args.name}", 1))
    out = run_check(policy)
    assert out.returncode != 0
    line = next(i for i, l in enumerate(policy.read_text().splitlines(), 1) if "args.name" in l)
    assert f"policy.toml:{line}" in out.stderr and "tools[0].scopes[0]" in out.stderr, out.stderr
    assert "`name`" in out.stderr and "key" in out.stderr, out.stderr


def test_check_lists_every_tool_with_what_the_gateway_does(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES)
    out = run_check(policy)
    assert out.returncode == 0, out.stderr
    rows = dict(line.split("\t")[1:] for line in out.stdout.splitlines())
    assert rows == {"put": "reversible", "unput": "refused", "send": "gated", "fail": "reversible", "die": "reversible",
                    "get": "refused", "slow": "refused", "grow": "refused", "wait": "refused"}
    assert "undeclared: `unput`" in out.stderr


async def test_an_upstream_over_streamable_http(workdir):
    from conftest import HttpLogUpstream

    log = workdir / "log.jsonl"
    up = HttpLogUpstream(log)
    try:
        policy = write_policy(workdir, up.policy() + RULES)
        async with stdio_session(policy) as s:
            for k in ("a", "b"):
                assert not (await s.call_tool("put", {"key": k, "value": k})).is_error
            await s.call_tool("send", {"to": "ops", "text": "held"})
            r = await s.call_tool("tidegate_abort", {})
            assert not r.is_error, text(r)
            await s.call_tool("put", {"key": "c", "value": "c"})
            await s.call_tool("send", {"to": "ops", "text": "once"})
            r = await s.call_tool("tidegate_commit", {})
            assert not r.is_error, text(r)
        ops = [(e["op"], e.get("key") or e.get("text")) for e in read_log(log)]
        assert ops == [("put", "a"), ("put", "b"), ("unput", "b"), ("unput", "a"), ("put", "c"), ("send", "once")]
    finally:
        up.kill()


async def test_an_http_upstream_that_dies_mid_turn(workdir):
    from conftest import HttpLogUpstream

    log = workdir / "log.jsonl"
    up = HttpLogUpstream(log)
    policy = write_policy(workdir, up.policy() + RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("put", {"key": "a", "value": "1"})
        await s.call_tool("send", {"to": "x", "text": "never"})
        up.kill()
        r = await s.call_tool("put", {"key": "b", "value": "2"})
        assert r.is_error
        t = text(r)
        # Nothing can reach the dead upstream: the turn ends, the put of `a` cannot be undone
        # and is reported, the held send never runs.
        assert "this turn was aborted" in t and "needs attention" in t and "Never run" in t, t
        r = await s.call_tool("tidegate_status", {})
        assert "no turn is open" in text(r)
    assert [e["op"] for e in read_log(log)] == ["put"]


PROBED = """
[[tools]]
upstream = "log"
match = "slow"
class = "reversible"
scopes = ["kv:{args.key}"]
compensate = { tool = "unput", args = { key = "{args.key}" } }
probe = { tool = "get", args = { key = "{args.key}" }, found = "result.value" }
"""


async def test_an_unknown_outcome_is_probed_and_what_happened_is_compensated(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES + PROBED, call_timeout_ms=1000)
    async with stdio_session(policy) as s:
        # The upstream stores at once but answers after 3 s; the gateway gives up after 1 s,
        # asks the probe, learns the value is there, and counts the call as done.
        r = await s.call_tool("slow", {"key": "k", "value": "v", "seconds": 3})
        assert not r.is_error, text(r)
        assert '"value": "v"' in text(r) or "'value': 'v'" in text(r) or '"v"' in text(r), text(r)
        r = await s.call_tool("tidegate_status", {})
        assert "slow: ran" in text(r), text(r)
        r = await s.call_tool("tidegate_abort", {})
        assert [e["disposition"] for e in r.structured_content["effects"]] == ["compensated"], text(r)
    assert [(e["op"], e["key"]) for e in read_log(log)] == [("put", "k"), ("unput", "k")]


def test_a_probe_needs_found_and_reads_its_answer(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES + PROBED.replace(', found = "result.value"', ""))
    out = run_check(policy)
    assert out.returncode != 0 and "probe.found" in out.stderr, out.stderr
    policy = write_policy(workdir, log_upstream(log) + RULES + PROBED.replace("result.value", "args.key"))
    out = run_check(policy)
    assert out.returncode != 0 and "result." in out.stderr, out.stderr


async def test_an_agent_that_stops_waiting_mid_call_loses_nothing(workdir):
    import anyio

    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + RULES + PROBED)
    async with stdio_session(policy) as s:
        # The agent gives up on a call after 0.2 s (the SDK sends notifications/cancelled); the
        # gateway still learns the call's outcome and keeps it in the turn.
        with anyio.move_on_after(0.2):
            await s.call_tool("slow", {"key": "k", "value": "v", "seconds": 1})
        r = await s.call_tool("tidegate_status", {})
        assert "slow: ran" in text(r), text(r)
        r = await s.call_tool("tidegate_abort", {})
        assert [e["disposition"] for e in r.structured_content["effects"]] == ["compensated"], text(r)
    assert [(e["op"], e["key"]) for e in read_log(log)] == [("put", "k"), ("unput", "k")]


async def test_a_read_the_agent_cancels_is_cancelled_upstream(workdir):
    import anyio

    log = workdir / "log.jsonl"
    reads = '\n[[tools]]\nupstream = "log"\nmatch = "wait"\nclass = "read"\nscopes = ["kv:{args.key}"]\n'
    policy = write_policy(workdir, log_upstream(log) + RULES + reads)
    async with stdio_session(policy) as s:
        # A read has no outcome the turn needs: the agent's notifications/cancelled reaches
        # the upstream, which stops (unlike an effect, which runs to its end: the test above).
        with anyio.move_on_after(0.5):
            await s.call_tool("wait", {"key": "k", "seconds": 30})
        for _ in range(50):
            if [e["op"] for e in read_log(log)] == ["wait", "wait-cancelled"]:
                break
            await anyio.sleep(0.1)
        assert [e["op"] for e in read_log(log)] == ["wait", "wait-cancelled"], read_log(log)
        # The session is free at once, and the turn still holds the read.
        with anyio.fail_after(5):
            r = await s.call_tool("tidegate_status", {})
        assert "wait: read" in text(r), text(r)


async def test_a_changed_tool_list_is_checked_against_the_policy_before_use(workdir):
    import anyio

    log = workdir / "log.jsonl"
    grows = """
[[tools]]
upstream = "log"
match = "grow"
class = "read"
scopes = ["kv:tools"]

[[tools]]
upstream = "log"
match = "stash_*"
class = "gated"
scopes = ["kv:{args.key}"]
"""
    changed = []

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.append(message)

    policy = write_policy(workdir, log_upstream(log) + RULES + grows)
    async with stdio_session(policy, message_handler=on_message) as s:
        assert "stash_x" not in {t.name for t in (await s.list_tools()).tools}
        assert not (await s.call_tool("grow", {"name": "stash_x"})).is_error
        for _ in range(50):
            if changed:
                break
            await anyio.sleep(0.1)
        assert changed, "the agent is told the list changed"
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert "held until the turn commits" in tools["stash_x"].description, "governed by its rule"
        r = await s.call_tool("stash_x", {"key": "k", "value": "v"})
        assert text(r).startswith("queued"), text(r)
        assert [e["op"] for e in read_log(log)] == []
        assert not (await s.call_tool("tidegate_commit", {})).is_error
    assert [(e["op"], e["key"]) for e in read_log(log)] == [("stash_x", "k")]
