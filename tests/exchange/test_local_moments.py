"""LocalMomentsAdam in a hand-written loop: identical replicas, and a resume from rank 0's checkpoint bit for bit."""
from __future__ import annotations

import pytest
import torch

from gradwire.compress import get_compressor
from gradwire.exchange import CompressionState, LocalMomentsAdam, UnsupportedOptimizer
from gradwire.exchange.local_moments import sketch_ratio
from gradwire.launch import spawn

from . import scheme_workers


@pytest.mark.parametrize("compressor, delayed", [("onebit", False), ("onebit:allgather:block=64", False),
                                                  ("topk:0.1", False), ("onebit:allgather:block=64", True),
                                                  ("none", True)])
def test_resume_from_rank0s_checkpoint_is_bit_exact(compressor, delayed):
    """Rank 0's checkpoint (delayed: with what the average in flight still owes each parameter)."""
    results = spawn(scheme_workers.local_moments_resume, 2, (3, compressor, delayed), timeout=90)
    for r in results:
        # identical replicas after every step; delayed: the ranks differ by their latest own directions
        assert all(r["same"]) != delayed, r["same"]
        for a, b in zip(r["straight"], r["resumed"]):
            assert torch.equal(a, b), f"{compressor}: the resumed run is not the uninterrupted one"
        assert r["norms"] == r["norms_resumed"]
        assert len(set(round(n, 12) for n in r["norms"])) > 1
    assert results[0]["norms"] == results[1]["norms"]  # every rank clips by the same norm


@pytest.mark.parametrize("delayed", [False, True])
def test_with_the_exact_exchange_and_agreeing_ranks_it_is_torchs_adamw(delayed):
    """rho is 1 and every rank's moments are the average's: torch's AdamW with clip_grad_norm_, step for step
    (delayed: the own direction now, the identical average a step later, the same)."""
    for r in spawn(scheme_workers.local_moments_vs_adamw, 2, (delayed,), timeout=90):
        assert len(r["scheme"]) == len(r["adamw"]) + 1
        for t, (a, b) in enumerate(zip(r["adamw"], r["scheme"])):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14, msg=f"step {t + 1}")
        torch.testing.assert_close(r["scheme"][-1], r["adamw"][-1], rtol=1e-12, atol=1e-14)  # finish


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
    with pytest.raises(ValueError, match="exact_first must be False"):
        LocalMomentsAdam(torch.optim.AdamW(params), CompressionState("onebit"), delayed=True)
    with pytest.raises(UnsupportedOptimizer, match="error feedback"):
        LocalMomentsAdam(torch.optim.AdamW(params), CompressionState("signum"))
    scheme = LocalMomentsAdam(torch.optim.AdamW(params), CompressionState(get_compressor("onebit")))
    with pytest.raises(UnsupportedOptimizer, match="norm_type=2"):
        scheme.global_norm([torch.ones(4)], norm_type=float("inf"))
