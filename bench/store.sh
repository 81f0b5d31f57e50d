#!/usr/bin/env bash
# Portal API server + store vs raw etcd, one run, on loopback. Prints a
# markdown table; with --write, also replaces the store section of
# docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v etcd >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; }
cargo build --release --locked -p portal -p portal-bench
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" target/release/portal-bench store --portal target/release/portal --etcd "$(command -v etcd)" "$@"
if $write; then
  python3 bench/write_section.py store "$table" "bench/store.sh --write"
fi
