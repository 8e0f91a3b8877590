"""Multi-rank behaviour of the strategies: parity with DDP, misuse raises, ranks agree."""
from __future__ import annotations

import pytest
import torch

from gradwire.launch import spawn
from gradwire.strategies.clipping import GradientClip
from gradwire.train import TrainConfig

from . import workers


def test_handler_matches_ddp_after_n_steps() -> None:
    results = spawn(workers.handler_vs_ddp, 2, (6,), timeout=90)
    for out in results:
        for a, b in zip(out["ddp"], out["handler"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(results[0]["handler"], results[1]["handler"]):
        assert torch.equal(a, b)


def test_step_before_synchronize_raises() -> None:
    for out in spawn(workers.handler_misuse, 2, timeout=90):
        assert out["pending"] == "2"
        assert "synchronize() before optimizer.step()" in out["step"]
        assert out["unchanged"] == "True"
        assert "accumulated twice" in out["twice"]
        assert out["after"] == "0"


def _configs(strategies: list[str], steps: int = 12) -> list[TrainConfig]:
    return [TrainConfig(strategy=s, model="tiny", epochs=1, batch_size=16, max_steps=steps) for s in strategies]


def test_strategies_keep_ranks_identical_and_count_collectives() -> None:
    names = ["sync", "delayed", "delayed:naive", "localsgd:4", "localsgd:3:warmup=4", "async-average:4", "handler",
             "torch-fp16", "torch-powersgd:2:start=4"]
    results = spawn(workers.train_many, 2, ("loopback", _configs(names)), timeout=100)
    by_name = {name: [results[r][i] for r in range(2)] for i, name in enumerate(names)}
    for name, (r0, r1) in by_name.items():
        assert r0.param_checksum == r1.param_checksum, name
        assert len(r0.step_seconds) == 12 and len(r0.step_comm_model) == 12, name
        assert r0.test_accuracy > 0.3, name
    # one parameter average per H steps; sync reduces every step (tiny: one bucket), plus DDP's rebuild
    assert by_name["localsgd:4"][0].collectives == 3
    assert by_name["localsgd:3:warmup=4"][0].collectives == 4 + 8 // 3
    assert by_name["async-average:4"][0].collectives == 3
    assert by_name["sync"][0].collectives >= 12
    # tiny: one bucket, one average per step, plus DDP's own (bucket rebuild) exactly as in sync
    assert by_name["delayed"][0].collectives == by_name["sync"][0].collectives
    assert by_name["delayed:naive"][0].collectives == by_name["sync"][0].collectives
    assert by_name["handler"][0].collectives == 2 * 12  # weight and bias, each its own all_reduce
    # PyTorch's own hooks on CPU: fp16 halves every bucket's bytes; PowerSGD (rank 2, from step 4) sends two small
    # factors of the 10x64 weight plus the bias uncompressed instead of the whole bucket
    sync_bytes = by_name["sync"][0].stats["total"]["payload_bytes"]
    assert 0.45 < by_name["torch-fp16"][0].stats["total"]["payload_bytes"] / sync_bytes < 0.6
    assert by_name["torch-powersgd:2:start=4"][0].stats["total"]["payload_bytes"] < 0.5 * sync_bytes


def test_every_strategy_composes_with_compressors() -> None:
    # the digits CNN (38 K parameters: its weights are above the 1024-element cutoff), 16 steps, the first of them
    # uncompressed (warm-up): wire bytes against the same strategy uncompressed, within what the compressor can
    # save (fp16 halves, onebit ~30x and topk:0.05 ~10x on the weights, int8 ~4x; biases and DDP's own ops stay)
    pairs = {"fp16+sync": ("sync", 1.5, 2.0), "onebit+delayed": ("delayed", 5.0, 32.0),
             "topk:0.05+delayed": ("delayed", 3.5, 20.0), "topk:0.05+localsgd:2": ("localsgd:2", 3.5, 20.0),
             "int8+async-average:2": ("async-average:2", 2.0, 4.0), "fp16+handler": ("handler", 1.6, 2.0)}
    names = sorted(set(pairs) | {plain for plain, _, _ in pairs.values()})
    configs = [TrainConfig(strategy=s, model="cnn", epochs=1, batch_size=16, max_steps=16) for s in names]
    results = spawn(workers.train_many, 2, ("loopback", configs), timeout=150)
    by_name = {name: (results[0][i], results[1][i]) for i, name in enumerate(names)}
    for name, (r0, r1) in by_name.items():
        assert r0.param_checksum == r1.param_checksum, name
    for name, (plain, lo, hi) in pairs.items():
        ratio = by_name[plain][0].stats["total"]["wire_bytes"] / by_name[name][0].stats["total"]["wire_bytes"]
        assert lo <= ratio <= hi, f"{name}: {ratio:.2f}x fewer wire bytes than {plain}, expected [{lo}, {hi}]"


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_delayed_applies_local_gradient_plus_previous_average_correction() -> None:
    names = ["delayed", "delayed:naive", "fp16+delayed", "onebit+delayed"]
    steps = 5
    results = spawn(workers.delayed_updates, 2, (names, steps), timeout=90)
    for out in results:
        # delayed: u_0 = g_0; u_t = g_t + mean_{t-1} - g_{t-1}; finish applies mean_T - g_T
        r = out["delayed"]
        g, mean, applied = r["local"], r["mean"], r["applied"]
        assert len(applied) == steps + 1
        _close(applied[0], g[0])
        for t in range(1, steps):
            _close(applied[t], mean[t - 1] + g[t] - g[t - 1])
        _close(applied[steps], mean[steps - 1] - g[steps - 1])
        # naive: step 0 skipped, then the stale average alone
        r = out["delayed:naive"]
        assert r["skipped"] == 1 and len(r["applied"]) == steps
        for t in range(steps):
            _close(r["applied"][t], r["mean"][t])
        # with a compressor the strategy owns the momentum: v = m = 0.9 m + g, the average is of m
        r = out["fp16+delayed"]
        m = [r["local"][0]]
        for t in range(1, steps):
            m.append(0.9 * m[-1] + r["local"][t])
        m_mean = [r["mean"][0]]  # the average of the momenta is the momentum of the average
        for t in range(1, steps):
            m_mean.append(0.9 * m_mean[-1] + r["mean"][t])
        _close(r["applied"][0], m[0])
        for t in range(1, steps):
            _close(r["applied"][t], m_mean[t - 1] + m[t] - m[t - 1], tol=2e-3)
        # onebit: the first step is local; in total every rank applied the same sum of averages
        _close(out["onebit+delayed"]["applied"][0], out["onebit+delayed"]["local"][0])
    for name in names:
        totals = [torch.stack(out[name]["applied"]).sum(0) for out in results]
        _close(totals[0], totals[1], tol=1e-4)
        # the update is written flat into DDP's buckets, but on the step after DDP rebuilt them
        assert all(out[name]["per_parameter_steps"] <= 1 for out in results)


def test_exposure_counts_only_network_waiting() -> None:
    # about 21 ms of modelled all_reduce per step; 60 ms of compute after each step hides it for delayed
    names = ["sync", "delayed"]
    for out in spawn(workers.exposure, 2, (names, 8, 0.06), timeout=90):
        for comm, waited, network in out.values():
            assert comm > 0 and 0 <= network <= waited + 1e-9
        sync_comm, _, sync_network = out["sync"]
        delayed_comm, _, delayed_network = out["delayed"]
        assert sync_network > 0.5 * sync_comm  # sync waits for every all_reduce after backward
        assert delayed_network < 0.1 * delayed_comm  # delayed's average had a whole step to arrive


@pytest.mark.parametrize("name", ["delayed", "onebit+delayed"])
def test_delayed_resumes_exactly_in_new_processes(tmp_path, name: str) -> None:
    # the averages in flight at the checkpoint are waited for and saved as what each parameter is owed
    straight = spawn(workers.strategy_resume, 2, (name, 7), timeout=90)
    path = str(tmp_path / "ckpt")
    spawn(workers.strategy_resume, 2, (name, 7, 3, None, path), timeout=90)
    resumed = spawn(workers.strategy_resume, 2, (name, 7, None, 3, path), timeout=90)
    for r in range(2):
        assert torch.equal(straight[r], resumed[r]), f"rank {r}"


def test_torch_powersgd_over_many_buckets_pairs_the_same_collectives_on_every_rank() -> None:
    # PyTorch's hook issues its Q all_reduce from the P all_reduce's completion callback; on a slow
    # simulated network that raced the next bucket's P on the backward thread, and gloo paired different
    # collectives across the ranks (a size-mismatch abort). torch-powersgd runs the buckets in turn.
    sums = spawn(workers.powersgd_many_buckets, 2, ("bandwidth=200mbit,latency=200us", 6), timeout=120)
    assert sums[0] == sums[1]


@pytest.mark.parametrize("clip", [GradientClip(max_norm=0.5), GradientClip(max_norm=0.5, norm_type=1.0),
                                  GradientClip(max_norm=0.5, norm_type=float("inf")), GradientClip(max_norm=1e3),
                                  GradientClip(clip_value=0.05)])
def test_a_recorded_clip_applies_as_torch_clips(clip: GradientClip) -> None:
    """What delayed applies to an average is what clip_grad_norm_ / clip_grad_value_ does to gradients."""
    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (7, 300, 1)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 0.1
    tensors = [p.grad.clone() for p in params]
    if clip.max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, clip.max_norm, norm_type=clip.norm_type)
    else:
        torch.nn.utils.clip_grad_value_(params, clip.clip_value)
    clip.apply_(tensors)
    for p, t in zip(params, tensors):
        torch.testing.assert_close(t, p.grad, rtol=1e-6, atol=0)


def test_a_clip_bounds_one_thing() -> None:
    with pytest.raises(ValueError, match="either the norm"):
        GradientClip(max_norm=1.0, clip_value=1.0)
