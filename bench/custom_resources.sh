#!/usr/bin/env bash
# Custom resources (issue 30): create throughput of a custom resource with
# a structural schema and a CEL rule against a ConfigMap of the same size,
# one run, alternating rounds; a no-op webhook's and API aggregation's
# added latency. With --write, replaces the custom_resources
# section of docs/BENCHMARKS.md. Other arguments go to `portal-bench custom`
# (--clients, --seconds, --rounds). Runs as root (a network namespace).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p portal -p portal-bench
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
# A network namespace of its own: the extension API server needs an
# address Endpoints may name (not loopback), which the machine never sees
# (on a veth pair with both ends inside).
ns="portal-bench-custom-$$"
ip netns add "$ns"
trap 'ip netns delete "$ns"' EXIT
ip -n "$ns" link set lo up
ip -n "$ns" link add ext0 type veth peer name ext1
ip -n "$ns" addr add 192.168.77.1/32 dev ext0
ip -n "$ns" link set ext0 up
ip -n "$ns" link set ext1 up
BENCH_OUT="$table" nsenter --net="/run/netns/$ns" \
  target/release/portal-bench custom --portal target/release/portal --extension-ip 192.168.77.1 "$@"
if $write; then
  python3 bench/write_section.py custom_resources "$table" "bench/custom_resources.sh --write${*:+ $*}"
fi
