"""Pure, one-process tests of the compressors, packing and error feedback."""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from gradwire.compress import (
    COMPRESSORS, ErrorFeedback, Pattern, StateKey, get_compressor, parse_compressor, payload_nbytes, roundtrip,
)
from gradwire.compress import twophase
from gradwire.compress.base import deserialize, serialize
from gradwire.compress.blocks import block_scales, mul_blocks_
from gradwire.compress.packing import (
    SIGN_TABLE, decode_table, decode_table_torch, pack_bits_torch, pack_codes2, pack_signs, unpack_signs,
)
from gradwire.compress.randomk import RandomKCompressor

ALL = ["none", "fp16", "bf16", "int8", "int8:allgather", "qsgd:16", "terngrad", "onebit", "onebit:allgather",
       "onebit:block=0:rms=0", "signum", "topk:0.01", "randomk:0.1", "powersgd:4"]


def rand(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_registry_lists_every_name_and_rejects_unknown():
    assert {"none", "fp16", "bf16", "int8", "qsgd", "terngrad", "onebit", "signum", "topk", "randomk",
            "powersgd"} <= set(COMPRESSORS)
    with pytest.raises(ValueError, match="valid names: .*topk:ratio"):
        get_compressor("zip")


@pytest.mark.parametrize("spec, match", [
    ("topk:0", r"\(0, 1\]"), ("topk:1.5", r"\(0, 1\]"), ("randomk:-1", r"\(0, 1\]"),
    ("qsgd:0", r"\[1, 127\]"), ("qsgd:300", r"\[1, 127\]"), ("powersgd:0", ">= 1"),
    ("topk:abc", "float"), ("fp16:3", "no parameter"), ("onebit:allreduce", "two_phase"),
])
def test_invalid_parameters_name_the_valid_range(spec, match):
    with pytest.raises(ValueError, match=match):
        get_compressor(spec)


@pytest.mark.parametrize("name, bound", [
    ("none", 0.0), ("fp16", 1e-3), ("bf16", 1e-2), ("int8", 0.03), ("powersgd:4", 0.99), ("topk:0.01", 0.99),
])
def test_roundtrip_error_bounds(name, bound):
    x = rand(10_001)
    y = roundtrip(get_compressor(name), x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert rel_err(y, x) <= bound


def test_onebit_one_block_is_sign_times_mean_magnitude():
    x = rand(1001)
    y = roundtrip(get_compressor("onebit:block=0:rms=0"), x)
    expected = torch.where(x < 0, -1.0, 1.0) * x.abs().mean()
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("n", [100, 512, 1001, 1536])
def test_onebit_per_block_rms_scales_round_trip(n):
    x = rand(n) * torch.linspace(0.01, 10, n)  # magnitudes that differ along the tensor
    payload, ctx = get_compressor("onebit").compress(x)
    packed, scales = payload
    assert scales.numel() == math.ceil(n / 512) and scales.dtype == torch.float32
    expected = torch.cat([torch.where(b < 0, -1.0, 1.0) * b.pow(2).mean().sqrt() for b in x.split(512)])
    torch.testing.assert_close(get_compressor("onebit").decompress(payload, ctx), expected)
    # per-block scales follow the magnitudes: less error than one scale for the whole tensor
    if n > 512:
        one = roundtrip(get_compressor("onebit:block=0"), x)
        assert rel_err(expected, x) < rel_err(one, x)


def test_block_scales_kinds_and_short_tail():
    x = torch.tensor([1.0, -3.0, 2.0, 0.0, -4.0])
    torch.testing.assert_close(block_scales(x, 2, "mean"), torch.tensor([2.0, 1.0, 4.0]))
    torch.testing.assert_close(block_scales(x, 2, "max"), torch.tensor([3.0, 2.0, 4.0]))
    torch.testing.assert_close(block_scales(x, 2, "rms"), torch.tensor([5 ** 0.5, 2 ** 0.5, 4.0]))
    torch.testing.assert_close(block_scales(x, 0, "max"), torch.tensor([4.0]))
    y = mul_blocks_(torch.ones(5), torch.tensor([1.0, 2.0, 3.0]), 2)
    assert y.tolist() == [1, 1, 2, 2, 3]
    x[2] = float("nan")  # only that block's scale is NaN
    s = block_scales(x, 2, "rms")
    assert torch.isfinite(s[0]) and not torch.isfinite(s[1]) and torch.isfinite(s[2])


def test_int8_per_block_max_scales_keep_small_layers():
    # A small-gradient "layer" next to a large one: one max scale flattens it to level 0 or 1.
    x = torch.cat([rand(4096, 1) * 1e-3, rand(4096, 2)])
    torch.manual_seed(0)
    blocked = roundtrip(get_compressor("int8"), x)
    one = roundtrip(get_compressor("int8:block=0"), x)
    assert rel_err(blocked[:4096], x[:4096]) < 0.02 < rel_err(one[:4096], x[:4096])


def test_options_parse_and_warmup_rides_on_the_compressor():
    assert parse_compressor("onebit:allgather:block=64:warmup=5") == ("onebit", "allgather", {"block": 64, "warmup": 5})
    comp = get_compressor("topk:0.05:warmup=7")
    assert comp.ratio == 0.05 and comp.warmup == 7
    assert get_compressor("onebit").warmup == 0
    c = get_compressor("int8:allgather:block=128")
    assert c.pattern is Pattern.ALLGATHER and c.block == 128 and c.name == "int8"
    assert get_compressor("int8").pattern is Pattern.TWO_PHASE


def test_ef_option_damps_the_residual_through_the_state():
    """``ef=N`` keeps N% of what compression dropped; the state builds its error feedback with it."""
    from gradwire.compress import ErrorFeedback, StateKey
    from gradwire.exchange import CompressionState
    assert get_compressor("onebit").ef == 100 and get_compressor("onebit:block=64:ef=50").ef == 50
    assert CompressionState("onebit:ef=50").error_feedback.keep == 0.5
    assert CompressionState("onebit").error_feedback.keep == 1.0
    torch.manual_seed(0)
    x = torch.randn(1024)
    key = StateKey.of("p0", x.numel())
    full, half = ErrorFeedback(), ErrorFeedback(keep=0.5)
    approx = roundtrip(get_compressor("onebit:block=64"), x)
    full.update(key, x.clone(), approx)
    half.update(key, x.clone(), approx)
    assert torch.equal(full.residual(key), x - approx)
    assert torch.allclose(half.residual(key), 0.5 * (x - approx))
    with pytest.raises(ValueError, match="0 to 1"):
        ErrorFeedback(keep=1.5)


@pytest.mark.parametrize("spec, match", [
    ("onebit:block=12", "multiple of 8"), ("onebit:bloc=8", "unknown option 'bloc'"),
    ("fp16:block=8", "options of fp16: warmup"), ("onebit:warmup=x", "integer"),
    ("topk:0.1:0.2", "at most one positional"), ("onebit:warmup=-1", ">= 0"), ("onebit:rms=2", "rms"),
    ("onebit:ef=150", "0 to 100"), ("onebit:ef=-1", "0 to 100"),
])
def test_bad_options_say_what_is_valid(spec, match):
    with pytest.raises(ValueError, match=match):
        get_compressor(spec)


def test_serialize_round_trip_with_padding():
    payload = [torch.arange(5, dtype=torch.uint8), torch.tensor([1.5, -2.0]), torch.arange(3, dtype=torch.int32)]
    buf, layout = serialize(payload, nbytes=64)
    assert buf.numel() == 64
    for a, b in zip(deserialize(buf, layout), payload):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="needs"):
        serialize(payload, nbytes=8)


def test_topk_keeps_the_largest_magnitudes():
    x = rand(100_000)
    payload, ctx = get_compressor("topk:0.01").compress(x)
    idx, vals = payload
    assert idx.dtype == torch.int32 and idx.numel() == 1000
    kept = vals[vals != 0].abs()
    assert kept.numel() >= 950  # the sampled threshold leaves at most a little padding
    true_kth = x.abs().topk(1000).values[-1]
    assert float(kept.min()) >= 0.9 * float(true_kth)


def test_powersgd_recovers_a_low_rank_matrix():
    a, b = rand(64 * 2, 1).view(64, 2), rand(2 * 48, 2).view(2, 48)
    m = a @ b
    y = roundtrip(get_compressor("powersgd:2"), m)
    assert rel_err(y, m) < 1e-4


@pytest.mark.parametrize("name", ["qsgd:4", "int8", "terngrad", "randomk:0.25"])
def test_unbiased_compressors_average_to_the_input(name):
    torch.manual_seed(0)
    comp = get_compressor(name)
    assert comp.unbiased
    x = rand(64)
    trials = 4000
    mean = torch.stack([roundtrip(comp, x) for _ in range(trials)]).mean(0)
    # Per-element standard error is at most ~ sqrt(n/k)*|x|/sqrt(trials) for randomk; 0.15 is > 4 sigma.
    assert float((mean - x).abs().max()) < 0.15 * float(x.abs().max())


@pytest.mark.parametrize("name", ["onebit:allgather", "signum", "topk:0.01", "powersgd:2", "terngrad",
                                  "qsgd:4", "fp16"])
def test_error_feedback_invariant(name):
    comp, ef, k = get_compressor(name), ErrorFeedback(), StateKey.of("k", 5001)
    for step in range(3):
        g = rand(5001, step)
        c = ef.compensate(g.clone(), k)
        c_copy = c.clone()
        y = roundtrip(comp, c, k)
        r = ef.update(k, c, y)
        torch.testing.assert_close(y + r, c_copy, rtol=1e-6, atol=1e-5)


def test_error_feedback_state_dict_and_nonfinite_step():
    ef, k = ErrorFeedback(), StateKey.of("k", 4)
    ef.update(k, torch.ones(4), torch.zeros(4))
    ef2 = ErrorFeedback()
    ef2.load_state_dict(pickle.loads(pickle.dumps(ef.state_dict())))
    assert torch.equal(ef2.compensate(torch.zeros(4), k), torch.ones(4))
    # a non-finite step leaves the residual as it was (the next clean step continues from it)
    assert ef.update(k, torch.tensor([1.0, float("nan"), 0, 0]), torch.zeros(4)) is None
    assert torch.equal(ef.residual(k), torch.ones(4))
    # a tensor that does not fit its key is refused
    with pytest.raises(ValueError, match="names 4 elements, the tensor has 5"):
        ef.compensate(torch.zeros(5), k)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1001])
