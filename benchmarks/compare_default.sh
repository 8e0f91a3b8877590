#!/usr/bin/env bash
# The README's main table: `gradwire compare` with its defaults (digits CNN-wide, 4 workers,
# bandwidth=1.5gbit,latency=100us, sync / onebit / delayed / onebit+delayed / torch-fp16 /
# torch-powersgd:4, 10 epochs, 3 seeds, plus a compute-only run).
set -euo pipefail
cd "$(dirname "$0")/.."
gradwire compare --out benchmarks/results/compare_default "$@"
