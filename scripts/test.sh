#!/usr/bin/env bash
# The project's test command (README "Quick start"): the Rust workspace, then the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
if [ -f python/run-tests.sh ]; then
    bash python/run-tests.sh
fi
