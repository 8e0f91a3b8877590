#!/usr/bin/env bash
# torchft's own DiLoCo as a row beside gradwire's, on the WAN of benchmarks/wan_diloco.sh (issue 27's peers):
# examples/gpt_adamw.py, 4 ranks under torchrun, 100 Mbit/s with 50 ms, the target sync's final val loss + 2%.
# Rows: sync (600 steps, the script as written); with 1200 steps each: gradwire's diloco:100 with the outer
# optimizer of wan_diloco.sh (lr=1, mu=0.5), torchft-diloco:100 with the same outer optimizer, as torchft sends
# by default (one all_reduce per parameter tensor) and bucketized (:bucket), int8+diloco:100, and PyTorch's
# torch-postlocalsgd:100.
# torchft-diloco runs torchft's lighthouse, Managers and DiLoCo (pip install torchft; 0.2.0 here); its
# per-tensor all_reduces go over gradwire groups, so its bytes and waits are on the same simulated WAN.
# The comparison runs from a copy of src/ and examples/; the machine's load before and after goes to load.txt.
# Usage: SEED=0 bash benchmarks/wan_torchft.sh
#        NET=shared-wan SEED=0 OUT=benchmarks/results/wan_torchft/shared_wan_seed0 bash benchmarks/wan_torchft.sh
#        (another network: a spec or preset of `gradwire compare --net`; default 100 Mbit/s with 50 ms)
set -uo pipefail
source "$(dirname "$0")/_snapshot.sh"
seed=${SEED:-0}
out=$(realpath -m "${OUT:-$repo/benchmarks/results/wan_torchft/seed$seed}")  # a relative OUT is this directory's, wherever the runs cd to
cd "$snap"
O=lr=1:mu=0.5
strategies=(sync diloco:100:$O torchft-diloco:100:$O torchft-diloco:100:$O:bucket int8+diloco:100:$O torch-postlocalsgd:100)
longer=()
for s in "${strategies[@]:1}"; do longer+=(--strategy-args "$s=--steps 1200"); done
mkdir -p "$out"
echo "before: $(cat /proc/loadavg) $(date -u +%FT%T)" > "$out/load.txt"
t=$(date +%s)
python -m gradwire compare --net "${NET:-bandwidth=100mbit,latency=50ms}" --metric val_loss --target-within 2% --timeout 900 \
  --out "$out" --strategies "$(IFS=,; echo "${strategies[*]}")" "${longer[@]}" \
  -- torchrun --nproc-per-node 4 examples/gpt_adamw.py --steps 600 --eval-every 100 --seed "$seed" > "$out/log.txt" 2>&1
echo "rc $?" >> "$out/load.txt"
{ echo "after:  $(cat /proc/loadavg) $(date -u +%FT%T)"; echo "wall: $(( $(date +%s) - t )) s"; } >> "$out/load.txt"
python "$repo/benchmarks/wan_diloco_plot.py" "$out" || true
