"""The optimizer schemes: momentum (and Adam's frozen variance) moved into the exchange, and their refusals."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gradwire.exchange import CompressionState
from gradwire.exchange.schemes import (
    MAX_UPDATE_RMS, FrozenVarianceAdam, MomentumSGD, UnsupportedOptimizer, check_optimizer, frozen_adam_step,
    frozen_denominator, scheme_for,
)
from gradwire.launch import spawn

from . import scheme_workers


@pytest.fixture(scope="module")
def trained():
    return spawn(scheme_workers.schemes_vs_plain, 2, timeout=100)


def _close(a, b, rtol):
    return all(torch.allclose(x, y, rtol=rtol, atol=rtol) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["sgd", "sgd_maximize"])
def test_sgd_momentum_in_the_exchange_is_momentum_sgd(trained, name):
    """`none` compressor: the hook's momentum and decay give SGD(momentum, weight_decay) to rounding."""
    for rank in trained:
        plain, schemed = rank[name]
        assert _close(plain["params"], schemed["params"], 1e-12)
        assert not _close(plain["params"], [p * 0 for p in plain["params"]], 1e-3)  # it trained
        # the optimizer runs without momentum and decay; the exchange keeps beta; lr followed the scheduler
        assert schemed["groups"][0]["momentum"] == 0 and schemed["groups"][0]["weight_decay"] == 0
        assert schemed["scheme"]["exchange_momentum"] == plain["groups"][0]["momentum"]
        assert schemed["groups"][0]["lr"] == plain["groups"][0]["lr"] == 0.05 * 0.5 ** 4
        assert "moved into the exchange" in schemed["scheme"]["describe"]


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_frozen_variance_adam_is_torchs_step_with_the_variance_held(trained, name):
    """Three plain steps, then five with v frozen: torch's own (Adam|AdamW).step with exp_avg_sq held at v_hat.

    (The scheme's refreshes, floor and clipping off: the frozen step alone, as 1-bit Adam runs it.)
    """
    for rank in trained:
        plain, schemed = rank[name]
        assert schemed["scheme"]["frozen"] and schemed["scheme"]["steps"] == scheme_workers.STEPS
        assert _close(plain["params"], schemed["params"], 1e-10)
        b1, b2 = plain["groups"][0]["betas"]
        for ps, ss in zip(plain["state"], schemed["state"]):
            # the checkpointable state: step, EMA momentum and exp_avg_sq / (1 - beta2^t) = v_hat, as torch's
            assert float(ss["step"]) == float(ps["step"]) == scheme_workers.STEPS
            assert torch.allclose(ss["exp_avg"], ps["exp_avg"], rtol=1e-10, atol=1e-12)
            assert torch.allclose(ss["exp_avg_sq"], ps["exp_avg_sq"], rtol=1e-8, atol=1e-14)


def test_the_preconditioned_exchange_takes_the_same_steps(trained):
    """The exchange carries P g instead of g; with an exact exchange the steps are the same to rounding."""
    for rank in trained:
        plain, units = rank["adamw_units"]
        assert _close(plain["params"], units["params"], 1e-10)


def test_refreshed_variance_is_the_ranks_mean_and_the_same_everywhere(trained):
    same = [rank["refresh_same"] for rank in trained]
    own = [rank["refresh_own"] for rank in trained]
    for run in same + own:
        assert run["scheme"]["refreshes"] == 2  # after steps 4 and 8: 2 and 4 times the warm-up of 2
    for runs in (same, own):  # one preconditioner on every rank
        assert all(torch.equal(a, b) for a, b in zip(runs[0]["denominators"], runs[1]["denominators"]))
    b2, t, eps = 0.99, scheme_workers.STEPS, 1e-8
    # the same data on every rank: no noise between them, v_hat is the local variance (bf16, floored)
    for denom, local in zip(same[0]["denominators"], same[0]["local_v"]):
        v = local / (1 - b2 ** t)
        expected = v.clamp(min=0.01 * float(v.mean())).sqrt() + eps
        assert torch.allclose(denom.reshape(-1), expected.to(denom.dtype), rtol=1e-2, atol=1e-6)
    # each rank on its own data: the mean of the ranks' variances times a noise ratio in [1/2, 1]
    for denom, v0, v1 in zip(own[0]["denominators"], own[0]["local_v"], own[1]["local_v"]):
        mean_v = (v0 + v1) / 2 / (1 - b2 ** t)
        ratio = float(((denom.reshape(-1) - eps) ** 2).mean()) / float(mean_v.mean())
        assert 0.45 <= ratio <= 1.1, ratio


