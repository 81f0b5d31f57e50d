#!/usr/bin/env bash
# Dual-stack data path (issue 31): new-connection rate across nodes over
# IPv6 against IPv4, pod to pod and through a dual-stack Service. With
# --write, replaces the dual-stack section of docs/BENCHMARKS.md. Other
# arguments go to bench/dual_stack.py. Runs as root: it makes node network
# namespaces (and deletes them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/dual_stack.py "$@"
if $write; then
  python3 bench/write_section.py dual-stack "$table" "bench/dual_stack.sh --write${*:+ $*}"
fi
