#!/usr/bin/env bash
# The checks that need a CUDA machine, in one go (CI has no GPU; these skip there):
#   1. every test marked `cuda` (compressors on CUDA, the backend's CUDA inner group, every
#      strategy trained on CUDA against the same training on CPU, `gradwire profile` of a plain
#      nccl DDP script, `gradwire bench --device cuda`);
#   2. `gradwire bench` of each collective on CUDA tensors through the gradwire backend, 2 ranks
#      (on a one-GPU machine they share the GPU and run on gloo; an op gloo lacks on CUDA says so);
#   3. encode + decode time of every compressor on the GPU (benchmarks/compress_timing.py).
# Usage: bash benchmarks/cuda_check.sh [OUT_DIR]   (default benchmarks/results/cuda)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cuda}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{
    nvidia-smi -L
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
    nproc
} 2>&1 | tee "$out/env.txt"
status=0
timeout 420 "$py" -m pytest -q -m cuda -p no:cacheprovider -o addopts="" -rfEs 2>&1 | tee "$out/pytest_cuda.txt"
status=$(( status | ${PIPESTATUS[0]} ))
for op in all_reduce all_gather broadcast all_to_all reduce_scatter reduce sendrecv; do
    timeout 120 "$py" -m gradwire.cli.main bench --backend gradwire --tensors cuda --net 10gbe --world-size 2 \
        -b 1M -e 64M -f 8 -n 5 -w 2 --op "$op" --no-progress 2>&1 | grep -v "^#  Rank"
done | tee "$out/bench_gradwire_cuda.txt"
timeout 300 "$py" benchmarks/compress_timing.py --device cuda --repeats 20 --out "$out/compress_timing_cuda.json"
status=$(( status | $? ))
exit $status
