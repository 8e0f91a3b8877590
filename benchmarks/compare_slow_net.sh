#!/usr/bin/env bash
# Where compression pays: the default experiment on a 3x slower network (500 Mbit/s),
# where the baseline spends most of each step waiting for the network.
set -euo pipefail
cd "$(dirname "$0")/.."
gradwire compare --net bandwidth=500mbit,latency=100us --out benchmarks/results/compare_500mbit "$@"
