"""Every op under gradwire gives exactly what plain gloo gives."""
import pytest
import torch

from gradwire.launch import spawn
from tests.backend import workers


def _same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {b!r}"
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path}: {a} != {b}"
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("world", [2, 4])
def test_every_op_matches_gloo(world):
    ref = spawn(workers.op_suite, world, ("gloo",), timeout=100)
    got = spawn(workers.op_suite, world, ("gradwire", "10gbe"), timeout=100)
    for rank in range(world):
        for key, want in ref[rank].items():
            _same(got[rank][key], want, f"rank {rank} {key}")
        assert not any(isinstance(v, tuple) and v[:1] == ("error",) for v in got[rank].values())


def test_avg_is_sum_divided():
    got = spawn(workers.avg_allreduce, 2, timeout=60)
    assert got[0] == got[1] == pytest.approx([1.5, 3.0, 4.5])


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_matches_gloo(world):
    ref = spawn(workers.ddp_train, world, ("gloo", None), timeout=100)
    got = spawn(workers.ddp_train, world, ("gradwire", "10gbe"), timeout=100)
    for rank in range(world):
        _same(got[rank], ref[rank], f"rank {rank}")
        _same(got[rank], got[0], f"rank {rank} vs rank 0")


@pytest.mark.parametrize("hook", ["allreduce_hook", "fp16_compress_hook"])
def test_ddp_with_comm_hook_matches_gloo(hook):
    ref = spawn(workers.ddp_train, 2, ("gloo", None, 3, hook), timeout=100)
    got = spawn(workers.ddp_train, 2, ("gradwire", "10gbe", 3, hook), timeout=100)
    for rank in range(2):
        _same(got[rank], ref[rank], f"rank {rank}")
