# Shell functions for the repository's own Python environments (sourced by python/run-tests.sh
# and .ci/run). Nothing here installs into an interpreter's own site-packages: every install
# goes into a virtual environment under .venv/ at the repository root, with pip's
# --require-virtualenv as a second guard.
#
#   .venv/                  the main environment (python3, or $PYTHON): build and check tools,
#                           test dependencies, the package
#   .venv/versions/X.Y/     one environment per other CPython the tests run on

tidegate_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tidegate_venv="$tidegate_root/.venv"

# The CPython versions tested besides the main one. The default test run (scripts/test.sh)
# tests the main interpreter only; scripts/test-python-versions.sh sets the oldest and the
# newest supported (3.10 3.13), installing them with uv when missing.
TIDEGATE_PYTHON_VERSIONS="${TIDEGATE_PYTHON_VERSIONS-}"
TIDEGATE_SUPPORTED_PYTHONS="3.10 3.13"

# Creates the virtual environment $2 with interpreter $1 unless it exists. Fails with the
# reason when the interpreter cannot create one (Debian/Ubuntu: the python3-venv package).
tidegate_make_venv() {
    local py="$1" dir="$2"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
        return 0
    fi
    rm -rf "$dir"
    if ! "$py" -m venv "$dir"; then
        echo "error: '$py -m venv' cannot create $dir. On Debian/Ubuntu install python3-venv" \
            "(.ci/run does it); elsewhere use a Python with the venv module." >&2
        return 1
    fi
}

# Installs requirement file $2 into environment $1 when it changed since the last install.
# With uv (see tidegate_uv) when the main environment has it, else with pip; the same pins
# resolve to the same packages either way (checked with `pip freeze`). uv compiles the modules
# to bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine),
# nothing else would, and every fresh interpreter compiled langgraph again (the Python
# suite took 81 s instead of 54).
tidegate_install_requirements() {
    local dir="$1" req="$2" stamp uv=""
    # uv reads a certificate bundle from SSL_CERT_FILE; pip's own setting, if any, is passed on.
    local cert="${SSL_CERT_FILE:-${PIP_CERT:-}}"
    stamp="$dir/.installed-$(basename "$req")"
    if cmp -s "$req" "$stamp"; then
        return 0
    fi
    # uv's own pin (scripts/requirements-ci.txt, however the path is spelled) goes in with pip.
    if [ "$(basename "$req")" = requirements-ci.txt ] || ! uv="$(tidegate_uv)" \
        || ! env ${cert:+SSL_CERT_FILE="$cert"} "$uv" pip install --quiet --compile-bytecode --python "$dir/bin/python" -r "$req"; then
        [ -z "$uv" ] || echo "warning: uv could not install $req into $dir; trying pip" >&2
        "$dir/bin/python" -m pip install --require-virtualenv --quiet --disable-pip-version-check -r "$req" || return 1
    fi
    cp "$req" "$stamp"
}

# Prints the path of uv (pinned in scripts/requirements-ci.txt), installing it into the main
# environment .venv/ with pip when that environment exists and lacks it; fails (and the caller
# uses pip) when there is no main environment yet. uv installs a suite's pinned requirements
# into a fresh environment in about 6 s where pip took about 24 s (the MCP suite's, empty
# caches, on the 2-core machine), and it refuses to install into anything but a virtual
# environment.
tidegate_uv() {
    [ -x "$tidegate_venv/bin/python" ] || return 1
    tidegate_install_requirements "$tidegate_venv" "$tidegate_root/scripts/requirements-ci.txt" >&2 || return 1
    [ -x "$tidegate_venv/bin/uv" ] || return 1
    echo "$tidegate_venv/bin/uv"
}

# Prints the path of a CPython $1 (X.Y) on this machine: on PATH, under pyenv, or installed by
# uv (`uv python install`). Fails if there is none.
tidegate_find_python() {
    local v="$1" p
    local candidates=("$(command -v "python$v" 2>/dev/null || true)")
    local root="${PYENV_ROOT:-$HOME/.pyenv}"
    if [ -d "$root/versions" ]; then
        candidates+=($(ls -d "$root/versions/$v".*/bin/"python$v" 2>/dev/null | sort -V | tail -1))
    fi
    if [ -x "$tidegate_venv/bin/uv" ]; then
        candidates+=("$("$tidegate_venv/bin/uv" python find --managed-python --no-project "$v" 2>/dev/null || true)")
    fi
    for p in "${candidates[@]}"; do
        if [ -n "$p" ] && "$p" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$v'.split('.'))))" 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# Prints the pytest-xdist arguments for the number of processes in the variable named $1
# (default $2): `-n N` for more than one, nothing for one. Refuses anything but a whole number
# of processes, naming the variable.
tidegate_xdist_args() {
    local name="$1" workers="${!1:-$2}"
    case "$workers" in
        '' | *[!0-9]* | 0)
            echo "error: $name = '$workers': expected a whole number of processes, 1 or more" >&2
            return 2
            ;;
    esac
    [ "$workers" -gt 1 ] && echo "-n $workers"
    return 0
}
