#!/usr/bin/env bash
# Several nodes (issue 17): pod-to-pod TCP across nodes (host-gw, VXLAN)
# against a direct veth, and the time from losing a node to the Service
# serving only live endpoints. With --write, replaces the cluster section
# of docs/BENCHMARKS.md. Other arguments go to bench/cluster.py. Runs as
# root: it makes node network namespaces (and deletes them).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
command -v iperf3 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iperf3 >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/cluster.py "$@"
if $write; then
  python3 bench/write_section.py cluster "$table" "bench/cluster.sh --write${*:+ $*}"
fi
