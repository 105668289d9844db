"""The operator console in headless Chromium (run by scripts/console-browser-test.sh).

Against a running `tidegate serve` with two tenants (`first`, whose admin key is --key, and
`second`, --key2): makes real agents (HTTP calls) produce every state the console shows, then
checks each view in the browser, one test per view, each saving a screenshot under --out:

  live        open / waiting / committing transactions; the waiting one names the earlier
              transaction and the overlapping scope; a new transaction appears without a reload
  timeline    a transaction's reads, effects with class/key/disposition/tag, ledger events
  attention   an operator marks an unresolved effect resolved with a note; the ledger records
              the operator's key on the stream `operator` and the attention list shows it
  review      a reviewer removes a buffered payment after the confirmation names the shipment it
              takes along; the tenant's review database shows neither
  attention   ... and a stuck plan in the owner-intervention queue: the operator sees why and
              accepts it through the page (plans.resolve); the plan API then shows it accepted,
              the queue without it, and the ledger's operator stream who accepted it
  registry, ledger (filters, JSON Lines export), picture
  plans       the list (an open plan with two steps and a stuck one), the open plan's detail:
              compensations newest first, the deadline countdown, trigger values
  isolation   the second tenant's key sees nothing of the first on any view
  axe         axe-core finds no serious or critical violation on any view
  speed       the live view with 1,000 open transactions (second tenant): render time reported
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sqlite3
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

SCHEMA = """
CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS payment (order_id INTEGER PRIMARY KEY, amount INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS shipment (order_id INTEGER PRIMARY KEY);
"""

SET = {
    "tables": {"payment": {"primary_key": ["order_id"]}, "shipment": {"primary_key": ["order_id"]}},
    "invariants": [{"kind": "process_order", "first": "pay", "then": "ship", "on": [["order_id", "order_id"]]}],
    "templates": [
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


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, key: str, body: object | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + key)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def ok(self, method: str, path: str, key: str, body: object | None = None) -> dict:
        status, out = self.call(method, path, key, body)
        if status // 100 != 2:
            raise AssertionError(f"{method} {path}: {status} {out}")
        return out


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


class Webhooks(BaseHTTPRequestHandler):
    """The tools' far side: `fax` always answers 503 (its release's outcome stays unknown),
    `slow` takes ten minutes (its commit stays `committing`), `ok` answers at once."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path.startswith("/fax"):
            self.send_response(503)
            self.end_headers()
            return
        if self.path.startswith("/slow"):
            time.sleep(600)
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class World:
    """What the agents made: ids the tests look for."""

    def __init__(self) -> None:
        self.open = self.waiting = self.committing = self.fax = self.committed = ""
        self.plan = self.stuck_plan = ""
        self.plan_steps: list[str] = []
        self.pay = self.ship = {}
        self.keys: dict[str, str] = {}


