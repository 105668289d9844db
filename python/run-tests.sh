#!/usr/bin/env bash
# Builds and installs the `tidegate` Python package from this directory, installs the pinned
# test dependencies, and runs the Python test suites. Works on a fresh machine with Python >= 3.9,
# pip and a Rust toolchain (PyPI reachable). Called by scripts/test.sh after `cargo test`.
#
#   python/run-tests.sh            # build (release, cached in python/target) + all tests
#   python/run-tests.sh -k order   # extra arguments go to pytest
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"

# Pinned so that the LangGraph tests run against one known release of langgraph.
"$py" -m pip install --quiet --disable-pip-version-check \
    "maturin==1.16.0" "pytest==9.2.0" "hypothesis==6.170.15" \
    "langgraph==1.2.22" "langgraph-prebuilt==1.1.2" "langgraph-checkpoint==4.3.2" \
    "langgraph-checkpoint-sqlite==3.1.2" "langchain-core==1.7.2"

# The wheel build reuses python/target between runs, so only the first build is slow.
"$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$here"

# Run from a directory that does not contain the source package, so the installed one is tested.
cd "$here/tests"
exec "$py" -m pytest -q -p no:cacheprovider "$@" .
