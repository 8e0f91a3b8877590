#!/usr/bin/env bash
# Training over a WAN on the simulated cluster clock: the DiLoCo family's time to target where a rank's step
# is its own (each rank computes on DEVICE, default the cpu-core roofline), so that ranks sharing this host's
# cores no longer decide the figure (benchmarks/wan_diloco.sh is the same comparison on this host's wall clock).
#
# examples/gpt_adamw.py (DDP + AdamW, a small GPT, 4 ranks under torchrun): sync runs the script as written
# (600 steps); diloco (H=200, and H=100 beside it), streaming-diloco in 4 fragments and int8 outer gradients
# (H=200) get 1200 (--strategy-args; the judge is the time and the bytes to the target, not the step count).
# The target is each network's sync final val loss + 2% in the same comparison. Evaluations every 100 steps,
# every H for the H rows: every plain DiLoCo evaluation is of the model just averaged. The outer optimizer
# lr=1 mu=0.5 was chosen on the held-out seed 100 (wan_diloco.sh's).
#
# One comparison a part, each in its own folder under $OUT (default benchmarks/results/wan_clock/):
#   wan_seed0, wan_seed1   100 Mbit/s and 50 ms, seeds 0 and 1 (the acceptance)
#   shared_seed0, shared_seed1   shared-wan (1 Gbit/s, 30 ms, cross traffic), seeds 0 and 1
#   flaky_seed0, flaky_seed1     flaky-cloud (10 GbE with drops and outages), seeds 0 and 1
# Usage: bash benchmarks/wan_clock.sh [PART...]   (default: wan_seed0 wan_seed1, one after the other)
# then:  python benchmarks/wan_clock_summary.py   (results/wan_clock/summary.json and table.md)
# Each comparison runs from a copy of src/ and examples/ (editing the tree meanwhile changes nothing in it);
# the machine's load before and after goes into load.txt (on this clock it moves the wall time, not a figure).
set -uo pipefail
source "$(dirname "$0")/_snapshot.sh"
out=$(realpath -m "${OUT:-$repo/benchmarks/results/wan_clock}")  # a relative OUT is this directory's, wherever the runs cd to
cd "$snap"
DEVICE=${DEVICE:-cpu-core}
H=${H:-200}
O=${OUTER:-lr=1:mu=0.5}
DILOCO_STEPS=${DILOCO_STEPS:-1200}
W=bandwidth=100mbit,latency=50ms
strategies=(sync "diloco:$H:$O" "streaming-diloco:$H:fragments=4:$O" "int8+diloco:$H:$O" "diloco:100:$O")

run() {  # NAME NET SEED
  local dir=$out/$1 net=$2 seed=$3 longer=()
  for s in "${strategies[@]:1}"; do
    case $s in *":$H:"*) longer+=(--strategy-args "$s=--steps $DILOCO_STEPS --eval-every $H");;
               *) longer+=(--strategy-args "$s=--steps $DILOCO_STEPS");; esac
  done
  mkdir -p "$dir"
  echo "before: $(cat /proc/loadavg) $(date -u +%FT%T)" > "$dir/load.txt"
  local t=$(date +%s)
  python -m gradwire compare --net "$net" --device "$DEVICE" --metric val_loss --target-within 2% --timeout 3000 \
    --out "$dir" --strategies "$(IFS=,; echo "${strategies[*]}")" "${longer[@]}" \
    -- torchrun --nproc-per-node 4 examples/gpt_adamw.py --steps 600 --eval-every 100 --seed "$seed" \
    > "$dir/log.txt" 2>&1
  echo "rc $?" >> "$dir/load.txt"
  { echo "after:  $(cat /proc/loadavg) $(date -u +%FT%T)"; echo "wall: $(( $(date +%s) - t )) s"; } >> "$dir/load.txt"
}

parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(wan_seed0 wan_seed1)
for part in "${parts[@]}"; do
  case $part in
    wan_seed0) run wan_seed0 $W 0 ;;
    wan_seed1) run wan_seed1 $W 1 ;;
    shared_seed0) run shared_seed0 shared-wan 0 ;;
    shared_seed1) run shared_seed1 shared-wan 1 ;;
    flaky_seed0) run flaky_seed0 flaky-cloud 0 ;;
    flaky_seed1) run flaky_seed1 flaky-cloud 1 ;;
    *) echo "unknown part $part (wan_seed0 wan_seed1 shared_seed0 shared_seed1 flaky_seed0 flaky_seed1)" >&2; exit 2 ;;
  esac
done
