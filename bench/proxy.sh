#!/usr/bin/env bash
# The service proxy against its anchors (issue 6), in network namespaces the
# run creates: userspace mode vs HAProxy vs a direct connection (wrk),
# kernel-mode connection latency with 100 and 10,000 Services, programming
# latency and full resync at 10,000 Services / 50,000 endpoints, proxy RSS.
# With --write, replaces the proxy section of docs/BENCHMARKS.md. Other
# arguments go to bench/proxy.py (--services, --endpoints, --seconds, --samples).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in wrk:wrk haproxy:haproxy nginx:nginx-light nft:nftables conntrack:conntrack; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/proxy.py "$@"
if $write; then
  python3 bench/write_section.py proxy "$table" "bench/proxy.sh --write${*:+ $*}"
fi
