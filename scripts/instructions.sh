#!/usr/bin/env bash
# Instructions per transaction of the engine's hot path (docs/performance.md): runs
# `tidegate bench micro --tx N --level L` under callgrind at two sizes and subtracts, so that
# start-up and setup cancel out. Repeatable on a shared machine, unlike a wall clock.
#
#   bash scripts/instructions.sh [L0 L1 L4 ...]      (default: L0 L1 L4)
#   TIDEGATE_CALLS=100 bash scripts/instructions.sh L1
#       transactions of 100 reversible calls each (`bench micro --calls`), reported per
#       transaction and per call; lower TIDEGATE_TX_SMALL/TIDEGATE_TX_LARGE (default 200 and
#       2200) for large call counts, e.g. 2 and 22 for 1000 calls.
#   TIDEGATE_PAPER=1 bash scripts/instructions.sh
#       the source paper's overhead loop (`bench micro --paper-overhead`): tasks of ten
#       one-call transactions on a fresh engine, 20 and 220 tasks, reported per task and per
#       step (docs/performance.md, "The paper's overhead loop").
#   TIDEGATE_SPEC=1 bash scripts/instructions.sh
#       the speculation benchmark (`bench micro --speculation`): 16 branches that each queue
#       a gated call and seal, then the commit of one winner; reported per round, and for the
#       commit alone (callgrind collecting only inside the benchmark's `speculation_commit`,
#       its `block_on` included), 20 and 220 rounds.
#   TIDEGATE_SERVE=1 bash scripts/instructions.sh [memory durable]
#       the server's instructions per transaction: `tidegate serve` runs under callgrind in a
#       process of its own and `tidegate bench serve --against` (another process, with the
#       webhook receiver) sends it 20 and then 220 one-request transactions (`--forms batch`,
#       one client: begin, a reversible and a gated webhook effect, seal, commit), so only
#       the server's own work is counted: HTTP, JSON, authentication, the engine, the ledger
#       and both webhook calls. Memory and the embedded durable store by default. The server
#       logs at its default level (one line per request); RUST_LOG=warn leaves that out. To
#       count an older server, set TIDEGATE_BIN to it and TIDEGATE_DRIVER_BIN to a binary
#       that has `bench serve --against` (default: TIDEGATE_BIN).
#
# Needs valgrind (`apt-get install valgrind`) and a release build of the binary
# (`cargo build --release -p tidegate`; set TIDEGATE_BIN to use another). Set
# TIDEGATE_CALLGRIND_DIR to keep the profiles (callgrind_annotate reads them); for
# per-function figures with inlined frames, use the build with debug info:
# `cargo build --profile profiling -p tidegate` and TIDEGATE_BIN=target/profiling/tidegate
# (the counts are the same).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${TIDEGATE_BIN:-target/release/tidegate}"
paper="${TIDEGATE_PAPER:-0}"
spec="${TIDEGATE_SPEC:-0}"
serve="${TIDEGATE_SERVE:-0}"
if [ "$paper" = 1 ] || [ "$spec" = 1 ] || [ "$serve" = 1 ]; then
    small="${TIDEGATE_TX_SMALL:-20}"
    large="${TIDEGATE_TX_LARGE:-220}"
else
    small="${TIDEGATE_TX_SMALL:-200}"
    large="${TIDEGATE_TX_LARGE:-2200}"
fi
if ! command -v valgrind >/dev/null; then
    echo "valgrind is not installed (apt-get install valgrind)" >&2
    exit 2
fi
if [ ! -x "$bin" ]; then
    echo "no binary at $bin: cargo build --release -p tidegate" >&2
    exit 2
fi
calls="${TIDEGATE_CALLS:-}"
extra=()
[ -n "$calls" ] && extra=(--calls "$calls")
[ "$paper" = 1 ] && extra=(--paper-overhead)
[ "$spec" = 1 ] && extra=(--speculation)
if [ -n "${TIDEGATE_CALLGRIND_DIR:-}" ]; then
    out=$TIDEGATE_CALLGRIND_DIR
    mkdir -p "$out"
else
    # A temporary directory, removed after a successful run (kept, with its logs, after a
    # failure).
    out=$(mktemp -d)
    trap 'status=$?; [ "$status" -eq 0 ] && rm -rf "$out"; exit "$status"' EXIT
