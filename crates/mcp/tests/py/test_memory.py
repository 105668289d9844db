"""The gateway in front of @modelcontextprotocol/server-memory (npm), driven by the official
Python SDK. Ground truth: the knowledge graph server-memory keeps in its own file."""

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import (
    MEMORY_RULES,
    HttpGateway,
    http_session,
    memory_upstream,
    read_memory,
    stdio_session,
    text,
    write_policy,
)

pytestmark = pytest.mark.anyio


def ann(name="Ann", obs="first"):
    return {"entities": [{"name": name, "entityType": "person", "observations": [obs]}]}


def observe(name, what):
    return {"observations": [{"entityName": name, "contents": [what]}]}


async def test_a_held_call_runs_only_when_the_turn_commits(workdir):
    mem = workdir / "memory.jsonl"
    policy = write_policy(workdir, memory_upstream(mem) + MEMORY_RULES)
    async with stdio_session(policy) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert {"tidegate_commit", "tidegate_abort", "tidegate_status"} <= set(tools)
        assert "held until the turn commits" in tools["add_observations"].description
        assert "undone by `delete_entities`" in tools["create_entities"].description

        r = await s.call_tool("create_entities", ann())
        assert not r.is_error and r.structured_content["entities"][0]["name"] == "Ann"
        assert read_memory(mem) == {"Ann": ["first"]}, "a reversible call runs at once"

        r = await s.call_tool("add_observations", observe("Ann", "likes tea"))
        assert not r.is_error and text(r).startswith("queued")
        assert read_memory(mem) == {"Ann": ["first"]}, "a held call must not run before commit"

        r = await s.call_tool("tidegate_commit", {})
        assert not r.is_error, text(r)
        assert r.structured_content["committed"] is True
        assert read_memory(mem) == {"Ann": ["first", "likes tea"]}
        assert "likes tea" in text(r), "the commit reports what the released call answered"


async def test_an_abort_undoes_what_ran_and_never_runs_what_was_held(workdir):
    mem = workdir / "memory.jsonl"
    policy = write_policy(workdir, memory_upstream(mem) + MEMORY_RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("create_entities", ann("Keep"))
        await s.call_tool("tidegate_commit", {})
        for name in ("Ann", "Bob"):
            r = await s.call_tool("create_entities", ann(name))
            assert not r.is_error
        await s.call_tool("add_observations", observe("Keep", "never"))
        assert set(read_memory(mem)) == {"Keep", "Ann", "Bob"}

        r = await s.call_tool("tidegate_abort", {"reason": "the user changed their mind"})
        assert not r.is_error
        out = r.structured_content
        assert out["committed"] is False
        assert [e["disposition"] for e in out["effects"]] == ["compensated", "compensated", "discarded"]
        assert all(e["tag"] == "clean" for e in out["effects"])
        assert read_memory(mem) == {"Keep": ["first"]}, "both creates undone, the held call never ran"

        r = await s.call_tool("tidegate_status", {})
        assert "no turn is open" in text(r)


async def test_a_session_that_goes_away_mid_turn_is_aborted(workdir):
    mem = workdir / "memory.jsonl"
    policy = write_policy(workdir, memory_upstream(mem) + MEMORY_RULES)
    async with stdio_session(policy) as s:
        await s.call_tool("create_entities", ann("Gone"))
        await s.call_tool("add_observations", observe("Gone", "held"))
        assert read_memory(mem) == {"Gone": ["first"]}
        # Leave without committing: the SDK closes the gateway's stdin.
    for _ in range(100):
        if read_memory(mem) == {}:
            break
        await anyio.sleep(0.1)
    assert read_memory(mem) == {}, "the executed call is compensated, the held one never fires"


async def test_refused_and_unknown_tools(workdir):
    mem = workdir / "memory.jsonl"
    policy = write_policy(workdir, memory_upstream(mem) + MEMORY_RULES)
    async with stdio_session(policy) as s:
        r = await s.call_tool("delete_entities", {"entityNames": ["x"]})
        assert r.is_error and "not declared" in text(r) and "policy.toml" in text(r)
        with pytest.raises(MCPError):
            await s.call_tool("no_such_tool", {})
        # A scope template over an argument the call left out: a tool error, nothing called.
        r = await s.call_tool("add_observations", {"observations": [{"contents": ["x"]}]})
        assert r.is_error and "entityName" in text(r) and "nothing was called" in text(r)
        r = await s.call_tool("tidegate_status", {})
        assert "no turn is open" in text(r), "a call refused before it was recorded begins no turn"


async def test_two_agents_racing_on_one_entity_never_lose_an_update(workdir):
    mem = workdir / "memory.jsonl"
    policy = write_policy(workdir, memory_upstream(mem) + MEMORY_RULES)
    gw = HttpGateway(policy)
    try:
        async with http_session(gw.url) as setup:
            await setup.call_tool("create_entities", ann("Ann", "v0"))
            assert not (await setup.call_tool("tidegate_commit", {})).is_error
        async with http_session(gw.url) as a, http_session(gw.url) as b:
            # Both read Ann, both decide to add to her.
            for s in (a, b):
                r = await s.call_tool("open_nodes", {"names": ["Ann"]})
                assert not r.is_error and "v0" in text(r)
            await a.call_tool("add_observations", observe("Ann", "from a"))
            await b.call_tool("add_observations", observe("Ann", "from b"))
            ra = await a.call_tool("tidegate_commit", {})
            assert not ra.is_error, text(ra)
            rb = await b.call_tool("tidegate_commit", {})
            assert rb.is_error, "b read Ann before a changed her: its commit must not stand"
            assert "stale read" in text(rb) and "read it again and retry" in text(rb)
            assert read_memory(mem) == {"Ann": ["v0", "from a"]}, "b's held call never ran"
            # b does what the message says.
            r = await b.call_tool("open_nodes", {"names": ["Ann"]})
            assert "from a" in text(r)
            await b.call_tool("add_observations", observe("Ann", "from b"))
            rb = await b.call_tool("tidegate_commit", {})
            assert not rb.is_error, text(rb)
        assert read_memory(mem) == {"Ann": ["v0", "from a", "from b"]}
    finally:
        gw.stop()
