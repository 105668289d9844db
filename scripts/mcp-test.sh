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
source scripts/python-env.sh

npm_dir=crates/mcp/tests/npm
if ! cmp -s "$npm_dir/package-lock.json" "$npm_dir/node_modules/.package-lock.json.installed" 2>/dev/null; then
    npm ci --prefix "$npm_dir" --no-audit --no-fund --loglevel=error
    cp "$npm_dir/package-lock.json" "$npm_dir/node_modules/.package-lock.json.installed"
fi

venv="$tidegate_venv/mcp"
tidegate_make_venv python3 "$venv"
tidegate_install_requirements "$venv" crates/mcp/tests/py/requirements.txt

if [ -z "${TIDEGATE_MCP_BIN:-}" ]; then
    cargo build -q -p tidegate-mcp
    export TIDEGATE_MCP_BIN="$PWD/target/debug/tidegate-mcp"
fi
export TIDEGATE_MCP_NPM="$PWD/$npm_dir/node_modules/.bin"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider crates/mcp/tests/py "$@"