fi
levels=("$@")
[ ${#levels[@]} -eq 0 ] && levels=(L0 L1 L4)
[ "$paper" = 1 ] && levels=(default)
[ "$spec" = 1 ] && levels=(default commit)
collected() {
    local n=$1 level=$2
    local lv=(--level "$level") only=()
    # The paper's loop and the speculation run at the engine's default level (L4), as a user
    # gets it; `commit` counts only what runs inside the speculation's commit.
    { [ "$paper" = 1 ] || [ "$spec" = 1 ]; } && lv=()
    [ "$level" = commit ] && only=(--toggle-collect='*speculation_commit*')
    valgrind --tool=callgrind "${only[@]}" --callgrind-out-file="$out/callgrind.$level.$n" \
        "$bin" bench micro --tx "$n" "${lv[@]}" "${extra[@]}" >/dev/null 2>"$out/valgrind.$level.$n.log"
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/valgrind.$level.$n.log"
}
# The server under callgrind, driven from another process; prints the instructions it
# executed from start to its exit on SIGTERM. Runs in a background subshell (`serve_count`):
# its traps kill the server and remove its directory (which holds the tenant's admin key)
# whatever happens, including a SIGTERM or SIGINT to this script.
serve_collected() {
    local n=$1 store=$2
    # `pid` and `tmp` are not `local`: the EXIT trap runs after the function has returned.
    pid=""
    tmp=$(mktemp -d) || return 1
    trap 'exit 143' TERM INT
    trap '[ -n "$pid" ] && { kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }; rm -rf "$tmp"' EXIT
    local where=(--memory)
    [ "$store" = durable ] && where=(--data-dir "$tmp/data")
    valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.serve-$store.$n" \
        "$bin" serve --listen 127.0.0.1:0 "${where[@]}" --bootstrap-tenant bench \
        >"$tmp/stdout" 2>"$out/valgrind.serve-$store.$n.log" &
    pid=$!
    local waited=0
    until grep -qs '^listening on ' "$tmp/stdout"; do
        if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge 600 ]; then
            echo "the server did not start within 120 s (see $out/valgrind.serve-$store.$n.log)" >&2
            return 1
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
    local addr key
    addr=$(sed -n 's/^listening on //p' "$tmp/stdout")
    key=$(sed -n 's/^tenant=bench role=admin key=//p' "$tmp/stdout")
    if ! timeout 900 "$driver" bench serve --against "http://$addr" --key "$key" --transactions "$n" \
        --forms batch --clients 1 >"$tmp/load" 2>&1; then
        echo "the load failed or took over 900 s: $(cat "$tmp/load")" >&2
        return 1
    fi
    kill -TERM "$pid"
    # A clean stop drains and writes the profile; past 120 s it is stuck.
    waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge 600 ]; then
            echo "the server did not stop within 120 s of SIGTERM" >&2
            return 1
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
    wait "$pid" || true
    pid=""
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/valgrind.serve-$store.$n.log"
}
# Sets `count` to what serve_collected printed; the script's TERM/INT stop it too.
serve_count() {
    serve_collected "$1" "$2" >"$out/serve.count" &
    child=$!
    if ! wait "$child"; then
        child=""
        return 1
    fi
    child=""
    count=$(cat "$out/serve.count")
}
if [ "$serve" = 1 ]; then
    child=""
    trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait; exit 143' TERM INT
    driver="${TIDEGATE_DRIVER_BIN:-$bin}"
    if [ ! -x "$driver" ]; then
        echo "no driver binary at $driver (TIDEGATE_DRIVER_BIN)" >&2
        exit 2
    fi
    stores=("$@")
    [ ${#stores[@]} -eq 0 ] && stores=(memory durable)
    for store in "${stores[@]}"; do
        case "$store" in
            memory | durable) ;;
            *) echo "store $store: expected memory or durable" >&2; exit 2 ;;
        esac
        serve_count "$small" "$store" || exit 1
        a=$count
        serve_count "$large" "$store" || exit 1
        b=$count
        if [ -z "$a" ] || [ -z "$b" ]; then
            echo "serve $store: callgrind reported no count (see $out/valgrind.serve-$store.*.log)" >&2
            exit 1
        fi
        echo "serve $store: $(( (b - a) / (large - small) )) instructions per one-request transaction (the server process alone)"
    done
    exit 0
fi
for level in "${levels[@]}"; do
    a=$(collected "$small" "$level")
    b=$(collected "$large" "$level")
    if [ -z "$a" ] || [ -z "$b" ]; then
        echo "$level: callgrind reported no count (see $out/valgrind.$level.*.log)" >&2
        exit 1
    fi
    per_tx=$(( (b - a) / (large - small) ))
    if [ "$spec" = 1 ] && [ "$level" = commit ]; then
        echo "speculation: $per_tx instructions per 16-branch commit (the commit alone)"
    elif [ "$spec" = 1 ]; then
        echo "speculation: $per_tx instructions per round (16 branches begun, called and sealed, then the commit)"
    elif [ "$paper" = 1 ]; then
        echo "paper overhead loop: $per_tx instructions per task of ten transactions, $(( per_tx / 10 )) per step"
    elif [ -n "$calls" ]; then
        echo "$level $per_tx instructions per transaction of $calls calls, $(( per_tx / calls )) per call"
    else
        echo "$level $per_tx instructions per transaction"
    fi
done
