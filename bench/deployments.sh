#!/usr/bin/env bash
# Deployments (issue 27): scale 0 → N against the RC path, a rolling update
# under load (time, failed requests), and the controllers' memory with many
# Deployments against as many RCs. With --write, replaces the deployments
# section of docs/BENCHMARKS.md. Other arguments go to bench/deployments.py
# (--replicas, --deployments, --per). Runs as root: it makes a node network
# namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/deployments.py "$@"
if $write; then
  python3 bench/write_section.py deployments "$table" "bench/deployments.sh --write${*:+ $*}"
fi
