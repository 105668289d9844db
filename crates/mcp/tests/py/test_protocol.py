"""Hostile input on the gateway's stdio, byte by byte: what a broken or hostile client sends
must get a protocol error or a tool error, never a crash, and the session goes on."""

import json
import select
import subprocess

from conftest import BIN, MEMORY_RULES, memory_upstream, write_policy


class Raw:
    def __init__(self, policy):
        self.p = subprocess.Popen(
            [BIN, "serve", "--policy", str(policy)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def send(self, data: bytes):
        self.p.stdin.write(data + b"\n")
        self.p.stdin.flush()

    def recv(self, timeout=10):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "no answer"
        return json.loads(self.p.stdout.readline())

    def request(self, id, method, params=None):
        msg = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(json.dumps(msg).encode())
        return self.recv()


def test_malformed_and_oversized_messages_get_protocol_errors(workdir):
    policy = write_policy(workdir, memory_upstream(workdir / "m.jsonl") + MEMORY_RULES)
    raw = Raw(policy)
    try:
        init = raw.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                             "clientInfo": {"name": "raw", "version": "0"}})
        assert init["result"]["protocolVersion"] == "2025-06-18", "an older revision is still served"
        raw.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

        raw.send(b"{this is not json")
        assert raw.recv()["error"]["code"] == -32700

        raw.send(b'{"jsonrpc":"2.0","id":9,"method":17}')
        e = raw.recv()
        assert (e["id"], e["error"]["code"]) == (9, -32600)

        raw.send(b'{"jsonrpc":"2.0","id":10,"method":"x","params":"' + b"a" * (5 << 20) + b'"}')
        e = raw.recv()
        assert e["error"]["code"] == -32600 and "at most" in e["error"]["message"]

        assert raw.request(11, "no/such/method")["error"]["code"] == -32601

        big = {"name": "create_entities", "arguments": {"entities": [{"name": "x" * (2 << 20), "entityType": "p",
                                                                     "observations": []}]}}
        r = raw.request(12, "tools/call", big)
        assert r["result"]["isError"] is True and "at most" in r["result"]["content"][0]["text"]

        r = raw.request(13, "tools/call", {"name": "create_entities", "arguments": {"entities": "not a list"}})
        assert r["result"]["isError"] is True and "nothing was called" in r["result"]["content"][0]["text"]

        assert raw.request(14, "ping") == {"jsonrpc": "2.0", "id": 14, "result": {}}
        assert raw.p.poll() is None
    finally:
        raw.p.stdin.close()
        assert raw.p.wait(timeout=20) == 0
