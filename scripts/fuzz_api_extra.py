"""Hand-written hostile requests for scripts/fuzz-api.sh: every operation of the server's
OpenAPI document that takes a body gets malformed JSON, an oversized body, unknown fields,
wrong types, other media types and odd path segments; every answer must be a 4xx
`application/problem+json` document whose `status` is the HTTP status (never a 5xx, never a
dropped connection). Standard library only. Exits 1 listing every violation."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

Violation = str


class Client:
    def __init__(self, base: str, key: str) -> None:
        u = urllib.parse.urlsplit(base)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.key = key

    def send(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        content_type: Optional[str] = "application/json",
        auth: bool = True,
    ) -> Tuple[int, Dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        headers = {}
        if auth:
            headers["Authorization"] = f"Bearer {self.key}"
        if body is not None and content_type is not None:
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        raw = None if body is None else json.dumps(body).encode()
        status, _, data = self.send(method, path, raw)
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, data


def fixtures(c: Client) -> Dict[str, str]:
    """A capability of each kind, tools, an open transaction: real ids for path parameters."""
    made: Dict[str, str] = {}
    for name, spec in [
        ("fz-hook", {"kind": "webhook", "url": "http://127.0.0.1:9/", "attempts": 1, "timeout_ms": 500}),
        ("fz-worker", {"kind": "worker", "task_lease_ms": 1000, "deadline_ms": 2000}),
    ]:
        s, b = c.json("PUT", f"/v1/capabilities/{name}", spec)
        assert s in (200, 201), (name, s, b)
    for name, tool in [
        ("fz-gated", {"class": "gated", "scopes": ["kv:fz:{id}"], "call": "fz-hook"}),
        ("fz-staged", {"class": "bufferable", "scopes": ["kv:fz:{id}"], "call": "fz-hook"}),
    ]:
        s, b = c.json("PUT", f"/v1/tools/{name}", tool)
        assert s in (200, 201), (name, s, b)
    s, b = c.json("POST", "/v1/transactions", {"agent": "fuzz"})
    assert s == 201, (s, b)
    made["tx"] = b["id"]
    s, b = c.json("POST", "/v1/groups", {"branches": 2})
    assert s == 201, (s, b)
    made["group"] = b["id"]
    s, b = c.json("POST", "/v1/keys", {"role": "agent", "label": "fuzz"})
    assert s == 201, (s, b)
    made["key"] = b["id"]
    made["name"] = "fz-gated"
    made["task"] = "task_00000000_1"
    return made


def check(violations: List[Violation], what: str, status: int, headers: Dict[str, str], data: bytes) -> None:
    if status >= 500:
        violations.append(f"{what}: {status} {data[:300]!r}")
        return
    if status < 400:
        violations.append(f"{what}: accepted with {status} {data[:200]!r}")
        return
    ct = headers.get("content-type", "")
    if not ct.startswith("application/problem+json"):
        violations.append(f"{what}: {status} with content type {ct!r}")
        return
    try:
        doc = json.loads(data)
    except ValueError:
        violations.append(f"{what}: {status} body is not JSON: {data[:200]!r}")
        return
    for member in ("type", "title", "status", "detail", "code", "retryable"):
        if member not in doc:
            violations.append(f"{what}: problem document without `{member}`: {doc}")
    if doc.get("status") != status:
        violations.append(f"{what}: problem status {doc.get('status')} != HTTP {status}")


def wrong_value(schema: Dict[str, Any], spec: Dict[str, Any]) -> Any:
    """A value of a type the property's schema does not allow."""
    if "$ref" in schema:
        schema = resolve(spec, schema["$ref"])
    types = schema.get("type")
    if isinstance(types, str):
        types = [types]
    types = types or []
    if "object" in types or "properties" in schema or "oneOf" in schema:
        return "not-an-object"
    if "integer" in types or "number" in types:
        return "soon"
    if "boolean" in types:
        return "yes"
    if "array" in types:
        return {"not": "an array"}
    if "string" in types:
        return [1, 2]
    return None


def resolve(spec: Dict[str, Any], ref: str) -> Dict[str, Any]:
    node: Any = spec
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node  # type: ignore[no-any-return]


