#!/usr/bin/env bash
# The scheduler (issue 27): an RC of N pods on M API-only nodes, create →
# every pod bound, plain and with affinity and spread rules, against the
# same pods with their node named (nothing to schedule). With --write,
# replaces the scheduler section of docs/BENCHMARKS.md. Other arguments go
# to bench/scheduler.py (--pods, --nodes). Loopback only: no proxy, no agent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/scheduler.py "$@"
if $write; then
  python3 bench/write_section.py scheduler "$table" "bench/scheduler.sh --write${*:+ $*}"
fi