def make_world(api: Api, admin: str, hooks: str) -> World:
    w = World()
    w.keys["admin"] = admin
    for role in ("agent", "operator", "reviewer"):
        w.keys[role] = api.ok("POST", "/v1/keys", admin, {"role": role, "label": "console-" + role})["key"]
    w.keys["operator_id"] = api.ok("GET", "/v1/whoami", w.keys["operator"])["key_id"]
    agent = w.keys["agent"]
    for name, timeout, attempts in (("fax", 2000, 2), ("slow", 600000, 1), ("ok", 2000, 1)):
        cap = {"kind": "webhook", "url": f"{hooks}/{name}/call", "timeout_ms": timeout, "attempts": attempts, "backoff_ms": 10}
        api.ok("PUT", f"/v1/capabilities/{name}-call", admin, cap)
        tool = {"class": "gated", "scopes": [f"kv:{name}:{{id}}"], "call": f"{name}-call", "description": f"the {name} tool"}
        api.ok("PUT", f"/v1/tools/{name}", admin, tool)

    def begin(agent_name: str, scopes: list[str]) -> str:
        body = {"agent": agent_name, "may_touch": scopes, "lease_ms": 3_600_000}
        return api.ok("POST", "/v1/transactions", agent, body)["id"]

    # Open, and a later one on an overlapping scope whose commit waits for it.
    w.open = begin("planner", ["kv:hotel:*"])
    api.ok("POST", f"/v1/transactions/{w.open}/reads", agent, {"scope": "kv:hotel:3"})
    w.waiting = begin("booker", ["kv:hotel:7"])
    api.ok("POST", f"/v1/transactions/{w.waiting}/reads", agent, {"scope": "kv:hotel:7"})
    api.ok("POST", f"/v1/transactions/{w.waiting}/commit", agent, {"seal": True, "wait_ms": 0})
    # Committing: its held effect's release is slow.
    w.committing = begin("shipper", ["kv:slow:*"])
    api.ok("POST", f"/v1/transactions/{w.committing}/effects", agent, {"tool": "slow", "args": {"id": "s1"}})
    api.ok("POST", f"/v1/transactions/{w.committing}/commit", agent, {"seal": True, "wait_ms": 0})
    # An unresolved effect: the release's outcome is unknown (503 twice, no probe).
    w.fax = begin("faxer", ["kv:fax:*"])
    api.ok("POST", f"/v1/transactions/{w.fax}/effects", agent, {"tool": "fax", "args": {"id": "f1"}})
    out = api.ok("POST", f"/v1/transactions/{w.fax}/commit", agent, {"seal": True, "wait_ms": 20000})
    check(out["effects"][0]["tag"] == "unresolved", f"the fax effect is unresolved: {out}")
    # A clean commit and an abort, for the picture and the ledger.
    w.committed = begin("clerk", ["kv:ok:*"])
    api.ok("POST", f"/v1/transactions/{w.committed}/reads", agent, {"scope": "kv:ok:1"})
    api.ok("POST", f"/v1/transactions/{w.committed}/effects", agent, {"tool": "ok", "args": {"id": "1"}})
    api.ok("POST", f"/v1/transactions/{w.committed}/commit", agent, {"seal": True, "wait_ms": 20000})
    ab = begin("clerk", ["kv:ok:2"])
    api.ok("POST", f"/v1/transactions/{ab}/abort", agent, {"reason": "changed its mind"})
    state = api.ok("GET", f"/v1/transactions/{w.waiting}", agent)
    check(state["state"] == "waiting" and state["waits_for"][0]["transaction"] == w.open, f"waiting: {state}")
    state = api.ok("GET", f"/v1/transactions/{w.committing}", agent)
    check(state["state"] == "committing", f"committing: {state}")
    # Review: a suspicious payment with a shipment that builds on it.
    api.ok("POST", "/v1/review/templates", admin, {"set": SET, "schema": SCHEMA})
    req = lambda t, p, s: api.ok(  # noqa: E731
        "POST", "/v1/review/transactions", agent, {"template": t, "params": p, "sender": "llm-agent-7", "suspicious": s}
    )
    w.pay = req("pay", {"order_id": 9, "amount": 5}, True)
    w.ship = req("ship", {"order_id": 9}, False)
    check(w.ship["status"] == "held", f"ship: {w.ship}")
    make_plans(api, admin, w)
    return w


def make_plans(api: Api, admin: str, w: World) -> None:
    """Plans (docs/plans.md) through the real API: an open one with two committed steps whose
    effects carry compensation descriptors, a deadline a day away and a predicate trigger that
    its second step makes false; and a stuck one (a gated effect without compensation fired in
    its step, then the plan failed: nothing can be compensated, so it waits for its owner)."""
    agent = w.keys["agent"]
    api.ok("PUT", "/v1/tools/trip", admin,
           {"class": "reversible", "scopes": ["kv:trip:{id}"], "call": "ok-call", "compensate": "ok-call", "description": "the trip tool"})

    def step(plan: str, tool: str, item: str, compensate: bool) -> str:
        body = {"agent": "traveller", "plan": plan, "may_touch": [f"kv:{tool}:{item}"], "lease_ms": 3_600_000}
        tx = api.ok("POST", "/v1/transactions", agent, body)["id"]
        effect: dict = {"tool": tool, "args": {"id": item}}
        if compensate:
            effect["compensate"] = {"capability": "ok-call", "args": {"id": item, "undo": True}}
        api.ok("POST", f"/v1/transactions/{tx}/effects", agent, effect)
        out = api.ok("POST", f"/v1/transactions/{tx}/commit", agent, {"seal": True, "wait_ms": 20000})
        check(out["outcome"]["committed"], f"the step {tx} committed: {out}")
        return tx

    far = int(time.time() * 1000) + 86_400_000
    opened = api.ok("POST", "/v1/plans", agent, {
        "owner": "trip-planner", "deadline_in_ms": 86_400_000,
        "triggers": [{"no_commit": {"scope": "kv:trip:hotel", "before_ms": far}}],
    })
    w.plan = opened["id"]
    w.plan_steps = [step(w.plan, "trip", "flight", True), step(w.plan, "trip", "hotel", True)]
    plan = api.ok("GET", f"/v1/plans/{w.plan}", agent)
    check(plan["state"] == "open" and plan["held"] == 2, f"the open plan holds two compensations: {plan}")
    check([r["seq"] for r in plan["registrations"]] == [1, 0], f"registrations in unwind order: {plan}")
    stuck = api.ok("POST", "/v1/plans", agent, {"owner": "mailer"})
    w.stuck_plan = stuck["id"]
    step(w.stuck_plan, "ok", "mail-1", False)
    api.ok("POST", f"/v1/plans/{w.stuck_plan}/fail", agent, {"reason": "the customer cancelled"})
    deadline = time.monotonic() + 20
    while not any(p["id"] == w.stuck_plan for p in api.ok("GET", "/v1/plans/stuck", agent)["stuck"]):
        check(time.monotonic() < deadline, f"the plan {w.stuck_plan} goes stuck: {api.ok('GET', f'/v1/plans/{w.stuck_plan}', agent)}")
        time.sleep(0.1)


