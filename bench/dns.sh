#!/usr/bin/env bash
# Cluster DNS against Knot DNS (issue 7): with --write, replaces the dns
# section of docs/BENCHMARKS.md. Other arguments go to bench/dns.py
# (--services, --endpoints, --threads, --seconds, --samples).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v knotd >/dev/null && command -v dnsperf >/dev/null || {
  sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq knot dnsperf
}
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/dns.py "$@"
if $write; then
  python3 bench/write_section.py dns "$table" "bench/dns.sh --write${*:+ $*}"
fi
