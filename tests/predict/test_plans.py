"""Which collectives a strategy issues per bucket, with what bytes; measured costs used only where they apply."""
import math

import pytest
import torch

from gradwire.compress import get_compressor
from gradwire.compress.base import serialize
from gradwire.compress.twophase import chunk_bounds, chunk_granule
from gradwire.predict import Bucket, MeasuredExchange, StepProfile
from gradwire.predict.codec import CodecCost, Line, longest_chunk, round_bytes, two_phase_row_bytes
from gradwire.predict.plans import Ratio, bucket_exchange, plan_for
from gradwire.predict.simulate import Kind


def _profile(*sizes, strategy=None, exchanges=None, world=4):
    return StepProfile("m", 0.01, 0.02, 0.001, tuple(Bucket(n, 0.02) for n in sizes), world, strategy, exchanges)


def _ops(ex):
    return [(p.op, p.nbytes) for p in ex.phases]


def test_bytes_per_pattern_by_hand():
    n = 1_000_000  # elements
    assert _ops(bucket_exchange(n, 4, None, 8)) == [("all_reduce", 4 * n)]
    assert _ops(bucket_exchange(n, 4, "fp16", 8)) == [("all_reduce", 2 * n)]
    # topk 1%: k = 10,000 int32 indices and fp32 values in one row per rank, 8 rows gathered
    assert _ops(bucket_exchange(n, 4, "topk:0.01", 8)) == [("all_gather", 8 * 80_000)]
    # onebit at 8 ranks: chunks of 512 * ceil(1e6 / 4096) = 125,440 elements: 15,680 sign bytes + 245 scales (980
    # bytes, padded to 984)
    row = 15_680 + 984
    assert _ops(bucket_exchange(n, 4, "onebit", 8)) == [("all_to_all", 8 * row), ("all_gather", 8 * row)]
    # powersgd rank 4 on a flat bucket: a 1000 x 1000 matrix, P and Q of 1000 x 4 floats, one round each
    assert _ops(bucket_exchange(n, 4, "powersgd:4", 8)) == [("all_reduce", 16_000), ("all_reduce", 16_000)]
    # buckets under 1024 elements are averaged uncompressed (the hooks' cutoff)
    assert _ops(bucket_exchange(1000, 4, "onebit", 8)) == [("all_reduce", 4000)]
    # the ideal compressor of the ratio column: two-phase of nbytes / r
    assert _ops(bucket_exchange(n, 4, Ratio(8.0), 8)) == [("all_to_all", n // 2), ("all_gather", n // 2)]


def test_small_buckets_pay_for_the_granule_at_large_worlds():
    # 100,000 elements over 1024 ranks: chunks of 98 elements round up to one 512-element block
    assert two_phase_row_bytes("onebit", 100_000, 1024) == 64 + 8
    for numel, world, granule in [(10, 4, 8), (100_000, 1024, 512), (1_000_003, 7, 512), (4096, 8, 512), (5, 1, 8)]:
        assert longest_chunk(numel, world, granule) == max(c for _, c in chunk_bounds(numel, world, granule))


def test_row_bytes_are_what_the_exchange_serialises():
    for spec in ("onebit", "int8", "onebit:block=1024"):
        comp = get_compressor(spec)
        for numel, world in [(100_000, 4), (4_097, 3), (1_000, 16)]:
            longest = max(c for _, c in chunk_bounds(numel, world, chunk_granule(comp)))
            payload, _ = comp.compress(torch.randn(longest))
            assert two_phase_row_bytes(spec, numel, world) == max(8, serialize(payload)[0].numel()), (spec, numel)
    assert round_bytes("fp16", 10) == ((20,),)


def test_codec_cost_lines_scale_with_the_bucket():
    cost = CodecCost(encode=Line(1e-4, 1e-9), serve=Line(0, 2e-9), decode=Line(0, 3e-9))
    ex = bucket_exchange(1_000_000, 4, "onebit", 4, cost)
    assert ex.encode == pytest.approx(1e-4 + 1e-3)
    assert ex.phases[1].before == pytest.approx(2e-3) and ex.decode == pytest.approx(3e-3)
    gathered = bucket_exchange(1_000_000, 4, "topk:0.01", 16, CodecCost(decode=Line(0, 1e-9), per_rank=Line(0, 1e-10)))
    assert gathered.decode == pytest.approx(1e-3 + 16 * 1e-4)  # every gathered payload is decoded


def test_plan_kinds():
    prof = _profile(4_000_000, 4_000_000)
    assert plan_for("sync", prof, 4).kind is Kind.BLOCKING
    assert plan_for("onebit+delayed", prof, 4).kind is Kind.NEXT_STEP
    avg = plan_for("localsgd:8", prof, 4)
    assert (avg.kind, avg.period, avg.overlapped) == (Kind.AVERAGE, 8, False)
    assert _ops(avg.exchanges[0]) == [("all_reduce", 8_000_000)]  # every parameter at once
    assert plan_for("async-average:2", prof, 4).overlapped
    assert _ops(plan_for("torch-fp16", prof, 4).exchanges[0]) == [("all_reduce", 2_000_000)]
    with pytest.raises(ValueError, match="not a DDP bucket strategy"):
        plan_for("handler", prof, 4)


def test_measured_costs_apply_to_their_own_strategy_only():
    m = MeasuredExchange(("all_to_all", "all_gather"), hook=0.004, inner=(0.001, 0.002), gaps=(0.003,), tail=0.005)
    prof = _profile(4_000_000, strategy="onebit", exchanges=(m,))
    mine = plan_for("onebit", prof, 4).exchanges[0]
    assert (mine.encode, mine.phases[1].before, mine.decode) == (0.004, 0.003, 0.005)
    assert [p.floor for p in mine.phases] == [0.001, 0.002]  # at the world size it was measured at
    assert [p.floor for p in plan_for("onebit", prof, 8).exchanges[0].phases] == [0.0, 0.0]
    assert plan_for("fp16", prof, 4).exchanges[0].encode == 0.0  # another strategy: its own (free) cost
    other = _profile(4_000_000, strategy="fp16", exchanges=(MeasuredExchange(("all_reduce",), 0.004, (0.001,), ()),))
    assert plan_for("onebit", other, 4).exchanges[0].encode == 0.0
    unknown = _profile(4_000_000, strategy="hook:my_hook",
                       exchanges=(MeasuredExchange(("all_reduce",), 1.0, (0.0,), ()),))
    assert plan_for("sync", unknown, 4).exchanges[0].encode == 0.0


def test_measured_costs_move_with_the_codecs_cost_to_another_world_size():
    """A two-phase exchange measured at 4 ranks, predicted at 16: each stage gains 12 more chunks' cost; the
    run's own times are the base (at the measured world nothing moves)."""
    m = MeasuredExchange(("all_to_all", "all_gather"), hook=0.004, inner=(0.001, 0.002), gaps=(0.003,), tail=0.005)
    prof = _profile(4_000_000, strategy="onebit", exchanges=(m,))
    # over 16 chunks each stage costs 12 more chunks of 0.1, 0.2 and 0.3 ms
    cost = CodecCost(Line(0.001), Line(0.002), Line(0.003), wide=(Line(0.001 + 12e-4), Line(0.002 + 24e-4),
                                                                 Line(0.003 + 36e-4)))
    same = plan_for("onebit", prof, 4, cost).exchanges[0]
    assert (same.encode, same.phases[1].before, same.decode) == (0.004, 0.003, 0.005)
    wide = plan_for("onebit", prof, 16, cost).exchanges[0]
    assert (wide.encode, wide.phases[1].before, wide.decode) == pytest.approx((0.004 + 12e-4, 0.003 + 24e-4,
                                                                              0.005 + 36e-4))
    narrow = plan_for("onebit", prof, 2, cost).exchanges[0]  # fewer chunks: less, never below nothing
    assert (narrow.encode, narrow.phases[1].before, narrow.decode) == pytest.approx((0.004 - 2e-4, 0.003 - 4e-4,
                                                                                    0.005 - 6e-4))
    # without a measurement the lines themselves move: a chunk per rank
    bare = plan_for("onebit", _profile(4_000_000), 16, cost).exchanges[0]
    assert (bare.encode, bare.phases[1].before, bare.decode) == pytest.approx((0.001 + 12e-4, 0.002 + 24e-4,
                                                                              0.003 + 36e-4))
