#!/usr/bin/env bash
# The cluster soak (issue 29): the failover test on 20 seeds (three real `tidegate serve` nodes
# on the machine's PostgreSQL, 64 clients, two SIGKILLs and a SIGSTOP of the owner per seed,
# the history check after each). About 25 s per seed. Needs PostgreSQL at $TIDEGATE_PG_URL
# (default postgres://postgres@127.0.0.1:5432/test).
#   TIDEGATE_FAILOVER_SEEDS=50 scripts/soak-cluster.sh    more seeds
#   TIDEGATE_FAILOVER_KILLS=4 scripts/soak-cluster.sh     more kills per seed
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p tidegate
export TIDEGATE_BIN="$PWD/target/debug/tidegate"
TIDEGATE_FAILOVER_SEEDS="${TIDEGATE_FAILOVER_SEEDS:-20}" \
    cargo test -p tidegate-server --test it failover -- --nocapture
