#!/usr/bin/env bash
# `gradwire compare -- CMD` on the stacks people train with: examples/lightning_digits.py (Lightning 2.6,
# Trainer(strategy="ddp")), examples/hf_trainer_gpt.py (the Hugging Face Trainer, its defaults) and
# examples/accelerate_loop.py (an Accelerate-prepared loop), each under torchrun with 2 ranks on a simulated
# 200 Mbit/s network, under every strategy, plus a compute-only run. Each stack's comparison goes into
# benchmarks/results/compare_stacks/<stack>/; summary.md is the table stack x strategy: status, speedup,
# bytes reduction, the script's metric against sync (or the reason a run was refused or failed).
#
#   bash benchmarks/compare_stacks.sh                       # every strategy, 1 seed
#   STRATEGIES=sync,onebit SEEDS=1 bash benchmarks/compare_stacks.sh     # a smoke run
#   STACKS=hf_trainer bash benchmarks/compare_stacks.sh     # one stack
#   OUT=/tmp/stacks STRATEGIES=sync,auto bash benchmarks/compare_stacks.sh   # elsewhere than results/
#
# The machine's load before and after goes into load.txt.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${OUT:-$repo/benchmarks/results/compare_stacks}")  # a relative OUT is this directory's, wherever the runs cd to
# every comparison works in a scratch folder: what a stack writes in its working directory (lightning_logs/,
# the Trainer's output_dir) stays out of the repository, and edits in the repository never reach the
# comparison's check of its working directory
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
strategies=${STRATEGIES:-sync,onebit,delayed,onebit+delayed,int8,torch-fp16,torch-powersgd:2,localsgd:4,async-average:4,handler,auto,auto+delayed}
seeds=${SEEDS:-1}
stacks=${STACKS:-lightning hf_trainer accelerate}
net=bandwidth=200mbit
mkdir -p "$out"
{ echo "before: $(uptime)"; echo "strategies: $strategies; seeds: $seeds; net: $net"; } > "$out/load.txt"
start=$(date +%s)
for stack in $stacks; do
  case $stack in
    lightning)  script=$repo/examples/lightning_digits.py; metric=val_acc ;;
    hf_trainer) script=$repo/examples/hf_trainer_gpt.py;   metric=eval_loss ;;
    accelerate) script=$repo/examples/accelerate_loop.py;  metric=test_accuracy ;;
    *) echo "unknown stack $stack (lightning, hf_trainer, accelerate)" >&2; exit 2 ;;
  esac
  t0=$(date +%s)
  # a stack whose runs fail still gets its row in the summary: compare's exit code is not the verdict
  (cd "$work" && gradwire compare --net "$net" --strategies "$strategies" --seeds "$seeds" --timeout 300 \
    --metric "$metric" --out "$out/$stack" -- torchrun --nproc-per-node 2 "$script" --seed {seed}) || true
  echo "$stack: $(( $(date +%s) - t0 )) s" >> "$out/load.txt"
done
{ echo "after:  $(uptime)"; echo "wall: $(( $(date +%s) - start )) s"; } >> "$out/load.txt"

python - "$out" $stacks <<'EOF'
"""summary.md: one row per stack and strategy, from each stack's results.json."""
import json
import sys
from pathlib import Path

out, stacks = Path(sys.argv[1]), sys.argv[2:]
lines = ["| stack | strategy | status | time/step (ms) | speedup | reduction | metric | vs sync | note |",
         "|---|---|---|---|---|---|---|---|---|"]
for stack in stacks:
    path = out / stack / "results.json"
    if not path.exists():
        lines.append(f"| {stack} | | no results.json | | | | | | |")
        continue
    rows = json.loads(path.read_text())["rows"]
    sync = next((r for r in rows if r["strategy"] == "sync"), None)
    for r in rows:
        ok = r["status"] == "ok"
        cells = [stack, r["strategy"], r["status"]]
        if ok:
            vs = (f"{r['metric_mean'] - sync['metric_mean']:+.4f}" if sync and sync["status"] == "ok" else "")
            reduction = "—" if r["strategy"] == "compute-only" else f"{r['reduction']:.1f}x"  # nothing on the wire
            cells += [f"{r['step_ms']:.1f}", f"{r['speedup']:.2f}x", reduction,
                      f"{r['metric']} {r['metric_mean']:.4f}", vs, r["applied"]]
        else:
            cells += [""] * 5 + [" ".join(r["error"].split())[:240]]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
