#!/usr/bin/env bash
# The Python package on the oldest and newest supported CPython (3.10 and 3.13), a separate
# command from the default test run (scripts/test.sh tests the main interpreter only). The
# interpreters are looked for on PATH and under pyenv; missing ones are installed by uv (from
# PyPI, into .venv/) with `uv python install`, which keeps them in uv's own directory
# (~/.local/share/uv/python), never in the system. About 4 minutes per interpreter.
#
#   bash scripts/test-python-versions.sh
#   TIDEGATE_BIN=target/debug/tidegate bash scripts/test-python-versions.sh   # a built CLI
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python-env.sh
source scripts/python-env.sh
missing=()
for v in $TIDEGATE_SUPPORTED_PYTHONS; do
    tidegate_find_python "$v" >/dev/null || missing+=("$v")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing CPython ${missing[*]} with uv" >&2
    tidegate_make_venv python3 "$tidegate_venv"
    tidegate_install_requirements "$tidegate_venv" scripts/requirements-ci.txt
    "$tidegate_venv/bin/uv" python install "${missing[@]}"
fi
if [ -z "${TIDEGATE_BIN:-}" ]; then
    cargo build -p tidegate
    export TIDEGATE_BIN="$PWD/target/debug/tidegate"
fi
TIDEGATE_PYTHON_VERSIONS="$TIDEGATE_SUPPORTED_PYTHONS" TIDEGATE_REQUIRE_PYTHON_VERSIONS=1 TIDEGATE_PYTHON_MAIN=0 \
    bash python/run-tests.sh
