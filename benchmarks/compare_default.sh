#!/usr/bin/env bash
# The README's main table, as a newcomer gets it: `gradwire compare` with its defaults, run 3 times
# from a fresh clone of this repository's HEAD (its own source on PYTHONPATH, the installed torch).
# Run 1 becomes benchmarks/results/compare_default/ (table.md, results.json, the plots); runs 2 and 3
# go to compare_default/repeats/. summary.json holds, per run and network, what the acceptance reads:
# sync's network share of the step, onebit+delayed's speedup, share of ideal and accuracy against sync,
# and the strategies slower than sync; plus each run's wall time and the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=benchmarks/results/compare_default
tmp=$(mktemp -d)
git clone -q "$repo" "$tmp/gradwire"
rm -rf "$out"/{results.json,table.md,accuracy.png,breakdown.png,bandwidth.png,wall.json,summary.json,repeats}
mkdir -p "$out/repeats"
for i in $(seq 1 "${RUNS:-3}"); do  # RUNS=1 for one run
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  (cd "$tmp/gradwire" && PYTHONPATH=src python -m gradwire compare --out "$tmp/run$i" "$@")
  wall=$(python -c "print(round($(date +%s.%N) - $start, 1))")
  echo "{\"run\": $i, \"wall_s\": $wall, \"load_before\": $load}" > "$tmp/run$i/wall.json"
  if [ "$i" = 1 ]; then
    cp "$tmp/run1"/{results.json,table.md,accuracy.png,breakdown.png,wall.json} "$out/"
    [ ! -f "$tmp/run1/bandwidth.png" ] || cp "$tmp/run1/bandwidth.png" "$out/"  # the realtime clock's prediction
  else
    cp "$tmp/run$i/results.json" "$out/repeats/run$i.json"
    cp "$tmp/run$i/wall.json" "$out/repeats/run$i.wall.json"
  fi
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = [(out / "results.json", out / "wall.json")] + [
    (out / f"repeats/run{i}.json", out / f"repeats/run{i}.wall.json") for i in (2, 3)
    if (out / f"repeats/run{i}.json").exists()]
summary = []
for i, (res, wall) in enumerate(runs, 1):
    rows = json.loads(res.read_text())["rows"]
    for net in dict.fromkeys(r["net"] for r in rows):
        mine = {r["strategy"]: r for r in rows if r["net"] == net}
        sync, best = mine["sync"], mine["onebit+delayed"]
        entry = {"run": i, "net": net, "sync_exposed": round(sync["exposed_share"], 3),
                 "onebit+delayed_speedup": round(best["speedup"], 3), "of_ideal": round(best["of_ideal"], 3),
                 "accuracy_vs_sync_points": round((best["metric_mean"] - sync["metric_mean"]) * 100, 2),
                 "slower_than_sync": {s: round(r["speedup"], 3) for s, r in mine.items()
                                      if r.get("speedup") is not None and r["speedup"] < 0.97},
                 **json.loads(wall.read_text())}
        summary.append(entry)
        print(json.dumps(entry))
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
PY
rm -rf "$tmp"
