#!/usr/bin/env bash
# The MCP gateway's protocol tests: the official Python SDK (`mcp`, in .venv/mcp/) as the
# client of a real `tidegate-mcp`, in front of real upstream servers installed from npm into
# crates/mcp/tests/npm/node_modules (@modelcontextprotocol/server-memory and
# server-filesystem, pinned by its package-lock.json) and an upstream written in the suite
# (crates/mcp/tests/py/log_upstream.py) whose append-only log is the ground truth.
#
#   bash scripts/mcp-test.sh            # builds target/debug/tidegate-mcp unless TIDEGATE_MCP_BIN is set
#   bash scripts/mcp-test.sh -k race    # pytest arguments pass through
#   TIDEGATE_MCP_TEST_WORKERS=1 bash scripts/mcp-test.sh   # one process (default 4)
#
# The tests run in four pytest-xdist processes: most of the suite's time is spent waiting for
# leases to end and processes to die, so several run side by side (on the 2-core machine about
# 50 s with four, 63 s with two, 80 s with one). Every test starts its own gateway, servers
# and directories.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mcp-env.sh

npm_dir=crates/mcp/tests/npm
tidegate_npm_ci "$npm_dir"
tidegate_mcp_env
export TIDEGATE_MCP_NPM="$PWD/$npm_dir/node_modules/.bin"
xdist="$(tidegate_xdist_args TIDEGATE_MCP_TEST_WORKERS 4)" || exit 2
read -r -a parallel <<<"$xdist"
exec "$tidegate_mcp_venv/bin/python" -m pytest -q -p no:cacheprovider "${parallel[@]}" crates/mcp/tests/py "$@"
