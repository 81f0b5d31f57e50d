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
  BENCH_ARGS="$*" python3 - "$table" <<'PY'
import pathlib, sys, datetime, os
table = pathlib.Path(sys.argv[1]).read_text()
doc = pathlib.Path("docs/BENCHMARKS.md")
text = doc.read_text()
start, end = "<!-- dns:begin -->", "<!-- dns:end -->"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
body = f"{start}\nRun {datetime.date.today()} on {os.cpu_count()} cores ({cpu}), `bench/dns.sh --write{(' ' + os.environ['BENCH_ARGS']) if os.environ.get('BENCH_ARGS') else ''}`.\n\n{table}{end}"
if start in text:
    text = text[: text.index(start)] + body + text[text.index(end) + len(end):]
else:
    text += "\n" + body + "\n"
doc.write_text(text)
PY
fi
