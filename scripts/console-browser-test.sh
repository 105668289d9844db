#!/usr/bin/env bash
# The operator console (`/console`, docs/console.md) in headless Chromium (issue 17): starts a
# real `tidegate serve` on a scratch data directory with two tenants, then
# scripts/console_browser_test.py makes real agents (HTTP calls) produce every state the console
# shows — open, waiting (on an earlier overlapping transaction), committing, an unresolved
# effect, buffered review transactions — and checks each view in the browser: the live view
# (updated by the tenant stream), a transaction's timeline, the attention queue (an operator
# resolves the unresolved effect; the ledger records it), the review queue (a reviewer removes a
# buffered transaction; the database shows it gone), registry, ledger browser and export, the
# picture, plans; a second tenant's key sees none of it; axe-core finds no serious or critical
# violation on any view; and the live view's render time with 1,000 open transactions is
# reported. Each test saves a screenshot under the output directory.
#
# Chromium and its driver come from Debian's packages `chromium` and `chromium-driver` (installed
# here with apt-get when missing and run as root); selenium from PyPI into .venv/browser/
# (scripts/requirements-browser.txt); axe-core from npm, pinned below, into .venv/axe/ (the
# test injects it into the page; nothing is fetched by the page itself).
#
#   scripts/console-browser-test.sh
#   TIDEGATE_BIN=target/release/tidegate scripts/console-browser-test.sh
#   TIDEGATE_CONSOLE_OUT=/tmp/shots scripts/console-browser-test.sh   # where screenshots go
#                                               (default target/console-browser-test/)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python-env.sh
source scripts/python-env.sh

AXE_VERSION=4.10.2

chromium="${TIDEGATE_CHROMIUM:-$(command -v chromium || true)}"
driver="${TIDEGATE_CHROMEDRIVER:-$(command -v chromedriver || true)}"
if [ -z "$chromium" ] || [ -z "$driver" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing Debian's chromium and chromium-driver" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
        chromium="$(command -v chromium)"
        driver="$(command -v chromedriver)"
    else
        echo "error: the console test needs Debian's chromium and chromium-driver" \
            "(apt-get install chromium chromium-driver, as root)" >&2
        exit 1
    fi
fi

venv="$tidegate_venv/browser"
tidegate_make_venv "${PYTHON:-python3}" "$venv"
tidegate_install_requirements "$venv" "$PWD/scripts/requirements-browser.txt"

axe_dir="$tidegate_venv/axe"
axe="$axe_dir/node_modules/axe-core/axe.min.js"
if ! grep -qs "\"version\": \"$AXE_VERSION\"" "$axe_dir/node_modules/axe-core/package.json"; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "error: the console test needs npm to install axe-core $AXE_VERSION into $axe_dir" >&2
        exit 1
    fi
    mkdir -p "$axe_dir"
    npm install --prefix "$axe_dir" --no-audit --no-fund --silent "axe-core@$AXE_VERSION"
fi

bin="${TIDEGATE_BIN:-$PWD/target/debug/tidegate}"
if [ -z "${TIDEGATE_BIN:-}" ]; then
    cargo build --quiet -p tidegate --bin tidegate
fi

out="${TIDEGATE_CONSOLE_OUT:-$PWD/target/console-browser-test}"
rm -rf "$out"
mkdir -p "$out"
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

data="$work/data"
# The second tenant and its admin key, made on the data directory before the server starts.
"$bin" tenant create --data-dir "$data" second >/dev/null
key2="$("$bin" key create --data-dir "$data" --tenant second --role admin 2>/dev/null)"

RUST_LOG="${RUST_LOG:-warn}" TIDEGATE_ENGINE_LEASE_MS=600000 \
    "$bin" serve --data-dir "$data" --listen 127.0.0.1:0 --bootstrap-tenant first >"$work/out" 2>"$work/err" &
server_pid=$!
for _ in $(seq 1 300); do
    grep -q '^listening on ' "$work/out" 2>/dev/null && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "error: tidegate serve exited:" >&2
        cat "$work/err" >&2
        exit 1
    fi
    sleep 0.1
done
addr="$(sed -n 's/^listening on //p' "$work/out")"
key="$(sed -n 's/^tenant=first role=admin key=//p' "$work/out")"
if [ -z "$addr" ] || [ -z "$key" ] || [ -z "$key2" ]; then
    echo "error: tidegate serve did not print its address and key" >&2
    cat "$work/out" "$work/err" >&2
    exit 1
fi

status=0
SE_OFFLINE=true "$venv/bin/python" scripts/console_browser_test.py --base "http://$addr" --key "$key" --key2 "$key2" \
    --review-db "$data/tenants/first/review.db" --axe "$axe" \
    --chromium "$chromium" --chromedriver "$driver" --out "$out" || status=$?
if grep -q 'panicked' "$work/err"; then
    echo "error: the server panicked:" >&2
    grep -A5 'panicked' "$work/err" | head -40 >&2
    exit 1
fi
echo "screenshots: $out" >&2
exit "$status"