class Browser:
    def __init__(self, args: argparse.Namespace) -> None:
        opts = Options()
        opts.binary_location = args.chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1366,900"):
            opts.add_argument(a)
        self.d = webdriver.Chrome(service=Service(executable_path=args.chromedriver), options=opts)
        self.base = args.base
        self.out = args.out
        self.wait = WebDriverWait(self.d, 20)
        # A page that does not load in 30 s fails its test instead of stalling the run.
        self.d.set_page_load_timeout(30)
        with open(args.axe, encoding="utf-8") as f:
            self.axe_src = f.read()

    def sign_in(self, key: str, role: str) -> None:
        # A fresh document with an empty session (a hash change alone would keep the page).
        self.d.get(self.base + "/console")
        self.d.execute_script("sessionStorage.clear()")
        self.d.get("about:blank")
        self.d.get(self.base + "/console#/live")
        field = self.wait.until(ec.visibility_of_element_located((By.ID, "key")))
        check(self.d.switch_to.active_element == field, "the key field has focus")
        field.send_keys(key, Keys.ENTER)
        self.wait.until(ec.text_to_be_present_in_element((By.ID, "who"), role))

    def go(self, hash_: str) -> None:
        self.d.execute_script("location.hash = arguments[0]", hash_)

    def text(self, css: str) -> str:
        return self.d.find_element(By.CSS_SELECTOR, css).text

    def shot(self, name: str) -> None:
        self.d.save_screenshot(os.path.join(self.out, name + ".png"))

    def axe(self, view: str) -> list[str]:
        t0 = time.monotonic()
        self.d.execute_script(self.axe_src)
        print(f"  axe inject {view}: {time.monotonic() - t0:.2f} s")
        t0 = time.monotonic()
        res = self.d.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "axe.run(document, {resultTypes: ['violations']}).then((r) => done(r.violations.map((v) =>"
            " ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' '))}))))"
            ".catch((e) => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));"
        )
        print(f"  axe run {view}: {time.monotonic() - t0:.2f} s")
        bad = [f"{view}: {v['impact']} {v['id']} ({v['help']}) at {v['nodes']}" for v in res if v["impact"] in ("serious", "critical")]
        minor = [f"{view}: {v['impact']} {v['id']}" for v in res if v["impact"] not in ("serious", "critical")]
        if minor:
            print("  axe (not serious):", "; ".join(minor))
        return bad

    def quit(self) -> None:
        self.d.quit()


def test_live(b: Browser, api: Api, w: World) -> None:
    b.sign_in(w.keys["operator"], "operator")
    b.go("#/live")
    b.wait.until(ec.presence_of_element_located((By.ID, "row-" + w.waiting)))
    for tx, state in ((w.open, "open"), (w.waiting, "waiting"), (w.committing, "committing")):
        row = b.d.find_element(By.ID, "row-" + tx)
        check(row.get_attribute("data-state") == state, f"{tx} shows {state}: {row.text!r}")
    waits = b.text(f"#row-{w.waiting} .waits-cell")
    check(w.open in waits and "kv:hotel:7" in waits and "planner" in waits, f"the waiting row names what it waits for: {waits!r}")
    check("kv:hotel" in b.text(f"#row-{w.open}"), "the open row shows its footprint")
    check(w.fax not in b.d.find_element(By.ID, "live-rows").text, "settled transactions are not live")
    # Live: a new transaction appears, and a commit takes it away, without a reload.
    marker = b.d.execute_script("window.__noReload = 1; return window.__noReload")
    new = api.ok("POST", "/v1/transactions", w.keys["agent"], {"agent": "late-comer", "may_touch": ["kv:new:1"], "lease_ms": 3_600_000})["id"]
    WebDriverWait(b.d, 10).until(ec.presence_of_element_located((By.ID, "row-" + new)))
    api.ok("POST", f"/v1/transactions/{new}/commit", w.keys["agent"], {"seal": True, "wait_ms": 5000})
    WebDriverWait(b.d, 10).until(ec.invisibility_of_element_located((By.ID, "row-" + new)))
    check(b.d.execute_script("return window.__noReload") == marker, "the page was not reloaded")
    # The state filter, by keyboard.
    sel = b.d.find_element(By.ID, "live-state")
    b.d.execute_script("arguments[0].focus()", sel)
    sel.send_keys("waiting")
    WebDriverWait(b.d, 5).until(lambda d: d.find_element(By.ID, "live-table").get_attribute("data-count") == "1")
    b.shot("live-waiting-filter")
    sel.send_keys(Keys.HOME)
    b.d.execute_script("sessionStorage.removeItem('tidegate.console.live.state')")
    b.go("#/live")
    b.wait.until(ec.presence_of_element_located((By.ID, "row-" + w.open)))
    b.shot("live")


