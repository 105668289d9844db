"""An upstream MCP server written for the gateway's tests (stdio, or Streamable HTTP with
`--http PORT`), built on the official SDK.

Its append-only log (the file named by LOG_UPSTREAM_FILE, one JSON object per line) is the
ground truth of what reached it: every tool call appends a line *before* it answers.

Tools: put(key, value) and unput(key) (a reversible pair), get(key) (a probe), slow(key,
value, seconds) (stores at once, answers late: a call whose outcome the gateway does not
learn in time), grow(name) (adds a tool at run time and says so), send(to, text) (for a gated
tool),
fail(key) (answers a tool error, having done nothing), die(key) (logs that it started, then
the process exits without answering: an upstream that dies mid-call).
"""

import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LOG = os.environ["LOG_UPSTREAM_FILE"]
server = MCPServer("log-upstream")


def log(**entry) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


@server.tool()
def put(key: str, value: str) -> dict:
    """Stores value under key."""
    log(op="put", key=key, value=value)
    return {"key": key, "stored": value}


@server.tool()
def unput(key: str) -> dict:
    """Removes key."""
    log(op="unput", key=key)
    return {"key": key, "removed": True}


@server.tool()
def send(to: str, text: str) -> dict:
    """Sends a message (irreversible)."""
    log(op="send", to=to, text=text)
    return {"sent": True, "to": to}


@server.tool()
def get(key: str) -> dict:
    """The value under key (from the log: the last put not undone), or null."""
    value = None
    try:
        with open(LOG, encoding="utf-8") as f:
            for line in f:
                e = json.loads(line)
                if e.get("key") == key and e["op"] == "put":
                    value = e["value"]
                elif e.get("key") == key and e["op"] == "unput":
                    value = None
    except FileNotFoundError:
        pass
    return {"key": key, "value": value}


@server.tool()
async def slow(key: str, value: str, seconds: float) -> dict:
    """Stores value under key at once, then answers only after `seconds`."""
    import anyio

    log(op="put", key=key, value=value)
    await anyio.sleep(seconds)
    return {"key": key, "stored": value}


@server.tool()
async def wait(key: str, seconds: float) -> dict:
    """Reads nothing, waits `seconds`; logs its start, its end, or its cancellation."""
    import anyio

    log(op="wait", key=key)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        log(op="wait-cancelled", key=key)
        raise
    log(op="wait-done", key=key)
    return {"key": key}


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool `name` (it stores like put) and says the tool list changed."""

    def added(key: str, value: str) -> dict:
        log(op=name, key=key, value=value)
        return {"key": key}

    server.add_tool(added, name=name, description=f"{name}: added at run time")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
def fail(key: str) -> str:
    """Always fails, having done nothing."""
    raise ToolError(f"refusing {key}")


@server.tool()
def die(key: str) -> str:
    """Starts, then the process dies before answering."""
    log(op="die", key=key)
    sys.stdout.flush()
    os._exit(3)


if __name__ == "__main__":
    # `--http PORT`: Streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio.
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
