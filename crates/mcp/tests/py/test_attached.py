"""Attached mode: the gateway's turns live on a real `tidegate serve` (its ledger, its console,
its attention queue). Held releases, compensations and probes reach the gateway as the
server's worker tasks; the suite's upstream's own log is the ground truth of what ran, and the
server's API says what it recorded."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import (
    BIN,
    HERE,
    HttpGateway,
    http_session,
    log_upstream,
    put_hold_and_kill,
    read_log,
    stdio_session,
    text,
    toml_str,
    wait_for,
)
from test_log_upstream import RULES

pytestmark = pytest.mark.anyio

TIDEGATE = os.environ.get("TIDEGATE_BIN") or str(HERE.parents[3] / "target" / "debug" / "tidegate")


class TidegateServer:
    """`tidegate serve` on a free loopback port with a bootstrap tenant's admin key."""

    def __init__(self, data_dir: Path | None = None, listen: str = "127.0.0.1:0", key: str | None = None):
        if not os.path.exists(TIDEGATE):
            pytest.skip(f"no tidegate binary at {TIDEGATE} (scripts/mcp-test.sh builds it; or set TIDEGATE_BIN)")
        store = ["--data-dir", str(data_dir)] if data_dir else ["--memory"]
        self.proc = subprocess.Popen(
            [TIDEGATE, "serve", *store, "--listen", listen, "--bootstrap-tenant", "mcp"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        self.key, self.url = key, None
        for line in self.proc.stdout:
            if line.startswith("tenant=mcp role=admin key="):
                self.key = line.split("key=", 1)[1].strip()
            elif line.startswith("listening on "):
                self.url = "http://" + line.split("listening on ", 1)[1].strip()
                break
        assert self.key and self.url, "tidegate serve did not print its key and address"

    def get(self, path: str):
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.key}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def transactions(self, state: str = "settled") -> list:
        return self.get(f"/v1/transactions?state={state}&limit=200")["data"]

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def server():
    s = TidegateServer()
    yield s
    s.stop()


def attached_policy(workdir: Path, server: TidegateServer, body: str, extra: str = "") -> Path:
    p = workdir / "policy.toml"
    p.write_text(
        f'version = "test"\n[gateway]\nserver = {toml_str(server.url)}\ncall_timeout_ms = 5000\n{extra}\n' + body
    )
    return p


def key_env(server: TidegateServer) -> dict:
    return {"TIDEGATE_API_KEY": server.key}



def effects(tx: dict) -> list:
    return [(e["tool"], e["disposition"], e["tag"]) for e in tx["effects"]]


async def test_a_committed_turn_is_in_the_servers_ledger_and_its_held_call_ran_once(workdir, server):
    log = workdir / "log.jsonl"
    policy = attached_policy(workdir, server, log_upstream(log) + RULES)
    async with stdio_session(policy, env=key_env(server)) as s:
        assert not (await s.call_tool("put", {"key": "a", "value": "1"})).is_error
        r = await s.call_tool("send", {"to": "ops", "text": "hello"})
        assert "queued" in text(r)
        assert [e["op"] for e in read_log(log)] == ["put"], "the held send waits for the commit"
        # While the turn is open the server shows it, with both effects.
        (open_tx,) = server.transactions("unfinished")
        assert [e["tool"] for e in open_tx["effects"]] == ["mcp.log.put", "mcp.log.send"]
        assert open_tx["effects"][0]["args"]["arguments"] == {"key": "a", "value": "1"}
        r = await s.call_tool("tidegate_commit", {})
        assert not r.is_error, text(r)
        assert "send ran" in text(r), text(r)
        assert r.structured_content["committed"] is True
    assert [(e["op"], e.get("key") or e.get("to")) for e in read_log(log)] == [("put", "a"), ("send", "ops")]
    (tx,) = server.transactions()
    assert tx["state"] == "committed"
    assert effects(tx) == [("mcp.log.put", "accepted", "clean"), ("mcp.log.send", "fired", "clean")]
    # The tools and the worker capability the gateway registered.
    tool = server.get("/v1/tools/mcp.log.put")
    assert tool["definition"]["compensate"] == "mcp.log" and tool["definition"]["call"] == "mcp.log"
    assert server.get("/v1/capabilities/mcp.log")["spec"]["kind"] == "worker"


async def test_an_aborted_turn_is_compensated_through_the_servers_tasks(workdir, server):
    log = workdir / "log.jsonl"
    policy = attached_policy(workdir, server, log_upstream(log) + RULES)
    async with stdio_session(policy, env=key_env(server)) as s:
        for k in ("a", "b"):
            assert not (await s.call_tool("put", {"key": k, "value": k})).is_error
        await s.call_tool("send", {"to": "ops", "text": "never"})
        r = await s.call_tool("tidegate_abort", {"reason": "the user changed their mind"})
        assert not r.is_error, text(r)
        assert "Undone: mcp.log.put, mcp.log.put" in text(r) and "Never run: mcp.log.send" in text(r), text(r)
    ops = [(e["op"], e.get("key")) for e in read_log(log)]
    assert ops == [("put", "a"), ("put", "b"), ("unput", "b"), ("unput", "a")]
    (tx,) = server.transactions()
    assert tx["state"] == "aborted" and tx["outcome"]["reason"]["kind"] == "explicit"
    assert effects(tx) == [
        ("mcp.log.put", "compensated", "clean"),
        ("mcp.log.put", "compensated", "clean"),
        ("mcp.log.send", "discarded", "clean"),
    ]


async def test_a_failing_call_aborts_the_turn_on_the_server(workdir, server):
    log = workdir / "log.jsonl"
    policy = attached_policy(workdir, server, log_upstream(log) + RULES)
    async with stdio_session(policy, env=key_env(server)) as s:
        await s.call_tool("put", {"key": "a", "value": "1"})
        r = await s.call_tool("fail", {"key": "z"})
        assert r.is_error and "this turn was aborted" in text(r) and "Undone: mcp.log.put" in text(r), text(r)
        # The next call begins a new turn, which commits.
        await s.call_tool("put", {"key": "b", "value": "2"})
        assert not (await s.call_tool("tidegate_commit", {})).is_error
    assert [(e["op"], e.get("key")) for e in read_log(log)] == [("put", "a"), ("unput", "a"), ("put", "b")]
    states = sorted(t["state"] for t in server.transactions())
    assert states == ["aborted", "committed"]


async def test_two_attached_sessions_racing_on_one_key_never_lose_an_update(workdir, server):
    log = workdir / "log.jsonl"
    rules = RULES + '\n[[tools]]\nupstream = "log"\nmatch = "get"\nclass = "read"\nscopes = ["kv:{args.key}"]\n'
    gw = HttpGateway(attached_policy(workdir, server, log_upstream(log) + rules), env=key_env(server))
    try:
        async with http_session(gw.url) as a, http_session(gw.url) as b:
            for s in (a, b):
                assert not (await s.call_tool("get", {"key": "k"})).is_error
            await a.call_tool("put", {"key": "k", "value": "from a"})
            ra = await a.call_tool("tidegate_commit", {})
            assert not ra.is_error, text(ra)
            await b.call_tool("send", {"to": "k-owner", "text": "k is mine"})
            rb = await b.call_tool("tidegate_commit", {})
            assert rb.is_error, "b read k before a changed it: its commit must not stand"
            assert "stale read" in text(rb) and "read it again and retry" in text(rb), text(rb)
    finally:
        gw.stop()
    assert [e["op"] for e in read_log(log)] == ["put"], "b's held send never ran"
    kinds = sorted((t["state"], (t["outcome"].get("reason") or {}).get("kind")) for t in server.transactions())
    assert kinds == [("aborted", "stale_read"), ("committed", None)]


async def test_a_gateway_killed_mid_turn_is_settled_by_the_server_through_the_next_gateway(workdir, server):
    log = workdir / "log.jsonl"
    policy = attached_policy(workdir, server, "[turn]\nidle_ms = 100\n" + log_upstream(log) + RULES)
    put_hold_and_kill(policy, key_env(server))
    assert [e["op"] for e in read_log(log)] == ["put"]
    assert len(server.transactions("unfinished")) == 1

    # The server aborts the turn when its lease ends (idle 100 ms + call 5 s + 5 s) and queues
    # the compensation as a task of `mcp.log`: the next gateway of that name runs it.
    gw = HttpGateway(policy, env=key_env(server))
    try:
        assert await wait_for(lambda: [e["op"] for e in read_log(log)] == ["put", "unput"], 40), read_log(log)
        assert await wait_for(lambda: len(server.transactions()) == 1, 10)
    finally:
        gw.stop()
    (tx,) = server.transactions()
    assert tx["state"] == "aborted" and tx["outcome"]["reason"]["kind"] == "lease_expired", tx["outcome"]
    assert effects(tx) == [("mcp.log.put", "compensated", "clean"), ("mcp.log.send", "discarded", "clean")]


async def test_a_compensation_that_fails_is_in_the_servers_attention_queue(workdir, server):
    log = workdir / "log.jsonl"
    rules = """
[[tools]]
upstream = "log"
match = "put"
class = "reversible"
scopes = ["kv:{args.key}"]
compensate = { tool = "fail", args = { key = "{args.key}" } }
"""
    policy = attached_policy(workdir, server, log_upstream(log) + rules)
    async with stdio_session(policy, env=key_env(server)) as s:
        await s.call_tool("put", {"key": "a", "value": "1"})
        r = await s.call_tool("tidegate_abort", {})
        assert "needs attention" in text(r) and "unresolved" in text(r), text(r)
    attention = server.get("/v1/ledger/attention")["data"]
    assert [(a["effect"]["tool"], a["tag"]) for a in attention] == [("mcp.log.put", "unresolved")], attention


async def test_a_server_that_dies_mid_turn_is_a_tool_error_and_settles_the_turn_when_back(workdir):
    from conftest import free_port

    log = workdir / "log.jsonl"
    listen = f"127.0.0.1:{free_port()}"
    server = TidegateServer(workdir / "data", listen)
    try:
        # The gateway asks a silent server again for 3 s (default 120 s) before giving up.
        policy = attached_policy(workdir, server, "[turn]\nidle_ms = 3000\n" + log_upstream(log) + RULES,
                                 extra="server_patience_ms = 3000")
        async with stdio_session(policy, env=key_env(server)) as s:
            assert not (await s.call_tool("put", {"key": "a", "value": "1"})).is_error
            await s.call_tool("send", {"to": "x", "text": "never"})
            server.kill()
            started = time.monotonic()
            r = await s.call_tool("put", {"key": "b", "value": "2"})
            assert time.monotonic() - started < 60, "the gateway kept asking past gateway.server_patience_ms"
            assert r.is_error and "did not answer" in text(r) and "when its lease ends" in text(r), text(r)
            assert [e["op"] for e in read_log(log)] == ["put"], "nothing ran without a record"
            # Back on the same data: the turn's lease ends, the server aborts it and queues the
            # compensation, and this gateway's worker (polling again) runs it.
            server = TidegateServer(workdir / "data", listen, key=server.key)
            assert await wait_for(lambda: [e["op"] for e in read_log(log)] == ["put", "unput"], 40), read_log(log)
            # The session goes on with a new turn.
            assert not (await s.call_tool("put", {"key": "c", "value": "3"})).is_error
            assert not (await s.call_tool("tidegate_commit", {})).is_error
        assert [e["op"] for e in read_log(log)] == ["put", "unput", "put"], "the held send never ran"
        states = sorted((t["state"], (t["outcome"].get("reason") or {}).get("kind")) for t in server.transactions())
        assert states == [("aborted", "lease_expired"), ("committed", None)], states
    finally:
        server.stop()


def start_error(policy: Path, env: dict) -> str:
    r = subprocess.run([BIN, "serve", "--policy", str(policy)], input="", capture_output=True, text=True,
                       timeout=60, env={**os.environ, **env})
    assert r.returncode != 0
    return r.stderr


def test_an_attached_gateway_refuses_to_start_without_a_working_server_or_key(workdir, server):
    log = workdir / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TIDEGATE_API_KEY"}
    policy = attached_policy(workdir, server, log_upstream(log) + RULES)
    err = subprocess.run([BIN, "serve", "--policy", str(policy)], input="", capture_output=True, text=True,
                         timeout=60, env=env).stderr
    assert "TIDEGATE_API_KEY" in err and "is not set" in err, err
    assert "401" in start_error(policy, {"TIDEGATE_API_KEY": "tg_not_a_key"})
    # Both a server and a store: the policy names the line and the key.
    both = workdir / "both.toml"
    both.write_text(f'[gateway]\nserver = {toml_str(server.url)}\nstore = "memory:"\n' + log_upstream(log))
    err = start_error(both, key_env(server))
    assert re.search(r"both\.toml:3.*gateway\.store", err), err
    bad = workdir / "bad.toml"
    bad.write_text('[gateway]\nserver = "https://tidegate.example"\n' + log_upstream(log))
    err = start_error(bad, key_env(server))
    assert re.search(r"bad\.toml:2.*gateway\.server.*http://HOST:PORT", err), err
    assert not read_log(log), "no upstream call was made"


async def test_a_release_cut_off_by_a_dead_gateway_is_never_run_again(workdir, server):
    """A gateway dies while the server's release task of a held call runs: the lease ends, the
    next gateway is offered the task again (attempt 2) and reports its outcome unknown instead
    of calling the upstream a second time."""
    import subprocess as sp

    log = workdir / "log.jsonl"
    rules = RULES + '\n[[tools]]\nupstream = "log"\nmatch = "slow"\nclass = "gated"\nscopes = ["kv:{args.key}"]\n'
    p = workdir / "policy.toml"
    p.write_text(f'version = "test"\n[gateway]\nserver = {toml_str(server.url)}\ncall_timeout_ms = 2000\n\n'
                 + log_upstream(log) + rules)
    a = sp.Popen([BIN, "serve", "--policy", str(p)], stdin=sp.PIPE, stdout=sp.PIPE, stderr=sp.DEVNULL,
                 start_new_session=True, env={**os.environ, **key_env(server)})

    def send(msg):
        a.stdin.write((json.dumps(msg) + "\n").encode())
        a.stdin.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    a.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "slow", "arguments": {"key": "k", "value": "once", "seconds": 60}}})
    assert b"queued" in a.stdout.readline()
    send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "tidegate_commit", "arguments": {}}})
    # The release reached the upstream (it logs at once, then sleeps): kill the gateway then.
    assert await wait_for(lambda: [e["op"] for e in read_log(log)] == ["put"], 20), read_log(log)
    os.killpg(a.pid, signal.SIGKILL)
    a.wait()

    gw = HttpGateway(p, env=key_env(server))
    try:
        # The task's lease (call 2 s + 10 s) ends; the new gateway is offered it and settles it.
        assert await wait_for(lambda: len(server.transactions()) == 1, 40), server.transactions("unfinished")
    finally:
        gw.stop()
    assert [e["op"] for e in read_log(log)] == ["put"], "the held call reached the upstream once"
    (tx,) = server.transactions()
    (effect,) = tx["effects"]
    assert effect["tag"] != "clean" or effect["disposition"] != "fired", effect