def test_refresh_schedule():
    scheme = FrozenVarianceAdam(torch.optim.AdamW(_params()), CompressionState("onebit"), warmup_steps=8,
                                refresh_cap=64)
    assert [t for t in range(1, 300) if scheme.refresh_due(t)] == [16, 32, 64, 128, 192, 256]


def test_update_clipping_and_variance_floor_by_hand():
    p = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=0.0, weight_decay=0.0)
    v = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    opt.state[p] = {"step": torch.tensor(100.0), "exp_avg": torch.zeros(4, dtype=torch.float64),
                    "exp_avg_sq": v * (1 - 0.99 ** 100)}
    # the unseen coordinate (v = 0) is raised to 1% of the mean (0.75): its denominator is sqrt(0.0075)
    denom = frozen_denominator(opt.state[p]["exp_avg_sq"], 100, 0.99, 0.0, floor=0.01)
    assert torch.allclose(denom, torch.tensor([1.0, 1.0, 1.0, 0.0075 ** 0.5], dtype=torch.float64))
    # u = 30 everywhere: exp_avg = 3, update m_hat / denom = 3 / (1 - 0.9^101) per coordinate, RMS well
    # above 1: scaled to RMS 1, then times lr
    p.grad = torch.full((4,), 30.0, dtype=torch.float64)
    frozen_adam_step(opt, {p: denom}, max_update_rms=1.0)
    update = 3.0 / denom
    expected = -0.1 * update / (update.norm() / 2.0)
    assert torch.allclose(p.detach(), expected, rtol=1e-12)
    assert abs(float(p.detach().norm()) / 2.0 - 0.1) < 1e-12  # the step's RMS is lr


def test_adam_warmup_is_torchs_adam_bit_for_bit(trained):
    for rank in trained:
        plain, schemed = rank["adamw_warmup_only"]
        assert not schemed["scheme"]["frozen"] and schemed["scheme"]["exchange_momentum"] == 0.0
        assert all(torch.equal(a, b) for a, b in zip(plain["params"], schemed["params"]))


def test_frozen_step_by_hand():
    """One frozen AdamW step, written out: decay, EMA of u, bias-corrected step over the frozen denominator."""
    p = nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    v, t0 = torch.tensor([0.04, 0.01, 0.09], dtype=torch.float64), 10
    opt.state[p] = {"step": torch.tensor(float(t0)), "exp_avg": torch.zeros(3, dtype=torch.float64),
                    "exp_avg_sq": v.clone()}
    denom = frozen_denominator(v, t0, 0.99, 1e-8)
    assert torch.allclose(denom, (v / (1 - 0.99 ** t0)).sqrt() + 1e-8)
    u = torch.tensor([0.3, -0.1, 0.2], dtype=torch.float64)
    p.grad = u.clone()
    before = p.detach().clone()
    frozen_adam_step(opt, {p: denom})
    t = t0 + 1
    expected = before * (1 - 0.1 * 0.05) - 0.1 / (1 - 0.9 ** t) * (0.1 * u) / denom
    assert torch.allclose(p.detach(), expected, rtol=1e-14)
    assert torch.allclose(opt.state[p]["exp_avg"], 0.1 * u)
    # exp_avg_sq / (1 - beta2^t) stays the frozen v_hat
    assert torch.allclose(opt.state[p]["exp_avg_sq"] / (1 - 0.99 ** t), v / (1 - 0.99 ** t0), rtol=1e-12)
    assert float(opt.state[p]["step"]) == t


