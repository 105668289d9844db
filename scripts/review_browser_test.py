"""The reviewer page in headless Chromium (run by scripts/review-browser-test.sh).

Against a running `tidegate serve`: creates a reviewer key and an agent key with the tenant's
admin key, registers a bank's templates with their schema, posts suspicious requests (a
withdrawal; a payment with a shipment that builds on it), then in the browser signs in with the
reviewer key, accepts the withdrawal and removes the payment after checking that the
confirmation names the shipment it takes along, using the keyboard for the removal. Finally the
outcome is checked through the API and in the review database itself.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

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
            with urllib.request.urlopen(req, timeout=30) as r:
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--key", required=True, help="an admin key of the tenant")
    ap.add_argument("--database", required=True, help="the tenant's review database (SQLite file)")
    ap.add_argument("--chromium", required=True)
    ap.add_argument("--chromedriver", required=True)
    ap.add_argument("--shots", help="directory for a screenshot when a step fails")
    args = ap.parse_args()
    api = Api(args.base)

    reviewer = api.ok("POST", "/v1/keys", args.key, {"role": "reviewer", "label": "browser"})["key"]
    agent = api.ok("POST", "/v1/keys", args.key, {"role": "agent", "label": "llm"})["key"]
    api.ok("POST", "/v1/review/templates", args.key, {"set": SET, "schema": SCHEMA})

    def request(template: str, params: dict, suspicious: bool) -> dict:
        body = {"template": template, "params": params, "sender": "llm-agent-7", "suspicious": suspicious}
        return api.ok("POST", "/v1/review/transactions", agent, body)

    withdraw = request("withdraw", {"id": 1, "amount": 70}, True)
    pay = request("pay", {"order_id": 9, "amount": 5}, True)
    ship = request("ship", {"order_id": 9}, False)
    check(withdraw["status"] == "awaiting_review", f"withdraw: {withdraw}")
    check(ship["status"] == "held" and ship["waits_for"] == [pay["id"]], f"ship: {ship}")

    opts = Options()
    opts.binary_location = args.chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=args.chromedriver), options=opts)
    try:
        run_browser(driver, args.base, reviewer, withdraw, pay, ship)
    except Exception:
        if args.shots:
            driver.save_screenshot(args.shots + "/failure.png")
        raise
    finally:
        driver.quit()

    # Through the API.
    w = api.ok("GET", f"/v1/review/transactions/{withdraw['id']}", agent)
    p = api.ok("GET", f"/v1/review/transactions/{pay['id']}", agent)
    s = api.ok("GET", f"/v1/review/transactions/{ship['id']}", agent)
    check((w["status"], w["review"]) == ("committed", "accept"), f"withdraw after review: {w}")
    check((p["status"], p["review"]) == ("removed", "remove"), f"payment after review: {p}")
    check((s["status"], s["cascaded_from"]) == ("removed", pay["id"]), f"shipment after review: {s}")
    queue = api.ok("GET", "/v1/review/queue", reviewer)
    check(queue["total"] == 0, f"queue after review: {queue}")

    # In the database.
    db = sqlite3.connect(args.database)
    balance = db.execute("SELECT balance FROM account WHERE id = 1").fetchone()[0]
    check(balance == 30, f"the accepted withdrawal ran once: balance {balance}, expected 30")
    payments = db.execute("SELECT COUNT(*) FROM payment").fetchone()[0]
    shipments = db.execute("SELECT COUNT(*) FROM shipment").fetchone()[0]
    check((payments, shipments) == (0, 0), f"removed transactions never ran: {payments} payments, {shipments} shipments")
    print("reviewer page: accepted", withdraw["id"], "and removed", pay["id"], "with", ship["id"], "- all checks passed")
    return 0


def run_browser(driver: webdriver.Chrome, base: str, reviewer: str, withdraw: dict, pay: dict, ship: dict) -> None:
    wait = WebDriverWait(driver, 20)
    driver.get(base + "/review")
    # Sign in with the keyboard: the key field has focus on load.
    key = wait.until(ec.visibility_of_element_located((By.ID, "key")))
    check(driver.switch_to.active_element == key, "the key field has focus on load")
    key.send_keys(reviewer, Keys.ENTER)
    wait.until(ec.text_to_be_present_in_element((By.ID, "who"), "as reviewer"))
    wait.until(ec.presence_of_element_located((By.ID, "tx-" + withdraw["id"])))

    item = driver.find_element(By.ID, "tx-" + withdraw["id"])
    text = item.text
    for want in ("UPDATE account SET balance = balance - :amount WHERE id = :id", "llm-agent-7", '"amount": 70'):
        check(want in text, f"the queue shows {want!r}: {text!r}")
    pay_item = driver.find_element(By.ID, "tx-" + pay["id"])
    check(ship["id"] in pay_item.text, f"the payment shows what waits on it: {pay_item.text!r}")
    check(driver.find_element(By.ID, "tx-" + ship["id"]).get_attribute("data-status") == "held", "shipment held")

    # Accept the withdrawal with the mouse.
    item.find_element(By.CSS_SELECTOR, "button[data-action=accept]").click()
    dialog = wait.until(ec.visibility_of_element_located((By.ID, "confirm")))
    check("Accept " + withdraw["id"] in dialog.text, f"accept dialog: {dialog.text!r}")
    driver.find_element(By.ID, "confirm-ok").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "message"), withdraw["id"] + " is now committed"))
    wait.until(ec.invisibility_of_element_located((By.ID, "tx-" + withdraw["id"])))

    # Remove the payment with the keyboard only: focus its button, Enter; in the dialog the
    # focus starts on Cancel, Tab moves to Confirm, Enter confirms.
    remove = driver.find_element(By.CSS_SELECTOR, f"#tx-{pay['id']} button[data-action=remove]")
    driver.execute_script("arguments[0].focus()", remove)
    check(driver.switch_to.active_element == remove, "the remove button takes the focus")
    remove.send_keys(Keys.ENTER)
    dialog = wait.until(ec.visibility_of_element_located((By.ID, "confirm")))
    cascade = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#confirm-cascade li")]
    check(cascade == [ship["id"]], f"the confirmation names the cascade {ship['id']}: {cascade} / {dialog.text!r}")
    check(driver.switch_to.active_element.get_attribute("id") == "confirm-cancel", "Cancel has the focus first")
    driver.switch_to.active_element.send_keys(Keys.TAB)
    check(driver.switch_to.active_element.get_attribute("id") == "confirm-ok", "Tab reaches Confirm")
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    wait.until(ec.text_to_be_present_in_element((By.ID, "message"), "also removed: " + ship["id"]))
    wait.until(ec.text_to_be_present_in_element((By.ID, "summary"), "0 transaction(s) not final"))
    check(driver.find_element(By.ID, "error").text == "", "no error shown")


if __name__ == "__main__":
    sys.exit(main())
