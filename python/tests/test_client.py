"""tidegate.connect: the transaction and tool API against a real `tidegate serve --memory`,
server tools dispatched to a webhook sink run by the test (its append-only log is the ground
truth), tools of this process served by the client's worker thread, and the end-to-end story
with agents that are SIGKILLed (issue 14, "How it is checked")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import tidegate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _binary() -> str:
    binary = os.environ.get("TIDEGATE_BIN") or os.path.join(ROOT, "target", "debug", "tidegate")
    if not os.path.exists(binary):
        pytest.skip(f"no tidegate binary at {binary} (scripts/test.sh builds it; or set TIDEGATE_BIN)")
    return binary


class Server:
    def __init__(self, proc: "subprocess.Popen[str]", url: str, key: str) -> None:
        self.proc, self.url, self.key = proc, url, key


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    proc = subprocess.Popen(
        [_binary(), "serve", "--memory", "--listen", "127.0.0.1:0", "--bootstrap-tenant", "py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    key = url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("tenant=py role=admin key="):
            key = line.split("key=", 1)[1].strip()
        elif line.startswith("listening on "):
            url = "http://" + line.split("listening on ", 1)[1].strip()
            break
    assert key and url, "tidegate serve did not print its key and address"
    yield Server(proc, url, key)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


class Sink:
    """A webhook receiver on 127.0.0.1 that honours Idempotency-Key and appends every request
    to a JSON Lines file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.delay: Dict[str, float] = {}
        self.applied: set = set()
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"null")
                route = self.path.strip("/")
                time.sleep(sink.delay.get(route, 0.0))
                key = self.headers.get("Idempotency-Key", "")
                with sink.lock:
                    applied = key not in sink.applied
                    sink.applied.add(key)
                    with open(sink.path, "a") as f:
                        f.write(json.dumps({"path": route, "key": key, "operation": self.headers.get("Tidegate-Operation"), "args": body.get("args"), "applied": applied}) + "\n")
                        f.flush()
                out = json.dumps({"receipt": key}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def log(self, path: Optional[str] = None) -> List[Dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [r for r in rows if path is None or r["path"] == path]

    def wait_for(self, path: str, n: int, timeout: float = 20.0) -> List[Dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.log(path)
            if len(rows) >= n:
                return rows
            time.sleep(0.05)
        return self.log(path)


@pytest.fixture
def sink(tmp_path: Any) -> Iterator[Sink]:
    s = Sink(str(tmp_path / "sink.jsonl"))
    yield s
    s.httpd.shutdown()


@pytest.fixture
def client(server: Server) -> Iterator[tidegate.Client]:
    c = tidegate.connect(server.url, api_key=server.key, timeout=20)
    yield c
    c.close()


_n = [0]


def unique(prefix: str) -> str:
    _n[0] += 1
    return f"{prefix}{os.getpid()}x{_n[0]}"


def webhook_tools(c: tidegate.Client, sink: Sink, suffix: str) -> Tuple[str, str]:
    """A gated `send<suffix>` and a reversible `book<suffix>` (compensated) on the sink."""
    for cap, route in [("send", "send"), ("book", "book"), ("unbook", "unbook")]:
        c.define_capability(f"{cap}{suffix}", {"kind": "webhook", "url": f"{sink.url}/{route}", "timeout_ms": 5000, "attempts": 3, "backoff_ms": 20})
    c.define_tool(f"send{suffix}", {"class": "gated", "scopes": ["mail:to:{to}"], "call": f"send{suffix}"})
    c.define_tool(f"book{suffix}", {"class": "reversible", "scopes": ["travel:hotel:{room}"], "call": f"book{suffix}", "compensate": f"unbook{suffix}"})
    return f"send{suffix}", f"book{suffix}"


def test_server_tools_commit_and_release_through_the_webhook_once(client: tidegate.Client, sink: Sink) -> None:
    send, book = webhook_tools(client, sink, unique("a"))
    with client.transaction(agent="t", may_touch=["mail:to:ann", "travel:hotel:7"]) as tx:
        assert tx.read("mail:to:ann").version == 0
        booked = tx.call(book, room="7")
        held = tx.call(send, to="ann", body="hi")
        assert isinstance(held, tidegate.Held) and held.kind == "queued" and not held.released
        assert sink.log("send") == [], "a held effect waits for the commit"
    assert tx.outcome is not None and tx.outcome.committed and tx.outcome.is_clean
    assert booked["receipt"].startswith(tx.remote_id or "?")
    sent = sink.log("send")
    assert [r["args"] for r in sent] == [{"to": "ann", "body": "hi"}]
    assert held.result == {"receipt": sent[0]["key"]}
    assert tx.state is None and isinstance(tx.id, int) and tx.id > 0


def test_a_batch_commits_in_one_request_and_a_failing_step_compensates_the_ones_before(client: tidegate.Client, sink: Sink) -> None:
    send, book = webhook_tools(client, sink, unique("bt"))
    out = client.batch(
        [{"tool": book, "args": {"room": "9"}}, {"tool": send, "args": {"to": "eve", "body": "booked"}}],
        reads=["travel:hotel:9"],
        agent="batcher",
    )
    assert out["transaction"]["state"] == "committed"
    assert [e["ack"] for e in out["effects"]] == ["executed", "queued"]
    assert out["reads"] == [{"scope": "travel:hotel:9", "version": 0}]
    assert [r["args"] for r in sink.log("send")] == [{"to": "eve", "body": "booked"}]
    with pytest.raises(tidegate.InvalidArgument) as bad:
        client.batch([{"tool": send, "args": {"to": "x"}}, {"tool": "no_such_tool"}])
    assert bad.value.argument == "effects[1].tool"
    # The second step is outside the declared may-touch set: the server aborts, and the
    # booking that ran first is compensated.
    with pytest.raises(tidegate.TidegateError) as failed:
        client.batch(
            [{"tool": book, "args": {"room": "10"}}, {"tool": send, "args": {"to": "mallory"}}],
            may_touch=["travel:hotel:10"],
        )
    assert failed.value.outcome is not None and not failed.value.outcome.committed
    assert len(sink.wait_for("unbook", 1)) == 1
    assert len(sink.log("send")) == 1, "the aborted batch's held effect never fired"


def test_an_exception_aborts_and_the_server_compensates(client: tidegate.Client, sink: Sink) -> None:
    send, book = webhook_tools(client, sink, unique("b"))
    with pytest.raises(RuntimeError, match="changed my mind"):
        with client.transaction(may_touch=["mail:to:bob", "travel:hotel:8"]) as tx:
            tx.call(book, room="8")
            tx.call(send, to="bob")
            raise RuntimeError("changed my mind")
    assert tx.outcome is not None and not tx.outcome.committed
    assert tx.outcome.reason_kind == "explicit"
    undone = sink.log("unbook")
    assert len(undone) == 1 and undone[0]["key"].endswith("#compensate")
    assert sink.log("send") == [], "a held effect of an aborted transaction never fires"


def _unbook(suffix: str) -> tidegate.Compensate:
    return tidegate.Compensate(f"unbook{suffix}", {"booking": tidegate.Compensate.output("/receipt")})


def test_a_plan_over_http_unwinds_its_steps_lifo_on_the_server(client: tidegate.Client, sink: Sink) -> None:
    """Three committed steps of a plan, each booking a room through the server's webhook with
    a descriptor; an exception in the plan block fails the plan and the server's executor
    calls the compensation capability for each, last first, exactly once."""
    s = unique("p")
    _, book = webhook_tools(client, sink, s)
    rooms = [f"{s}-{i}" for i in range(3)]
    receipts = []
    with pytest.raises(RuntimeError, match="visa refused"):
        with client.plan(owner="ops", deadline=3600) as plan:
            assert plan.remote_id is not None and plan.remote_id.startswith("plan_") and plan.id > 0
            for room in rooms:
                with plan.transaction(may_touch=[f"travel:hotel:{room}"]) as tx:
                    receipts.append(tx.call(book, room=room, _compensate=_unbook(s))["receipt"])
                assert tx.outcome is not None and tx.outcome.committed
            d = plan.detail()
            assert d["state"] == "open" and d["held"] == 3 and len(d["steps"]) == 3, d
            assert sink.log("unbook") == [], "a committed step's compensation is held, not run"
            raise RuntimeError("visa refused")
    undone = sink.wait_for("unbook", 3)
    assert [r["args"] for r in undone] == [{"booking": r} for r in reversed(receipts)], undone
    assert len({r["key"] for r in undone}) == 3
    final = plan.wait(20)
    assert final["state"] == "unwound" and final["held"] == 0, final
    assert plan.remote_id in {p["id"] for p in client.plans()}
    # The same plan through a fresh handle: ended plans refuse commands as PlanError.
    again = client.get_plan(plan.remote_id)
    with pytest.raises(tidegate.PlanError) as ended:
        again.commit()
    assert ended.value.kind == "plan_state"
    time.sleep(0.3)
    assert len(sink.log("unbook")) == 3, "no compensation runs twice"


def test_a_plan_over_http_commits_retires_and_refuses_a_step_without_a_descriptor(
    client: tidegate.Client, sink: Sink
) -> None:
    s = unique("q")
    _, book = webhook_tools(client, sink, s)
    with client.plan(owner="ops") as plan:
        with plan.transaction(may_touch=[f"travel:hotel:{s}-a", f"travel:hotel:{s}-b"]) as tx:
            with pytest.raises(tidegate.MissingDescriptor) as missing:
                tx.call(book, room=f"{s}-a")
            assert missing.value.argument == "compensate" and book in str(missing.value)
            tx.call(book, room=f"{s}-b", _compensate=_unbook(s))
        # A tool of this process with a descriptor: it runs here, its compensation is the
        # server's (the capability's webhook), held like the server tool's.
        @tidegate.tool(name=f"plan_room{s}", scope=lambda room: f"travel:py-plan:{room}", effect="reversible", compensate=_unbook(s))
        def plan_room(room: str) -> dict:
            return {"receipt": f"local-{room}"}

        with plan.transaction(may_touch=[f"travel:py-plan:{s}"]) as tx2:
            assert plan_room(s) == {"receipt": f"local-{s}"}
        assert tx2.outcome is not None and tx2.outcome.committed
        assert plan.detail()["held"] == 2
    d = plan.detail()
    assert d["state"] == "committed" and d["held"] == 0, d
    time.sleep(0.3)
    assert sink.log("unbook") == [], "a committed plan compensates nothing"
    with pytest.raises(tidegate.InvalidArgument) as bad:
        client.plan(owner="")
    assert bad.value.argument == "owner"
    with pytest.raises(tidegate.InvalidArgument) as bad_comp:
        with client.transaction(may_touch=[f"travel:hotel:{s}-c"]) as tx3:
            tx3.call(book, room=f"{s}-c", _compensate={"capability": "x"})
    assert bad_comp.value.argument == "_compensate"
    with pytest.raises(tidegate.PlanError) as unknown:
        client.get_plan("plan_zz_999999")
    assert unknown.value.kind == "unknown_plan"


def test_a_task_leased_while_its_client_closes_is_run_not_left_to_its_lease(
    server: Server, client: tidegate.Client, sink: Sink
) -> None:
    """close() stops the worker after its long poll. A task that this poll leases after close()
    was called is run and reported before the thread ends; it was once dropped, and the plan
    waited for the task's lease (30 s) to run out before any worker could take it."""
    s = unique("c")
    _, book = webhook_tools(client, sink, s)
    cancel = f"py_close{s}"
    plan = client.open_plan(owner="ops", deadline=3600)
    with plan.transaction(may_touch=[f"travel:hotel:{s}"]) as tx:
        comp = tidegate.Compensate(cancel, {"booking": tidegate.Compensate.output("/receipt")})
        tx.call(book, room=s, _compensate=comp)
    ran: List[str] = []
    worker = tidegate.connect(server.url, api_key=server.key, timeout=20)
    worker.capability(cancel)(lambda req: ran.append(req.key))
    time.sleep(0.3)  # its worker thread is in its first long poll (2 s)
    closer = threading.Thread(target=worker.close)
    closer.start()
    time.sleep(0.2)  # close() has stopped the worker and waits for that poll
    client.get_plan(plan.remote_id).fail("the customer cancelled")  # the task arrives in it
    closer.join(timeout=15)
    assert not closer.is_alive()
    final = client.get_plan(plan.remote_id).wait(10)
    assert final["state"] == "unwound" and final["held"] == 0, final
    assert len(ran) == 1, ran


def test_a_capability_served_by_a_client_worker_unwinds_a_plan_whose_agent_is_gone(
    server: Server, client: tidegate.Client, sink: Sink
) -> None:
    """``client.capability(name)`` serves a compensation capability from this process over
    the task queue. The agent's client runs three steps and closes; another client (another
    process's, here another connection) serves the capability, the plan is failed, and the
    handler gets the three compensations LIFO with the forward receipts, once each (a
    transient failure is queued again under the same key)."""
    s = unique("w")
    _, book = webhook_tools(client, sink, s)
    cancel = f"py_unbook{s}"
    agent = tidegate.connect(server.url, api_key=server.key, timeout=20)
    receipts = []
    plan = agent.open_plan(owner="ops", deadline=3600)
    for i in range(3):
        with plan.transaction(may_touch=[f"travel:hotel:{s}-{i}"]) as tx:
            comp = tidegate.Compensate(cancel, {"booking": tidegate.Compensate.output("/receipt")})
            receipts.append(tx.call(book, room=f"{s}-{i}", _compensate=comp)["receipt"])
    plan_id = plan.remote_id
    assert plan_id is not None
    agent.close()

    seen: List[Tuple[str, str, Any]] = []
    failed_once: List[str] = []
    lock = threading.Lock()

    def unbook(req: tidegate.CapabilityRequest) -> None:
        assert req.operation == "compensate" and req.capability == cancel and req.tool == book
        with lock:
            if req.args["booking"] == receipts[1] and not failed_once:
                failed_once.append(req.key)
                raise tidegate.TransientError("the hotel's API is busy")
            seen.append((req.key, req.args["booking"], req.output))

    worker = tidegate.connect(server.url, api_key=server.key, timeout=20)
    try:
        assert worker.capability(cancel)(unbook) is unbook
        with pytest.raises(tidegate.InvalidArgument) as bad:
            worker.capability("")
        assert bad.value.argument == "name"
        client.get_plan(plan_id).fail("visa refused")
        final = client.get_plan(plan_id).wait(30)
        assert final["state"] == "unwound" and final["held"] == 0, final
        with lock:
            assert [b for _, b, _ in seen] == list(reversed(receipts)), seen
            assert [o for _, _, o in seen] == [{"receipt": r} for r in reversed(receipts)], seen
            assert len({k for k, _, _ in seen}) == 3 and all(k.endswith("#compensate") for k, _, _ in seen)
            assert failed_once and failed_once[0] == seen[1][0], "the retry runs under the same key"
        time.sleep(0.3)
        assert len(seen) == 3, "no compensation runs twice"
    finally:
        worker.close()


def test_errors_are_the_package_exception_types(client: tidegate.Client, sink: Sink) -> None:
    send, _ = webhook_tools(client, sink, unique("c"))
    tx = client.begin(may_touch=["mail:to:carol"])
    with pytest.raises(tidegate.UnknownTool):
        tx.call("no_such_tool", x=1)
    with pytest.raises(tidegate.ProtocolViolation) as e:
        tx.call(send, to="dave")  # outside may_touch: the server aborts the transaction
    assert e.value.outcome is not None and not e.value.outcome.committed
    with pytest.raises(tidegate.WrongState):
        tx.call(send, to="carol")
    with pytest.raises(tidegate.InvalidArgument) as bad:
        client.begin(may_touch=["no-type-here"])
    assert bad.value.argument == "may_touch[0]"
    with pytest.raises(tidegate.InvalidArgument):
        client.transaction(lease=-1)
    bad_key = tidegate.connect(client.url, api_key="tgk_0000000000000000_nope")
    with pytest.raises(tidegate.TidegateError) as unauth:
        bad_key.whoami()
    assert unauth.value.kind == "unauthenticated"
    bad_key.close()


def test_a_stale_read_raises_stale_read_with_the_outcome(client: tidegate.Client, sink: Sink) -> None:
    send, _ = webhook_tools(client, sink, unique("d"))
    scope = f"mail:to:{unique('erin')}"
    # `other` begins first (an earlier epoch: `first` cannot hold it up) and commits a write
    # to the scope `first` has read.
    other = client.begin(may_touch=[scope])
    first = client.begin(may_touch=[scope])
    first.read(scope)
    other.call(send, to=scope.rsplit(":", 1)[1])
    assert other.commit().committed
    with pytest.raises(tidegate.StaleRead) as e:
        first.commit()
    assert e.value.retryable and e.value.outcome is not None and e.value.outcome.reason_kind == "stale_read"


calls: List[Tuple[str, Any]] = []


@tidegate.tool(
    scope=lambda room, **_: f"travel:room:{room}",
    effect="reversible",
    compensate=lambda result, room, **_: calls.append(("cancel", result)),
)
def hold_room(room: str, nights: int = 1) -> Dict[str, Any]:
    calls.append(("hold", room))
    return {"hold": f"H-{room}", "nights": nights}


@tidegate.tool(scope=lambda to, **_: f"mail:to:{to}", effect="gated")
def notify(to: str, text: str) -> str:
    calls.append(("notify", to))
    return f"sent to {to}"


def test_tools_of_this_process_run_here_and_are_released_and_compensated_by_its_worker_thread(client: tidegate.Client) -> None:
    calls.clear()
    with client.transaction(may_touch=["travel:room:12", "mail:to:fay"]) as tx:
        assert hold_room("12", nights=2) == {"hold": "H-12", "nights": 2}
        held = notify("fay", text="booked")
        assert isinstance(held, tidegate.Held) and ("notify", "fay") not in calls
    assert tx.outcome is not None and tx.outcome.committed
    assert held.result == "sent to fay"
    assert calls == [("hold", "12"), ("notify", "fay")]
    threads = [t.name for t in threading.enumerate()]
    assert any(n.startswith("tidegate-worker-") for n in threads), threads

    calls.clear()
    with pytest.raises(ValueError):
        with client.transaction(may_touch=["travel:room:13"]) as tx2:
            hold_room("13")
            raise ValueError("no")
    assert calls == [("hold", "13"), ("cancel", {"hold": "H-13", "nights": 1})]
    assert tx2.outcome is not None and tx2.outcome.tags == {0: "clean"}


@tidegate.tool(scope=lambda n, **_: f"kv:py:async{n}", effect="reversible")
async def double(n: int) -> int:
    return 2 * n


def test_async_blocks_and_coroutine_tools_of_this_process(client: tidegate.Client) -> None:
    import asyncio

    async def main() -> Any:
        async with client.transaction(may_touch=["kv:py:async21"]) as tx:
            out = await double(21)
        return out, tx.outcome

    out, outcome = asyncio.run(main())
    assert out == 42 and outcome is not None and outcome.committed


@tidegate.tool(scope="kv:py:flaky", effect="reversible")
def flaky(n: int) -> int:
    raise tidegate.NotApplied("the provider refused")


def test_a_failing_tool_of_this_process_aborts_with_tool_failed(client: tidegate.Client) -> None:
    with pytest.raises(tidegate.ToolFailed) as e:
        with client.transaction(may_touch=["kv:py:flaky"]):
            flaky(1)
    assert e.value.outcome is not None and e.value.outcome.reason_kind == "tool_failed"
    assert "refused" in str(e.value)
    assert e.value.outcome.effects[0].tag == "clean", "NotApplied: certainly not done, nothing to undo"


applied: List[Tuple[str, Any]] = []


@tidegate.tool(
    scope=lambda seat, **_: f"air:seat:{seat}",
    effect="reversible",
    compensate=lambda result, seat, **_: applied.append(("undo", seat, result)),
)
def seat_after_effect(seat: str) -> str:
    applied.append(("do", seat))
    raise TimeoutError("the reply timed out")


def test_an_ordinary_exception_of_an_eager_tool_is_an_unknown_outcome(client: tidegate.Client) -> None:
    # Issue 10 item 8 through a ticket: the call runs in the caller, which reports "unknown",
    # so the server, which has no probe to ask, aborts and compensates it blind (through the
    # worker thread), and tags it unresolved (never clean). As in process, ToolFailed carries
    # the tool's exception as its cause.
    applied.clear()
    seat = unique("9F")
    with pytest.raises(tidegate.ToolFailed) as e:
        with client.transaction(may_touch=[f"air:seat:{seat}"]):
            seat_after_effect(seat)
    assert "timed out" in str(e.value)
    assert isinstance(e.value.__cause__, TimeoutError), repr(e.value.__cause__)
    o = e.value.outcome
    assert o is not None and not o.committed and not o.is_clean
    assert o.effects[0].tag == "unresolved", o
    assert applied == [("do", seat), ("undo", seat, None)], "called once, undone once"


# -- eager tools of this process run in the caller, through tickets ---------------------------

where: List[Tuple[str, int]] = []


@tidegate.tool(
    scope=lambda slot, **_: f"kv:py:slot:{slot}",
    effect="reversible",
    compensate=lambda result, slot, call_id, **_: where.append(("undo", call_id)),
)
def reserve(slot: str, call_id: str) -> str:
    where.append(("do", threading.get_ident()))
    where.append(("id", call_id))
    return f"R-{slot}"


def metric(client: tidegate.Client, name: str) -> float:
    text = client._http.get("/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_an_eager_tool_runs_in_the_caller_through_a_ticket_under_the_effect_key(client: tidegate.Client) -> None:
    where.clear()
    slot = unique("s")
    tickets = metric(client, "tidegate_client_tickets_total")
    done = metric(client, 'tidegate_client_results_total{result="done"}')
    with client.transaction(may_touch=[f"kv:py:slot:{slot}"]) as tx:
        assert reserve(slot) == f"R-{slot}"
    assert tx.outcome is not None and tx.outcome.committed and tx.outcome.is_clean
    # It ran on this thread (not the worker thread), under the key the server recorded.
    assert where[0] == ("do", threading.get_ident()), where
    v = client.get(tx.remote_id or "")
    [effect] = v["effects"]
    assert where[1] == ("id", effect["key"]) and effect["status"] == "executed" and effect["output"] == f"R-{slot}"
    assert metric(client, "tidegate_client_tickets_total") == tickets + 1
    assert metric(client, 'tidegate_client_results_total{result="done"}') == done + 1

    # Aborted afterwards: the worker thread compensates it with the same call id.
    where.clear()
    slot2 = unique("s")
    with pytest.raises(RuntimeError):
        with client.transaction(may_touch=[f"kv:py:slot:{slot2}"]) as tx2:
            reserve(slot2)
            raise RuntimeError("changed my mind")
    assert tx2.outcome is not None and tx2.outcome.tags == {0: "clean"}
    assert where[2] == ("undo", where[1][1]), where


@tidegate.tool(scope="kv:py:gateway", effect="reversible")
def push_busy(n: int) -> int:
    raise tidegate.NotApplied("503 before processing", retry=True)


def test_not_applied_with_retry_aborts_retryably(client: tidegate.Client) -> None:
    with pytest.raises(tidegate.ToolFailed) as e:
        with client.transaction(may_touch=["kv:py:gateway"]):
            push_busy(1)
    assert e.value.retryable and e.value.outcome is not None
    assert e.value.outcome.reason_kind == "tool_unavailable", e.value.outcome
    assert isinstance(e.value.__cause__, tidegate.NotApplied)
    assert e.value.outcome.effects[0].tag == "clean", "not applied: nothing to undo"


busy: List[str] = []


@tidegate.tool(scope=lambda to, **_: f"mail:busy:{to}", effect="gated")
def send_when_free(to: str) -> str:
    busy.append(to)
    if len(busy) < 3:
        raise tidegate.NotApplied("the mail relay is busy", retry=True)
    return f"sent to {to}"


def test_a_release_not_applied_with_retry_is_queued_again_under_the_capability_policy(client: tidegate.Client) -> None:
    # The worker reports not_applied with retry: the server queues the task again (same key)
    # within the capability's attempts (default 4), so the third try commits.
    busy.clear()
    to = unique("u")
    with client.transaction(may_touch=[f"mail:busy:{to}"]) as tx:
        held = send_when_free(to)
    assert tx.outcome is not None and tx.outcome.committed and tx.outcome.is_clean, tx.outcome
    assert busy == [to, to, to] and held.result == f"sent to {to}"


def test_ticket_refusals_are_wrong_state(client: tidegate.Client) -> None:
    slot = unique("s")
    tx = client.begin(may_touch=[f"kv:py:slot:{slot}", f"mail:to:{slot}"])
    ticket = tx._record(reserve, (), {"slot": slot}, None, None)
    tx._report(ticket, {"status": "done", "output": "R"}, None)
    # The same result again is the same answer; another one is a conflict.
    assert tx._report(ticket, {"status": "done", "output": "R"}, None) == (None, "R")
    with pytest.raises(tidegate.WrongState) as e:
        tx._report(ticket, {"status": "unknown", "error": "x"}, None)
    assert e.value.kind == "result_conflict"
    held = tx._record(notify, (), {"to": slot, "text": "t"}, None, None)
    assert isinstance(held, tidegate.Held)
    with pytest.raises(tidegate.WrongState) as e:
        client._request("POST", f"/v1/transactions/{tx.remote_id}/effects/{held.effect}/result", {"status": "done"})
    assert e.value.kind == "not_client_executed"
    tx.abort()


@pytest.mark.parametrize("code", ["result_conflict", "ticket_expired", "not_client_executed", "result_in_progress"])
def test_ticket_problems_raise_wrong_state(code: str) -> None:
    from tidegate.client import _problem_error

    e = _problem_error(409, {"code": code, "detail": "refused"})
    assert isinstance(e, tidegate.WrongState) and e.kind == code


def test_an_inner_transactions_abort_aborts_the_enclosing_remote_transaction(client: tidegate.Client) -> None:
    # Regression: RemoteTransaction took any error carrying an outcome for its own settlement,
    # so an inner transaction's abort leaving an outer `with` left the outer one open with the
    # inner one's outcome (until its lease ran out) instead of aborting it.
    where.clear()
    slot = unique("s")
    with pytest.raises(tidegate.ToolFailed) as e:
        with client.transaction(may_touch=[f"kv:py:slot:{slot}"]) as outer:
            reserve(slot)
            with client.transaction(may_touch=["kv:py:gateway"]) as inner:
                push_busy(1)
    assert e.value.outcome is not None and e.value.outcome.tx == inner.id
    assert inner.outcome is not None and inner.outcome.tx == inner.id and not inner.outcome.committed
    assert outer.outcome is not None and outer.outcome.tx == outer.id != inner.id, outer.outcome
    assert not outer.outcome.committed and outer.outcome.reason_kind == "explicit", outer.outcome
    assert outer.outcome.tags == {0: "clean"} and client.get(outer.remote_id or "")["state"] == "aborted"
    assert ("undo", where[1][1]) in where, where


# -- the LangGraph ToolNode against the server, unchanged ---------------------------------------


def test_langgraph_tool_node_runs_unchanged_against_connect(client: tidegate.Client) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool as lc_tool
    from test_langgraph import graph, tool_messages

    from tidegate.langgraph import ToolNode

    fired: List[str] = []
    booked: List[Tuple[str, int]] = []
    cancelled: List[str] = []
    suffix = unique("")

    @lc_tool
    def book(room: str) -> str:
        """Hold a room."""
        booked.append((room, threading.get_ident()))
        return f"hold-{room}"

    @lc_tool
    def email(to: str) -> str:
        """Send an email."""
        fired.append(to)
        return "sent"

    @lc_tool
    def charge(amount: int) -> str:
        """Charge a card; the reply times out after the charge went through."""
        raise TimeoutError("the gateway did not answer")

    node = ToolNode(
        [book, email, charge],
        engine=client,
        name=f"tools{suffix}",
        effects={
            "book": {"effect": "reversible", "scope": lambda room: f"travel:room:{room}",
                     "compensate": lambda result, room: cancelled.append(result)},
            "email": "gated",
            "charge": tidegate.langgraph.effect("reversible", scope=f"retail:card:{suffix}",
                                                compensate=lambda result, amount: cancelled.append(f"refund-{amount}")),
        },
    )

    room = unique("r")
    calls = [
        {"name": "book", "args": {"room": room}, "id": "c1", "type": "tool_call"},
        {"name": "email", "args": {"to": room}, "id": "c2", "type": "tool_call"},
        {"name": "charge", "args": {"amount": 30}, "id": "c3", "type": "tool_call"},
    ]
    # A turn that commits: the booking ran here (a ticket), the gated email fired at commit.
    msgs = tool_messages(graph(node, calls[:2]).invoke({"messages": []}))
    assert [m.content for m in msgs] == [f"hold-{room}", "sent"], msgs
    assert booked == [(room, threading.get_ident())] and fired == [room]

    # A turn whose last call raises an ordinary exception: an unknown outcome, so the turn
    # aborts, the booking is undone and the charge is compensated blind (never clean); the
    # gated email never fires.
    booked.clear()
    fired.clear()
    msgs = tool_messages(graph(node, calls).invoke({"messages": []}))
    assert [m.tool_call_id for m in msgs] == ["c1", "c2", "c3"] and all(m.status == "error" for m in msgs), msgs
    assert "aborted" in msgs[0].content
    assert fired == [] and [b for b, _ in booked] == [room]
    deadline = time.monotonic() + 10
    while len(cancelled) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(cancelled) == sorted([f"hold-{room}", "refund-30"]), cancelled

    # The async path of the same node.
    booked.clear()
    fired.clear()
    import asyncio

    room2 = unique("r")
    calls2 = [
        {"name": "book", "args": {"room": room2}, "id": "d1", "type": "tool_call"},
        {"name": "email", "args": {"to": room2}, "id": "d2", "type": "tool_call"},
    ]
    msgs = tool_messages(asyncio.run(graph(node, calls2).ainvoke({"messages": []})))
    assert [m.content for m in msgs] == [f"hold-{room2}", "sent"], msgs
    assert [b for b, _ in booked] == [room2] and fired == [room2]


# -- the end-to-end story: agents that die --------------------------------------------------

AGENT = r"""
import sys, tidegate
url, key, mode, tool, arg = sys.argv[1:6]
c = tidegate.connect(url, api_key=key)
if mode == "commit":
    tx = c.begin(agent="doomed", may_touch=[f"mail:to:{arg}"])
    tx.call(tool, to=arg, body="release me")
    state = tx.request_commit()
    print("ACK", tx.remote_id, state, flush=True)
else:
    tx = c.begin(agent="doomed", may_touch=[f"travel:hotel:{arg}"], lease=1.0)
    out = tx.call(tool, room=arg)
    print("ACK", tx.remote_id, out["receipt"], flush=True)
import time
time.sleep(600)
"""


def run_agent(server: Server, mode: str, tool: str, arg: str) -> str:
    """Starts an agent process, waits for its acknowledgement line, SIGKILLs it at once."""
    p = subprocess.Popen(
        [sys.executable, "-c", AGENT, server.url, server.key, mode, tool, arg], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    assert line.startswith("ACK "), f"the agent printed {line!r}"
    return line.split()[1]


def test_story_a_release_reaches_the_sink_exactly_once_after_the_agent_is_killed(
    server: Server, client: tidegate.Client, sink: Sink
) -> None:
    send, _ = webhook_tools(client, sink, unique("s"))
    sink.delay["send"] = 0.5  # the release is still in flight when the agent dies
    to = unique("gus")
    tx_id = run_agent(server, "commit", send, to)
    rows = sink.wait_for("send", 1)
    v = client.get(tx_id)
    deadline = time.monotonic() + 20
    while v["state"] != "committed" and time.monotonic() < deadline:
        time.sleep(0.05)
        v = client.get(tx_id)
    assert v["state"] == "committed", v
    time.sleep(1.0)  # room for a duplicate to show up
    rows = sink.log("send")
    assert len(rows) == 1 and rows[0]["args"]["to"] == to, rows
    assert rows[0]["key"].startswith(tx_id) and rows[0]["applied"]


def test_story_a_compensation_runs_exactly_once_after_the_agent_is_killed(
    server: Server, client: tidegate.Client, sink: Sink
) -> None:
    _, book = webhook_tools(client, sink, unique("t"))
    room = unique("r")
    tx_id = run_agent(server, "abort", book, room)
    assert len(sink.log("book")) == 1
    # The agent is gone with its transaction open: its 1 s lease ends it, and the server
    # compensates what it executed.
    rows = sink.wait_for("unbook", 1)
    v = client.get(tx_id)
    deadline = time.monotonic() + 20
    while v["state"] != "aborted" and time.monotonic() < deadline:
        time.sleep(0.05)
        v = client.get(tx_id)
    assert v["state"] == "aborted" and v["outcome"]["reason"]["kind"] == "lease_expired", v
    time.sleep(1.0)
    rows = sink.log("unbook")
    assert len(rows) == 1 and rows[0]["key"] == sink.log("book")[0]["key"] + "#compensate", rows
    assert rows[0]["args"] == {"room": room}


def test_a_capability_handlers_answers_map_to_task_results_as_in_process() -> None:
    """What ``Client.capability``'s worker reports for each answer of a handler (no server:
    the mapping alone), and that a forward call's task never reaches a compensation handler."""
    from tidegate.client import _run_capability

    def task(op: str) -> Dict[str, Any]:
        return {"capability": "c", "operation": op, "tool": "t", "key": "k#compensate", "args": {"a": 1}, "output": 2}

    def answering(value: Any) -> Any:
        def handler(req: tidegate.CapabilityRequest) -> Any:
            assert (req.capability, req.tool, req.key, req.args, req.output) == ("c", "t", "k#compensate", {"a": 1}, 2)
            if isinstance(value, BaseException):
                raise value
            return value

        return handler

    comp = [
        (None, {"status": "done"}),
        ("fee 3", {"status": "done", "residue": "fee 3"}),
        ({"refund": 9}, {"status": "done", "output": {"refund": 9}}),
        (tidegate.NotApplied("closed", retry=True), {"status": "not_applied", "retry": True}),
        (tidegate.TransientError("busy"), {"status": "not_applied", "retry": True}),
        (RuntimeError("timeout"), {"status": "unknown"}),
    ]
    for value, want in comp:
        got = _run_capability(answering(value), task("compensate"))
        assert {k: got[k] for k in want} == want, (value, got)
    probe = [
        (True, "done"),
        (tidegate.Happened({"id": 1}), "done"),
        (False, "failed"),
        (None, "unknown"),
        (RuntimeError("down"), "unknown"),
    ]
    for value, status in probe:
        assert _run_capability(answering(value), task("probe"))["status"] == status, value
    assert _run_capability(answering(tidegate.Happened({"id": 1})), task("probe"))["output"] == {"id": 1}
    called: List[str] = []
    refused = _run_capability(lambda req: called.append(req.key), task("call"))
    assert refused["status"] == "failed" and "not `call`" in refused["error"] and called == []

    async def coro(req: tidegate.CapabilityRequest) -> str:
        return "async fee"

    assert _run_capability(coro, task("compensate")) == {"status": "done", "residue": "async fee"}


def test_a_tool_probes_answer_maps_to_a_task_result_as_in_process() -> None:
    """What the worker reports for a probe of a tool of the process (no server: the mapping
    alone) is what the in-process engine reads from the same answer: True, Happened(output)
    or another true value "done", a false one "failed" (did not happen), None or an exception
    "unknown"."""
    from tidegate._worker import _run_tool

    answers: List[Any] = []

    def probed(n: int) -> int:
        return n

    def ask(n: int) -> Any:
        value = answers[0]
        if isinstance(value, BaseException):
            raise value
        return value

    t = tidegate.tool(probed, scope="kv:py:probe", effect="gated", probe=ask)
    task = {"capability": "py.probed.probe", "operation": "probe", "tool": "probed", "key": "k", "args": {"n": 1}}
    for value, status in [
        (True, "done"),
        (tidegate.Happened(7), "done"),
        (1, "done"),
        ({"id": 1}, "done"),
        (False, "failed"),
        (0, "failed"),
        ("", "failed"),
        (None, "unknown"),
        (RuntimeError("down"), "unknown"),
    ]:
        answers[:] = [value]
        assert _run_tool(t, task)["status"] == status, value
    answers[:] = [tidegate.Happened(7)]
    assert _run_tool(t, task)["output"] == 7


class _NotTheOwner(BaseHTTPRequestHandler):
    """A node of a cluster that does not serve the tenant: every request gets the server's
    `503 tenant_unavailable` naming the owner and where it answers (docs/deployment.md,
    "Route a request"); the counts say what reached it."""

    owner_address = ""
    seen: List[str] = []

    def _refuse(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        type(self).seen.append(f"{self.command} {self.path}")
        body = json.dumps(
            {
                "type": "urn:tidegate:problem:tenant_unavailable",
                "title": "Service unavailable",
                "status": 503,
                "code": "tenant_unavailable",
                "detail": "this node does not serve the tenant",
                "retryable": True,
                "owner": "node-a",
                "owner_address": type(self).owner_address,
            }
        ).encode()
        self.send_response(503)
        self.send_header("content-type", "application/problem+json")
        self.send_header("retry-after", "9")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _refuse

    def log_message(self, *args: Any) -> None:
        pass


def test_a_client_sent_to_a_node_that_does_not_serve_its_tenant_moves_to_the_owner(server: Server, sink: Sink) -> None:
    _NotTheOwner.owner_address = server.url + "/"
    _NotTheOwner.seen = []
    other = ThreadingHTTPServer(("127.0.0.1", 0), _NotTheOwner)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        c = tidegate.connect(f"http://127.0.0.1:{other.server_address[1]}", api_key=server.key, timeout=20)
        started = time.monotonic()
        send, book = webhook_tools(c, sink, unique("r"))
        # Not the 9 s Retry-After: the owner's address is followed at once.
        assert time.monotonic() - started < 5
        assert c.url == server.url, "the client now talks to the owner"
        assert len(_NotTheOwner.seen) == 1, _NotTheOwner.seen
        with c.transaction(agent="t", may_touch=["mail:to:rob"]) as tx:
            tx.call(send, to="rob", body="hi")
        assert tx.outcome is not None and tx.outcome.committed
        assert [r["args"]["to"] for r in sink.log("send")] == ["rob"]
        assert len(_NotTheOwner.seen) == 1, "nothing more was sent to the node that refused"
        c.close()
    finally:
        other.shutdown()
        other.server_close()
