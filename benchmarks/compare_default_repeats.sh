#!/usr/bin/env bash
# How much the main table's speed figures move between runs: the default comparison again
# (all strategies), then twice with sync and onebit+delayed only. Each writes its own folder;
# benchmarks/results/compare_default_repeats/ keeps the results.json of each.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/compare_default_repeats
tmp=$(mktemp -d)
gradwire compare --out "$tmp/all" "$@" && cp "$tmp/all/results.json" "$out/repeat1_all.json"
for i in 2 3; do
  gradwire compare --strategies sync,onebit+delayed --out "$tmp/r$i" "$@" && cp "$tmp/r$i/results.json" "$out/repeat$i.json"
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("*.json")) + [Path("benchmarks/results/compare_default/results.json")]:
    rows = {r["strategy"]: r for r in json.loads(f.read_text())["rows"]}
    ideal, got = rows["compute-only"]["speedup"], rows["onebit+delayed"]["speedup"]
    print(f"{f}: ideal {ideal:.2f}x, onebit+delayed {got:.2f}x = {got / ideal:.0%} of ideal")
PY
