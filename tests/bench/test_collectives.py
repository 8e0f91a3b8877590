"""Pure tests of the collective definitions: nccl-tests byte conventions and bus factors."""
from __future__ import annotations

import pytest
import torch

from gradwire.bench.collectives import COLLECTIVES, RankSetup, fill, reference_reduce
from gradwire.net import NetworkModel, busbw_factor
from tests.net import textbook as tb

NCCL_TESTS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def test_every_collective_has_a_factor_under_test() -> None:
    assert set(COLLECTIVES) == set(NCCL_TESTS_FACTOR)


@pytest.mark.parametrize("op", sorted(NCCL_TESTS_FACTOR))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16])
def test_bus_factor_is_nccl_tests(op: str, n: int) -> None:
    assert COLLECTIVES[op].bus_factor(n) == pytest.approx(NCCL_TESTS_FACTOR[op](n))
    # and agrees with the network model's own table (sendrecv is priced as send)
    assert COLLECTIVES[op].bus_factor(n) == pytest.approx(busbw_factor(COLLECTIVES[op].model_op, n))


@pytest.mark.parametrize("op,size,send,recv", [
    ("all_reduce", 4096, 1024, 1024),
    ("broadcast", 4096, 1024, 1024),
    ("reduce", 4096, 1024, 1024),
    ("sendrecv", 4096, 1024, 1024),
    ("all_gather", 4096, 256, 1024),      # S = the full gathered buffer
    ("reduce_scatter", 4096, 1024, 256),  # S = the full input buffer
    ("all_to_all", 4096, 1024, 1024),     # S = one rank's whole buffer
])
def test_layout_follows_nccl_tests(op: str, size: int, send: int, recv: int) -> None:
    lay = COLLECTIVES[op].layout(size, 4, 4)
    assert (lay.size, lay.count, lay.send, lay.recv) == (size, size // 4, send, recv)


def test_layout_rounds_down_to_a_multiple_of_ranks() -> None:
    lay = COLLECTIVES["all_gather"].layout(40, 4, 3)  # 10 floats -> 3 per rank
    assert (lay.size, lay.send, lay.recv) == (36, 3, 9)


def test_algbw_and_busbw_from_time() -> None:
    from gradwire.bench.collectives import Buffers
    from gradwire.bench.config import BenchConfig
    from gradwire.bench.driver import _row

    ctx = RankSetup(0, 4, torch.float32, "sum", 0, torch.device("cpu"))
    lay = Buffers(8_000_000, 2_000_000, 2_000_000, 2_000_000)
    row = _row(COLLECTIVES["all_reduce"], lay, BenchConfig(), ctx, "in-place", 0.01, 0, None)
    assert row.algbw == pytest.approx(0.8)  # 8 MB / 10 ms = 0.8 GB/s
    assert row.busbw == pytest.approx(0.8 * 2 * 3 / 4)
    assert row.time_us == pytest.approx(10_000)


@pytest.mark.parametrize("redop", ["sum", "prod", "max", "min", "avg"])
def test_fill_is_exact_in_half_precision(redop: str) -> None:
    ctx = RankSetup(0, 8, torch.float16, redop, 0, torch.device("cpu"))
    ref = reference_reduce(ctx, 1000)
    if redop != "avg":
        assert torch.equal(ref.to(torch.float16).double(), ref)
    assert torch.isfinite(ref.to(torch.float16)).all()
    assert not torch.equal(fill(ctx, 0, 64), fill(ctx, 1, 64))  # ranks differ


@pytest.mark.parametrize("p", tb.P)
def test_model_seconds_are_the_textbook_costs(p: int) -> None:
    """What the gradwire backend charges per call: the cheapest textbook algorithm (tests/net/textbook.py)."""
    alpha, beta, n = 1e-3, 8 / 1e9, 3 << 20
    model = NetworkModel("bandwidth=1gbit,latency=1ms,protocol=none", p)
    for name, coll in COLLECTIVES.items():
        best, _ = tb.auto(coll.model_op, p, n, alpha, beta)
        assert coll.model_seconds(model, n) == pytest.approx(best, rel=1e-12), name
    # send and recv overlap on a full-duplex link: one message time, not two
    assert COLLECTIVES["sendrecv"].model_seconds(model, n) == pytest.approx(alpha + n * beta, rel=1e-12)
