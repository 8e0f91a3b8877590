"""The ``local`` network: no communication at all, every collective answered from the rank's own data."""
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


def test_all_to_all_with_splits_the_own_data_cannot_answer_is_refused():
    with pytest.raises(ValueError, match="splits"):
        local.all_to_all(torch.zeros(5), torch.arange(5.0), [2, 3], [2, 3], 0, 2)


def test_local_is_a_preset_with_nothing_to_shape():
    assert parse_spec("local").is_local and parse_spec("local,clock=virtual").is_local
    assert not parse_spec("loopback").is_local
    assert parse_spec("local,clock=virtual").unused_by_local() == []
    assert parse_spec("local,bandwidth=1gbit,latency=1ms").unused_by_local() == ["bandwidth", "latency"]


def test_collectives_are_answered_from_the_own_data_without_the_inner_group():
    world = 2
    res = spawn(local_workers.collectives, world, timeout=90)
    for rank, r in enumerate(res):
        x = [1.0 + rank, -2.0 + rank, 3.0 + rank]
        assert r["SUM"] == [world * v for v in x]
        assert r["AVG"] == r["MAX"] == r["MIN"] == x
        assert r["PRODUCT"] == [v ** world for v in x]
        assert r["int_avg"] == [-3 + rank, 5 + rank]
        assert r["broadcast"] == x  # the root's tensor is taken to be the own one
        assert r["all_gather"] == [x] * world and r["all_gather_into_tensor"] == x * world
        own = [2.0 * rank + 10 * rank, 2.0 * rank + 1 + 10 * rank]
        assert r["reduce_scatter_tensor"] == [world * v for v in own]
        assert r["all_to_all_single"] == own * world
        assert r["reduce"] == ([world * v for v in x] if rank == 0 else x)
        assert r["point_to_point"] is not None and "no peers" in r["point_to_point"]
        payload, sent, wire, seconds = r["bytes"]
        assert payload > 0 and sent == wire == 0 and seconds == 0
        assert r["inner"] == 0  # the inner gloo group ran no collective


def test_ddp_trains_on_the_local_network():
    res = spawn(local_workers.ddp_training, 2, (30,), timeout=90)
    for r in res:
        assert r["losses"][-1] < 0.7 * r["losses"][0], r["losses"]
        assert r["all_reduce_calls"] >= 30 and r["wire_bytes"] == 0
        assert r["inner"] == 0
