"""tidegate.review.ReviewClient against a real `tidegate serve --memory`: register templates,
request transactions (some suspicious), read the queue, accept and remove with the removal's
cascade, and the errors of bad input and wrong roles."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from typing import Iterator, Tuple

import pytest

import tidegate
from tidegate.review import ReviewClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEMA = """
CREATE TABLE account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE payment (order_id INTEGER PRIMARY KEY, amount INTEGER NOT NULL);
CREATE TABLE shipment (order_id INTEGER PRIMARY KEY);
INSERT INTO account VALUES (1, 100);
"""

SET = {
    "tables": {
        "account": {"primary_key": ["id"]},
        "payment": {"primary_key": ["order_id"]},
        "shipment": {"primary_key": ["order_id"]},
    },
    "invariants": [
        {"kind": "check", "table": "account", "column": "balance", "op": ">=", "value": 0},
        {"kind": "process_order", "first": "pay", "then": "ship", "on": [["order_id", "order_id"]]},
    ],
    "templates": [
        {
            "name": "withdraw",
            "params": ["id", "amount"],
            "steps": [{"statements": [{"sql": "UPDATE account SET balance = balance - :amount WHERE id = :id"}]}],
            "writes": [{"table": "account", "column": "balance", "kind": "decrement", "row": {"id": "id"}}],
        },
        {
            "name": "pay",
            "params": ["order_id", "amount"],
            "steps": [{"statements": [{"sql": "INSERT INTO payment (order_id, amount) VALUES (:order_id, :amount)"}]}],
            "writes": [{"table": "payment", "kind": "insert", "row": {"order_id": "order_id"}}],
        },
        {
            "name": "ship",
            "params": ["order_id"],
            "steps": [{"statements": [{"sql": "INSERT INTO shipment (order_id) VALUES (:order_id)"}]}],
            "writes": [{"table": "shipment", "kind": "insert", "row": {"order_id": "order_id"}}],
        },
    ],
}


def _binary() -> str:
    binary = os.environ.get("TIDEGATE_BIN") or os.path.join(ROOT, "target", "debug", "tidegate")
    if not os.path.exists(binary):
        pytest.skip(f"no tidegate binary at {binary} (scripts/test.sh builds it; or set TIDEGATE_BIN)")
    return binary


def _key(url: str, admin: str, role: str) -> str:
    req = urllib.request.Request(
        url + "/v1/keys",
        data=json.dumps({"role": role}).encode(),
        method="POST",
        headers={"Authorization": "Bearer " + admin, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(json.loads(r.read())["key"])


@pytest.fixture(scope="module")
def server() -> Iterator[Tuple[str, str]]:
    proc = subprocess.Popen(
        [_binary(), "serve", "--memory", "--listen", "127.0.0.1:0", "--bootstrap-tenant", "rv"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    key = url = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("tenant=rv role=admin key="):
            key = line.split("key=", 1)[1].strip()
        elif line.startswith("listening on "):
            url = "http://" + line.split("listening on ", 1)[1].strip()
            break
    assert key and url, "tidegate serve did not print its key and address"
    yield url, key
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def test_request_queue_accept_and_remove_with_its_cascade(server: Tuple[str, str]) -> None:
    url, admin = server
    ops = ReviewClient(url, admin)
    agent = ReviewClient(url, _key(url, admin, "agent"))
    reviewer = ReviewClient(url, _key(url, admin, "reviewer"))
    registered = ops.register(SET, schema=SCHEMA)
    assert registered["added"] is True and registered["templates"] == ["withdraw", "pay", "ship"]
    assert ops.register(SET)["added"] is False

    w = agent.request("withdraw", {"id": 1, "amount": 70}, sender="llm-7", suspicious=True)
    held = agent.request("withdraw", {"id": 1, "amount": 40})
    pay = agent.request("pay", {"order_id": 9, "amount": 5}, suspicious=True)
    ship = agent.request("ship", {"order_id": 9})
    assert (w["status"], w["sender"]) == ("awaiting_review", "llm-7")
    assert held["status"] == "held" and held["waits_for"] == [w["id"]]
    assert ship["waits_for"] == [pay["id"]]

    q = reviewer.queue()
    assert (q["total"], q["reviewable"]) == (4, 2)
    first = q["data"][0]
    assert first["sql"] == ["UPDATE account SET balance = balance - :amount WHERE id = :id"]
    assert first["params"] == {"id": 1, "amount": 70} and first["waited_by"] == [held["id"]]
    assert next(t for t in q["data"] if t["id"] == pay["id"])["removal_cascade"] == [ship["id"]]

    accepted = reviewer.accept(w)
    assert accepted["transaction"]["status"] == "committed" and accepted["cascaded"] == []
    # 100 - 70 = 30 is not enough for the held withdrawal of 40: the database refuses it.
    refused = reviewer.status(held["id"])
    assert refused["status"] == "failed" and "CHECK" in refused["error"]

    removed = reviewer.remove(pay["id"])
    assert removed["transaction"]["status"] == "removed" and removed["cascaded"] == [ship["id"]]
    assert agent.status(ship)["cascaded_from"] == pay["id"]
    assert reviewer.queue()["total"] == 0

    with pytest.raises(tidegate.TidegateError) as e:
        reviewer.remove(pay)
    assert e.value.kind == "not_reviewable"


def test_bad_input_and_wrong_roles_raise_naming_the_field(server: Tuple[str, str]) -> None:
    url, admin = server
    agent = ReviewClient(url, _key(url, admin, "agent"))
    with pytest.raises(tidegate.InvalidArgument) as e:
        agent.request("withdraw", {"id": 1})
    assert e.value.argument == "params.amount"
    with pytest.raises(tidegate.InvalidArgument) as e:
        agent.request("no_such_template", {})
    assert e.value.argument == "template"
    with pytest.raises(tidegate.TidegateError) as e:
        agent.remove("rv_00000000_1")
    assert e.value.kind == "forbidden"
    with pytest.raises(tidegate.TidegateError) as e:
        ReviewClient(url, admin).status("rv_00000000_1")
    assert e.value.kind == "not_found"
    with pytest.raises(tidegate.InvalidArgument) as e:
        ReviewClient(url, admin).status({"no": "id"})
    assert e.value.argument == "id"
    with pytest.raises(tidegate.InvalidArgument):
        ReviewClient("ftp://x", admin)
