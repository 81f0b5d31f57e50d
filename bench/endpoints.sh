#!/usr/bin/env bash
# The endpoints controller at scale (issue 5): with --write, replaces the
# endpoints section of docs/BENCHMARKS.md. Arguments go to the benchmark
# (--services, --pods, --samples).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p portal -p portal-bench
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" target/release/portal-bench endpoints --portal target/release/portal "$@"
if $write; then
  python3 bench/write_section.py endpoints "$table" "bench/endpoints.sh --write${*:+ $*}"
fi
