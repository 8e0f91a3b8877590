"""Every strategy on a script's own DDP, in the shapes the training stacks use: right, or refused with the reason.

Lightning steps with a closure; the HF Trainer builds DDP with
``find_unused_parameters=True`` and clips; mixed precision brings a
GradScaler; accumulation uses ``no_sync()``. For each strategy and shape the
training either runs and means what the script meant (a closure gives what
the plain loop gives, bit for bit; unused parameters and buffers never pair
collectives differently on the ranks, which would hang) or is refused before
it trains on, with a reason that names the cause.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from gradwire.launch import spawn

from . import inject_ranks

STRATEGIES = ["sync", "onebit", "int8", "delayed", "onebit+delayed", "localsgd:2", "async-average:2", "handler",
              "torch-fp16", "torch-powersgd:2:start=2"]
#: strategies whose ranks hold the same parameters after every step (at STEPS, a multiple of localsgd's period)
IDENTICAL = {"sync", "torch-fp16", "torch-powersgd:2:start=2", "handler", "localsgd:2"}


def _run(runs: list[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    results = spawn(inject_ranks.cases, 2, (runs,), timeout=110)
    return {run: [results[r][i] for r in range(2)] for i, run in enumerate(runs)}


def _ok(outs: list[dict[str, Any]], strategy: str) -> None:
    for out in outs:
        assert "raised" not in out, out.get("raised")
        assert out["status"] == "applied", out
    if strategy in IDENTICAL:
        assert all(out["same"] for out in outs), f"{strategy}: the ranks hold different parameters"


def _refused(outs: list[dict[str, Any]], *words: str) -> None:
    for out in outs:
        assert out["status"] == "refused", out
        assert "raised" in out
        for word in words:
            assert word in out["reason"], (word, out["reason"])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_closure_step_equals_the_plain_loop(optimizer: str) -> None:
    strategies = STRATEGIES if optimizer == "sgd" else ["sync", "onebit", "delayed", "onebit+delayed", "localsgd:2"]
    prefix = "" if optimizer == "sgd" else "adamw-"
    got = _run([(s, prefix + case) for s in strategies for case in ("plain", "closure")])
    for s in strategies:
        plain, closure = got[(s, prefix + "plain")], got[(s, prefix + "closure")]
        _ok(plain, s)
        _ok(closure, s)
        if s.startswith("async-average"):  # applies each average at the first step it has arrived by: timing
            continue
        for a, b in zip(plain, closure):
            for x, y in zip(a["params"], b["params"]):
                assert torch.equal(x, y), f"{s}: a closure step trains differently from the plain loop"


@pytest.mark.slow
def test_lbfgs_runs_where_the_optimizer_owns_its_step_and_is_refused_elsewhere() -> None:
    got = _run([(s, "lbfgs") for s in STRATEGIES])
    for s in ("sync", "torch-fp16", "torch-powersgd:2:start=2"):
        _ok(got[(s, "lbfgs")], s)
    for s in ("delayed", "onebit+delayed", "localsgd:2", "async-average:2", "handler"):
        _refused(got[(s, "lbfgs")], "closure several times")
    for s in ("onebit", "int8"):
        _refused(got[(s, "lbfgs")], "LBFGS")


@pytest.mark.slow
def test_clipping_runs_under_every_strategy() -> None:
    got = _run([(s, "clipped") for s in STRATEGIES])
    for s in STRATEGIES:
        _ok(got[(s, "clipped")], s)
    for s in ("onebit", "int8", "onebit+delayed"):  # the script's SGD steps as written on the exchanged gradient
        assert all("SGD as written" in out["description"] for out in got[(s, "clipped")]), s
    for s in ("onebit", "int8"):  # every rank applies the one clipped average
        assert all(out["same"] for out in got[(s, "clipped")]), s
    # handler clips the averaged gradients, as DDP does: the same training as sync
    for a, b in zip(got[("sync", "clipped")], got[("handler", "clipped")]):
        for x, y in zip(a["params"], b["params"]):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_mixed_precision_and_accumulation() -> None:
    got = _run([(s, case) for s in STRATEGIES for case in ("scaled", "bf16", "accumulated")])
    for s in STRATEGIES:
        _ok(got[(s, "bf16")], s)
    for s in ("sync", "torch-fp16", "torch-powersgd:2:start=2", "handler"):
        _ok(got[(s, "scaled")], s)
    for s in ("onebit", "int8", "delayed", "onebit+delayed", "localsgd:2", "async-average:2"):
        _refused(got[(s, "scaled")], "GradScaler")
    for s in STRATEGIES:
        if s == "handler":
            _refused(got[(s, "accumulated")], "no_sync")
        else:
            _ok(got[(s, "accumulated")], s)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unused", "static", "buffers", "views"])
def test_ddp_options_never_hang_and_train(case: str) -> None:
    got = _run([(s, case) for s in STRATEGIES])
    for s in STRATEGIES:
        if case == "static" and s == "handler":
            _refused(got[(s, case)], "static_graph")
        else:
            _ok(got[(s, case)], s)


#: every compressor on sync's exchange, and delayed with and without one
CLIP_STRATEGIES = ["fp16", "bf16", "int8", "qsgd", "terngrad", "onebit", "signum", "topk", "randomk", "powersgd",
                   "auto", "delayed", "onebit+delayed", "int8+delayed"]


def _clip(x: torch.Tensor) -> torch.Tensor:
    """Sync's clip of ``x`` (clip_grad_norm_'s factor) at the threshold the ranks used."""
    return x * min(1.0, inject_ranks.CLIP_NORM / (float(x.norm()) + 1e-6))


#: the least cosine of a compressed average to the exact one (a sparsifier keeps 1% of the coordinates)
MIN_COS = {"topk": 0.1, "randomk": 0.02}


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


@pytest.mark.slow
def test_a_clip_scales_the_update_as_sync_scales_the_same_average() -> None:
    """clip_grad_norm_ below the average's norm: the update is sync's clip of the (compressed) average.

    Sync with a compressor: ``.grad`` read before the clip is the average the step uses (the same on every rank;
    the exact mean of the ranks' gradients at the uncompressed first step, near it later), and the update is that
    average clipped as sync clips it. Delayed: ``.grad`` is this rank's gradient ``g_t``, applied clipped now and
    taken back a step later, when the average arrives and is applied clipped as sync clips it: the update minus
    the clipped ``g_t`` plus the clipped ``g_{t-1}`` is sync's clip of ``avg_{t-1}`` (exact after the
    uncompressed first step, of the norm of the threshold later).
    """
    results = spawn(inject_ranks.clip_cases, 2, (CLIP_STRATEGIES,), timeout=110)
    for i, strategy in enumerate(CLIP_STRATEGIES):
        runs = [results[r][i] for r in range(2)]
        _ok(runs, strategy)
        steps = list(zip(*(run["records"] for run in runs)))
        assert len(steps) == inject_ranks.STEPS, strategy
        for t, ranks in enumerate(steps):
            mean_own = sum(r["own"] for r in ranks) / len(ranks)
            for r in ranks:
                assert r["norm"] > 2 * inject_ranks.CLIP_NORM, (strategy, t, r["norm"])
            if "delayed" not in strategy:
                read = ranks[0]["read"]
                for r in ranks:
                    torch.testing.assert_close(r["read"], read, msg=f"{strategy}: the ranks read different .grad")
                    torch.testing.assert_close(r["update"], _clip(r["read"]), rtol=1e-5, atol=1e-7,
                                               msg=f"{strategy} step {t}: the update is not the clipped average")
                if t == 0:
                    torch.testing.assert_close(read, mean_own, rtol=1e-5, atol=1e-6)
                else:
                    assert _cos(read, mean_own) > MIN_COS.get(strategy, 0.3), (strategy, t, _cos(read, mean_own))
                continue
            before = steps[t - 1] if t else None
            prev_mean = sum(r["own"] for r in before) / len(before) if before else None
            applied = []
            for k, r in enumerate(ranks):
                torch.testing.assert_close(r["read"], r["own"], rtol=1e-5, atol=1e-6)
                owed = r["update"] - _clip(r["read"]) + (_clip(before[k]["read"]) if before else 0)
                applied.append(owed)
            torch.testing.assert_close(applied[0], applied[1], rtol=1e-5, atol=1e-6)
            if prev_mean is None:
                assert float(applied[0].abs().max()) < 1e-6, strategy
            elif t == 1:
                torch.testing.assert_close(applied[0], _clip(prev_mean), rtol=1e-4, atol=1e-6)
            else:
                assert abs(float(applied[0].norm()) - inject_ranks.CLIP_NORM) < 1e-4, (strategy, t)
                assert _cos(applied[0], prev_mean) > 0.3, (strategy, t, _cos(applied[0], prev_mean))
