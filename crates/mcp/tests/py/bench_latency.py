"""The gateway's added latency per proxied call over stdio, against calling the same upstream
directly, in one run (issue 30's benchmark; not a test).

    .venv/mcp/bin/python crates/mcp/tests/py/bench_latency.py --bin target/release/tidegate-mcp [--calls 2000] [--clients 16]
        [--store sqlite|memory|attached [--server-bin target/release/tidegate] [--server-data DIR]]

Both paths use the official Python SDK as the client and log_upstream.py as the upstream, so
the difference is what the gateway adds: one more stdio hop, the engine's record of the call
(durable on the default SQLite store) and the turn bookkeeping. Reported: p50 and p99 of
`put` (a reversible call, recorded before it runs; a commit every 10 calls), and
calls/s through the gateway with N concurrent clients (each its own session and turn).
`--store attached` puts the turns on a `tidegate serve` started here (in memory, or on the
durable store under `--server-data`): each call is then two HTTP requests to it (the effect,
then its result).
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import conftest  # noqa: E402
from conftest import HttpGateway, http_session, log_upstream, toml_str  # noqa: E402

RULES = """
[[tools]]
upstream = "log"
match = "put"
class = "reversible"
scopes = ["kv:{args.key}"]
compensate = { tool = "unput", args = { key = "{args.key}" } }
"""


STARTED = []  # servers to stop however the run ends


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def timed_calls(params, n, commit_every):
    lat = []
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for i in range(n):
                t = time.perf_counter()
                res = await s.call_tool("put", {"key": f"k{i % 50}", "value": "v"})
                lat.append(time.perf_counter() - t)
                assert not res.is_error, res
                if commit_every and i % commit_every == commit_every - 1:
                    await s.call_tool("tidegate_commit", {})
    return lat


async def http_calls(url, n, commit_every, prefix):
    async with http_session(url) as s:
        for i in range(n):
            res = await s.call_tool("put", {"key": f"{prefix}{i % 50}", "value": "v"})
            assert not res.is_error, res
            if i % commit_every == commit_every - 1:
                await s.call_tool("tidegate_commit", {})


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--store", default="sqlite",
                    help="the gateway's ledger: sqlite (durable, the default), memory, or attached (a tidegate serve)")
    ap.add_argument("--server-bin", default=None, help="with --store attached: the tidegate binary")
    ap.add_argument("--server-data", default=None, help="with --store attached: the server's data dir (durable)")
    a = ap.parse_args()
    server = None
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        log = d / "log.jsonl"
        policy = d / "policy.toml"
        env = {}
        if a.store == "attached":
            import test_attached

            if a.server_bin:
                test_attached.TIDEGATE = a.server_bin
            server = test_attached.TidegateServer(Path(a.server_data) if a.server_data else None)
            STARTED.append(server)
            env = {"TIDEGATE_API_KEY": server.key}
            gateway = f"[gateway]\nserver = {toml_str(server.url)}\n"
        else:
            store = "memory:" if a.store == "memory" else "sqlite:" + str(d / "ledger")
            gateway = f"[gateway]\nstore = {toml_str(store)}\n"
        policy.write_text(gateway + log_upstream(log) + RULES)
        direct = StdioServerParameters(command=sys.executable, args=[str(HERE / "log_upstream.py")],
                                       env={"LOG_UPSTREAM_FILE": str(log)})
        from mcp.client.stdio import get_default_environment

        via = StdioServerParameters(command=a.bin, args=["serve", "--policy", str(policy)],
                                    env={**get_default_environment(), **env})
        await timed_calls(direct, 50, 0)  # warm-up
        await timed_calls(via, 50, 10)
        d_lat = await timed_calls(direct, a.calls, 0)
        g_lat = await timed_calls(via, a.calls, 10)
        # N clients: one gateway over Streamable HTTP, one session (and turn) per client, on
        # disjoint keys; a commit every 10 calls.
        conftest.BIN = a.bin
        gw = HttpGateway(policy, env=env)
        try:
            per = max(10, a.calls // a.clients)
            t = time.perf_counter()
            await asyncio.gather(*[http_calls(gw.url, per, 10, f"c{c}-") for c in range(a.clients)])
            wall = time.perf_counter() - t
        finally:
            gw.stop()
        out = {
            "calls": a.calls,
            "store": a.store,
            "direct_p50_ms": statistics.median(d_lat) * 1e3,
            "direct_p99_ms": pct(d_lat, 99) * 1e3,
            "gateway_p50_ms": statistics.median(g_lat) * 1e3,
            "gateway_p99_ms": pct(g_lat, 99) * 1e3,
            "added_p50_ms": (statistics.median(g_lat) - statistics.median(d_lat)) * 1e3,
            "added_p99_ms": (pct(g_lat, 99) - pct(d_lat, 99)) * 1e3,
            "clients": a.clients,
            "calls_per_s_http_clients": per * a.clients / wall,
        }
        print(json.dumps(out, indent=1))


try:
    asyncio.run(main())
finally:
    for s in STARTED:
        s.stop()
