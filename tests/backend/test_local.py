"""The ``local`` network: reductions answered from the rank's own data (no communication); the rest real, at 0 s."""
import pytest
import torch

from gradwire.backend import local
from gradwire.launch import spawn
from gradwire.net import parse_spec
from tests.backend import local_workers

OP = torch.distributed.ReduceOp


def test_reductions_as_if_every_rank_held_the_same_tensor():
    def red(values, op, world, dtype=torch.float32):
        t = torch.tensor(values, dtype=dtype)
        local.reduce_([t], op, world)
        return t.tolist()

    assert red([1.0, -2.0], OP.SUM, 3) == [3.0, -6.0]
    assert red([1.0, -2.0], OP.AVG, 3) == red([1.0, -2.0], OP.MAX, 3) == red([1.0, -2.0], OP.MIN, 3) == [1.0, -2.0]
    assert red([2.0, -2.0], OP.PRODUCT, 3) == [8.0, -8.0]
    assert red([5, 6], OP.BXOR, 2, torch.int64) == [0, 0] and red([5, 6], OP.BXOR, 3, torch.int64) == [5, 6]
    assert red([True, False], OP.SUM, 4, torch.bool) == [True, False]


def test_local_is_a_preset_with_nothing_to_shape():
    assert parse_spec("local").is_local and parse_spec("local,clock=virtual").is_local
    assert not parse_spec("loopback").is_local
    assert parse_spec("local,clock=virtual").unused_by_local() == []
    assert parse_spec("local,bandwidth=1gbit,latency=1ms").unused_by_local() == ["bandwidth", "latency"]


def test_reductions_are_answered_from_the_own_data_without_the_inner_group():
    world = 2
    res = spawn(local_workers.collectives, world, timeout=90)
    for rank, r in enumerate(res):
        x = [1.0 + rank, -2.0 + rank, 3.0 + rank]
        assert r["SUM"] == [world * v for v in x]
        assert r["AVG"] == r["MAX"] == r["MIN"] == x
        assert r["PRODUCT"] == [v ** world for v in x]
        assert r["int_avg"] == [-3 + rank, 5 + rank]
        own = [2.0 * rank + 10 * rank, 2.0 * rank + 1 + 10 * rank]
        assert r["reduce_scatter_tensor"] == [world * v for v in own]
        assert r["reduce"] == ([world * v for v in x] if rank == 0 else x)
        assert r["inner_after_reductions"] == 0  # the inner gloo group ran no reduction
        # the others ran for real: the root's data, every rank's slot, the object, the peer's tensor
        assert r["broadcast"] == [2.0, -1.0, 4.0]
        assert r["all_gather"] == [[1.0, -2.0, 3.0], [2.0, -1.0, 4.0]]
        assert r["broadcast_object"] == {"from": 1}
        assert r["point_to_point"] == [1.0, -2.0, 3.0]
        payload, sent, wire, seconds = r["bytes"]
        assert payload > 0 and sent == wire == 0 and seconds == 0


def test_ddp_trains_on_the_local_network():
    res = spawn(local_workers.ddp_training, 2, (30,), timeout=90)
    for r in res:
        assert r["losses"][-1] < 0.7 * r["losses"][0], r["losses"]
        assert r["all_reduce_calls"] >= 30 and r["wire_bytes"] == 0
        assert r["inner"] <= 6  # DDP's start (its shape check, parameter broadcast, ...): none per step
