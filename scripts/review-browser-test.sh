#!/usr/bin/env bash
# The reviewer web page (`/review`, docs/server.md "Review") in headless Chromium (issue 16):
# starts a real `tidegate serve --memory` on a free loopback port whose review database is a
# SQLite file in a scratch directory, then scripts/review_browser_test.py creates a reviewer
# key, registers templates, posts suspicious requests, and in the browser signs in with the
# key, accepts one transaction and removes another (whose dependent goes with it, as the
# confirmation said), then checks the outcome through the API and in the database.
#
# Chromium and its driver come from Debian's packages `chromium` and `chromium-driver`,
# installed here with apt-get when they are missing and this runs as root (.ci/run does);
# selenium comes from PyPI, pinned in scripts/requirements-browser.txt, into its own
# environment .venv/browser/ (never the system Python).
#
#   scripts/review-browser-test.sh
#   TIDEGATE_BIN=target/release/tidegate scripts/review-browser-test.sh
#   TIDEGATE_BROWSER_SHOW=1 scripts/review-browser-test.sh    # keep the scratch dir, print its path
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python-env.sh
source scripts/python-env.sh

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
        echo "error: the reviewer-page test needs Debian's chromium and chromium-driver" \
            "(apt-get install chromium chromium-driver, as root)" >&2
        exit 1
    fi
fi

venv="$tidegate_venv/browser"
tidegate_make_venv "${PYTHON:-python3}" "$venv"
tidegate_install_requirements "$venv" "$PWD/scripts/requirements-browser.txt"

bin="${TIDEGATE_BIN:-$PWD/target/debug/tidegate}"
if [ -z "${TIDEGATE_BIN:-}" ]; then
    cargo build --quiet -p tidegate --bin tidegate
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [ -z "${TIDEGATE_BROWSER_SHOW:-}" ]; then rm -rf "$work"; else echo "kept $work" >&2; fi
}
trap cleanup EXIT

TIDEGATE_REVIEW_DATABASE="sqlite:$work/review.db" RUST_LOG="${RUST_LOG:-warn}" \
    "$bin" serve --memory --listen 127.0.0.1:0 --bootstrap-tenant browser >"$work/out" 2>"$work/err" &
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
key="$(sed -n 's/^tenant=browser role=admin key=//p' "$work/out")"
if [ -z "$addr" ] || [ -z "$key" ]; then
    echo "error: tidegate serve did not print its address and key" >&2
    cat "$work/out" "$work/err" >&2
    exit 1
fi

status=0
SE_OFFLINE=true "$venv/bin/python" scripts/review_browser_test.py --base "http://$addr" --key "$key" \
    --database "$work/review.db" --chromium "$chromium" --chromedriver "$driver" --shots "$work" || status=$?
if grep -q 'panicked' "$work/err"; then
    echo "error: the server panicked:" >&2
    grep -A5 'panicked' "$work/err" | head -40 >&2
    exit 1
fi
exit "$status"
