#!/usr/bin/env python3
"""Replaces (or appends) one section of docs/BENCHMARKS.md, between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`, with a header saying when,
where and how it was run. Usage: write_section.py NAME TABLE_FILE COMMAND"""

import datetime
import os
import pathlib
import sys

name, table_file, command = sys.argv[1], sys.argv[2], sys.argv[3]
table = pathlib.Path(table_file).read_text()
doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "BENCHMARKS.md"
text = doc.read_text()
start, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
body = f"{start}\nRun {datetime.date.today()} on {os.cpu_count()} cores ({cpu}), `{command}`.\n\n{table}{end}"
if start in text:
    text = text[: text.index(start)] + body + text[text.index(end) + len(end):]
else:
    text += "\n" + body + "\n"
doc.write_text(text)