def test_timeline(b: Browser, api: Api, w: World) -> None:
    b.go("#/tx/" + w.fax)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "tx-body"), "Ledger events"))
    body = b.text("#tx-body")
    for want in ("fax", "gated", "unresolved", "settled", "faxer", "kv:fax:f1", "committed"):
        check(want in body, f"the timeline shows {want!r}: {body[:2000]!r}")
    b.shot("timeline-unresolved")
    b.go("#/tx/" + w.committed)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "tx-body"), "Ledger events"))
    body = b.text("#tx-body")
    for want in ("kv:ok:1", "fired", "clean", "decided: commit"):
        check(want in body, f"the committed timeline shows {want!r}: {body[:2000]!r}")
    # Linkable: a link from the live view's waits-for cell leads here.
    b.go("#/tx/" + w.waiting)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "tx-body"), "Waits for"))
    check(w.open in b.text("#tx-body"), "the waiting transaction's page names what it waits for")
    b.shot("timeline-waiting")
    # A transaction's page follows it live: begun, read, committed, without a reload.
    agent = w.keys["agent"]
    live = api.ok("POST", "/v1/transactions", agent, {"agent": "watched", "may_touch": ["kv:ok:*"], "lease_ms": 3_600_000})["id"]
    b.go("#/tx/" + live)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "tx-state"), "open"))
    b.d.execute_script("window.__noReload = 2")
    api.ok("POST", f"/v1/transactions/{live}/reads", agent, {"scope": "kv:ok:5"})
    WebDriverWait(b.d, 10).until(ec.text_to_be_present_in_element((By.ID, "tx-body"), "kv:ok:5"))
    api.ok("POST", f"/v1/transactions/{live}/commit", agent, {"seal": True, "wait_ms": 5000})
    WebDriverWait(b.d, 10).until(ec.text_to_be_present_in_element((By.ID, "tx-state"), "committed"))
    check(b.d.execute_script("return window.__noReload") == 2, "the page was not reloaded")
    b.shot("timeline-live")


