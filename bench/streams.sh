#!/usr/bin/env bash
# Streaming throughput (issue 14): exec and port-forward against a direct
# TCP connection to the pod. With --write, replaces the streams section of
# docs/BENCHMARKS.md. Other arguments go to bench/streams.py (--mib,
# --runs). Runs as root: it makes a node network namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/streams.py "$@"
if $write; then
  python3 bench/write_section.py streams "$table" "bench/streams.sh --write${*:+ $*}"
fi
