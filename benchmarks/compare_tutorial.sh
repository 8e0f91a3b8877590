#!/usr/bin/env bash
# An unchanged third-party-style script, examples/ddp_tutorial.py (PyTorch's DDP tutorial in its own shape:
# ToyModel, mp.spawn, fixed MASTER_PORT, gloo, plain SGD), under every strategy of the registry and the usual
# compositions, one seed, on 1 Gbit/s. Every run must be applied and finish; the ToyModel's 165 parameters are
# below the compression cutoff (1024 elements), so the compressors average them uncompressed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/compare_tutorial
mkdir -p "$out"
{ echo "before: $(uptime)"; } > "$out/load.txt"
start=$(date +%s)
gradwire compare --net 1gbe --out "$out" \
  --strategies sync,delayed,localsgd:4,localsgd:4:warmup=10,async-average:4,handler,torch-fp16,torch-powersgd:1,onebit,onebit+delayed,onebit+localsgd:4,onebit+handler,topk:0.1+delayed,fp16,int8,qsgd,signum,powersgd:1 \
  "$@" -- python examples/ddp_tutorial.py
{ echo "after:  $(uptime)"; echo "wall: $(( $(date +%s) - start )) s"; } >> "$out/load.txt"