def test_attention(b: Browser, api: Api, w: World) -> None:
    b.go("#/attention")
    row_id = f"att-{w.fax}-0"
    row = b.wait.until(ec.presence_of_element_located((By.ID, row_id)))
    check("unresolved" in row.text, f"the fax effect is listed unresolved: {row.text!r}")
    # Retry first: the fax line still answers 503, so the retry is recorded and resolves nothing.
    row.find_element(By.CSS_SELECTOR, "button[data-action=retry]").click()
    b.wait.until(ec.visibility_of_element_located((By.ID, "confirm")))
    b.d.find_element(By.ID, "confirm-ok").click()
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "retried release"))
    check("done" not in b.text("#message"), f"the retry did not succeed: {b.text('#message')!r}")
    row = b.wait.until(ec.presence_of_element_located((By.ID, row_id)))
    button = row.find_element(By.CSS_SELECTOR, "button[data-action=resolve]")
    b.d.execute_script("arguments[0].focus()", button)
    button.send_keys(Keys.ENTER)
    note = b.wait.until(ec.visibility_of_element_located((By.ID, "confirm-note")))
    check(b.d.switch_to.active_element == note, "the note field has focus in the dialog")
    note.send_keys("re-sent the fax by hand; the recipient confirmed")
    b.d.find_element(By.ID, "confirm-ok").click()
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "recorded in the ledger"))
    WebDriverWait(b.d, 10).until(ec.invisibility_of_element_located((By.ID, row_id)))
    check(b.d.find_element(By.ID, "error").text == "", "no error shown")
    # The ledger records it, with who did it; the attention list shows it resolved.
    att = api.ok("GET", "/v1/ledger/attention", w.keys["operator"])["data"]
    mine = [a for a in att if a["transaction"] == w.fax]
    check(mine and mine[0]["resolution"] and mine[0]["resolution"]["action"] == "resolved", f"attention: {mine}")
    ops = [e["data"]["body"] for e in api.ok("GET", "/v1/ledger/events?event=extension&limit=500", w.keys["operator"])["data"]
           if e["data"]["stream"] == "operator"]
    check([o["kind"] for o in ops] == ["retry_effect", "resolve_effect"], f"the ledger has the retry and the resolution: {ops}")
    check(w.keys["operator_id"] in mine[0]["resolution"]["by"], f"who: {mine[0]['resolution']}")
    lsn = mine[0]["resolution"]["lsn"]
    ev = api.ok("GET", f"/v1/ledger/events?after_lsn={lsn - 1}&limit=1", w.keys["operator"])["data"][0]
    check(ev["event"] == "extension" and ev["data"]["stream"] == "operator", f"the ledger record: {ev}")
    check(ev["data"]["body"]["note"].startswith("re-sent the fax"), f"the note is in the ledger: {ev}")
    # Shown resolved when resolved entries are not hidden.
    b.d.find_element(By.ID, "att-open").click()
    row = b.wait.until(ec.presence_of_element_located((By.ID, row_id)))
    check("resolved" in row.text and "re-sent the fax" in row.text, f"the resolved entry: {row.text!r}")
    b.shot("attention-resolved")
    # The stuck plan is in the owner-intervention queue; the operator sees why and accepts it
    # through the page (plans.resolve), and the ledger records who did it.
    row = b.wait.until(ec.presence_of_element_located((By.ID, "stuck-" + w.stuck_plan)))
    check("irreversible" in row.text and "mailer" in row.text, f"the stuck plan says why and whose: {row.text!r}")
    check(w.plan not in b.text("#attention-list"), "the open plan is not in the queue")
    b.go("#/plans/" + w.stuck_plan)
    regs = b.wait.until(ec.presence_of_element_located((By.ID, "plan-registrations")))
    check("not compensable" in regs.text and "ok" in regs.text, f"the gated effect is held without compensation: {regs.text!r}")
    check(b.text("#plan-state") == "stuck" and "irreversible" in b.text("#view"), f"stuck, and why: {b.text('#view')!r}")
    b.shot("plan-stuck")
    b.go("#/attention")
    row = b.wait.until(ec.presence_of_element_located((By.ID, "stuck-" + w.stuck_plan)))
    row.find_element(By.CSS_SELECTOR, "button[data-choice=accept]").click()
    b.wait.until(ec.visibility_of_element_located((By.ID, "confirm")))
    b.d.find_element(By.ID, "confirm-ok").click()
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "message"), w.stuck_plan + ": accept"))
    b.wait.until(ec.presence_of_element_located((By.ID, "stuck-plans-none")))
    check(b.d.find_element(By.ID, "error").text == "", "no error shown")
    plan = api.ok("GET", f"/v1/plans/{w.stuck_plan}", w.keys["operator"])
    check(plan["state"] == "accepted" and "stuck" not in plan, f"the plan is resolved (accepted): {plan}")
    queue = api.ok("GET", "/v1/plans/stuck", w.keys["operator"])["stuck"]
    check(all(p["id"] != w.stuck_plan for p in queue), f"the queue no longer lists it: {queue}")
    ops = [e["data"]["body"] for e in api.ok("GET", "/v1/ledger/events?event=extension&limit=500", w.keys["operator"])["data"]
           if e["data"]["stream"] == "operator" and e["data"]["body"].get("kind") == "resolve_plan"]
    check(len(ops) == 1 and ops[0]["plan"] == w.stuck_plan and ops[0]["choice"] == "accept"
          and w.keys["operator_id"] in ops[0]["by"], f"the ledger records who accepted the plan: {ops}")
    b.shot("attention-plan-accepted")


def test_review(b: Browser, api: Api, w: World, review_db: str) -> None:
    b.sign_in(w.keys["reviewer"], "reviewer")
    b.go("#/review")
    card = b.wait.until(ec.presence_of_element_located((By.ID, "rv-" + w.pay["id"])))
    text = card.text
    for want in ("INSERT INTO payment", "llm-agent-7", '"amount": 5', w.ship["id"]):
        check(want in text, f"the review card shows {want!r}: {text!r}")
    remove = card.find_element(By.CSS_SELECTOR, "button[data-action=remove]")
    b.d.execute_script("arguments[0].focus()", remove)
    remove.send_keys(Keys.ENTER)
    b.wait.until(ec.visibility_of_element_located((By.ID, "confirm")))
    cascade = [li.text for li in b.d.find_elements(By.CSS_SELECTOR, "#confirm-list li")]
    check(cascade == [w.ship["id"]], f"the confirmation names the cascade: {cascade}")
    check(b.d.switch_to.active_element.get_attribute("id") == "confirm-cancel", "Cancel has the focus first")
    b.d.switch_to.active_element.send_keys(Keys.TAB)
    check(b.d.switch_to.active_element.get_attribute("id") == "confirm-ok", "Tab reaches Confirm")
    b.shot("review-confirm")
    b.d.switch_to.active_element.send_keys(Keys.ENTER)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "also removed: " + w.ship["id"]))
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "review-summary"), "0 transaction(s) not final"))
    p = api.ok("GET", f"/v1/review/transactions/{w.pay['id']}", w.keys["agent"])
    check(p["status"] == "removed", f"payment: {p}")
    db = sqlite3.connect(review_db)
    counts = (db.execute("SELECT COUNT(*) FROM payment").fetchone()[0], db.execute("SELECT COUNT(*) FROM shipment").fetchone()[0])
    check(counts == (0, 0), f"the database holds neither the payment nor the shipment: {counts}")
    b.shot("review-removed")


