"""Compressors on CUDA tensors: the payload stays on the device and decodes like the CPU path.

Skipped without CUDA (CI has none); run on a GPU machine with ``pytest -m cuda``.
"""
import pytest
import torch

from gradwire.compress import get_compressor, roundtrip, twophase

from .test_compressors import ALL, rand, rel_err

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

#: deterministic compressors: the CUDA result equals the CPU result up to float rounding
DETERMINISTIC = ["none", "fp16", "bf16", "onebit", "onebit:allgather", "onebit:block=0:rms=0", "topk:0.01",
                 "randomk:0.1", "powersgd:4"]


@pytest.mark.parametrize("name", ALL)
def test_payload_and_result_stay_on_the_device(name):
    comp = get_compressor(name)
    x = rand(10_001).cuda()
    payload, ctx = comp.compress(x, 0)
    assert all(p.device.type == "cuda" for p in payload)
    y = roundtrip(get_compressor(name), x)
    assert y.device.type == "cuda" and y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_cuda_matches_cpu(name):
    x = rand(10_001)
    cpu = roundtrip(get_compressor(name), x)
    gpu = roundtrip(get_compressor(name), x.cuda()).cpu()
    assert rel_err(gpu, cpu) < 1e-5 if cpu.norm() > 0 else torch.equal(gpu, cpu)


@pytest.mark.parametrize("name", ["onebit", "int8"])
def test_two_phase_on_the_device(name):
    comp = get_compressor(name)
    x = rand(50_000).cuda()
    rows, approx, plan = twophase.split_encode(x, 4, comp)
    assert rows.device.type == "cuda" and approx.device.type == "cuda"
    recv = torch.stack([rows[0]] * 4)  # every rank sent the same tensor: the server's average is it
    row = twophase.server_reduce(recv, plan, 0, comp)
    assert row.device.type == "cuda"
    out = twophase.gather_decode(rows, plan, comp)
    assert out.device.type == "cuda"
    assert rel_err(out, approx) < 1e-6
