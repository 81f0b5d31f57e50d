#!/usr/bin/env bash
# Authorization cost (issue 29): a list of 100 pods as a user RBAC lets
# (1,000 Roles and RoleBindings in the cluster) against the admin, in one
# run. With --write, replaces the rbac section of docs/BENCHMARKS.md.
# Other arguments go to bench/rbac.py (--roles, --requests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup >/dev/null
cargo build --release --locked -p portal
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" python3 bench/rbac.py "$@"
if $write; then
  python3 bench/write_section.py rbac "$table" "bench/rbac.sh --write${*:+ $*}"
fi
