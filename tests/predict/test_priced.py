"""Compression and compute priced on a device model as the simulated clock prices them. Pure, one process."""
import pytest
import torch

from gradwire.device import DEVICES, op_seconds
from gradwire.predict.priced import device_of, priced_codec_cost, priced_cost, priced_net, priced_seconds


def test_an_op_is_priced_by_the_roofline_not_timed():
    x = torch.zeros(1 << 20)
    seconds = priced_seconds(lambda: x.add_(1.0), "a100")
    # add_ reads x and writes it: 2 x 4 MiB at 70% of 2039 GB/s, plus the per-op cost
    assert seconds == pytest.approx(op_seconds(DEVICES["a100"], 0.0, 2 * 4 * (1 << 20), False))
    assert priced_seconds(lambda: x.add_(1.0), "a100:x2") == pytest.approx(2 * seconds)


def test_a_compressor_is_priced_the_same_every_time_and_scales_with_the_device():
    first, again = priced_codec_cost("onebit", "cpu-core"), priced_codec_cost.__wrapped__("onebit", "cpu-core")
    assert first == again  # the device's price, not this host's stopwatch
    n = 600_000
    slow = first.encode(n) + first.serve(n) + first.decode(n)
    fast = priced_codec_cost("onebit", "a100")
    assert 0 < fast.encode(n) + fast.serve(n) + fast.decode(n) < slow / 5
    # per element: memory traffic at 2039 GB/s against 10 GB/s; per op: 5 us against 3 us (many small ops)
    assert fast.encode.per_element == pytest.approx(first.encode.per_element * 10 / 2039, rel=0.2)
    assert fast.encode.fixed > first.encode.fixed
    assert priced_cost("sync", "a100").encode(n) == 0.0


def test_a_hook_of_pytorchs_is_priced_at_each_bucket():
    cost = priced_cost("torch-powersgd:4", "a100")
    stages = cost.stages(1 << 16, ((256, 256),), 4)
    assert len(stages) == 4 and all(t > 0 for t in stages)
    assert cost.stages(1 << 16, ((256, 256),), 4) == stages


@pytest.mark.parametrize("text, words", [
    ("host", "this host's clock, not a device model"),
    ("host:x0.5", "this host's clock, not a device model"),
    ("step:35ms", "scales a training that runs"),
    ("warp9", "unknown device 'warp9'"),
])
def test_only_device_models_are_priced(text, words):
    with pytest.raises(ValueError, match=words):
        device_of(text)


def test_the_priced_runs_are_on_the_simulated_clock_over_free_loopback():
    assert priced_net("19.5,1555") == "loopback,clock=sim,device=19.5/1555"


@pytest.mark.parametrize("device", ["a100", "cpu-core"])
def test_a_two_phase_compressor_pays_each_ranks_chunk(device):
    """onebit cuts a bucket into one chunk per rank, each with its own ops: priced at 4 chunks and at 16, the
    cost at 16 or 64 ranks is what its stages cost there (per-op costs dominate on a fast device)."""
    from gradwire.predict.codec import _stages

    cost = priced_codec_cost("onebit", device)
    assert len(cost.wide) == 3
    numel = 600_000
    for world in (16, 64):
        stages = _stages("onebit", numel, "cpu", world)
        for f in stages.values():
            f()  # state built on a first call, as priced_codec_cost prices the second
        direct = [priced_seconds(stages[k], device) for k in ("encode", "serve", "decode")]
        assert cost.two_phase(numel, world) == pytest.approx(direct, rel=0.08)
    assert priced_codec_cost("topk:0.01", device).wide == ()  # an allgather: per_rank instead
