#!/usr/bin/env bash
# Rebuilds kjv-new-testament.txt from Debian's bible-kjv packages: the King James
# Version's New Testament (Matthew 1 to Revelation 22), one verse per line without
# verse numbers, a blank line and the heading before each chapter.
# Needs Debian or Ubuntu (apt-get) and python3.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v bible >/dev/null; then
    apt-get install -y -qq bible-kjv bible-kjv-text
fi
bible "Gen1:1-Rev22:21" > /tmp/kjv-full.txt
python3 - /tmp/kjv-full.txt kjv-new-testament.txt <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
heading = re.compile(r"^[1-3]?\s?[A-Z][a-z]+( of [A-Z][a-z]+)?( [A-Z][a-z]+)* \d+$")
out, verse = [], None
for line in lines[lines.index("Matthew 1"):]:
    if not line.strip():
        continue
    m = re.match(r"^\s+(\d+) (.*)$", line)
    if m:  # a verse starts: its number is dropped
        if verse is not None:
            out.append(verse)
        verse = m.group(2).strip()
    elif heading.match(line.strip()) and not line.startswith(" "):
        if verse is not None:
            out.append(verse)
            verse = None
        out += ["", line.strip()]
    else:  # a wrapped line continues the verse
        verse = line.strip() if verse is None else verse + " " + line.strip()
if verse is not None:
    out.append(verse)
open(sys.argv[2], "w").write("\n".join(out).strip() + "\n")
PY
wc -c kjv-new-testament.txt
