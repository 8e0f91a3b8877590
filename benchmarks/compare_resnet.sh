#!/usr/bin/env bash
# `gradwire compare -- CMD` on examples/resnet_digits.py (DDP + SGD with momentum 0.9 and weight decay, a small
# ResNet on upscaled digits, 2 ranks under torchrun, 12 epochs) on a 500 Mbit/s network: sync, PyTorch's fp16 and
# PowerSGD hooks, onebit and onebit+delayed (SGD's momentum and decay moved into the exchange), 3 seeds, plus
# a compute-only run. The machine's load before and after goes into load.txt beside the results.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/compare_resnet
mkdir -p "$out"
{ echo "before: $(uptime)"; } > "$out/load.txt"
start=$(date +%s)
gradwire compare --net bandwidth=500mbit --strategies sync,torch-fp16,torch-powersgd:4,onebit,onebit+delayed \
  --out "$out" "$@" -- torchrun --nproc-per-node 2 examples/resnet_digits.py --seed {seed}
{ echo "after:  $(uptime)"; echo "wall: $(( $(date +%s) - start )) s"; } >> "$out/load.txt"
