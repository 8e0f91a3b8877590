"""Every strategy on CUDA tensors: ranks agree, and the result is the CPU result.

Skipped without CUDA (CI has none); run on a GPU machine with ``pytest -m cuda``.
On a one-GPU machine the two ranks share the GPU and the backend runs CUDA
tensors on gloo (NCCL refuses that), so the hooks' collectives are exercised
across ranks there too.
"""
import pytest
import torch

from gradwire.launch import spawn

from . import workers

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

#: strategy -> largest relative L2 distance between the CUDA and the CPU parameters after the run.
#: Exact arithmetic strategies differ by float rounding only; sign and rank-R compressors can
#: flip a near-zero sign or pick another basis vector, which error feedback then carries.
NAMES = {"sync": 1e-4, "delayed": 1e-4, "localsgd:2": 1e-4, "handler": 1e-4, "torch-fp16": 1e-3,
         "onebit": 2e-2, "onebit+delayed": 2e-2, "int8+delayed": 2e-2, "topk:0.05": 2e-2,
         "torch-powersgd:2:start=2": 5e-2}
STEPS = 8


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return spawn(workers.cpu_and_cuda, 2, (list(NAMES), STEPS), timeout=300)


def test_cuda_inner_backend(results):
    expected = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    # the default group and delayed's second group chose it; groups that saw no CUDA op report None
    assert all(set(r["inner"]) - {"None"} == {expected} for r in results), [r["inner"] for r in results]


@pytest.mark.parametrize("name", list(NAMES))
def test_ranks_agree_and_cuda_matches_cpu(results, name):
    r0, r1 = results[0][name], results[1][name]
    assert r0["cuda"]["on_device"] == "cuda"
    assert torch.equal(r0["cuda"]["params"], r1["cuda"]["params"]), "ranks ended with different models"
    if name.startswith("torch-powersgd"):  # PyTorch's hook cannot run a CPU model where CUDA is
        assert "CUDA_VISIBLE_DEVICES" in r0["cpu"]["refused"]
        return
    gpu, cpu = r0["cuda"]["params"], r0["cpu"]["params"]
    dist = float((gpu - cpu).norm() / cpu.norm())
    assert dist < NAMES[name], f"{name}: CUDA vs CPU relative distance {dist:.2e}"
    assert all(abs(a - b) < 1e-2 * abs(b) + 1e-3 for a, b in zip(r0["cuda"]["losses"][:2], r0["cpu"]["losses"][:2]))
