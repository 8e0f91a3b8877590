#!/usr/bin/env bash
# How much the main table's figures move between runs: the default comparison three more
# times (every strategy, interleaved as `gradwire compare` runs them). Each run's results.json
# is kept in benchmarks/results/compare_default_repeats/repeatN.json, and the script prints
# onebit+delayed's share of the ideal speedup in each (and in the main table's run).
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/compare_default_repeats
mkdir -p "$out"
tmp=$(mktemp -d)
for i in 1 2 3; do
  gradwire compare --out "$tmp/r$i" "$@" && cp "$tmp/r$i/results.json" "$out/repeat$i.json"
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("repeat*.json")) + [Path("benchmarks/results/compare_default/results.json")]:
    rows = {r["strategy"]: r for r in json.loads(f.read_text())["rows"]}
    ideal, got = rows["compute-only"]["speedup"], rows["onebit+delayed"]["speedup"]
    acc = rows["onebit+delayed"]["accuracy_mean"] - rows["sync"]["accuracy_mean"]
    print(f"{f}: ideal {ideal:.2f}x, onebit+delayed {got:.2f}x = {got / ideal:.0%} of ideal, "
          f"accuracy {acc * 100:+.2f} points")
PY
