#!/usr/bin/env bash
# Issue 43's acceptance: scripts that clip (clip_grad_norm_(..., 1.0) between backward and step) under
# `gradwire compare -- CMD` on a simulated 200 Mbit/s network, simulated cluster clock (cpu-core), 2 ranks:
#   hf_trainer  examples/hf_trainer_gpt.py: the Hugging Face Trainer with its defaults (max_grad_norm=1.0,
#               AdamW, find_unused_parameters=True), 60 optimizer steps;
#   gpt         examples/gpt_adamw.py with AdamW, gradient accumulation by toggling DDP's
#               require_backward_grad_sync (2 micro-batches) and --clip 1.0, 150 optimizer steps.
# Every strategy of compare's default lists (bundled and command) plus int8 and auto, 2 seeds. The verdict
# (benchmarks/results/clip_acceptance.json, .md): int8, onebit, delayed, onebit+delayed and auto run ok with the
# final loss within 2% of sync's on every seed, onebit moves at least 16x fewer bytes than sync, and at most one
# strategy of the default lists is refused.
#
#   bash benchmarks/clip_acceptance.sh                     # both scripts (about 40 min on a busy 2-core host)
#   SCRIPTS=hf_trainer SEEDS=1 bash benchmarks/clip_acceptance.sh
#   OUT=/tmp/clip bash benchmarks/clip_acceptance.sh       # elsewhere than benchmarks/results/
#   HF_STEPS=150 SCRIPTS=hf_trainer bash benchmarks/clip_acceptance.sh  # the Trainer for 150 steps (default 60)
#   ONE_BIT=onebit:allgather:block=64 STRATEGIES=sync,onebit:allgather:block=64,onebit:allgather:block=64+delayed \
#     OUT=benchmarks/results/clip_acceptance_onebit64 bash benchmarks/clip_acceptance.sh  # another 1-bit exchange
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${OUT:-$repo/benchmarks/results/clip_acceptance}")  # a relative OUT is this directory's, wherever the runs cd to
work=$(mktemp -d)  # what the Trainer writes in its working directory stays out of the repository
trap 'rm -rf "$work"' EXIT
strategies=${STRATEGIES:-sync,int8,onebit,delayed,onebit+delayed,auto,torch-fp16,torch-powersgd:4}
seeds=${SEEDS:-2}
scripts=${SCRIPTS:-hf_trainer gpt}
net=bandwidth=200mbit
gw=(python -m gradwire)
mkdir -p "$out"
{ echo "before: $(uptime)"; echo "strategies: $strategies; seeds: $seeds; net: $net; clock: sim (cpu-core); hf_trainer steps: ${HF_STEPS:-60}"; } > "$out/load.txt"
start=$(date +%s)
for name in $scripts; do
  case $name in
    hf_trainer) cmd=("$repo/examples/hf_trainer_gpt.py" --seed {seed} --steps "${HF_STEPS:-60}"); metric=eval_loss ;;
    gpt) cmd=("$repo/examples/gpt_adamw.py" --seed {seed} --steps 150 --batch 4 --accumulate 2 --clip 1.0
              --eval-every 50); metric=val_loss ;;
    *) echo "unknown script $name (hf_trainer, gpt)" >&2; exit 2 ;;
  esac
  t0=$(date +%s)
  (cd "$work" && "${gw[@]}" compare --net "$net" --clock sim --strategies "$strategies" --seeds "$seeds" \
    --timeout 600 --metric "$metric" --out "$out/$name" -- torchrun --nproc-per-node 2 "${cmd[@]}") || true
  echo "$name: $(( $(date +%s) - t0 )) s" >> "$out/load.txt"
done
{ echo "after:  $(uptime)"; echo "wall: $(( $(date +%s) - start )) s"; } >> "$out/load.txt"
python "$repo/benchmarks/clip_acceptance.py" "$out" $scripts
