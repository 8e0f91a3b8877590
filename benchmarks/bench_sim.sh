#!/usr/bin/env bash
# gradwire bench on the simulated cluster clock: all_reduce and reduce_scatter over 10 GbE, 2 ranks, 1-64 MiB,
# on three devices (the reduction's additions priced on each), and the same sweep on this host's wall clock
# (--clock realtime: the modelled network waited out for real) to check the model against real packets.
# The simulated rows are the same on any host; the realtime ones are this host's (load in load.txt).
# Usage: bash benchmarks/bench_sim.sh   (results under benchmarks/results/bench_sim/)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${OUT:-$repo/benchmarks/results/bench_sim}")  # a relative OUT is this directory's, wherever the runs cd to
mkdir -p "$out"
export PYTHONPATH=$repo/src
sweep=(--net 10gbe --op all_reduce --op reduce_scatter -b 1M -e 64M -f 4 -n 5 -w 1 --no-progress)
echo "before: $(cat /proc/loadavg) $(date -u +%FT%T)" > "$out/load.txt"
for device in cpu-core a100 h100; do
  python -m gradwire.cli.main bench --clock sim --device "$device" "${sweep[@]}" --json "$out/sim_$device.json" \
    | tee "$out/sim_$device.txt"
done
python -m gradwire.cli.main bench --clock sim "${sweep[@]}" --json "$out/sim_nodevice.json" | tee "$out/sim_nodevice.txt"
python -m gradwire.cli.main bench --clock realtime "${sweep[@]}" --json "$out/realtime.json" | tee "$out/realtime.txt"
echo "after: $(cat /proc/loadavg) $(date -u +%FT%T)" >> "$out/load.txt"
