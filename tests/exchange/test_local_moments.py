"""LocalMomentsAdam in a hand-written loop: identical replicas, and a resume from rank 0's checkpoint bit for bit."""
from __future__ import annotations

import pytest
import torch

from gradwire.compress import get_compressor
from gradwire.exchange import CompressionState, LocalMomentsAdam, UnsupportedOptimizer
from gradwire.exchange.local_moments import sketch_ratio
from gradwire.launch import spawn

from . import scheme_workers


@pytest.mark.parametrize("compressor", ["onebit", "onebit:allgather:block=64", "topk:0.1"])
def test_resume_from_rank0s_checkpoint_is_bit_exact(compressor):
    results = spawn(scheme_workers.local_moments_resume, 2, (3, compressor), timeout=90)
    for r in results:
        assert all(r["same"]), "the ranks' parameters differ after a step"
        for a, b in zip(r["straight"], r["resumed"]):
            assert torch.equal(a, b), f"{compressor}: the resumed run is not the uninterrupted one"
        assert r["norms"] == r["norms_resumed"]
        assert len(set(round(n, 12) for n in r["norms"])) > 1
    assert results[0]["norms"] == results[1]["norms"]  # every rank clips by the same norm


def test_sketch_ratio_is_one_for_identical_ranks_and_falls_for_independent_ones():
    g = torch.randn(4096, dtype=torch.float64)
    assert sketch_ratio(2 * g, 2, 2 * float(g.square().sum())) == pytest.approx(1.0)
    a, b = torch.randn(4096, dtype=torch.float64), torch.randn(4096, dtype=torch.float64)
    ratio = sketch_ratio(a + b, 2, float(a.square().sum() + b.square().sum()))
    assert 0.4 < ratio < 0.6  # independent noise: the average's norm^2 is half the ranks' mean
    assert sketch_ratio(torch.zeros(8), 2, 0.0) == 1.0


def test_refuses_what_it_cannot_run():
    params = [torch.nn.Parameter(torch.zeros(4))]
    with pytest.raises(UnsupportedOptimizer, match="Adam/AdamW"):
        LocalMomentsAdam(torch.optim.SGD(params, lr=0.1), CompressionState("onebit"))
    with pytest.raises(UnsupportedOptimizer, match="error feedback"):
        LocalMomentsAdam(torch.optim.AdamW(params), CompressionState("int8"))
    with pytest.raises(UnsupportedOptimizer, match="error feedback"):
        LocalMomentsAdam(torch.optim.AdamW(params), CompressionState("signum"))
    scheme = LocalMomentsAdam(torch.optim.AdamW(params), CompressionState(get_compressor("onebit")))
    with pytest.raises(UnsupportedOptimizer, match="norm_type=2"):
        scheme.global_norm([torch.ones(4)], norm_type=float("inf"))
