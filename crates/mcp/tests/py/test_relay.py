"""What an upstream sends toward the agent during a call, through the gateway: sampling and
elicitation requests (answered by the agent's client), log messages (filtered at the level
the agent set), and resource updates to the sessions subscribed to the resource. The upstream
is conformance_upstream.py (the conformance suite's server scenarios), over stdio."""

import sys

import anyio
import mcp_types as types
import pytest

from conftest import HERE, stdio_session, text, toml_str

pytestmark = pytest.mark.anyio


def policy(workdir):
    p = workdir / "policy.toml"
    p.write_text(
        'version = "relay"\n[gateway]\nstore = "memory:"\n'
        f"[upstreams.conformance]\ncommand = {toml_str(sys.executable)}\n"
        f"args = [{toml_str(HERE / 'conformance_upstream.py')}]\n"
        '[[tools]]\nupstream = "conformance"\nmatch = "test_*"\nclass = "read"\nscopes = ["conformance:all"]\n'
    )
    return p


async def test_sampling_and_elicitation_reach_the_agent_of_the_call(workdir):
    asked = []

    async def sampling(context, params):
        asked.append(("sampling", params.messages[0].content.text))
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="forty-two"),
                                         model="scripted", stop_reason="endTurn")

    async def elicitation(context, params):
        asked.append(("elicitation", params.message))
        return types.ElicitResult(action="accept", content={"username": "ann", "email": "ann@example.com"})

    async with stdio_session(policy(workdir), sampling_callback=sampling, elicitation_callback=elicitation) as s:
        r = await s.call_tool("test_sampling", {"prompt": "the answer?"})
        assert not r.is_error and "LLM response: forty-two" in text(r), text(r)
        r = await s.call_tool("test_elicitation", {"message": "who are you?"})
        assert not r.is_error and "ann@example.com" in text(r), text(r)
    assert asked == [("sampling", "the answer?"), ("elicitation", "who are you?")]


async def test_an_agent_that_cannot_answer_makes_the_upstreams_request_fail(workdir):
    async with stdio_session(policy(workdir)) as s:  # no sampling capability declared
        r = await s.call_tool("test_sampling", {"prompt": "the answer?"})
        assert r.is_error or "LLM response" not in text(r), text(r)


async def test_log_messages_are_relayed_at_the_level_the_agent_set(workdir):
    got = []

    async def logged(params):
        got.append((params.level, params.data))

    async with stdio_session(policy(workdir), logging_callback=logged) as s:
        await s.set_logging_level("warning")
        await s.call_tool("test_tool_with_logging", {})
        await anyio.sleep(0.3)
        assert got == [], "info messages are below the level the agent set"
        await s.set_logging_level("info")
        await s.call_tool("test_tool_with_logging", {})
        await anyio.sleep(0.3)
    assert [d for _, d in got] == ["Tool execution started", "Tool processing data", "Tool execution completed"]


async def test_a_subscribed_session_hears_of_updates_until_it_unsubscribes(workdir):
    updates = []

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/resources/updated":
            updates.append(str(message.params.uri))

    async with stdio_session(policy(workdir), message_handler=on_message) as s:
        await s.subscribe_resource("test://watched-resource")
        r = await s.call_tool("test_touch_watched", {})
        assert "1 subscription" in text(r), text(r)
        for _ in range(30):
            if updates:
                break
            await anyio.sleep(0.1)
        assert updates == ["test://watched-resource"]
        await s.unsubscribe_resource("test://watched-resource")
        r = await s.call_tool("test_touch_watched", {})
        assert "0 subscription" in text(r), "the last session's unsubscribe reached the upstream"
        assert updates == ["test://watched-resource"], "nothing after the unsubscribe"