def test_registry_ledger_picture_plans(b: Browser, api: Api, w: World) -> None:
    b.sign_in(w.keys["operator"], "operator")
    b.go("#/registry")
    table = b.wait.until(ec.presence_of_element_located((By.ID, "tools-table")))
    for want in ("fax", "slow", "ok", "gated", "kv:fax:{id}"):
        check(want in table.text, f"the registry shows {want!r}")
    b.shot("registry")
    b.go("#/ledger")
    b.wait.until(ec.presence_of_element_located((By.ID, "ledger-table")))
    b.d.find_element(By.ID, "lf-agent").send_keys("booker", Keys.ENTER)
    # The table is replaced when the filtered page arrives.
    WebDriverWait(b.d, 10, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: "booker" in d.find_element(By.ID, "ledger-table").text and "planner" not in d.find_element(By.ID, "ledger-table").text
    )
    rows = b.d.find_elements(By.CSS_SELECTOR, "#ledger-table tbody tr")
    txs = {r.find_elements(By.TAG_NAME, "td")[2].text for r in rows}
    check(txs == {w.waiting}, f"the agent filter keeps booker's transaction only: {txs}")
    b.d.find_element(By.ID, "ledger-export").click()
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "message"), f"Exported {len(rows)} event(s)"))
    b.shot("ledger-filtered")
    b.go("#/picture")
    totals = b.wait.until(ec.presence_of_element_located((By.ID, "picture-totals")))
    check(b.d.find_elements(By.CSS_SELECTOR, "#picture-svg polyline"), "the picture has its lines")
    check(" commit(s)" in totals.text and "abort(s)" in totals.text, f"totals: {totals.text!r}")
    commits = int(totals.text.split(" ")[0])
    check(commits >= 2, f"the picture counts this tenant's commits: {totals.text!r}")
    b.shot("picture")
    b.go("#/plans")
    table = b.wait.until(ec.presence_of_element_located((By.ID, "plans-table")))
    for plan, state, owner in ((w.plan, "open", "trip-planner"), (w.stuck_plan, "", "mailer")):
        row = b.d.find_element(By.ID, "plan-" + plan)
        check(owner in row.text and state in row.text, f"the plans list shows {plan} ({owner}, {state}): {row.text!r}")
    check("in 23 h" in b.text("#plan-" + w.plan), f"the open plan's deadline counts down: {table.text!r}")
    b.shot("plans")
    b.go("#/plans/" + w.plan)
    regs = b.wait.until(ec.presence_of_element_located((By.ID, "plan-registrations")))
    rows = regs.find_elements(By.CSS_SELECTOR, "tbody tr")
    check([r.get_attribute("data-seq") for r in rows] == ["1", "0"], f"newest registration first: {regs.text!r}")
    check(w.plan_steps[1] in rows[0].text and w.plan_steps[0] in rows[1].text, f"the unwind starts at the last step: {regs.text!r}")
    check(all("ok-call" in r.text and "held" in r.text and "externalised" in r.text for r in rows), f"held compensations: {regs.text!r}")
    steps = b.text("#plan-steps")
    check(steps.index(w.plan_steps[0]) < steps.index(w.plan_steps[1]), f"the steps in order: {steps!r}")
    check(b.text("#plan-state") == "open", "the plan is open")
    triggers = b.d.find_elements(By.CSS_SELECTOR, "#plan-triggers tbody tr")
    seen = {t.find_elements(By.TAG_NAME, "td")[0].text: t.find_elements(By.TAG_NAME, "td")[2].text for t in triggers}
    check(seen == {"deadline": "unknown", "predicate": "false"}, f"trigger values: {seen}")
    before = b.d.find_element(By.CSS_SELECTOR, "#view [data-deadline]").text
    check("in 23 h" in before, f"the deadline countdown: {before!r}")
    b.shot("plan-detail")
    b.go("#/plans/" + w.stuck_plan)
    b.wait.until(ec.presence_of_element_located((By.ID, "plan-triggers")))
    text = b.text("#view")
    check("the customer cancelled" in text and "signal" in text, f"the accepted plan says why it failed: {text!r}")
    seen = [t.find_elements(By.TAG_NAME, "td")[2].text for t in b.d.find_elements(By.CSS_SELECTOR, "#plan-triggers tbody tr")]
    check("true" in seen, f"the signal trigger reads true: {seen}")
    check(b.text("#plan-state") == "accepted" and "No compensation held" in text, f"accepting retired what was left: {text!r}")
    b.shot("plan-stuck-accepted")


