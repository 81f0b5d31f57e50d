#!/usr/bin/env bash
# Node agent: pod startup against bare runc (and podman where it runs), and
# the agent's memory (issue 12). With --write, replaces the agent section of
# docs/BENCHMARKS.md. Other arguments go to bench/agent.py (--singles,
# --burst, --pods). Runs as root: it makes a node network namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
# The podman anchor, where Debian's podman installs (best effort).
command -v podman >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman >/dev/null 2>&1 || true
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/agent.py "$@"
if $write; then
  python3 bench/write_section.py agent "$table" "bench/agent.sh --write${*:+ $*}"
fi
