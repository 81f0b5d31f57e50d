#!/usr/bin/env bash
# The endpoints controller at scale (issue 5): with --write, replaces the
# endpoints section of docs/BENCHMARKS.md. Arguments go to the benchmark
# (--services, --pods, --samples).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p portal -p portal-bench
write=false
if [ "${1:-}" = "--write" ]; then write=true; shift; fi
table=$(mktemp)
BENCH_OUT="$table" target/release/portal-bench endpoints --portal target/release/portal "$@"
if $write; then
  BENCH_ARGS="$*" python3 - "$table" <<'PY'
import pathlib, sys, datetime, os
table = pathlib.Path(sys.argv[1]).read_text()
doc = pathlib.Path("docs/BENCHMARKS.md")
text = doc.read_text()
start, end = "<!-- endpoints:begin -->", "<!-- endpoints:end -->"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
body = f"{start}\nRun {datetime.date.today()} on {os.cpu_count()} cores ({cpu}), `bench/endpoints.sh --write{(' ' + os.environ['BENCH_ARGS']) if os.environ.get('BENCH_ARGS') else ''}`.\n\n{table}{end}"
if start in text:
    text = text[: text.index(start)] + body + text[text.index(end) + len(end):]
else:
    text += "\n" + body + "\n"
doc.write_text(text)
PY
fi
