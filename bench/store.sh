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
  python3 - "$table" <<'PY'
import pathlib, sys, datetime, platform, os
table = pathlib.Path(sys.argv[1]).read_text()
doc = pathlib.Path("docs/BENCHMARKS.md")
text = doc.read_text() if doc.exists() else "# Benchmarks\n"
start, end = "<!-- store:begin -->", "<!-- store:end -->"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
body = f"{start}\nRun {datetime.date.today()} on {os.cpu_count()} cores ({cpu}), `bench/store.sh --write`.\n\n{table}{end}"
if start in text:
    text = text[: text.index(start)] + body + text[text.index(end) + len(end):]
else:
    text += "\n" + body + "\n"
doc.write_text(text)
PY
fi
