#!/usr/bin/env bash
# The project's test command (README "Quick start"): the Rust workspace, then the Python
# package in the repository's own virtual environment (.venv/, created on first use; the
# system Python is never installed into). .ci/run runs the same command.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall-clock time, printed when the run ends (passed or not), so a slow run says
# where its time went.
stages=()
run_started=$SECONDS
stage() {
    local name=$1 started=$SECONDS
    shift
    "$@"
    stages+=("$(printf '%6ds  %s' $((SECONDS - started)) "$name")")
}
report_stages() {
    local rc=$?
    echo "== test stages (wall clock; exit $rc)"
    printf '%s\n' "${stages[@]}"
    printf '%6ds  total\n' $((SECONDS - run_started))
}
trap report_stages EXIT
stage "build the workspace's tests" cargo test --workspace --no-run
# cargo-nextest (on the project's machines) runs every test binary's tests side by side, each in
# its own process, four at a time (.config/nextest.toml), instead of one binary after the other
# (about 105 s instead of 220 s on the 2-core machine); it does not run doctests, so they run
# after it. Without nextest, cargo test.
if cargo nextest --version >/dev/null 2>&1; then
    stage "cargo nextest run --workspace" cargo nextest run --workspace --no-fail-fast
    stage "cargo test --workspace --doc" cargo test --workspace --doc
else
    echo "cargo-nextest not found: running the tests with cargo test (slower)" >&2
    stage "cargo test --workspace" cargo test --workspace
fi
# The binaries the workspace tests built (with the test build's features; a plain `cargo
# build` of them would compile half the workspace again with other features): the Python
# tests check their trace with the CLI, the MCP tests run the gateway and the server.
export TIDEGATE_BIN="$PWD/target/debug/tidegate"
export TIDEGATE_MCP_BIN="$PWD/target/debug/tidegate-mcp"
if [ -f python/run-tests.sh ]; then
    # The binding's own Rust unit tests (error mapping); the extension module is not linked here.
    stage "python binding unit tests" bash -c 'cd python && CARGO_TARGET_DIR=../target cargo test --lib --quiet'
    stage "python package (wheel build + pytest)" bash python/run-tests.sh
fi
# The MCP gateway: the official Python SDK (`mcp`, into .venv/mcp/) as the client of a real
# `tidegate-mcp` in front of @modelcontextprotocol/server-memory and server-filesystem (npm,
# into crates/mcp/tests/npm/), the suite's own upstreams and a `tidegate serve` for the
# attached mode (about 3 min on this 2-core machine).
stage "mcp gateway tests" bash scripts/mcp-test.sh
# The MCP conformance suite's server scenarios against the gateway (npm, into
# crates/mcp/tests/conformance/; under 10 s once installed).
stage "mcp conformance" bash scripts/mcp-conformance.sh
# API fuzzing against a real `tidegate serve --memory` (about 50 s; the longer run is in the
# script's header).
stage "api fuzzing" env TIDEGATE_BIN="$TIDEGATE_BIN" bash scripts/fuzz-api.sh
# The reviewer web page in headless Chromium (Debian's chromium and chromium-driver, installed
# by the script when missing and run as root; selenium in .venv/browser/; about 20 s).
stage "reviewer page in chromium" env TIDEGATE_BIN="$TIDEGATE_BIN" bash scripts/review-browser-test.sh
# The operator console in headless Chromium: two tenants, real agents, every view, axe-core
# (npm, into .venv/axe/), the live view's render time with 1,000 open transactions (about 60 s).
stage "console in chromium" env TIDEGATE_BIN="$TIDEGATE_BIN" bash scripts/console-browser-test.sh