def _params():
    return [nn.Parameter(torch.zeros(4))]


@pytest.mark.parametrize("make, reason", [
    (lambda: torch.optim.SGD(_params(), lr=0.1, momentum=0.9, nesterov=True), "nesterov=True"),
    (lambda: torch.optim.SGD(_params(), lr=0.1, momentum=0.9, dampening=0.1), "dampening != 0"),
    (lambda: torch.optim.Adam(_params(), amsgrad=True), "amsgrad=True"),
    (lambda: torch.optim.AdamW(_params(), maximize=True), "maximize=True"),
    (lambda: torch.optim.Adam(_params(), weight_decay=0.01), "use AdamW (decoupled decay) or weight_decay=0"),
    (lambda: torch.optim.RMSprop(_params()), "RMSprop is not supported"),
    (lambda: torch.optim.SGD([{"params": _params(), "momentum": 0.9}, {"params": _params(), "momentum": 0.5}],
                             lr=0.1), "different momentum"),
    (lambda: torch.optim.AdamW([{"params": _params(), "betas": (0.9, 0.99)},
                                {"params": _params(), "betas": (0.8, 0.99)}]), "different betas"),
])
def test_refusals_say_why(make, reason):
    opt = make()
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(UnsupportedOptimizer, match=reason.replace("(", r"\(").replace(")", r"\)")):
        scheme_for(opt, CompressionState("onebit"))
    assert [dict(g) for g in opt.param_groups] == groups  # a refusal changes nothing


def test_scheme_choice_and_other_refusals():
    assert check_optimizer(torch.optim.Adam(_params(), weight_decay=0.01, decoupled_weight_decay=True)) == \
        "FrozenVarianceAdam"
    sgd = torch.optim.SGD(_params(), lr=0.1, momentum=0.9)
    assert isinstance(scheme_for(sgd, CompressionState("onebit")), MomentumSGD)
    adamw = torch.optim.AdamW(_params())
    state = CompressionState("onebit")
    scheme = scheme_for(adamw, state, adam_warmup=7)
    assert isinstance(scheme, FrozenVarianceAdam) and state.momentum == 0.0 and not state.compressing(10**6)
    with pytest.raises(ValueError, match="warmup_steps must be >= 1"):
        FrozenVarianceAdam(torch.optim.AdamW(_params()), CompressionState("onebit"), warmup_steps=0)
    with pytest.raises(UnsupportedOptimizer, match="vote"):
        FrozenVarianceAdam(torch.optim.AdamW(_params()), CompressionState("signum"))


def test_resumed_sgd_momentum_moves_into_the_exchange():
    p = nn.Parameter(torch.ones(4))
    sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.full((4,), 2.0)
    sgd.step()  # momentum_buffer = 2
    state = CompressionState("onebit")
    MomentumSGD(sgd, state)
    key = next(iter(state.momentum_buffers.keys()))
    assert key.segments == ((state.names.name(p), 4),)
    assert torch.equal(state.momentum_buffers.get(key), torch.full((4,), 2.0))
    assert sgd.state[p]["momentum_buffer"] is None


def test_update_clipping_is_off_by_default_under_error_feedback():
    # error feedback keeps only what compression dropped: a clipped update would lose the rest for good
    # (onebit on the digits CNN: -7.6 points with the clip, benchmarks/adamw_onebit.py)
    def scheme(name, **kw):
        return FrozenVarianceAdam(torch.optim.AdamW(_params()), CompressionState(name), **kw)

    assert scheme("onebit").max_update_rms is None and scheme("topk:0.1").max_update_rms is None
    assert scheme("int8").max_update_rms == scheme("none").max_update_rms == MAX_UPDATE_RMS == 1.0
    assert scheme("onebit", max_update_rms=2.0).max_update_rms == 2.0
    assert scheme("int8", max_update_rms=None).max_update_rms is None