def test_isolation(b: Browser, api: Api, w: World, key2: str) -> None:
    b.sign_in(key2, "admin")
    secrets = [w.open, w.waiting, w.committing, w.fax, "planner", "booker", "faxer", "llm-agent-7", "kv:hotel",
               w.plan, w.stuck_plan, "trip-planner", "mailer"]
    for view, ready in (("#/live", "live-status"), ("#/attention", "attention-list"), ("#/review", "review-summary"),
                        ("#/ledger", "ledger-out"), ("#/registry", "view"), ("#/picture", "picture-totals"),
                        ("#/plans", "plans-none")):
        b.go(view)
        b.wait.until(ec.presence_of_element_located((By.ID, ready)))
        time.sleep(0.5)
        text = b.d.find_element(By.TAG_NAME, "body").text
        for s in secrets:
            check(s not in text, f"the second tenant sees {s!r} on {view}")
        b.shot("isolation-" + view.strip("#/"))
    b.go("#/live")
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "live-status"), "0 unfinished"))
    b.go("#/tx/" + w.fax)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "404"))
    check("no transaction" in b.text("#error"), f"the first tenant's transaction is not found: {b.text('#error')!r}")
    check("faxer" not in b.text("#view") and "kv:fax" not in b.text("#view"), "nothing of it is shown")
    b.shot("isolation-tx")
    b.go("#/plans/" + w.plan)
    b.wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "404"))
    check("trip-planner" not in b.text("#view") and "kv:trip" not in b.text("#view"), "nothing of the plan is shown")


def test_roles(b: Browser, api: Api, w: World) -> None:
    # An agent: no attention list or ledger in the navigation, and the views say why.
    b.sign_in(w.keys["agent"], "agent")
    for view in ("attention", "ledger"):
        link = b.d.find_element(By.CSS_SELECTOR, f"#nav a[data-view={view}]")
        check(not link.is_displayed(), f"an agent's navigation hides {view}")
        b.go("#/" + view)
        b.wait.until(ec.text_to_be_present_in_element((By.ID, "view"), "needs the reviewer, operator or admin role"))
    b.go("#/review")
    b.wait.until(ec.presence_of_element_located((By.ID, "review-summary")))
    check(not b.d.find_elements(By.CSS_SELECTOR, "button[data-action=remove]"), "an agent cannot remove")
    b.shot("roles-agent")
    # A reviewer reads the attention list but has no resolve, retry or accept buttons.
    b.sign_in(w.keys["reviewer"], "reviewer")
    b.go("#/attention")
    b.wait.until(ec.presence_of_element_located((By.ID, "attention-list")))
    b.d.find_element(By.ID, "att-open").click()
    b.wait.until(ec.presence_of_element_located((By.ID, f"att-{w.fax}-0")))
    check(not b.d.find_elements(By.CSS_SELECTOR, "#attention-list button[data-action]"), "a reviewer has no attention actions")
    b.shot("roles-reviewer")


def test_leaving(b: Browser, w: World) -> None:
    """A page left (for about:blank here; the browser may keep it in its back-forward cache)
    ends its streams: more visits than the browser's six connections to one host, each page
    with the live view's stream open, and each visit still loads at once. Before the console
    ended its streams on `pagehide`, a load after a few such visits waited about 50 s for the
    server to end an old stream."""
    b.sign_in(w.keys["operator"], "operator")
    for i in range(8):
        b.wait.until(ec.presence_of_element_located((By.ID, "live-table")))
        b.d.get("about:blank")
        started = time.monotonic()
        b.d.get(b.base + "/console#/live")
        b.wait.until(ec.presence_of_element_located((By.ID, "live-table")))
        took = time.monotonic() - started
        check(took < 10, f"visit {i + 1}: the console took {took:.1f} s to show its live view again")


def test_axe(b: Browser, w: World) -> list[str]:
    bad: list[str] = []
    b.d.get(b.base + "/console")
    b.d.execute_script("sessionStorage.clear()")
    b.d.get("about:blank")
    b.d.get(b.base + "/console")
    b.wait.until(ec.visibility_of_element_located((By.ID, "key")))
    bad += b.axe("sign-in")
    b.sign_in(w.keys["operator"], "operator")
    for view, ready in (("#/live", "row-" + w.open), ("#/tx/" + w.fax, "tx-body"), ("#/attention", "attention-list"),
                        ("#/plans", "plans-table"), ("#/plans/" + w.plan, "plan-registrations"), ("#/registry", "tools-table"), ("#/ledger", "ledger-table"),
                        ("#/picture", "picture-totals")):
        b.go(view)
        b.wait.until(ec.presence_of_element_located((By.ID, ready)))
        time.sleep(0.3)
        bad += b.axe(view)
        text = b.d.find_element(By.ID, "view").text
        for junk in ("[object ", "undefined", "NaN", "\nnull"):
            if junk in text:
                bad.append(f"{view}: the page shows {junk.strip()!r}")
    b.sign_in(w.keys["reviewer"], "reviewer")
    b.go("#/review")
    b.wait.until(ec.presence_of_element_located((By.ID, "review-summary")))
    time.sleep(0.3)
    bad += b.axe("#/review")
    # The dialog, open.
    b.go("#/attention")
    b.sign_in(w.keys["operator"], "operator")
    b.go("#/attention")
    b.wait.until(ec.presence_of_element_located((By.ID, "attention-list")))
    b.d.find_element(By.ID, "att-open").click()
    btn = b.wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "button[data-action=accept]")))
    btn.click()
    b.wait.until(ec.visibility_of_element_located((By.ID, "confirm")))
    bad += b.axe("dialog")
    b.d.find_element(By.ID, "confirm-cancel").click()
    b.shot("axe-done")
    return bad


