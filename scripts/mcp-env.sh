# Shell functions shared by the MCP gateway's test scripts (scripts/mcp-test.sh,
# scripts/mcp-conformance.sh). Everything installs into the project's folder: npm packages
# under the directory holding their package-lock.json, Python packages into .venv/mcp/.
source "$(dirname "${BASH_SOURCE[0]}")/python-env.sh"

# `npm ci` in $1 unless its node_modules already match its package-lock.json.
tidegate_npm_ci() {
    local dir="$1"
    if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.package-lock.json.installed" 2>/dev/null; then
        npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
        cp "$dir/package-lock.json" "$dir/node_modules/.package-lock.json.installed"
    fi
}

# The test environment .venv/mcp/ ($tidegate_mcp_venv), the gateway's binary
# ($TIDEGATE_MCP_BIN) and the server's ($TIDEGATE_BIN), built here in debug unless already set.
tidegate_mcp_env() {
    tidegate_mcp_venv="$tidegate_venv/mcp"
    tidegate_make_venv python3 "$tidegate_mcp_venv"
    tidegate_install_requirements "$tidegate_mcp_venv" "$tidegate_root/crates/mcp/tests/py/requirements.txt"
    if [ -z "${TIDEGATE_MCP_BIN:-}" ]; then
        (cd "$tidegate_root" && cargo build -q -p tidegate-mcp)
        TIDEGATE_MCP_BIN="$tidegate_root/target/debug/tidegate-mcp"
    fi
    # The attached mode's tests run a real `tidegate serve`.
    if [ -z "${TIDEGATE_BIN:-}" ]; then
        (cd "$tidegate_root" && cargo build -q -p tidegate)
        TIDEGATE_BIN="$tidegate_root/target/debug/tidegate"
    fi
    export TIDEGATE_MCP_BIN TIDEGATE_BIN
}
