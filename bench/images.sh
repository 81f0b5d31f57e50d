#!/usr/bin/env bash
# Real images and live configuration (issue 28): pull + unpack of a Debian
# nginx image against skopeo copy + umoci unpack, and ConfigMap update ->
# visible in a pod. With --write, replaces the images section of
# docs/BENCHMARKS.md. Runs as root: it makes a node network namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/images.py "$@"
if $write; then
  python3 bench/write_section.py images "$table" "bench/images.sh --write${*:+ $*}"
fi
