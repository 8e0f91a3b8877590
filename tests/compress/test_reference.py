"""Compressors against references worked out by hand or computed the naive dense way (one process).

Inputs are chosen so that the expected payloads are exact: quantisation levels
that land on whole numbers, magnitudes that make the probabilities 0 or 1.
The all_gather ``combine`` of every compressor is checked against the naive
exchange: decompress every rank's payload, average.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from gradwire.compress import Ctx, Pattern, get_compressor, parse_compressor, register_compressor, roundtrip
from gradwire.compress import COMPRESSORS
from gradwire.compress._rng import CallCounter, stable_hash, uniform
from gradwire.compress.base import Compressor, check_out, deserialize, payload_nbytes, serialize
from gradwire.compress.blocks import block_scales, mul_blocks_, num_blocks
from gradwire.compress.onebit import check_block
from gradwire.compress.packing import SIGN_TABLE, TERNARY_TABLE, decode_table, pack_bits_torch, pack_codes2, pack_signs
from gradwire.compress.powersgd import PowerSGDCompressor, matrix_shape, orthogonalize
from gradwire.compress.qsgd import QSGDCompressor
from gradwire.compress.randomk import RandomKCompressor
from gradwire.compress.terngrad import TernGradCompressor
from gradwire.compress.topk import TopKCompressor


def rand(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# ------------------------------------------------------------------ exact payloads
def test_qsgd_levels_on_whole_numbers_are_exact() -> None:
    # ||[3, -4, 0]|| = 5; s = 10: |x| / 5 * 10 = 6, 8, 0 exactly, so floor(a + u) = a for every draw u
    comp = QSGDCompressor(10, seed=1)
    (levels, norm), ctx = comp.compress(t(3, -4, 0))
    assert levels.dtype == torch.int8 and levels.tolist() == [6, -8, 0]
    assert norm.tolist() == [5.0]
    assert comp.decompress([levels, norm], ctx).tolist() == [3.0, -4.0, 0.0]  # level * norm / s


def test_int8_block_max_scales_are_exact() -> None:
    # block 4: maxima 127 and 254; 127 levels: every |x| / max * 127 is a whole number
    comp = get_compressor("int8:allgather:block=4")
    x = t(127, -64, 1, 0, 254, -2, 0, 128, 10)  # 9 elements: blocks of 4, 4 and a tail of 1
    (levels, scales), ctx = comp.compress(x)
    assert scales.tolist() == [127.0, 254.0, 10.0]
    assert levels.tolist() == [127, -64, 1, 0, 127, -1, 0, 64, 127]
    assert comp.decompress([levels, scales], ctx).tolist() == x.tolist()
    assert comp.slice_units() == (1, 4) and get_compressor("int8:block=0").slice_units() is None


def test_qsgd_defaults() -> None:
    comp = QSGDCompressor()
    assert (comp.levels, comp.norm, comp.block, comp.pattern) == (16, "l2", 0, Pattern.ALLGATHER)


def test_qsgd_zero_tensor_has_zero_norm_and_levels() -> None:
    comp = QSGDCompressor(16)
    (levels, norm), ctx = comp.compress(torch.zeros(5))
    assert levels.tolist() == [0] * 5 and norm.tolist() == [0.0]
    assert comp.decompress([levels, norm], ctx).tolist() == [0.0] * 5


def test_qsgd_rounds_to_a_neighbouring_level_with_the_right_odds() -> None:
    # |x| / norm * s = 0.25 for the first element: level 1 in a quarter of the draws, 0 otherwise
    comp = QSGDCompressor(1, seed=0)
    x = torch.cat([t(0.25), torch.zeros(15)])
    x[1] = math.sqrt(1 - 0.25**2)  # norm 1
    ones = sum(int(comp.compress(x, 0)[0][0][0]) for _ in range(1000))
    assert 190 < ones < 310  # 250 expected, sd ~14


def test_terngrad_codes_and_scale() -> None:
    # scale = max |x| = 2; keep-probabilities |x| / 2 = 1, 1, 0, 0: the draws cannot change the codes
    comp = TernGradCompressor(seed=3)
    x = t(2, -2, 0, 0, -2)
    (packed, scale), ctx = comp.compress(x)
    assert scale.tolist() == [2.0]
    assert packed.tolist() == [0b01100000, 0b10000000]  # codes 1 (+), 2 (-), 0, 0 | 2, pad
    assert comp.decompress([packed, scale], ctx).tolist() == [2.0, -2.0, 0.0, 0.0, -2.0]


def test_terngrad_below_one() -> None:
    # scale 0.5: probabilities 1, 1, 0 whatever the draw
    assert roundtrip(TernGradCompressor(seed=0), t(0.5, -0.5, 0.0)).tolist() == [0.5, -0.5, 0.0]


def test_terngrad_keeps_with_probability_magnitude_over_scale() -> None:
    comp = TernGradCompressor(seed=0)
    x = t(4, 1)  # the second element survives a quarter of the time
    kept = sum(float(roundtrip(comp, x, 0)[1]) == 4.0 for _ in range(1000))
    assert 190 < kept < 310  # 250 expected, sd ~14


def test_onebit_rms_and_mean_scales() -> None:
    x = t(3, -1, 1, -3)
    rms = get_compressor("onebit:block=0")
    (packed, scale), ctx = rms.compress(x)
    assert packed.tolist() == [0b01010000] and scale.item() == pytest.approx(math.sqrt(5))  # sqrt((9+1+1+9) / 4)
    mean = get_compressor("onebit:block=0:rms=0")
    assert mean.compress(x)[0][1].tolist() == [2.0]
    assert roundtrip(mean, x).tolist() == [2.0, -2.0, 2.0, -2.0]
    assert rms.slice_units() is None and get_compressor("onebit:block=64").slice_units() == (8, 64)


@pytest.mark.parametrize("block", [0, 8, 16])
@pytest.mark.parametrize("n", [5, 16, 21])
def test_onebit_decompress_into_a_float32_buffer_is_the_dense_decode(block: int, n: int) -> None:
    comp = get_compressor(f"onebit:block={block}")
    x = rand(n, n) * torch.arange(1, n + 1)
    payload, ctx = comp.compress(x)
    signs = torch.where(x < 0, -1.0, 1.0)
    size = block if block and n > block else n
    scales = torch.stack([b.pow(2).mean().sqrt() for b in x.split(size)])
    expected = torch.cat([s * b for s, b in zip(scales, signs.split(size))])
    torch.testing.assert_close(comp.decompress(payload, ctx), expected)
    out = torch.full((n,), 9.0)
    assert comp.decompress_into(payload, ctx, out) is out
    torch.testing.assert_close(out, expected)
    half = torch.full((n,), 9.0, dtype=torch.float16)  # another dtype: the generic copy
    torch.testing.assert_close(comp.decompress_into(payload, ctx, half), expected.half())


def test_onebit_decompress_into_passes_integer_tensors_through() -> None:
    comp = get_compressor("onebit")
    ints = torch.arange(6)
    payload, ctx = comp.compress(ints)
    out = torch.zeros(6, dtype=torch.float32)
    assert comp.decompress_into(payload, ctx, out) is out and out.tolist() == [0, 1, 2, 3, 4, 5]


def test_onebit_decompress_into_an_empty_float_tensor() -> None:
    comp = get_compressor("onebit")
    payload, ctx = comp.compress(torch.empty(0))
    assert ctx.passthrough and comp.decompress_into(payload, ctx, torch.empty(0)).numel() == 0


def test_onebit_options_are_checked() -> None:
    assert check_block(None) == 0 and check_block(0) == 0 and check_block(64) == 64
    for bad in (-8, 12):
        with pytest.raises(ValueError, match="multiple of 8"):
            check_block(bad)
    with pytest.raises(ValueError, match="not summable"):
        get_compressor("onebit").__class__(Pattern.ALLREDUCE)
    with pytest.raises(ValueError, match="rms must be 1"):
        get_compressor("onebit").__class__(rms=2)
    assert "scale=mean" in repr(get_compressor("onebit:rms=0")) and "block=512" in repr(get_compressor("onebit"))


def test_topk_small_tensor_is_exact_topk() -> None:
    # n = 100 < the sample: the threshold comes from every element, so the selection is the exact top-k
    x = torch.linspace(-1, 1, 100)[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    x = x + 0.001 * torch.arange(100) / 100  # distinct magnitudes
    comp = TopKCompressor(0.1)
    (idx, vals), ctx = comp.compress(x)
    assert idx.dtype == torch.int32 and idx.numel() == vals.numel() == 10
    assert set(idx.tolist()) == set(x.abs().topk(10).indices.tolist())
    assert torch.equal(vals, x[idx.long()])
    y = comp.decompress([idx, vals], ctx)
    assert torch.equal(y[idx.long()], vals) and int((y != 0).sum()) == 10


def test_topk_pads_a_mostly_zero_tensor_and_keeps_everything_at_ratio_one() -> None:
    x = torch.zeros(50)
    x[7], x[30] = 2.0, -3.0
    (idx, vals), ctx = TopKCompressor(0.1).compress(x)  # k = 5, only 2 non-zeros
    assert idx.tolist()[:2] == [7, 30] and idx.tolist()[2:] == [0, 0, 0] and vals.tolist() == [2, -3, 0, 0, 0]
    assert TopKCompressor(0.1).decompress([idx, vals], ctx).tolist() == x.tolist()
    y = rand(20)
    (idx, vals), ctx = TopKCompressor(1.0).compress(y)
    assert sorted(idx.tolist()) == list(range(20)) and roundtrip(TopKCompressor(1.0), y).tolist() == y.tolist()


def test_topk_threshold_comes_from_a_strided_sample_that_moves_each_call() -> None:
    """200 000 elements, sample 100 000: stride 2. The odd elements are large, the even ones tiny.

    Call 1 samples the odd ones (start 7919 % 2 = 1): its threshold keeps the 1.15 * 1% * 100 000 = 1150
    largest odd elements and pads to k = 2000. Call 2 samples the even ones (start 0): every odd
    element passes, and the 2000 largest are kept: the exact top-k.
    """
    x = torch.empty(200_000)
    x[1::2] = torch.linspace(0.5, 0.9, 100_000)  # below 1: a threshold test against 1 would matter
    x[0::2] = torch.linspace(1e-6, 1e-3, 100_000)
    comp = TopKCompressor(0.01)
    (idx, vals), _ = comp.compress(x)
    assert idx.numel() == 2000 and int((vals != 0).sum()) == 1150
    assert set(idx[:1150].tolist()) == set(range(200_000 - 2 * 1150 + 1, 200_000, 2))
    (idx, vals), _ = comp.compress(x)
    assert int((vals != 0).sum()) == 2000 and set(idx.tolist()) == set(x.topk(2000).indices.tolist())
    assert comp.state_dict() == {"calls": {"0": 2}}
    # another key has its own count: its first call samples the odd elements again
    (idx, vals), _ = comp.compress(x, "other")
    assert int((vals != 0).sum()) == 1150 and comp.state_dict() == {"calls": {"0": 2, "other": 1}}


def test_topk_small_tensors_keep_at_least_one_and_the_sample_is_all_of_them() -> None:
    assert TopKCompressor(0.01).compress(rand(50))[0][0].numel() == 1  # ceil(0.5) = 1
    comp, x = TopKCompressor(0.1), rand(1000)
    # fewer elements than the sample: stride 1, the (1000 - 115 + 1)-th smallest magnitude
    assert comp._threshold(x, 0) == float(x.abs().kthvalue(1000 - 115 + 1).values)


def test_topk_threshold_is_the_sampled_quantile_and_its_state_round_trips() -> None:
    comp = TopKCompressor(0.01, sample=1000)
    x = rand(10_000)
    thr = comp._threshold(x, "k")
    # stride 10: 1000 samples; aim 15% above k: the (1000 - ceil(11.5) + 1)-th smallest |sample|
    start = (1 * 7919) % 10
    assert thr == float(x[start::10].abs().kthvalue(1000 - 12 + 1).values)
    assert comp.state_dict() == {"calls": {"k": 1}}
    other = TopKCompressor(0.01, sample=1000)
    other.load_state_dict(pickle.loads(pickle.dumps(comp.state_dict())))
    assert other._threshold(x, "k") == comp._threshold(x, "k")  # the same next sample start


def test_randomk_decode_is_the_rescaled_scatter() -> None:
    comp = RandomKCompressor(0.5, seed=7)
    x = torch.arange(1.0, 9.0)
    (vals,), ctx = comp.compress(x, 3)
    idx = ctx.info["idx"]
    assert idx.numel() == 4 and torch.equal(vals, x[idx])
    counts = torch.bincount(idx, minlength=8).float()
    torch.testing.assert_close(comp.decompress([vals], ctx), x * counts * (8 / 4))  # n / k
    plain = RandomKCompressor(0.5, seed=7, rescale=False)
    (vals,), ctx = plain.compress(x, 3)
    torch.testing.assert_close(plain.decompress([vals], ctx), x * counts)
    assert comp.unbiased and not plain.unbiased


def test_randomk_keys_draw_apart_and_a_single_value_carries_a_nan() -> None:
    a, b = RandomKCompressor(0.1, seed=1), RandomKCompressor(0.1, seed=1)
    assert not torch.equal(a.compress(rand(100), "k")[1].info["idx"], b.compress(rand(100), "j")[1].info["idx"])
    x = rand(100)
    x[37] = float("nan")
    (vals,), ctx = RandomKCompressor(0.01).compress(x)  # k = 1: the sum's NaN rides in the only value
    assert vals.numel() == 1 and math.isnan(vals[0])
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            RandomKCompressor(bad)
    assert RandomKCompressor(1.0).ratio == 1.0


def test_randomk_state_round_trips_and_seeds_differ() -> None:
    a = RandomKCompressor(0.1, seed=1)
    a.compress(rand(100), "k")
    b = RandomKCompressor(0.1, seed=1)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert torch.equal(a.compress(rand(100), "k")[1].info["idx"], b.compress(rand(100), "k")[1].info["idx"])
    c = RandomKCompressor(0.1, seed=2)
    assert not torch.equal(RandomKCompressor(0.1, seed=1).compress(rand(100), "k")[1].info["idx"],
                           c.compress(rand(100), "k")[1].info["idx"])


@pytest.mark.parametrize("name", ["qsgd:4", "terngrad"])
def test_seeded_draws_repeat_after_a_state_round_trip(name: str) -> None:
    cls = {"qsgd:4": lambda: QSGDCompressor(4, seed=5), "terngrad": lambda: TernGradCompressor(seed=5)}[name]
    a, x = cls(), rand(200)
    first = roundtrip(a, x, "k")
    b = cls()
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert torch.equal(roundtrip(a, x, "k"), roundtrip(b, x, "k"))  # the second draw on both
    assert torch.equal(roundtrip(cls(), x, "k"), first)  # the first draw of a fresh one
    assert not torch.equal(roundtrip(cls(), x, "k"), roundtrip(cls(), x, "other"))  # keys draw apart


# ------------------------------------------------------------------ powersgd
def test_powersgd_full_rank_reconstructs_exactly() -> None:
    m = rand(8 * 3, 1).view(8, 3)
    comp = PowerSGDCompressor(4)  # rank 4 > 3 columns: r = 3, P spans M's columns
    torch.testing.assert_close(roundtrip(comp, m), m, rtol=1e-4, atol=1e-5)
    (p,), ctx = comp.compress(m, 1)
    assert p.shape == (8, 3)


def test_powersgd_payloads_and_warm_start() -> None:
    comp = PowerSGDCompressor(2, seed=3)
    m = rand(6 * 5, 2).view(6, 5)
    (p,), ctx = comp.compress(m, "w")
    g = torch.Generator().manual_seed(3 * 1_000_003 + stable_hash("w"))
    q0 = torch.randn(5, 2, generator=g)
    torch.testing.assert_close(p, m @ q0)  # round 1: M Q with the seeded Q
    (q,) = comp.next_round([p], ctx)
    pp = ctx.info["p"]
    torch.testing.assert_close(pp.T @ pp, torch.eye(2), rtol=0, atol=1e-5)  # orthonormal columns
    torch.testing.assert_close(q, m.T @ pp)  # round 2: M^T P
    comp.finish([q], ctx)
    torch.testing.assert_close(comp.decompress([q], ctx), pp @ q.T)
    assert torch.equal(comp.state_dict()["q"][next(iter(comp.state_dict()["q"]))], q)
    (p2,), _ = comp.compress(m, "w")
    torch.testing.assert_close(p2, m @ q)  # the next step starts from the averaged Q


@pytest.mark.parametrize("shape, expected", [
    ((4, 5), (4, 5)), ((2, 5), (2, 5)), ((4, 2), (4, 2)), ((2, 1, 3), (2, 3)), ((4, 5, 2), (4, 10)), ((1, 20), (4, 5)), ((6, 1), (2, 3)), ((10,), (3, 4)), ((1,), (1, 1)),
])
def test_powersgd_matrix_shape(shape: tuple[int, ...], expected: tuple[int, int]) -> None:
    assert matrix_shape(torch.Size(shape), math.prod(shape)) == expected


def test_powersgd_pads_a_flat_tensor() -> None:
    x = rand(10)  # 3 x 4 = 12: two zeros of padding, cut again on decode
    y = roundtrip(PowerSGDCompressor(4), x)
    assert y.shape == (10,)
    torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5)  # r = 3 = full rank of a 3 x 4 matrix


def test_orthogonalize_is_gram_schmidt() -> None:
    p = torch.stack([t(3, 4, 0), t(4, 0, 1)], dim=1)  # columns (3, 4, 0) and (4, 0, 1)
    q = orthogonalize(p.clone())
    torch.testing.assert_close(q[:, 0], t(0.6, 0.8, 0.0))
    # the second column less its projection 2.4 on the first, normalised: (2.56, -1.92, 1) / |.|
    rest = t(4, 0, 1) - (t(4, 0, 1) @ t(0.6, 0.8, 0)) * t(0.6, 0.8, 0)
    torch.testing.assert_close(q[:, 1], rest / rest.norm())
    zero = orthogonalize(torch.zeros(3, 2))
    assert torch.isfinite(zero).all()  # the epsilon: no division by zero
    tiny = orthogonalize(t(1e-8, 0).view(2, 1))  # a column as small as the epsilon: 1e-8 / (1e-8 + 1e-8)
    torch.testing.assert_close(tiny, t(0.5, 0).view(2, 1))


def test_powersgd_defaults_and_rank_one() -> None:
    comp = PowerSGDCompressor()
    assert (comp.rank, comp.seed) == (4, 0)
    m = rand(5, 3).view(5, 1) @ rand(4, 4).view(1, 4)  # rank 1
    torch.testing.assert_close(roundtrip(PowerSGDCompressor(1), m), m, rtol=1e-4, atol=1e-5)


def test_powersgd_rejects_rank_zero() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        PowerSGDCompressor(0)
    with pytest.raises(NotImplementedError, match="single round"):
        get_compressor("fp16").next_round([], None)


# ------------------------------------------------------------------ combine = the naive dense exchange
GATHERED = ["onebit:allgather", "onebit:allgather:block=8", "onebit:allgather:block=0:rms=0", "int8:allgather",
            "int8:allgather:block=8", "qsgd:16", "terngrad", "topk:0.1", "fp16", "none"]


@pytest.mark.parametrize("name", GATHERED)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1, 13, 40])
def test_combine_is_the_mean_of_every_rank_decoded(name: str, world: int, n: int) -> None:
    comp = get_compressor(name)
    xs = [rand(n, seed) * (1 + seed) for seed in range(world)]
    payloads, ctxs = zip(*(comp.compress(x, 0) for x in xs))
    dense = torch.stack([comp.decompress(list(p), c).double() for p, c in zip(payloads, ctxs)]).mean(0)
    got = comp.combine([list(p) for p in payloads], ctxs[0])
    assert got.shape == (n,) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), dense, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", GATHERED + ["signum"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_combine_and_decompress_keep_the_input_dtype(name: str, dtype: torch.dtype) -> None:
    comp = get_compressor(name)
    xs = [(rand(24, s) * (s + 1)).to(dtype).view(4, 6) for s in range(3)]
    payloads, ctxs = zip(*(comp.compress(x, 0) for x in xs))
    got = comp.combine([list(p) for p in payloads], ctxs[0])
    assert got.dtype == dtype and got.shape == (4, 6)
    one = comp.decompress(list(payloads[0]), ctxs[0])
    assert one.dtype == dtype and one.shape == (4, 6)
    if name != "signum":  # a vote is not a mean
        dense = torch.stack([comp.decompress(list(p), c).double() for p, c in zip(payloads, ctxs)]).mean(0)
        torch.testing.assert_close(got.double(), dense, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("name", ["onebit:allgather", "signum", "topk:0.1", "qsgd:4", "terngrad"])
def test_combine_of_passthrough_tensors_is_their_mean_in_their_dtype(name: str) -> None:
    comp = get_compressor(name)
    ints = [torch.tensor([1, 2, 3]), torch.tensor([2, 2, 6])]
    payloads, ctxs = zip(*(comp.compress(x) for x in ints))
    assert ctxs[0].passthrough and payloads[0][0] is ints[0]
    assert comp.combine([list(p) for p in payloads], ctxs[0]).tolist() == [1, 2, 4]  # 1.5, 2, 4.5 as int64
    rows = [torch.tensor([[1, 2]]) * k for k in (1, 2, 6)]
    _, ctx = comp.compress(rows[0])
    assert comp.combine([[r] for r in rows], ctx).tolist() == [[3, 6]]  # the shape kept
    _, ctx = comp.compress(torch.empty(0, 2))
    assert comp.combine([[torch.empty(0, 2)]] * 3, ctx).shape == (0, 2)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("block", [0, 8])
def test_signum_is_the_majority_vote(world: int, block: int) -> None:
    comp = get_compressor(f"signum:block={block}")
    n = 20
    xs = [rand(n, 10 + r) for r in range(world)]
    payloads = [comp.compress(x)[0] for x in xs]
    _, ctx = comp.compress(xs[0])
    votes = torch.stack([torch.where(x < 0, -1.0, 1.0) for x in xs]).sum(0)
    size = block if block else n
    scales = torch.stack([torch.stack([b.abs().mean() for b in x.split(size)]) for x in xs]).mean(0)
    expected = torch.sign(votes) * scales.repeat_interleave(size)[:n]
    torch.testing.assert_close(comp.combine(payloads, ctx), expected)


def test_signum_tie_is_zero_and_decompress_is_one_ranks_vote() -> None:
    comp = get_compressor("signum:block=0")
    a, b = t(1, -2, 3, 4), t(-1, 2, 3, -4)
    pa, ctx = comp.compress(a)
    pb, _ = comp.compress(b)
    assert comp.combine([pa, pb], ctx).tolist() == [0.0, 0.0, 2.5, 0.0]  # votes 0, 0, 2, 0; scale (2.5 + 2.5) / 2
    assert comp.decompress(pa, ctx).tolist() == [2.5, -2.5, 2.5, 2.5]
    assert not comp.averages and comp.pattern is Pattern.ALLGATHER


# ------------------------------------------------------------------ packing, blocks, serialisation
def test_sign_and_ternary_tables_by_hand() -> None:
    assert SIGN_TABLE.shape == (256, 8) and SIGN_TABLE.dtype == np.float32
    assert SIGN_TABLE[0].tolist() == [1.0] * 8 and SIGN_TABLE[255].tolist() == [-1.0] * 8
    assert SIGN_TABLE[0b10000001].tolist() == [-1, 1, 1, 1, 1, 1, 1, -1]
    assert SIGN_TABLE[0b01100000].tolist() == [1, -1, -1, 1, 1, 1, 1, 1]
    assert TERNARY_TABLE.shape == (256, 4) and TERNARY_TABLE.dtype == np.float32
    assert TERNARY_TABLE[0].tolist() == [0.0] * 4
    assert TERNARY_TABLE[0b01100001].tolist() == [1, -1, 0, 1]
    assert TERNARY_TABLE[0b11101101].tolist() == [0, -1, 0, 1]  # code 3 is unused: 0


def test_decode_table_scale_cut_and_out() -> None:
    packed = torch.tensor([0b10000000, 0b01000000], dtype=torch.uint8)
    assert decode_table(packed, SIGN_TABLE, 10, 2.0).tolist() == [-2, 2, 2, 2, 2, 2, 2, 2, 2, -2]
    out = torch.full((10,), 5.0)
    assert decode_table(packed, SIGN_TABLE, 10, 0.5, out=out) is out
    assert out.tolist() == [-0.5] + [0.5] * 8 + [-0.5]
    exact = torch.empty(16)
    decode_table(packed, SIGN_TABLE, 16, out=exact)
    assert exact.tolist() == [-1] + [1] * 7 + [1, -1] + [1] * 6
    assert math.isnan(decode_table(packed, SIGN_TABLE, 2, float("inf"))[0] * 0)


def test_signs_of_a_matrix_pack_along_its_rows() -> None:
    x = torch.tensor([[-1.0, 1, 1, 1, 1, 1, 1, 1, -1], [1.0, -1, 1, 1, 1, 1, 1, 1, 1]])
    assert pack_signs(x).tolist() == [[0b10000000, 0b10000000], [0b01000000, 0]]


def test_decoding_an_infinite_scale_gives_nan_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0 * inf in the ternary table: NaN, on purpose
        y = decode_table(torch.tensor([0b01100000], dtype=torch.uint8), TERNARY_TABLE, 4, float("inf"))
    assert y[0] == math.inf and y[1] == -math.inf and math.isnan(y[2])


def test_bit_packing_by_hand() -> None:
    bits = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert pack_bits_torch(bits).tolist() == [[0b10000001, 0b10000000], [0b01000000, 0]]
    assert pack_bits_torch(bits).dtype == torch.uint8 and pack_bits_torch(bits[:, :8]).dtype == torch.uint8
    assert pack_signs(t(-1, 2, -3)).tolist() == [0b10100000]
    assert pack_signs(torch.tensor([-1.0, 0.0, -0.0], dtype=torch.bfloat16)).tolist() == [0b10000000]
    assert pack_codes2(torch.tensor([3, 0, 0, 0, 1], dtype=torch.uint8)).tolist() == [0b11000000, 0b01000000]
    assert pack_codes2(torch.tensor([1, 2, 1, 2], dtype=torch.uint8)).tolist() == [0b01100110]


@pytest.mark.parametrize("numel, block, blocks", [
    (0, 512, 1), (1, 512, 1), (512, 512, 1), (513, 512, 2), (1024, 512, 2), (1025, 512, 3), (10, 0, 1),
    (10, None, 1), (10, 3, 4),
])
def test_num_blocks(numel: int, block: int | None, blocks: int) -> None:
    assert num_blocks(numel, block) == blocks
    if numel:
        assert block_scales(torch.ones(numel), block).numel() == blocks


def test_block_scales_of_an_empty_tensor_and_exact_blocks() -> None:
    assert block_scales(torch.empty(0), 4).tolist() == [0.0]
    x = t(1, -1, 2, -2, 3, -3, 4, -4)  # two full blocks, no tail
    assert block_scales(x, 4, "max").tolist() == [2.0, 4.0]
    assert block_scales(x, 4, "mean").tolist() == [1.5, 3.5]
    y = mul_blocks_(torch.ones(8), t(2, 3), 4)
    assert y.tolist() == [2, 2, 2, 2, 3, 3, 3, 3]
    assert mul_blocks_(torch.ones(3), t(5), 0).tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match="'mean', 'rms' or 'max'"):
        block_scales(x, 4, "median")


def test_serialize_aligns_every_tensor_to_8_bytes() -> None:
    payload = [torch.arange(3, dtype=torch.uint8), torch.tensor([7], dtype=torch.int32), t(1.5, 2.5)]
    buf, layout = serialize(payload)
    assert [(start, size) for _, _, start, size in layout] == [(0, 3), (8, 4), (16, 8)]
    assert buf.numel() == 24 and buf.dtype == torch.uint8
    assert buf[3:8].tolist() == [0] * 5  # padding is zero
    back = deserialize(buf, layout)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(back, payload))
    assert payload_nbytes(payload) == 3 + 4 + 8
    assert serialize(payload, nbytes=24)[0].numel() == 24  # exactly enough room
    empty, layout = serialize([])
    assert empty.numel() == 0 and layout == [] and serialize([], nbytes=8)[0].tolist() == [0] * 8


def test_check_out_and_base_class() -> None:
    ctx = Ctx(torch.Size([3]), torch.float32, 3, 0)
    check_out(torch.empty(3), ctx)
    with pytest.raises(ValueError, match="out holds 2 elements"):
        check_out(torch.empty(2), ctx)
    base = Compressor()
    with pytest.raises(NotImplementedError):
        base.encode(torch.ones(1), ctx)
    with pytest.raises(NotImplementedError):
        base.decode([], ctx)
    assert base.slice_units() is None and base.state_dict() == {} and repr(base) == "<compressor base pattern=allreduce>"


def test_compress_keeps_shape_dtype_and_key_in_the_context() -> None:
    x = rand(12).view(3, 4).double()
    payload, ctx = get_compressor("fp16").compress(x, key=("b", 1))
    assert (ctx.shape, ctx.dtype, ctx.numel, ctx.key, ctx.passthrough) == (torch.Size([3, 4]), torch.float64, 12,
                                                                            ("b", 1), False)
    assert payload[0].dtype == torch.float16 and payload[0].shape == (12,)
    y = get_compressor("fp16").decompress(payload, ctx)
    assert y.shape == (3, 4) and y.dtype == torch.float64
    torch.testing.assert_close(y, x, rtol=1e-3, atol=0)
    bf = get_compressor("bf16").compress(x)[0][0]
    assert bf.dtype == torch.bfloat16


# ------------------------------------------------------------------ random streams
def test_call_counter_seeds_by_key_and_count() -> None:
    c = CallCounter(4)
    g1, g2 = c.generator("k"), c.generator("k")
    seed = lambda count: (4 * 1_000_003 + stable_hash("k") * 7919 + count) % (2**63 - 1)  # noqa: E731
    assert g1.initial_seed() == seed(0) and g2.initial_seed() == seed(1)
    assert c.counts == {"k": 2}
    assert c.state_dict() == {"seed": 4, "shared": True, "counts": {"k": 2}}
    d = CallCounter(None)
    d.load_state_dict(pickle.loads(pickle.dumps(c.state_dict())))
    assert d.seed == 4 and d.shared and d.generator("k").initial_seed() == seed(2)
    big = CallCounter(2**62)  # the seed wraps below 2**63 - 1
    assert big.generator("k").initial_seed() == (2**62 * 1_000_003 + stable_hash("k") * 7919) % (2**63 - 1)
    assert stable_hash("k") == stable_hash("k") and stable_hash("k") != stable_hash("j")


def test_an_unseeded_counter_draws_its_seed_from_the_global_generator_once() -> None:
    torch.manual_seed(11)
    a = CallCounter(None)
    torch.manual_seed(11)
    b = CallCounter(None)
    assert a.seed == b.seed and not a.shared  # the seed is the global generator's draw, made at construction
    assert a.generator("k", "cpu").initial_seed() == b.generator("k").initial_seed()
    torch.manual_seed(12)
    assert CallCounter(None).seed != a.seed
    # the draws do not touch the global generator afterwards: a checkpoint of seed and counts is all there is
    state = torch.get_rng_state()
    a.generator("k")
    assert torch.equal(torch.get_rng_state(), state)
    c = CallCounter(0)
    c.load_state_dict(a.state_dict())
    assert c.generator("k").initial_seed() == a.generator("k").initial_seed()


def test_uniform_draws_from_the_given_generator() -> None:
    a = uniform(torch.Size([5]), torch.Generator().manual_seed(1), torch.device("cpu"))
    b = torch.rand(5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and float(a.min()) >= 0 and float(a.max()) < 1


# ------------------------------------------------------------------ registry
def test_parse_compressor_by_hand() -> None:
    assert parse_compressor("TopK:0.05") == ("topk", "0.05", {})
    assert parse_compressor(" onebit ") == ("onebit", None, {})
    assert parse_compressor("onebit:Block=64:RMS=0") == ("onebit", None, {"block": 64, "rms": 0})
    assert parse_compressor("qsgd:") == ("qsgd", None, {})
    assert get_compressor("qsgd").levels == 16 and get_compressor("qsgd:8").levels == 8
    assert get_compressor("topk").ratio == 0.01 and get_compressor("randomk").ratio == 0.01
    assert get_compressor("powersgd").rank == 4 and get_compressor("powersgd:2").rank == 2
    assert get_compressor("int8:block=64").block == 64 and get_compressor("int8").block == 512
    assert get_compressor("int8").levels == 127 and get_compressor("int8").norm == "max"
    assert get_compressor("signum:block=16").block == 16 and get_compressor("signum").block == 512
    comp = get_compressor("fp16")
    assert get_compressor(comp) is comp
    for bad, match in (("powersgd:two", "powersgd rank must be a int"), ("qsgd:1.5", "qsgd levels must be a int"),
                       ("topk:x", "ratio must be a float")):
        with pytest.raises(ValueError, match=match):
            get_compressor(bad)


def test_unknown_name_lists_every_name_with_its_syntax() -> None:
    with pytest.raises(ValueError) as info:
        get_compressor("zip")
    assert str(info.value) == (
        "unknown compressor 'zip'; valid names: auto:fp16/int8/onebit[:every=N], bf16, fp16, "
        "int8:two_phase|allgather[:block=N], none, "
        "onebit:two_phase|allgather[:block=N][:rms=N], powersgd:r, qsgd:s, randomk:ratio, signum[:block=N], "
        "terngrad, topk:ratio")


def test_every_registered_name_builds_its_compressor() -> None:
    names = {"none": "none", "fp16": "fp16", "bf16": "bf16", "int8": "int8", "qsgd": "qsgd", "terngrad": "terngrad",
             "onebit": "onebit", "signum": "signum", "topk": "topk", "randomk": "randomk", "powersgd": "powersgd"}
    for name, built in names.items():
        assert get_compressor(name).name == built
        assert COMPRESSORS[name].doc
    assert COMPRESSORS["onebit"].options == ("block", "rms") and COMPRESSORS["signum"].options == ("block",)
    assert COMPRESSORS["int8"].options == ("block",) and COMPRESSORS["topk"].param == "ratio"
    assert COMPRESSORS["none"].options == () and COMPRESSORS["none"].param == ""
    patterns = {"none": Pattern.ALLREDUCE, "fp16": Pattern.ALLREDUCE, "bf16": Pattern.ALLREDUCE,
                "int8": Pattern.TWO_PHASE, "qsgd": Pattern.ALLGATHER, "terngrad": Pattern.ALLGATHER,
                "onebit": Pattern.TWO_PHASE, "signum": Pattern.ALLGATHER, "topk": Pattern.ALLGATHER,
                "randomk": Pattern.ALLREDUCE, "powersgd": Pattern.ALLREDUCE}
    assert {n: get_compressor(n).pattern for n in patterns} == patterns


def test_register_compressor_adds_a_name_and_refuses_bad_ones() -> None:
    register_compressor("half-again", lambda arg, **o: get_compressor("fp16"), "x", "a test entry", ("k",))
    try:
        assert parse_compressor("half-again:1:k=2:warmup=3") == ("half-again", "1", {"k": 2, "warmup": 3})
        assert get_compressor("half-again:warmup=3").warmup == 3
        assert "half-again:x[:k=N]" in str(pytest.raises(ValueError, get_compressor, "zip").value)
        with pytest.raises(ValueError, match="registered already"):
            register_compressor("half-again", lambda arg: get_compressor("none"))
    finally:
        del COMPRESSORS["half-again"]
    for bad in ("", "a:b"):
        with pytest.raises(ValueError, match="no ':'"):
            register_compressor(bad, lambda arg: get_compressor("none"))
