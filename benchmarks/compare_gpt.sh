#!/usr/bin/env bash
# `gradwire compare -- CMD` on a script of the user's kind: examples/gpt_adamw.py (DDP + AdamW, a small GPT on
# generated text, 2 ranks under torchrun, 1500 steps) on a 500 Mbit/s network: sync, PyTorch's fp16 and
# PowerSGD hooks, onebit and onebit+delayed (AdamW under gradwire's 1-bit Adam scheme), 3 seeds, plus a
# compute-only run. The machine's load before and after goes into load.txt beside the results.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/compare_gpt
mkdir -p "$out"
{ echo "before: $(uptime)"; } > "$out/load.txt"
start=$(date +%s)
gradwire compare --net bandwidth=500mbit --strategies sync,torch-fp16,torch-powersgd:4,onebit,onebit+delayed \
  --out "$out" "$@" -- torchrun --nproc-per-node 2 examples/gpt_adamw.py --seed {seed}
{ echo "after:  $(uptime)"; echo "wall: $(( $(date +%s) - start )) s"; } >> "$out/load.txt"
