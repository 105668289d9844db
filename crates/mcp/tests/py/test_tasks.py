"""The tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`): a client that declares it
gets a held call as a task it can poll (`tasks/get`), working until the turn ends, then
completed with the call's answer (the turn committed) or with a tool error saying it never ran
(the turn aborted). A client that does not declare it gets the plain "queued" text. The
Python SDK has no client side for the extension, so this drives the protocol by hand."""

from conftest import log_upstream, read_log, write_policy
from test_log_upstream import RULES
from test_protocol import Raw

TASKS = "io.modelcontextprotocol/tasks"


def call(raw, id, name, arguments):
    return raw.request(id, "tools/call", {"name": name, "arguments": arguments})


def test_a_held_call_is_a_task_until_its_turn_ends(workdir):
    log = workdir / "log.jsonl"
    raw = Raw(write_policy(workdir, log_upstream(log) + RULES))
    try:
        init = raw.request(1, "initialize", {"protocolVersion": "2025-11-25",
                                             "capabilities": {"extensions": {TASKS: {}}},
                                             "clientInfo": {"name": "raw", "version": "0"}})
        assert TASKS in init["result"]["capabilities"]["extensions"]
        raw.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

        held = call(raw, 2, "send", {"to": "ops", "text": "hello"})["result"]
        assert held["resultType"] == "task" and held["status"] == "working", held
        task = held["taskId"]
        got = raw.request(3, "tasks/get", {"taskId": task})["result"]
        assert got["status"] == "working" and "runs when this turn commits" in got["statusMessage"], got
        # A held call cannot be withdrawn alone: the error says how to end the turn instead.
        err = raw.request(4, "tasks/cancel", {"taskId": task})["error"]
        assert "tidegate_abort" in err["message"], err
        # An eager call answers as before.
        ran = call(raw, 5, "put", {"key": "a", "value": "1"})["result"]
        assert ran.get("resultType", "complete") == "complete" and not ran.get("isError"), ran
        assert [e["op"] for e in read_log(log)] == ["put"]

        assert not call(raw, 6, "tidegate_commit", {})["result"].get("isError")
        done = raw.request(7, "tasks/get", {"taskId": task})["result"]
        assert done["status"] == "completed" and not done["result"].get("isError"), done
        assert "ops" in done["result"]["content"][0]["text"], "the task carries the release's answer"
        assert [e["op"] for e in read_log(log)] == ["put", "send"]

        # A held call of a turn that aborts completes with a tool error, and never ran.
        task2 = call(raw, 8, "send", {"to": "ops", "text": "never"})["result"]["taskId"]
        assert task2 != task
        call(raw, 9, "tidegate_abort", {"reason": "changed my mind"})
        never = raw.request(10, "tasks/get", {"taskId": task2})["result"]
        assert never["status"] == "completed" and never["result"]["isError"], never
        assert "never ran" in never["result"]["content"][0]["text"] and "changed my mind" in never["result"]["content"][0]["text"]
        assert [e["op"] for e in read_log(log)] == ["put", "send"]
        assert "error" in raw.request(11, "tasks/get", {"taskId": "held-999"})
        assert "already ended" in raw.request(12, "tasks/cancel", {"taskId": task})["error"]["message"]
    finally:
        raw.p.kill()


def test_a_client_without_the_extension_gets_text_and_cannot_poll(workdir):
    log = workdir / "log.jsonl"
    raw = Raw(write_policy(workdir, log_upstream(log) + RULES))
    try:
        raw.request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                      "clientInfo": {"name": "raw", "version": "0"}})
        raw.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        held = call(raw, 2, "send", {"to": "ops", "text": "hello"})["result"]
        assert held.get("resultType", "complete") == "complete" and "queued" in held["content"][0]["text"], held
        assert "error" in raw.request(3, "tasks/get", {"taskId": "held-1"})
    finally:
        raw.p.kill()
