#!/usr/bin/env bash
# The MCP gateway's protocol tests: the official Python SDK (`mcp`, in .venv/mcp/) as the
# client of a real `tidegate-mcp`, in front of real upstream servers installed from npm into
# crates/mcp/tests/npm/node_modules (@modelcontextprotocol/server-memory and
# server-filesystem, pinned by its package-lock.json) and an upstream written in the suite
# (crates/mcp/tests/py/log_upstream.py) whose append-only log is the ground truth.
#
#   bash scripts/mcp-test.sh            # builds target/debug/tidegate-mcp unless TIDEGATE_MCP_BIN is set
#   bash scripts/mcp-test.sh -k race    # pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mcp-env.sh

npm_dir=crates/mcp/tests/npm
tidegate_npm_ci "$npm_dir"
tidegate_mcp_env
export TIDEGATE_MCP_NPM="$PWD/$npm_dir/node_modules/.bin"
exec "$tidegate_mcp_venv/bin/python" -m pytest -q -p no:cacheprovider crates/mcp/tests/py "$@"
