#!/usr/bin/env bash
# NetworkPolicy (issue 31): new-connection rate between two pods with 1,000
# policies selecting the server against none, and policy change → enforced.
# With --write, replaces the network-policy section of docs/BENCHMARKS.md.
# Other arguments go to bench/network_policy.py. Runs as root: it makes
# node network namespaces (and deletes them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/network_policy.py "$@"
if $write; then
  python3 bench/write_section.py network-policy "$table" "bench/network_policy.sh --write${*:+ $*}"
fi
