#!/usr/bin/env bash
# The built-in layer-7 proxy against nginx and HAProxy as reverse proxies
# (issue 32), on loopback: requests/s and latency with wrk, and an Ingress
# change to the first request it serves. With --write, replaces the ingress
# section of docs/BENCHMARKS.md. Other arguments go to bench/ingress.py
# (--seconds, --rounds, --samples).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in wrk:wrk haproxy:haproxy nginx:nginx-light; do
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
BENCH_OUT="$table" python3 bench/ingress.py "$@"
if $write; then
  python3 bench/write_section.py ingress "$table" "bench/ingress.sh --write${*:+ $*}"
fi
