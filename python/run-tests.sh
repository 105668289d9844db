#!/usr/bin/env bash
# Builds and tests the `tidegate` Python package in the repository's own virtual environments
# (never the system Python): .venv/ at the repository root is created on first use and reused,
# the pinned dependencies are installed into it when python/requirements-*.txt change, the
# wheel is built (a dev build by default, in the repository's target/ beside the binding's unit
# tests, whose compiled crates it reuses; TIDEGATE_WHEEL_PROFILE=release for an optimised one,
# in python/target) and installed, and pytest runs from it. Then the same wheel is tested on
# each CPython named in $TIDEGATE_PYTHON_VERSIONS (none by default;
# scripts/test-python-versions.sh names the oldest and newest supported, 3.10 and 3.13; see
# scripts/python-env.sh for where it looks), each in its own environment under .venv/versions/.
#
#   python/run-tests.sh              # the main interpreter (called by scripts/test.sh)
#   python/run-tests.sh -k order     # extra arguments go to pytest (main interpreter only)
#   PYTHON=python3.12 python/run-tests.sh     # another main interpreter (for a new .venv/)
#   TIDEGATE_PYTHON_VERSIONS="3.10 3.13" ...  # also these interpreters
#   TIDEGATE_PYTHON_MAIN=0 ...                # skip the main interpreter's pytest run
#   TIDEGATE_REQUIRE_PYTHON_VERSIONS=1 ...    # fail (not skip) when one is missing (.ci/run)
#   TIDEGATE_WHEEL_PROFILE=release ...        # test the optimised wheel (as python/bench/ wants)
#   TIDEGATE_PYTHON_TEST_WORKERS=1 ...        # the main interpreter's tests in one process (default 4)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../scripts/python-env.sh
source "$here/../scripts/python-env.sh"
venv="$tidegate_venv"

tidegate_make_venv "${PYTHON:-python3}" "$venv"
tidegate_install_requirements "$venv" "$here/requirements-dev.txt"
tidegate_install_requirements "$venv" "$here/requirements-test.txt"

# One abi3 wheel for every interpreter; cargo's incremental build makes an unchanged tree cost a
# few seconds. The tests check behaviour, not speed: the dev build (about 10 s after the unit
# tests' build, against about 100 s for a release build on the 2-core machine) runs them as fast.
profile="${TIDEGATE_WHEEL_PROFILE:-dev}"
case "$profile" in
    dev) target_dir="$(cd "$here/.." && pwd)/target" ;;
    release) target_dir="$here/target" ;;
    *)
        echo "error: TIDEGATE_WHEEL_PROFILE = '$profile': expected dev or release" >&2
        exit 2
        ;;
esac
wheels="$target_dir/wheels-test"
rm -rf "$wheels"
(cd "$here" && CARGO_TARGET_DIR="$target_dir" "$venv/bin/maturin" build --profile "$profile" --quiet --out "$wheels" >/dev/null)
wheel="$(ls "$wheels"/tidegate-*.whl)"
"$venv/bin/python" -m pip install --require-virtualenv --quiet --disable-pip-version-check \
    --force-reinstall --no-deps "$wheel"

# Tests run from python/tests, which does not contain the source package, so the installed one
# is tested. mypy and the API reference check are tests there (tests/test_docs.py).
cd "$here/tests"
# The main interpreter's run uses four pytest-xdist processes (much of the suite waits on
# leases, subprocesses and sleeps: on the 2-core machine about 54 s with four, 69 s with two);
# the other interpreters run in one.
xdist="$(tidegate_xdist_args TIDEGATE_PYTHON_TEST_WORKERS 4)" || exit 2
read -r -a parallel <<<"$xdist"
if [ "${TIDEGATE_PYTHON_MAIN:-1}" != 0 ]; then
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${parallel[@]}" "$@" .
fi

missing=()
for v in $TIDEGATE_PYTHON_VERSIONS; do
    if ! py="$(tidegate_find_python "$v")"; then
        missing+=("$v")
        continue
    fi
    env_dir="$venv/versions/$v"
    echo "== CPython $v ($py)"
    tidegate_make_venv "$py" "$env_dir"
    tidegate_install_requirements "$env_dir" "$here/requirements-test.txt"
    "$env_dir/bin/python" -m pip install --require-virtualenv --quiet --disable-pip-version-check \
        --force-reinstall --no-deps "$wheel"
    TIDEGATE_EXIT_RUNS="${TIDEGATE_EXIT_RUNS:-10}" "$env_dir/bin/python" -m pytest -q -p no:cacheprovider .
done
if [ "${#missing[@]}" -gt 0 ]; then
    msg="CPython ${missing[*]} not found on this machine (PATH, pyenv, or uv: .ci/run installs them with uv)"
    if [ "${TIDEGATE_REQUIRE_PYTHON_VERSIONS:-0}" = 1 ]; then
        echo "error: $msg" >&2
        exit 1
    fi
    echo "warning: $msg; their tests were skipped" >&2
fi