def test_sign_packing_odd_lengths(n):
    x = rand(n)
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n / 8)
    assert torch.equal(packed, torch.from_numpy(np.packbits(x.numpy() < 0)))
    torch.testing.assert_close(unpack_signs(packed, n, 2.0), torch.where(x < 0, -2.0, 2.0))


@given(st.lists(st.floats(allow_nan=False, width=32), min_size=0, max_size=70),
       st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
@settings(max_examples=60, deadline=None)
def test_sign_packing_paths_agree_for_every_dtype(values, dtype):
    """The numpy path (CPU) and the torch path (CUDA) pack the same bits, in numpy.packbits' order."""
    x = torch.tensor(values, dtype=torch.float32).to(dtype)
    expected = np.packbits(x.float().numpy() < 0)
    assert torch.equal(pack_signs(x), torch.from_numpy(expected))
    assert torch.equal(pack_bits_torch(torch.lt(x, 0)), torch.from_numpy(expected))
    packed = torch.from_numpy(expected)
    assert torch.equal(decode_table_torch(packed, torch.from_numpy(SIGN_TABLE), x.numel()),
                       decode_table(packed, SIGN_TABLE, x.numel()))


def test_two_bit_packing():
    codes = torch.tensor([1, 2, 0, 1, 2], dtype=torch.uint8)
    assert pack_codes2(codes).tolist() == [0b01100001, 0b10000000]


def test_payload_bytes():
    n = 100_001
    x = rand(n)
    fp32 = 4 * n
    blocks = math.ceil(n / 512)
    assert payload_nbytes(get_compressor("onebit").compress(x)[0]) == math.ceil(n / 8) + 4 * blocks
    assert fp32 / payload_nbytes(get_compressor("onebit").compress(x)[0]) >= 30
    assert payload_nbytes(get_compressor("onebit:block=0").compress(x)[0]) == math.ceil(n / 8) + 4
    assert payload_nbytes(get_compressor("signum").compress(x)[0]) == math.ceil(n / 8) + 4 * blocks
    assert payload_nbytes(get_compressor("int8").compress(x)[0]) == n + 4 * blocks
    assert fp32 / payload_nbytes(get_compressor("int8").compress(x)[0]) >= 3.96
    assert payload_nbytes(get_compressor("fp16").compress(x)[0]) == 2 * n
    assert payload_nbytes(get_compressor("terngrad").compress(x)[0]) == math.ceil(n / 4) + 4
    assert fp32 / payload_nbytes(get_compressor("topk:0.01").compress(x)[0]) >= 20
    assert fp32 / payload_nbytes(get_compressor("randomk:0.01").compress(x)[0]) >= 90


@pytest.mark.parametrize("name", ALL)
def test_empty_integer_and_noncontiguous_tensors(name):
    comp = get_compressor(name)
    assert roundtrip(comp, torch.empty(0)).numel() == 0
    ints = torch.arange(10)
    assert torch.equal(roundtrip(comp, ints), ints)
    x = rand(7 * 9).view(7, 9).t()  # not contiguous
    assert not x.is_contiguous()
    torch.manual_seed(0)
    y = roundtrip(get_compressor(name), x)
    torch.manual_seed(0)
    dense = roundtrip(get_compressor(name), x.contiguous())  # a fresh compressor: the same random draws
    assert y.shape == x.shape and y.dtype == x.dtype
    # element (i, j) of the result belongs to element (i, j) of the input, not to its place in memory
    assert torch.equal(y, dense), name
    if name in ("none", "fp16", "bf16"):
        torch.testing.assert_close(y, x, rtol=1e-2, atol=0)
    elif name.startswith("powersgd"):
        assert rel_err(y, x) < 0.5  # rank 4 of a 9 x 7 matrix keeps most of it
    else:  # the sign survives wherever the compressor keeps an element
        kept = y != 0
        assert kept.any() and torch.equal(torch.sign(y[kept]), torch.sign(x[kept])), name


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_stays_visible(name, bad):
    x = rand(4001)
    x[1234] = bad
    y = roundtrip(get_compressor(name), x)
    assert not torch.isfinite(y).all(), f"{name} dropped a {bad}"


def test_nonfinite_in_one_tensor_leaves_another_unaffected():
    comp, ef = get_compressor("onebit:allgather"), ErrorFeedback()
    bad, good = rand(1000, 1), rand(1000, 2)
    bad[3] = float("nan")
    for key, t in ((StateKey.of("bad", 1000), bad), (StateKey.of("good", 1000), good)):
        ef.update(key, t, roundtrip(comp, t, key))
    assert torch.isfinite(roundtrip(comp, good, "good")).all()
    assert torch.isfinite(ef.residual(StateKey.of("good", 1000))).all()
    assert ef.residual(StateKey.of("bad", 1000)) is None  # the non-finite tensor stored no residual


def test_randomk_indices_agree_for_the_same_key_and_step():
    a, b = RandomKCompressor(0.1, seed=3), RandomKCompressor(0.1, seed=3)
    _, ca = a.compress(rand(1000, 1), 5)
    _, cb = b.compress(rand(1000, 2), 5)
    assert torch.equal(ca.info["idx"], cb.info["idx"])
    _, ca2 = a.compress(rand(1000, 1), 5)
    assert not torch.equal(ca.info["idx"], ca2.info["idx"])  # a new step draws new indices


def test_powersgd_warm_start_survives_state_dict():
    a = get_compressor("powersgd:2")
    x = rand(2000)
    roundtrip(a, x, 0)
    b = get_compressor("powersgd:2")
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    torch.testing.assert_close(roundtrip(a, x, 0), roundtrip(b, x, 0))


@pytest.mark.parametrize("name", ["onebit", "int8"])
def test_two_phase_single_rank_matches_the_compressor(name):
    comp = get_compressor(name)
    x = rand(1003)
    twin = pickle.loads(pickle.dumps(comp))  # the same random state: int8 draws the same numbers
    rows, approx, plan = twophase.split_encode(x, 1, comp)
    torch.testing.assert_close(approx, roundtrip(twin, x))
    row = twophase.server_reduce(rows, plan, 0, comp)
    out = twophase.gather_decode(row.view(1, -1), plan, comp)
    if name == "onebit":  # deterministic: re-compressing the decoded chunk changes nothing
        torch.testing.assert_close(out, approx)
    assert rel_err(out, x) < (1.0 if name == "onebit" else 0.05)


def test_two_phase_chunks_cover_odd_lengths():
    bounds = twophase.chunk_bounds(1001, 4)
    assert sum(c for _, c in bounds) == 1001
    assert all(start % 8 == 0 for start, _ in bounds) and bounds[0] == (0, 256)
    assert twophase.chunk_bounds(5, 4)[1:] == [(5, 0), (5, 0), (5, 0)]  # empty chunks


@pytest.mark.parametrize("name", ["onebit", "onebit:block=64", "int8:block=64"])
@pytest.mark.parametrize("numel", [5, 200, 1001, 4097, 50_000])
def test_two_phase_sliced_encoding_equals_encoding_each_chunk(name, numel):
    """A local encoding is computed once and sliced: every row and the decoded result match per-chunk work."""
    comp = get_compressor(name)
    world, x = 4, rand(numel)
    assert comp.slice_units() is not None
    rows, approx, plan = twophase.split_encode(x, world, comp)
    assert all(start % twophase.chunk_granule(comp) == 0 for start, count in plan.bounds if count)
    expected_approx = torch.empty_like(x)
    for r, (start, count) in enumerate(plan.bounds):
        torch.manual_seed(0)  # int8 rounds stochastically: compare the deterministic parts only
        payload, ctx = comp.compress(x[start:start + count], (0, r))
        expected_approx[start:start + count] = comp.decompress(payload, ctx)
        if name.startswith("onebit"):
            buf, _ = serialize(payload, plan.row_bytes)
            assert torch.equal(rows[r], buf)
    if name.startswith("onebit"):
        torch.testing.assert_close(approx, expected_approx, rtol=0, atol=0)
        # decoding the gathered rows in one pass equals decoding each chunk
        torch.testing.assert_close(twophase.gather_decode(rows, plan, comp), expected_approx, rtol=0, atol=0)
    else:
        assert rel_err(approx, x) < 0.05


def test_two_phase_rejects_multi_round_compressors():
    with pytest.raises(ValueError, match="rounds"):
        twophase.split_encode(rand(100), 2, get_compressor("powersgd:2"))


@pytest.mark.parametrize("name", [n for n in ALL if get_compressor(n).rounds == 1])
@pytest.mark.parametrize("n", [1, 7, 8, 513, 20_001])
def test_decompress_into_equals_decompress(name, n):
    """Decoding into a caller's buffer (reused: it holds stale values) gives exactly decompress()."""
    comp = get_compressor(name)
    payload, ctx = comp.compress(rand(n, seed=n), 0)
    out = torch.full((n,), 7.0)
    assert comp.decompress_into(payload, ctx, out) is out
    assert torch.equal(out, comp.decompress(payload, ctx).reshape(-1))
    strided = torch.full((2 * n,), 7.0)[::2]  # not contiguous: the generic copy path
    assert torch.equal(comp.decompress_into(payload, ctx, strided), out)


@pytest.mark.parametrize("name", ["onebit", "int8"])
def test_decompress_into_a_buffer_of_the_wrong_size_says_so(name):
    comp = get_compressor(name)
    payload, ctx = comp.compress(rand(100), 0)
    with pytest.raises(ValueError, match="out holds 99 elements, the payload decodes to 100"):
        comp.decompress_into(payload, ctx, torch.empty(99))


def test_error_feedback_lends_its_residual_buffer():
    """workspace() is the residual's own buffer; update() with it as approx computes c - approx in place."""
    ef, k = ErrorFeedback(), StateKey.of("k", 64)
    c = rand(64)
    lent = ef.workspace(k, c)
    assert lent is ef.residual(k) and torch.equal(lent, torch.zeros(64))
    approx = torch.sign(c)
    lent.copy_(approx)
    ef.update(k, c, lent)
    assert torch.equal(ef.residual(k), c - approx)
    assert ef.workspace(k, c) is ef.residual(k)  # the same buffer every step
    with pytest.raises(ValueError, match="names 64 elements"):
        ef.workspace(k, rand(8))  # another size under the same key is an error, not a fresh residual


@pytest.mark.parametrize("name", ["onebit", "onebit:block=0"])  # sliced whole encoding; chunk by chunk
def test_split_encode_into_a_given_buffer_matches(name):
    comp = get_compressor(name)
    x = rand(50_001)
    rows, approx, plan = twophase.split_encode(x, 4, comp)
    buf = torch.full_like(x, 7.0)
    rows2, approx2, _ = twophase.split_encode(x, 4, get_compressor(name), approx=buf)
    assert approx2 is buf and torch.equal(approx2, approx) and torch.equal(rows2, rows)
    out = torch.full_like(x, 7.0)
    assert torch.equal(twophase.gather_decode(rows, plan, comp, out=out), twophase.gather_decode(rows, plan, comp))
