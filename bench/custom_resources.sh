#!/usr/bin/env bash
# Custom resources (issue 30): create throughput of a custom resource with
# a structural schema and a CEL rule against a ConfigMap of the same size,
# one run, alternating rounds. With --write, replaces the custom_resources
# section of docs/BENCHMARKS.md. Other arguments go to `portal-bench custom`
# (--clients, --seconds, --rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p portal -p portal-bench
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" target/release/portal-bench custom --portal target/release/portal "$@"
if $write; then
  python3 bench/write_section.py custom_resources "$table" "bench/custom_resources.sh --write${*:+ $*}"
fi
