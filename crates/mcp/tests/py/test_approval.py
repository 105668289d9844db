"""Calls that wait for a person's approval, asked through the protocol's elicitation and bound
to a digest of the exact arguments, the policy's version and an expiry."""

import re
import anyio
import mcp_types as types
import pytest

from conftest import log_upstream, read_log, stdio_session, text, write_policy
from test_log_upstream import RULES

pytestmark = pytest.mark.anyio

APPROVED = RULES.replace('match = "send"\nclass = "gated"', 'match = "send"\nclass = "gated"\napproval = true')


def answering(action, approve=True, delay=0.0, asked=None):
    async def callback(context, params):
        if asked is not None:
            asked.append(params.message)
        if delay:
            await anyio.sleep(delay)
        content = {"approve": approve} if action == "accept" else None
        return types.ElicitResult(action=action, content=content)

    return callback


async def test_an_approved_call_is_held_and_fires_at_commit(workdir):
    log = workdir / "log.jsonl"
    asked = []
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    async with stdio_session(policy, elicitation_callback=answering("accept", asked=asked)) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert "approval" in tools["send"].description
        r = await s.call_tool("send", {"to": "cfo", "text": "wire 10k"})
        assert not r.is_error and text(r).startswith("queued"), text(r)
        assert len(asked) == 1
        assert "`send`" in asked[0] and "wire 10k" in asked[0] and "policy test" in asked[0]
        digest = re.search(r"digest ([0-9a-f]{32})", asked[0]).group(1)
        assert not (await s.call_tool("tidegate_commit", {})).is_error
    assert [(e["op"], e["text"]) for e in read_log(log)] == [("send", "wire 10k")]
    # The approval (its digest) is recorded in the ledger with the call.
    stored = b"".join(p.read_bytes() for p in (workdir / "ledger").rglob("*") if p.is_file())
    assert digest.encode() in stored


@pytest.mark.parametrize("flow", ["elicitation", "input_required"])
@pytest.mark.parametrize("action,approve", [("decline", True), ("cancel", True), ("accept", False)])
async def test_a_call_that_is_not_approved_never_runs(workdir, action, approve, flow):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    callback = answering(action, approve)
    if flow == "elicitation":
        client = stdio_session(policy, elicitation_callback=callback)
    else:
        client = modern_client(policy, elicitation_callback=callback)
    async with client as s:
        r = await s.call_tool("send", {"to": "cfo", "text": "wire 10k"})
        assert r.is_error and "nothing was called" in text(r), text(r)
        r = await s.call_tool("tidegate_commit", {})
        assert "nothing to commit" in text(r)
    assert read_log(log) == []


async def test_an_approval_request_expires(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    policy.write_text(policy.read_text().replace("call_timeout_ms = 10000", "call_timeout_ms = 10000\napproval_timeout_ms = 300"))
    async with stdio_session(policy, elicitation_callback=answering("accept", delay=2.0)) as s:
        r = await s.call_tool("send", {"to": "cfo", "text": "late"})
        assert r.is_error and "expired" in text(r), text(r)
    assert read_log(log) == []


async def test_a_client_that_cannot_be_asked_is_told_so(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    async with stdio_session(policy) as s:  # no elicitation callback: the capability is not declared
        r = await s.call_tool("send", {"to": "cfo", "text": "x"})
        assert r.is_error and "cannot be asked" in text(r), text(r)
    assert read_log(log) == []


def modern_client(policy, **kwargs):
    """The SDK's high-level client on the 2026-07-28 revision, which takes no request from the
    server: approvals reach it as `input_required` results it answers by retrying the call."""
    from mcp import Client, StdioServerParameters

    from conftest import BIN

    params = StdioServerParameters(command=BIN, args=["serve", "--policy", str(policy)])
    return Client(params, mode="2026-07-28", **kwargs)


async def test_the_current_revision_is_asked_through_the_input_required_flow(workdir):
    log = workdir / "log.jsonl"
    asked = []
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    async with modern_client(policy, elicitation_callback=answering("accept", asked=asked)) as c:
        assert c.protocol_version == "2026-07-28"
        r = await c.call_tool("send", {"to": "cfo", "text": "wire 10k"})
        assert not r.is_error and text(r).startswith("queued"), text(r)
        assert len(asked) == 1 and "wire 10k" in asked[0]
        digest = re.search(r"digest ([0-9a-f]{32})", asked[0]).group(1)
        assert not (await c.call_tool("tidegate_commit", {})).is_error
    assert [(e["op"], e["text"]) for e in read_log(log)] == [("send", "wire 10k")]
    stored = b"".join(p.read_bytes() for p in (workdir / "ledger").rglob("*") if p.is_file())
    assert digest.encode() in stored and b"input_required" in stored


async def test_an_input_required_answer_binds_the_exact_arguments_and_answers_once(workdir):
    log = workdir / "log.jsonl"
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    async with modern_client(policy) as c:
        s = c.session
        first = await s.call_tool("send", {"to": "cfo", "text": "wire 10k"}, allow_input_required=True)
        assert first.result_type == "input_required", first
        state = first.request_state
        yes = {"approval": {"action": "accept", "content": {"approve": True}}}
        # The answer is replayed with other arguments: refused, nothing runs.
        r = await s.call_tool("send", {"to": "cfo", "text": "wire 99k"}, input_responses=yes, request_state=state,
                              allow_input_required=True)
        assert r.is_error and "other arguments" in text(r), text(r)
        # The handle was used: even the right arguments must be asked again.
        r = await s.call_tool("send", {"to": "cfo", "text": "wire 10k"}, input_responses=yes, request_state=state,
                              allow_input_required=True)
        assert r.is_error and "already used" in text(r), text(r)
        # A forged handle is refused the same way.
        r = await s.call_tool("send", {"to": "cfo", "text": "wire 10k"}, input_responses=yes,
                              request_state="approval-1-999", allow_input_required=True)
        assert r.is_error and "unknown" in text(r), text(r)
        assert not (await c.call_tool("tidegate_commit", {})).is_error
    assert read_log(log) == []


async def test_arguments_a_person_cannot_be_shown_whole_are_not_put_to_approval(workdir):
    log = workdir / "log.jsonl"
    asked = []
    policy = write_policy(workdir, log_upstream(log) + APPROVED)
    async with stdio_session(policy, elicitation_callback=answering("accept", asked=asked)) as s:
        r = await s.call_tool("send", {"to": "cfo", "text": "pay " + "x" * 9000})
        assert r.is_error and "cannot all be shown" in text(r) and "nothing was called" in text(r), text(r)
        # Direction overrides are shown escaped, so the text reads as the arguments are.
        r = await s.call_tool("send", {"to": "cfo", "text": "pay \u202etxt.exe"})
        assert not r.is_error, text(r)
    assert asked == [asked[0]] and "\\u{202e}" in asked[0] and "\u202e" not in asked[0], asked
    assert read_log(log) == []