def test_speed(b: Browser, api: Api, key2: str) -> float:
    agent = api.ok("POST", "/v1/keys", key2, {"role": "agent", "label": "load"})["key"]

    def begin(i: int) -> None:
        api.ok("POST", "/v1/transactions", agent, {"agent": f"load-{i % 7}", "may_touch": [f"kv:load:{i}"], "lease_ms": 3_600_000})

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(begin, range(1000)))
    b.sign_in(key2, "admin")
    runs = []
    for _ in range(3):
        b.go("#/picture")
        b.wait.until(ec.presence_of_element_located((By.ID, "picture-totals")))
        started = time.monotonic()
        b.go("#/live")
        WebDriverWait(b.d, 30, poll_frequency=0.02).until(
            lambda d: (d.find_element(By.ID, "live-table").get_attribute("data-rendered") or "0") != "0"
        )
        wall = (time.monotonic() - started) * 1000
        rows = int(b.d.find_element(By.ID, "live-table").get_attribute("data-rendered"))
        dom_ms = b.d.execute_script("return window.__tidegateConsole.liveFirstRenderMs")
        paint_ms = b.d.execute_script("return window.__tidegateConsole.liveFirstPaintMs")
        check(rows >= 1000, f"the live view renders every open transaction: {rows}")
        runs.append((paint_ms, dom_ms, wall))
    b.shot("live-1000")
    runs.sort()
    paint_ms, dom_ms, wall = runs[1]
    print(f"live view with {rows} open transactions (median of 3): painted {paint_ms:.0f} ms after the route changed "
          f"(rows in the DOM at {dom_ms:.0f} ms; includes opening the stream and its snapshot); "
          f"{wall:.0f} ms as seen through WebDriver (round trips included); target <= 1000 ms; "
          f"painted per run: {', '.join(f'{r[0]:.0f}' for r in runs)} ms")
    return paint_ms


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--key", required=True, help="an admin key of the first tenant")
    ap.add_argument("--key2", required=True, help="an admin key of the second tenant")
    ap.add_argument("--review-db", required=True, help="the first tenant's review database (SQLite file)")
    ap.add_argument("--axe", required=True, help="axe.min.js")
    ap.add_argument("--chromium", required=True)
    ap.add_argument("--chromedriver", required=True)
    ap.add_argument("--out", required=True, help="directory for the screenshots")
    args = ap.parse_args()
    api = Api(args.base)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Webhooks)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hooks = f"http://127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    w = make_world(api, args.key, hooks)
    print(f"ok   world ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    b = Browser(args)
    print(f"ok   browser started ({time.monotonic() - started:.1f} s)")
    failures: list[str] = []
    tests = [
        ("live", lambda: test_live(b, api, w)),
        ("timeline", lambda: test_timeline(b, api, w)),
        ("attention", lambda: test_attention(b, api, w)),
        ("review", lambda: test_review(b, api, w, args.review_db)),
        ("registry-ledger-picture-plans", lambda: test_registry_ledger_picture_plans(b, api, w)),
        ("isolation", lambda: test_isolation(b, api, w, args.key2)),
        ("roles", lambda: test_roles(b, api, w)),
        ("leaving", lambda: test_leaving(b, w)),
    ]
    try:
        for name, t in tests:
            started = time.monotonic()
            try:
                t()
                print(f"ok   {name} ({time.monotonic() - started:.1f} s)")
            except Exception:  # noqa: BLE001 (every test runs; all failures are reported)
                b.shot("failure-" + name)
                failures.append(name + ":\n" + traceback.format_exc())
                print(f"FAIL {name}")
        started = time.monotonic()
        try:
            bad = test_axe(b, w)
            if bad:
                failures.append("axe: serious or critical violations:\n  " + "\n  ".join(bad))
                print("FAIL axe")
            else:
                print(f"ok   axe: no serious or critical violation on any view ({time.monotonic() - started:.1f} s)")
        except Exception:  # noqa: BLE001
            b.shot("failure-axe")
            failures.append("axe:\n" + traceback.format_exc())
        started = time.monotonic()
        try:
            test_speed(b, api, args.key2)
            print(f"ok   speed ({time.monotonic() - started:.1f} s)")
        except Exception:  # noqa: BLE001
            b.shot("failure-speed")
            failures.append("speed:\n" + traceback.format_exc())
    finally:
        b.quit()
        server.shutdown()
    if failures:
        print("\n\n".join(failures), file=sys.stderr)
        return 1
    print("console: every view checked - all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
