#!/usr/bin/env bash
# API fuzzing of `tidegate serve` (issue 14, "How it is checked"): schemathesis, from PyPI,
# pinned in scripts/requirements-fuzz.txt and installed into its own environment .venv/fuzz/
# (never the system Python), runs every operation of /v1/openapi.json against a
# `tidegate serve --memory` started here on a free loopback port with an admin key of a
# bootstrap tenant. Its checks: no 5xx, every response conforms to the document (status,
# content type, headers, schema), invalid requests are refused. Then
# scripts/fuzz_api_extra.py sends malformed JSON, oversized bodies, unknown fields, wrong
# types, wrong media types and bad paths to every operation with a body, and asks for
# 4xx problem documents.
#
#   scripts/fuzz-api.sh                                  # bounded default (under a minute)
#   TIDEGATE_FUZZ_EXAMPLES=500 TIDEGATE_FUZZ_SECONDS=1800 scripts/fuzz-api.sh   # the long run
#   TIDEGATE_FUZZ_SEED=7 scripts/fuzz-api.sh             # another seed (default 1)
#   TIDEGATE_BIN=target/release/tidegate scripts/fuzz-api.sh
#
# Extra arguments go to `schemathesis run`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python-env.sh
source scripts/python-env.sh
venv="$tidegate_venv/fuzz"
# CPython 3.11.7 trips over hypothesis's lambda introspection ("AST constructor recursion
# depth mismatch", a CPython bug): prefer 3.13 when this machine has it.
py="${TIDEGATE_FUZZ_PYTHON:-$(tidegate_find_python 3.13 || command -v python3)}"
tidegate_make_venv "$py" "$venv"
tidegate_install_requirements "$venv" "$PWD/scripts/requirements-fuzz.txt"

bin="${TIDEGATE_BIN:-$PWD/target/debug/tidegate}"
if [ -z "${TIDEGATE_BIN:-}" ]; then
    cargo build --quiet -p tidegate --bin tidegate
fi
examples="${TIDEGATE_FUZZ_EXAMPLES:-25}"
seconds="${TIDEGATE_FUZZ_SECONDS:-45}"
seed="${TIDEGATE_FUZZ_SEED:-1}"

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# A small body limit so that "oversized" is cheap to send; event streams (the tenant-wide
# `/v1/transactions/stream` answers any valid key) end after 2 s, and long polls and commit
# waits (`wait_ms`, default 30 s: a task poll with no task to give blocks that long) last at
# most 2 s, within the request timeout.
TIDEGATE_LIMITS_MAX_BODY_BYTES=65536 TIDEGATE_LIMITS_MAX_SSE_MS=2000 TIDEGATE_LIMITS_MAX_WAIT_MS=2000 \
    RUST_LOG="${RUST_LOG:-warn}" \
    "$bin" serve --memory --listen 127.0.0.1:0 --bootstrap-tenant fuzz >"$work/out" 2>"$work/err" &
server_pid=$!
for _ in $(seq 1 200); do
    grep -q '^listening on ' "$work/out" 2>/dev/null && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "error: tidegate serve exited:" >&2
        cat "$work/err" >&2
        exit 1
    fi
    sleep 0.1
done
addr="$(sed -n 's/^listening on //p' "$work/out")"
key="$(sed -n 's/^tenant=fuzz role=admin key=//p' "$work/out")"
if [ -z "$addr" ] || [ -z "$key" ]; then
    echo "error: tidegate serve did not print its address and key" >&2
    cat "$work/out" "$work/err" >&2
    exit 1
fi
base="http://$addr"
echo "fuzzing $base (schemathesis: $examples examples per operation, at most $seconds s, seed $seed)"

# Fixtures (a webhook capability that refuses connections, a worker capability, tools, a
# transaction) so that some generated requests reach the handlers' deeper paths, then the
# hand-written malformed requests.
status=0
"$venv/bin/python" scripts/fuzz_api_extra.py --base "$base" --key "$key" --max-body 65536 || status=$?

# From the scratch directory: schemathesis keeps its cache in ./.schemathesis/.
(cd "$work" && "$venv/bin/schemathesis" run "$base/v1/openapi.json" \
    -H "Authorization: Bearer $key" \
    --checks all \
    --exclude-checks positive_data_acceptance \
    --phases examples,coverage,fuzzing,stateful \
    --max-examples "$examples" --max-time "$seconds" --seed "$seed" \
    --request-timeout 20 --workers 2 --suppress-health-check all \
    --warnings off --no-color "$@") || status=$?

if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "error: tidegate serve died during the run:" >&2
    tail -50 "$work/err" >&2
    exit 1
fi
if grep -q 'panicked' "$work/err"; then
    echo "error: the server panicked:" >&2
    grep -A5 'panicked' "$work/err" | head -40 >&2
    exit 1
fi
exit "$status"