def body_schema(spec: Dict[str, Any], op: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    rb = op.get("requestBody")
    if not rb:
        return None
    schema = rb.get("content", {}).get("application/json", {}).get("schema")
    if schema and "$ref" in schema:
        schema = resolve(spec, schema["$ref"])
    return schema


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--max-body", type=int, required=True)
    a = ap.parse_args()
    c = Client(a.base, a.key)
    s, _, data = c.send("GET", "/v1/openapi.json", auth=False)
    assert s == 200, s
    spec = json.loads(data)
    ids = fixtures(c)
    violations: List[Violation] = []
    cases = 0

    def path_for(template: str) -> str:
        out = template
        for param in ("tx", "group", "key", "name", "task"):
            out = out.replace("{" + param + "}", ids[param])
        return out

    for template, ops in spec["paths"].items():
        for method, op in ops.items():
            schema = body_schema(spec, op)
            if schema is None:
                continue
            m, path = method.upper(), path_for(template)
            bodies: List[Tuple[str, bytes, Optional[str]]] = [
                ("malformed JSON", b'{"agent": ', "application/json"),
                ("trailing garbage", b"{} {}", "application/json"),
                ("invalid UTF-8", b'{"agent": "\xff\xfe"}', "application/json"),
                ("JSON array", b"[]", "application/json"),
                ("JSON string", b'"x"', "application/json"),
                ("JSON null", b"null", "application/json"),
                ("huge number", b'{"lease_ms": 1e999}', "application/json"),
                ("deep nesting", b"[" * 5000 + b"]" * 5000, "application/json"),
                ("oversized", b'{"agent": "' + b"a" * (a.max_body + 1) + b'"}', "application/json"),
                ("text/plain", b"{}", "text/plain"),
                ("form", b"a=1", "application/x-www-form-urlencoded"),
                ("no content type", b"{}", None),
                ("unknown field", json.dumps({"zz_unknown_field": 1}).encode(), "application/json"),
            ]
            for prop, ps in (schema.get("properties") or {}).items():
                bodies.append((f"wrong type of `{prop}`", json.dumps({prop: wrong_value(ps, spec)}).encode(), "application/json"))
            for label, raw, ct in bodies:
                cases += 1
                what = f"{m} {template} [{label}]"
                try:
                    st, hd, data = c.send(m, path, raw, ct)
                except (OSError, http.client.HTTPException) as e:
                    violations.append(f"{what}: connection failed: {e!r}")
                    continue
                check(violations, what, st, hd, data)
                if label == "unknown field" and not schema.get("required") and "oneOf" not in schema and "zz_unknown_field" not in data.decode(errors="replace"):
                    violations.append(f"{what}: the problem does not name the unknown field: {data[:300]!r}")

    # Odd path segments and query strings on every operation (no body).
    odd = ["%00", "x" * 5000, "tx_zzzzzzzz_1", "tx_" + "9" * 40, "%E2%98%83", "..", "a%2Fb"]
    for template, ops in spec["paths"].items():
        if "{" not in template:
            continue
        for method in ops:
            for seg in odd:
                path = template
                for param in ("tx", "group", "key", "name", "task"):
                    path = path.replace("{" + param + "}", seg)
                cases += 1
                what = f"{method.upper()} {template} [segment {seg[:20]!r}]"
                body = b"{}" if method in ("post", "put") else None
                try:
                    st, hd, data = c.send(method.upper(), path, body)
                except (OSError, http.client.HTTPException) as e:
                    violations.append(f"{what}: connection failed: {e!r}")
                    continue
                check(violations, what, st, hd, data)
    for q in ["?limit=-1", "?limit=x", "?limit=99999999999999999999", "?cursor=%FF", "?zz=1", "?state=nope"]:
        for path in ["/v1/transactions", "/v1/ledger/events", "/v1/ledger/attention"]:
            cases += 1
            st, hd, data = c.send("GET", path + q)
            check(violations, f"GET {path}{q}", st, hd, data)

    print(f"fuzz_api_extra: {cases} hostile requests, {len(violations)} violations")
    for v in violations:
        print("  " + v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
