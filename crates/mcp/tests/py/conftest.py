"""Helpers of the gateway's protocol tests: a real `tidegate-mcp` started over stdio or
Streamable HTTP with a policy written per test, and the official SDK's client session."""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

HERE = Path(__file__).resolve().parent
BIN = os.environ.get("TIDEGATE_MCP_BIN") or str(HERE.parents[3] / "target" / "debug" / "tidegate-mcp")
NPM = Path(os.environ.get("TIDEGATE_MCP_NPM") or HERE.parent / "npm" / "node_modules" / ".bin")


def toml_str(s) -> str:
    return json.dumps(str(s))


def memory_upstream(mem_file: Path) -> str:
    return (
        "[upstreams.memory]\n"
        f"command = {toml_str(NPM / 'mcp-server-memory')}\n"
        f"env = {{ MEMORY_FILE_PATH = {toml_str(mem_file)} }}\n"
    )


def log_upstream(log_file: Path) -> str:
    return (
        "[upstreams.log]\n"
        f"command = {toml_str(sys.executable)}\n"
        f"args = [{toml_str(HERE / 'log_upstream.py')}]\n"
        f"env = {{ LOG_UPSTREAM_FILE = {toml_str(log_file)} }}\n"
    )


MEMORY_RULES = """
[[tools]]
upstream = "memory"
match = "create_entities"
class = "reversible"
scopes = ["kg:entity:{args.entities[*].name}"]
compensate = { tool = "delete_entities", args = { entityNames = "{result.entities[*].name}" } }

[[tools]]
upstream = "memory"
match = "add_observations"
class = "gated"
scopes = ["kg:entity:{args.observations[*].entityName}"]

[[tools]]
upstream = "memory"
match = "open_nodes"
class = "read"
scopes = ["kg:entity:{args.names[*]}"]

[[tools]]
upstream = "memory"
match = "read_graph"
class = "read"
scopes = ["kg:entity"]
"""


def read_memory(mem_file: Path) -> dict:
    """The knowledge graph as server-memory stored it (its own JSON-lines file)."""
    entities = {}
    if mem_file.exists():
        for line in mem_file.read_text().splitlines():
            if line.strip():
                item = json.loads(line)
                if item.get("type") == "entity":
                    entities[item["name"]] = item["observations"]
    return entities


def read_log(log_file: Path) -> list:
    if not log_file.exists():
        return []
    return [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]


def text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


def write_policy(dir: Path, body: str, store: str | None = None, call_timeout_ms: int = 10000) -> Path:
    store = store or f"sqlite:{dir / 'ledger'}"
    p = dir / "policy.toml"
    p.write_text(
        f'version = "test"\n[gateway]\nstore = {toml_str(store)}\ncall_timeout_ms = {call_timeout_ms}\n\n' + body
    )
    return p


async def wait_for(pred, seconds):
    """Polls `pred` every 0.1 s for up to `seconds`; its last answer."""
    import anyio

    for _ in range(int(seconds * 10)):
        if pred():
            return True
        await anyio.sleep(0.1)
    return pred()


def put_hold_and_kill(policy: Path, env: dict | None = None) -> None:
    """A gateway over raw stdio runs a `put` and holds a `send` in one turn, then dies without a
    word (SIGKILL of its process group: its upstreams too)."""
    import signal

    proc = subprocess.Popen([BIN, "serve", "--policy", str(policy)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **(env or {})})

    def rpc(i, method, params=None):
        msg = {"jsonrpc": "2.0", "id": i, "method": method}
        if params is not None:
            msg["params"] = params
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    rpc(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    assert "result" in rpc(2, "tools/call", {"name": "put", "arguments": {"key": "a", "value": "1"}})
    assert "queued" in json.dumps(rpc(3, "tools/call", {"name": "send", "arguments": {"to": "x", "text": "never"}}))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.asynccontextmanager
async def stdio_session(policy: Path, env: dict | None = None, **session_kwargs):
    # The SDK passes the child only a few variables of its own environment; `env` adds more.
    if env is not None:
        from mcp.client.stdio import get_default_environment

        env = {**get_default_environment(), **env}
    params = StdioServerParameters(command=BIN, args=["serve", "--policy", str(policy)], env=env)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, **session_kwargs) as s:
            await s.initialize()
            yield s


class HttpGateway:
    """`tidegate-mcp serve --http 127.0.0.1:0` in the background."""

    def __init__(self, policy: Path, env: dict | None = None):
        self.proc = subprocess.Popen(
            [BIN, "serve", "--policy", str(policy), "--http", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.time() + 30
        self.url = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"serving (http://\S+/mcp)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.proc.kill()
            raise RuntimeError(f"tidegate-mcp did not start: {self.proc.stderr.read()}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextlib.asynccontextmanager
async def http_session(url: str):
    async with streamable_http_client(url) as streams:
        r, w = streams[0], streams[1]
        async with ClientSession(r, w) as s:
            await s.initialize()
            yield s


@pytest.fixture
def anyio_backend():
    return "asyncio"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpLogUpstream:
    """log_upstream.py over Streamable HTTP on 127.0.0.1, started for one test."""

    def __init__(self, log_file: Path):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "log_upstream.py"), "--http", str(self.port)],
            env={**os.environ, "LOG_UPSTREAM_FILE": str(log_file)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import socket

        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.1)
        else:
            self.proc.kill()
            raise RuntimeError("log_upstream.py --http did not start")
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def policy(self) -> str:
        return f"[upstreams.log]\nurl = {toml_str(self.url)}\n"

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)
