"""The arithmetic of CompressionState on a one-rank gloo group, in this process (fast, no spawn).

With one rank the exchange averages over nobody else, which pins every
piece of arithmetic down exactly:

- the local correction gives back the rank's own (momentum) vector:
  ``u = avg + (e' - e) [+ 1 * (s' - s)]`` and ``avg + e' + s' == m + e + s``;
- without it the result is the compressed value, and the residuals hold
  exactly what was dropped;
- the momentum is ``m = beta m + g``, and a non-finite step leaves it alone.
"""
from __future__ import annotations

import os
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist

from gradwire.compress import StateKey, get_compressor
from gradwire.exchange import CompressionState
from gradwire.exchange import chooser as chooser_module

NAMES = ["onebit", "onebit:allgather", "topk:0.1", "powersgd:2", "int8", "fp16", "signum"]


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        yield
        dist.destroy_process_group()


def _g(step: int, n: int = 3000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(step))


@pytest.mark.parametrize("name", [n for n in NAMES if get_compressor(n).averages and not get_compressor(n).unbiased])
def test_local_correction_gives_back_the_momentum_on_one_rank(name: str) -> None:
    state = CompressionState(name, momentum=0.9, warmup_iters=0, min_compress_numel=0, local_correction=True)
    assert state.local_correction
    key, m = StateKey.of("w", 3000), torch.zeros(3000)
    for step in range(4):
        g = _g(step)
        m = 0.9 * m + g
        out = state.reduce(g.clone(), key).wait()
        torch.testing.assert_close(out, m, rtol=0, atol=2e-5)
        state.end_step()


@pytest.mark.parametrize("name", ["onebit:allgather", "topk:0.1", "powersgd:2"])
def test_without_correction_the_result_is_the_compressed_value_and_the_residual_what_was_dropped(name: str) -> None:
    # one rank, one-round or all_reduce patterns: out = C(c) with c = g + e, and e' = c - C(c)
    state = CompressionState(name, warmup_iters=0, min_compress_numel=0, local_correction=False)
    key, e = StateKey.of("w", 3000), torch.zeros(3000)
    for step in range(3):
        g = _g(step)
        out = state.reduce(g.clone(), key).wait()
        e2 = state.error_feedback.residual(key)
        assert float((out - (g + e)).abs().max()) > 1e-3  # it was compressed
        torch.testing.assert_close(out + e2, g + e, rtol=0, atol=2e-5)  # and nothing was lost
        e = e2.clone()
        state.end_step()


def test_two_phase_on_one_rank_keeps_everything_in_the_residuals() -> None:
    # onebit two-phase, no correction: out = C(C(c) + s) with c = g + e; then e' = c - C(c), s' = C(c) + s - out,
    # so out + e' + s' == g + e + s at every step
    state = CompressionState("onebit", warmup_iters=0, min_compress_numel=0, local_correction=False)
    ef = state.error_feedback
    key = StateKey.of("w", 3000)
    served = key.serving(0, 3000)
    e, s = torch.zeros(3000), torch.zeros(3000)
    for step in range(4):
        g = _g(step)
        out = state.reduce(g.clone(), key).wait()
        e2, s2 = ef.residual(key), ef.residual(served)
        torch.testing.assert_close(out + e2 + s2, g + e + s, rtol=0, atol=2e-5)
        assert float((e2 - e).abs().max()) > 0 and float((s2 - s).abs().max()) > 0
        e, s = e2.clone(), s2.clone()
        state.end_step()


def test_momentum_and_warmup() -> None:
    state = CompressionState("onebit", momentum=0.5, warmup_iters=2, min_compress_numel=0)
    key, m = StateKey.of("w", 3000), torch.zeros(3000)
    for step in range(2):  # warm-up: the plain average of the momentum, exactly
        g = _g(step)
        m = 0.5 * m + g
        assert not state.compressing(3000)
        torch.testing.assert_close(state.reduce(g.clone(), key).wait(), m, rtol=0, atol=1e-6)
        state.end_step()
    assert state.compressing(3000)
    cutoff = CompressionState("onebit", min_compress_numel=100, warmup_iters=0)
    assert not cutoff.compressing(99) and cutoff.compressing(100)


def test_a_non_finite_input_leaves_momentum_and_residuals_as_they_were() -> None:
    state = CompressionState("onebit", momentum=0.9, warmup_iters=0, min_compress_numel=0)
    key = StateKey.of("w", 3000)
    state.reduce(_g(0), key).wait()
    before = state.local_state_dict()
    bad = _g(1)
    bad[7] = float("inf")
    out = state.reduce(bad, key).wait()
    assert not torch.isfinite(out).all()  # visible to a GradScaler
    after = state.local_state_dict()
    for part in ("momentum", "error_feedback"):
        for x, y in zip(before[part]["buffers"], after[part]["buffers"]):
            assert torch.equal(x["value"], y["value"]), part
    good = state.reduce(_g(2), key).wait()
    assert torch.isfinite(good).all()


def test_small_and_integer_tensors_are_averaged_plainly() -> None:
    state = CompressionState("onebit", warmup_iters=0)  # cutoff 1024
    small = torch.tensor([1.0, -2.0, 3.0])
    assert torch.equal(state.reduce(small.clone(), StateKey.of("b", 3)).wait(), small)
    ints = torch.tensor([3, 5, 7])
    assert torch.equal(state.reduce(ints.clone(), StateKey.of("i", 3)).wait(), ints)
    assert state.error_feedback is not None and len(state.error_feedback) == 0  # nothing compressed, no residual


def test_a_tensor_that_does_not_fit_its_key_is_refused() -> None:
    state = CompressionState("onebit")
    with pytest.raises(ValueError, match="names 10 elements, the tensor has 3"):
        state.reduce(torch.zeros(3), StateKey.of("w", 10))


def test_fused_buckets_each_get_their_part_and_all_share_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    # one rank, local correction: each bucket gets back its own vector, fused or not
    state = CompressionState("onebit", warmup_iters=0, min_compress_numel=0, fuse_numel=10_000, local_correction=True)
    a, b = _g(1, 3000), _g(2, 2000)
    wa, wb = torch.zeros(3000), torch.zeros(2000)  # stand-ins for the buckets' parameters
    _, fa = state.reduce_params(a.clone(), [wa], last=False)
    assert not fa.done()  # held for the next bucket
    _, fb = state.reduce_params(b.clone(), [wb], last=True)
    torch.testing.assert_close(fa.wait(), a, rtol=0, atol=2e-5)
    torch.testing.assert_close(fb.wait(), b, rtol=0, atol=2e-5)
    state.end_step()

    def broken(self: CompressionState, flat: torch.Tensor, key: StateKey, local: torch.Tensor | None = None):
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_exception(RuntimeError("peer went away"))
        return fut

    monkeypatch.setattr(CompressionState, "reduce", broken)
    _, fa = state.reduce_params(a.clone(), [wa], last=False)
    _, fb = state.reduce_params(b.clone(), [wb], last=False)
    state.end_step()  # a caller that never said "last": the held buckets leave at the step's end
    for fut in (fa, fb):
        with pytest.raises(RuntimeError, match="peer went away"):
            fut.wait()


def test_auto_switching_keeps_the_arithmetic_and_settles_the_residuals() -> None:
    # one rank, local correction: whatever the choice, each step gives back the momentum vector m exactly,
    # across switches onebit -> none (what error feedback owed is sent, the residuals empty) -> int8 -> fp16
    state = CompressionState("auto", momentum=0.9, warmup_iters=0, min_compress_numel=0, fuse_numel=0,
                             local_correction=True)
    assert state.auto is not None and state.error_feedback is not None
    by_name = {c.name: c for c in state.auto.candidates}
    key, m = StateKey.of("w", 3000), torch.zeros(3000)
    plan = ["onebit", "onebit", "none", "none", "int8", "fp16", "onebit", "none"]
    for step, name in enumerate(plan):
        state.auto.choice[key] = by_name[name]
        g = _g(step)
        m = 0.9 * m + g
        out = state.reduce(g.clone(), key).wait()
        torch.testing.assert_close(out, m, rtol=0, atol=5e-5)
        if name == "none":
            assert state.error_feedback.keys() == []  # nothing owed after an uncompressed step
        else:
            assert state.error_feedback.residual(key) is not None
        state.end_step()


def test_auto_names_and_refusals() -> None:
    from gradwire.compress import AutoCompressor, get_compressor

    auto = get_compressor("auto:fp16/onebit:every=5")
    assert isinstance(auto, AutoCompressor) and [c.name for c in auto.candidates] == ["fp16", "onebit"]
    assert auto.every == 5
    with pytest.raises(ValueError, match="vote"):
        get_compressor("auto:signum")
    with pytest.raises(ValueError, match="unknown candidate"):
        get_compressor("auto:zip")
    with pytest.raises(ValueError, match="every must be >= 1"):
        get_compressor("auto:every=0")
    with pytest.raises(RuntimeError, match="compresses nothing itself"):
        auto.compress(torch.zeros(4))


def _chooser(spec: str, numel: int, step: int, last_probe: int) -> tuple[object, StateKey]:
    """An ``auto`` chooser of one exchange of ``numel`` elements, at ``step`` of a run, probed at ``last_probe``."""
    from gradwire.compress import AutoCompressor
    from gradwire.exchange.chooser import AutoChooser

    auto = get_compressor(spec)
    assert isinstance(auto, AutoCompressor)
    chooser = AutoChooser(auto)
    key = StateKey.of("p0", numel)
    chooser._keys, chooser._first, chooser._step, chooser._last_probe = [key], 0, step, last_probe
    return chooser, key


def _probed_before(chooser: object, link: object) -> None:
    """As if the chooser's probes so far had read ``link`` (its estimate, and the readings it is the median of)."""
    chooser.link, chooser._readings = link, [link]  # type: ignore[attr-defined]


def test_auto_trial_keeps_a_faster_choice_reverts_a_slower_one_and_retries_once_the_link_moves() -> None:
    # the chooser's decisions from agreed numbers alone (no process group): a priced proposal goes on trial,
    # its steps judge it against the old choice's steps on this link, a loser is not proposed again on the same
    # link; a moved link's proposal waits for the next probe to see the link there again
    from gradwire.exchange.chooser import TRIAL_STEPS, AutoChooser, _fitted

    chooser, key = _chooser("auto:onebit", 1 << 20, 9, 7)
    assert isinstance(chooser, AutoChooser)
    # a warm-up step, three clean ones before the probe, the probe's own, one after it
    chooser._periods = [(2, ("none",), 0.300, True), (5, ("none",), 0.060, True), (6, ("none",), 0.070, True),
                        (7, ("none",), 0.100, False), (8, ("none",), 0.050, True)]

    def agreed(alpha: float, beta: float) -> torch.Tensor:  # small, large, bus bytes, exposed share, cpu per candidate
        busbytes = 4e6
        return torch.tensor([alpha, alpha + beta * busbytes, busbytes, 1.0, 0.05, 0.0, 1e-3], dtype=torch.float64)

    slow = agreed(1e-3, 1e-7)  # 1 Gbit/s of bus bandwidth: 1 MiB elements take ~0.4 s uncompressed
    _probed_before(chooser, _fitted(slow))  # the link of the probes before: it has not moved
    chooser._decide(slow, [key], 2, 2)
    assert chooser.choice[key].name == "onebit" and chooser._trial is not None
    assert chooser._trial.before == 0.060  # the old choice's clean periods past the warm-up (the probe's left out)
    assert chooser.decisions[-1].event == "trial"
    chooser._judge(torch.tensor([0.060, 0.070, 0.0], dtype=torch.float64), 9 + TRIAL_STEPS + 1)
    assert key not in chooser.choice or chooser.choice[key].name == "none"
    assert chooser.decisions[-1].event == "reverted" and chooser.decisions[-1].steps_ms == (60.0, 70.0)
    chooser._decide(slow, [key], 20, 2)  # the same link: the loser is not tried again
    assert chooser._trial is None and chooser.choice.get(key, chooser.none).name == "none"
    chooser._step, chooser._last_probe = 31, 29
    chooser._periods += [(s, ("none",), 0.500, s != 29) for s in range(21, 31)]
    moved = agreed(1e-3, 1e-6)  # ten times slower
    chooser._decide(moved, [key], 30, 2)
    # one probe read it (step 29): the estimate stays until the next probe, ``every`` steps on, reads it there too
    assert chooser._trial is None and chooser.choice.get(key, chooser.none).name == "none"
    assert chooser._interval == chooser.auto.every and chooser.link.beta == pytest.approx(1e-7)
    chooser._step, chooser._last_probe = 36, 34
    chooser._periods += [(s, ("none",), 0.500, s != 34) for s in range(31, 36)]
    chooser._decide(moved, [key], 35, 2)  # the second reading there: moved, and none's steps since 30 judge onebit
    assert chooser.link.beta == pytest.approx(1e-6) and chooser._link_since == 30
    assert chooser._trial is not None and chooser.choice[key].name == "onebit"
    assert chooser._trial.before == 0.500
    chooser._judge(torch.tensor([0.500, 0.060, 0.0], dtype=torch.float64), 40)
    assert chooser.choice[key].name == "onebit" and chooser.decisions[-1].event == "kept"
    assert "1 trial(s) reverted" in chooser.describe()


def test_auto_estimate_of_a_measured_link_leaves_out_one_probe_that_read_it_elsewhere() -> None:
    # single probes of a tc-shaped 1 Gbit/s link on a busy 2-core host read 0.65-1.5 Gbit/s; the estimate is the
    # median of the last few on the link, and a probe that reads it moved waits for the next to confirm it
    from gradwire.exchange.chooser import ESTIMATE_PROBES, AutoChooser

    chooser, key = _chooser("auto:onebit", 1 << 20, 9, 7)
    assert isinstance(chooser, AutoChooser)
    busbytes = 4e6

    def agreed(beta: float) -> torch.Tensor:
        return torch.tensor([5e-4, 5e-4 + beta * busbytes, busbytes, 1.0, 0.05, 0.0, 1e-3], dtype=torch.float64)

    for step, beta in enumerate([8e-9, 9e-9, 7e-9, 8.5e-9], start=10):
        chooser._decide(agreed(beta), [key], step, 2)
    assert chooser.link.beta == pytest.approx((8e-9 + 8.5e-9) / 2)  # the median of four
    chooser._last_probe = 19
    chooser._decide(agreed(20e-9), [key], 20, 2)  # one slow reading (0.4 Gbit/s): the estimate stays
    assert chooser.link.beta == pytest.approx((8e-9 + 8.5e-9) / 2) and chooser._interval == chooser.auto.every
    chooser._decide(agreed(8e-9), [key], 24, 2)  # the next reads the link where it was: the slow one is dropped
    assert chooser.link.beta == pytest.approx(8e-9) and chooser._far is None
    for step in range(ESTIMATE_PROBES):
        chooser._decide(agreed(3e-9 if step % 2 else 12e-9), [key], 30 + step, 2)  # alternating far readings
    assert 7e-9 <= chooser.link.beta <= 9e-9  # never two in a row at one place: no move, the estimate holds
    chooser._last_probe = 39
    chooser._decide(agreed(80e-9), [key], 40, 2)
    chooser._last_probe = 43
    chooser._decide(agreed(82e-9), [key], 44, 2)  # a tenfold drop, read twice: moved, from the first reading's step
    assert chooser.link.beta == pytest.approx(81e-9) and chooser._link_since == 40


def test_auto_probe_is_long_enough_that_a_few_milliseconds_of_delay_do_not_move_it() -> None:
    from gradwire.compress import AlphaBeta
    from gradwire.exchange.chooser import PROBE_MAX_NUMEL, PROBE_SECONDS, probe_numel

    gbit = AlphaBeta(alpha=4e-4, beta=8e-9)  # 1 Gbit/s, 0.4 ms: 8 alphas would be 3.2 ms of bytes
    n = probe_numel(gbit, 2, 1 << 20)
    assert n * 4 * gbit.beta == pytest.approx(PROBE_SECONDS, rel=1e-3)
    slow = AlphaBeta(alpha=2e-3, beta=8e-8)  # 100 Mbit/s, 2 ms: 8 alphas, 16 ms, are more than PROBE_SECONDS
    assert probe_numel(slow, 2, 1 << 20) * 4 * slow.beta == pytest.approx(16e-3, rel=1e-3)
    assert probe_numel(gbit, 2, 1000) == 1 << 14  # twice a small exchange, but no less than the floor
    assert probe_numel(AlphaBeta(alpha=4e-4, beta=8e-11), 4, 1 << 24) == PROBE_MAX_NUMEL  # 100 Gbit/s: the cap
    for bad in ((gbit, 1, 1000), (gbit, 2, 0), (AlphaBeta(alpha=4e-4, beta=0.0), 2, 1000)):
        with pytest.raises(ValueError, match="a world of 2 or more ranks"):
            probe_numel(*bad)


def test_auto_takes_its_first_choice_as_priced_and_checks_it_once_against_the_next_cheapest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gradwire.exchange.chooser import AutoChooser

    monkeypatch.setattr(chooser_module, "CHECK_SHARE", 1.0)  # the checks' budget apart: its own test

    chooser, key = _chooser("auto:fp16/onebit", 1 << 20, 3, 1)
    assert isinstance(chooser, AutoChooser)
    chooser._periods = [(1, ("none",), 0.100, False), (2, ("none",), 0.090, True)]  # warm-up steps only
    # 8 Gbit/s of bus bandwidth: onebit priced 2.3 ms, fp16 next (3.6 ms: within 2x), none 5.2 ms
    busbytes = 4e6
    numbers = torch.tensor([1e-3, 1e-3 + 1e-9 * busbytes, busbytes, 1.0, 0.05, 0.0, 5e-4, 1e-4], dtype=torch.float64)
    chooser._decide(numbers, [key], 2, 2)
    assert chooser.choice[key].name == "onebit" and chooser._trial is None
    assert chooser.decisions[-1].event == "decided"
    chooser._step, chooser._last_probe = 13, 11
    chooser._periods += [(s, ("onebit",), 0.030, s != 11) for s in range(3, 13)]
    chooser._decide(numbers, [key], 12, 2)
    assert chooser._trial is not None and chooser.choice[key].name == "fp16"  # the check: the next-cheapest
    chooser._judge(torch.tensor([0.030, 0.035, 0.0], dtype=torch.float64), 18)
    assert chooser.choice[key].name == "onebit" and chooser._verified
    chooser._decide(numbers, [key], 22, 2)
    assert chooser._trial is None  # checked once


def test_auto_checks_of_a_priced_choice_wait_until_the_trials_steps_are_a_small_share_of_the_runs() -> None:
    # the first test's check (fp16 against a first choice of onebit, both priced near): not at step 12, where its
    # 3 steps would be a quarter of the run's; at step 60 (5%); the steps of every trial count, and are saved
    from gradwire.exchange.chooser import CHECK_SHARE, TRIAL_STEPS, AutoChooser

    chooser, key = _chooser("auto:fp16/onebit", 1 << 20, 3, 1)
    assert isinstance(chooser, AutoChooser)
    chooser._periods = [(1, ("none",), 0.100, False), (2, ("none",), 0.090, True)]
    busbytes = 4e6
    numbers = torch.tensor([1e-3, 1e-3 + 1e-9 * busbytes, busbytes, 1.0, 0.05, 0.0, 5e-4, 1e-4], dtype=torch.float64)
    chooser._decide(numbers, [key], 2, 2)
    assert chooser.choice[key].name == "onebit" and chooser._trial is None
    chooser._step, chooser._last_probe = 13, 11
    chooser._periods += [(s, ("onebit",), 0.030, s != 11) for s in range(3, 13)]
    chooser._decide(numbers, [key], 12, 2)
    assert chooser._trial is None and chooser.choice[key].name == "onebit"  # 3 steps of 13: not yet
    at = int(TRIAL_STEPS / CHECK_SHARE)
    chooser._step, chooser._last_probe = at, at - 2
    chooser._periods += [(s, ("onebit",), 0.030, s != at - 2) for s in range(13, at)]
    chooser._decide(numbers, [key], at - 1, 2)
    assert chooser._trial is not None and chooser.choice[key].name == "fp16" and chooser._explored == TRIAL_STEPS
    assert chooser.state_dict()["explored"] == TRIAL_STEPS
    other, _ = _chooser("auto:fp16/onebit", 1 << 20, 3, 1)
    assert isinstance(other, AutoChooser)
    other.load_state_dict(chooser.state_dict())
    assert other._explored == TRIAL_STEPS


def test_auto_probes_move_apart_while_nothing_changes_and_come_back_when_the_link_moves() -> None:
    from gradwire.compress import AutoCompressor
    from gradwire.exchange.chooser import MAX_BACKOFF, AutoChooser

    auto = get_compressor("auto:onebit:every=4")
    assert isinstance(auto, AutoCompressor)
    chooser = AutoChooser(auto)
    key = StateKey.of("p0", 1 << 10)
    chooser._keys, chooser._first = [key], 0
    numbers = torch.tensor([1e-3, 1e-3 + 1e-9 * 4e3, 4e3, 1.0, 0.01, 0.0, 1e-3], dtype=torch.float64)
    intervals = []
    for probe in range(7):
        chooser._probed_at = chooser._next_probe
        chooser._step = chooser._probed_at + 3
        chooser._decide(numbers, [key], chooser._step - 1, 2)
        intervals.append(chooser._interval)
    assert intervals == [4, 8, 16, 32, 32, 32, 32] and MAX_BACKOFF * 4 == 32
    assert chooser.choice.get(key, chooser.none).name == "none"  # a fast link: nothing to compress
    chooser._probed_at = chooser._next_probe
    chooser._decide(numbers * torch.tensor([5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64), [key], 0, 2)
    assert chooser._interval == 4
    # steps of 0.2 s: no more than BACKOFF_SECONDS (2 s) between probes, 10 steps
    slow = numbers * torch.tensor([5.0, 5.0, 1.0, 1.0, 20.0, 1.0, 1.0], dtype=torch.float64)
    for _ in range(4):
        chooser._decide(slow, [key], 0, 2)
    assert chooser._interval == 10


def _tried_on_a_slow_link(periods: list[float]) -> tuple[object, StateKey, torch.Tensor]:
    """A chooser at step 12 whose ``none`` steps took ``periods`` (from step 6), after a decision on a link of
    1 Gbit/s of bus bandwidth where onebit is priced far cheaper (its trial starts), agreed at the periods'
    median; and the agreed numbers of that link."""
    chooser, key = _chooser("auto:onebit", 1 << 20, 12, 5)
    chooser._periods = [(6 + i, ("none",), t, True) for i, t in enumerate(periods)]  # type: ignore[attr-defined]
    busbytes = 4e6
    slow = torch.tensor([1e-3, 1e-3 + 1e-7 * busbytes, busbytes, 1.0, sorted(periods)[len(periods) // 2], 0.0,
                         1e-3], dtype=torch.float64)
    chooser._decide(slow, [key], 12, 2)  # type: ignore[attr-defined]
    return chooser, key, slow


def test_auto_trial_won_by_less_than_the_old_choices_own_noise_is_reverted() -> None:
    # the old choice's steps swing by 10% (median absolute deviation 4 ms of 40): a trial 5% faster is within
    # that noise and reverted; one 25% faster stays. The spread is measured from the old choice's steps.
    from gradwire.exchange.chooser import TRIAL_NOISE, AutoChooser

    chooser, key, slow = _tried_on_a_slow_link([0.040, 0.036, 0.044, 0.040, 0.036, 0.044])
    assert isinstance(chooser, AutoChooser)
    assert chooser._trial is not None and chooser._trial.spread == pytest.approx(0.1)
    assert TRIAL_NOISE * chooser._trial.spread > 0.05
    chooser._judge(torch.tensor([0.040, 0.038, chooser._trial.spread], dtype=torch.float64), 16)
    assert chooser.choice.get(key, chooser.none).name == "none" and chooser.decisions[-1].event == "reverted"
    moved = slow * torch.tensor([1, 4, 1, 1, 1, 1, 1], dtype=torch.float64)
    chooser._decide(moved, [key], 20, 2)  # the link moved: the loser waits for a second probe to read it there
    assert chooser._trial is None
    chooser._decide(moved, [key], 24, 2)  # and is tried again
    assert chooser._trial is not None
    chooser._judge(torch.tensor([0.040, 0.030, chooser._trial.spread], dtype=torch.float64), 28)
    assert chooser.choice[key].name == "onebit" and chooser.decisions[-1].event == "kept"


def test_auto_trial_of_short_steps_runs_more_of_them_and_its_margin_shrinks_with_their_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a 10 ms step: a dozen steps judge the trial (three of them swing by a third on a busy host), the margin is
    # the old choice's spread scaled to a median of twelve; a 50 ms step keeps three, and every step period
    # gives one agreed number of steps (the ranks judge at the same step)
    from gradwire.exchange.chooser import TRIAL_MARGIN, TRIAL_MAX_STEPS, TRIAL_NOISE, TRIAL_STEPS, AutoChooser, \
        trial_margin, trial_steps

    assert (trial_steps(0.05), trial_steps(0.01), trial_steps(1e-4)) == (TRIAL_STEPS, 12, TRIAL_MAX_STEPS)
    assert trial_steps(0.0) == trial_steps(float("nan")) == trial_steps(float("inf")) == TRIAL_STEPS
    assert trial_margin(0.1, TRIAL_STEPS) == pytest.approx(TRIAL_NOISE * 0.1)
    assert trial_margin(0.1, 4 * TRIAL_STEPS) == pytest.approx(TRIAL_NOISE * 0.1 / 2)
    assert trial_margin(0.001, 12) == TRIAL_MARGIN
    for bad in ((0.1, 0), (-0.1, 3), (float("nan"), 3), (float("inf"), 3)):
        with pytest.raises(ValueError, match="a trial of 1 step or more and a spread"):
            trial_margin(*bad)

    chooser, key, _ = _tried_on_a_slow_link([0.010, 0.009, 0.011, 0.010, 0.009, 0.011])
    assert isinstance(chooser, AutoChooser)
    trial = chooser._trial
    assert trial is not None and trial.steps == 12 and trial.spread == pytest.approx(0.1)
    start = trial.start
    chooser._periods += [(start + i, ("onebit",), 0.0092, True) for i in range(1, 13)]
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # end_step's schedule, as on two ranks
    judged = []
    for step in range(start, start + 14):
        chooser.end_step(step, [key], None)
        assert chooser._due is not None
        judged.append(chooser._due[2])
    assert judged.index(True) == 12 and judged.count(True) == 1  # agreed on after its twelfth step, not before
    monkeypatch.undo()
    # judged by its own twelve steps: 8% faster, beyond the scaled margin (7.5%), within the unscaled one (15%)
    chooser._judge(torch.tensor([trial.before, 0.0092, trial.spread], dtype=torch.float64), start + 13)
    assert chooser.decisions[-1].event == "kept" and chooser.decisions[-1].margin == pytest.approx(0.075)
    assert chooser.choice[key].name == "onebit"


def test_auto_compressor_kept_against_another_compressor_is_then_checked_against_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a changing network: onebit ran through a slow stretch; on the fast link again fp16 is priced cheaper and
    # beats onebit's steps, but none's steps are faster still. The kept fp16 met only onebit: the next decision
    # puts none on trial (priced within UNSURE of fp16), and none stays.
    from gradwire.exchange.chooser import AutoChooser, _fitted

    monkeypatch.setattr(chooser_module, "CHECK_SHARE", 1.0)  # the checks' budget apart: its own test

    chooser, key = _chooser("auto:fp16/onebit", 1 << 20, 12, 10)
    assert isinstance(chooser, AutoChooser)
    chooser.choice = {key: next(c for c in chooser.candidates if c.name == "onebit")}
    chooser._verified = True
    chooser._periods = [(s, ("onebit",), 0.030, s != 10) for s in range(3, 12)]
    busbytes = 4e6
    # 8 Gbit/s of bus bandwidth: fp16 priced 3.6 ms, none 5.2 ms (within 2x), onebit 10 ms of coding
    fast = torch.tensor([1e-3, 1e-3 + 1e-9 * busbytes, busbytes, 1.0, 0.03, 0.0, 5e-4, 1e-2], dtype=torch.float64)
    _probed_before(chooser, _fitted(fast))
    chooser._decide(fast, [key], 11, 2)
    assert chooser._trial is not None and chooser.choice[key].name == "fp16"
    chooser._judge(torch.tensor([0.030, 0.020, 0.0], dtype=torch.float64), 16)
    assert chooser.choice[key].name == "fp16" and not chooser._verified
    chooser._step, chooser._last_probe = 22, 20
    chooser._periods += [(s, ("fp16",), 0.020, s != 20) for s in range(13, 22)]
    chooser._decide(fast, [key], 21, 2)
    assert chooser._trial is not None and chooser.choice.get(key, chooser.none).name == "none"
    chooser._judge(torch.tensor([0.020, 0.015, 0.0], dtype=torch.float64), 26)
    assert chooser.choice.get(key, chooser.none).name == "none" and chooser._verified
    chooser._decide(fast, [key], 31, 2)
    assert chooser._trial is None  # checked: none stays
    assert set(chooser._rejected) == {("onebit",), ("fp16",)}  # each lost a trial on this link: not tried again


@pytest.mark.parametrize("spec, cpu, runner, after, stays", [
    ("auto:onebit", [6e-3], "none", 0.085, "none"),
    ("auto:fp16/onebit", [1e-4, 1e-3], "fp16", 0.090, "onebit"),
], ids=["against-none-no-margin", "against-fp16-margin"])
def test_auto_check_of_a_compressor_taken_as_priced_has_no_margin_only_against_none(
        monkeypatch: pytest.MonkeyPatch, spec: str, cpu: list[float], runner: str, after: float, stays: str) -> None:
    # a first choice of onebit on a link measured too slow: its steps swing by 12% (the noise margin would be
    # 18%). Checked against none (priced within UNSURE of it), the contest is fair: none's steps 15% faster stay.
    # Checked against fp16 (cpu 0.1 ms, onebit's 1 ms: none priced 9 ms, beyond UNSURE of onebit's 3 ms, fp16
    # 5.1 ms within it), a compressor the price ranks behind, the margin holds: fp16's 10% faster steps revert.
    from gradwire.exchange.chooser import AutoChooser, _against_none, _fitted

    monkeypatch.setattr(chooser_module, "CHECK_SHARE", 1.0)  # the checks' budget apart: its own test

    chooser, key = _chooser(spec, 1 << 20, 2, 1)
    assert isinstance(chooser, AutoChooser)
    busbytes = 4e6
    slow = torch.tensor([1e-3, 1e-3 + 1e-7 * busbytes, busbytes, 1.0, 0.1, 0.0, *cpu], dtype=torch.float64)
    chooser._decide(slow, [key], 2, 2)
    assert chooser.choice[key].name == "onebit" and chooser._trial is None and not chooser._verified
    noisy = [0.100, 0.088, 0.112, 0.100, 0.088, 0.112, 0.100, 0.088, 0.112]
    chooser._periods = [(3 + i, ("onebit",), t, True) for i, t in enumerate(noisy)]
    chooser._step, chooser._last_probe = 13, 11
    near = torch.tensor([1e-3, 1e-3 + 2e-9 * busbytes, busbytes, 1.0, 0.1, 0.0, *cpu], dtype=torch.float64)
    _probed_before(chooser, _fitted(near))
    chooser._decide(near, [key], 12, 2)
    assert chooser._trial is not None and chooser.choice.get(key, chooser.none).name == runner
    assert chooser._trial.check is (runner == "none") and chooser._trial.spread == pytest.approx(0.12)
    chooser._judge(torch.tensor([0.100, after, chooser._trial.spread], dtype=torch.float64), 17)
    assert chooser.choice.get(key, chooser.none).name == stays
    assert chooser.decisions[-1].event == ("kept" if stays == runner else "reverted")
    assert _against_none(("onebit", "fp16"), ("none", "fp16")) and not _against_none(("onebit",), ("fp16",))
    assert not _against_none(("onebit", "none"), ("none", "fp16")) and not _against_none(("none",), ("none",))


def test_auto_on_the_simulated_backend_follows_the_models_condition_and_recalls_a_condition_met_before() -> None:
    # the agreed numbers end with the simulated backend's (alpha, beta, seconds to the next change): a probe that
    # reads the link differently on the same condition moves nothing; a new condition starts a fresh estimate and
    # a probe comes right after the next change; back on a condition met before, its standing choice returns
    # at once, without a trial
    from gradwire.exchange.chooser import AutoChooser, _fitted

    chooser, key = _chooser("auto:onebit", 1 << 20, 9, 7)
    assert isinstance(chooser, AutoChooser)
    chooser._periods = [(s, ("none",), 0.060, s != 7) for s in range(2, 9)]
    busbytes = 4e6

    def agreed(beta: float, model_beta: float, change: float) -> torch.Tensor:
        return torch.tensor([1e-3, 1e-3 + beta * busbytes, busbytes, 1.0, 0.05, 0.0, 1e-2, 1e-3, model_beta, change],
                            dtype=torch.float64)

    fast = agreed(1e-9, 1e-9, 0.5)  # 8 Gbit/s: none (5 ms) stays, onebit codes for 10 ms; a change in 0.5 s
    _probed_before(chooser, _fitted(fast))
    chooser._condition = (1e-3, 1e-9)
    chooser._decide(fast, [key], 8, 2)
    assert chooser.choice.get(key, chooser.none).name == "none" and chooser._conditions[(1e-3, 1e-9)][0] == {}
    assert chooser._next_probe == 9 + 10 + 1  # 0.5 s of 0.05 s steps from step 9, the first step after it
    noisy = agreed(1e-7, 1e-9, 3.0)  # the probe reads 100x slower, the model's condition is the same
    chooser._decide(noisy, [key], 18, 2)
    assert chooser._link_since == 0  # not moved; the estimate is the median of the probes: this one is left out
    assert chooser.link.beta == pytest.approx(1e-9) and chooser._trial is None
    chooser._step, chooser._last_probe = 91, 90
    chooser._periods += [(s, ("none",), 0.060, s != 90) for s in range(80, 91)]
    drop = agreed(1e-7, 1e-7, 4.0)  # the model dropped to 1/100
    chooser._decide(drop, [key], 91, 2)
    assert chooser.link.beta == pytest.approx(1e-7) and chooser._link_since == 91  # afresh, not averaged
    assert chooser._trial is None and chooser.choice.get(key, chooser.none).name == "none"  # waits for steps on it
    chooser._step, chooser._last_probe = 96, 95
    chooser._periods += [(s, ("none",), 0.400, s != 95) for s in range(91, 96)]
    chooser._decide(drop, [key], 96, 2)
    assert chooser._trial is not None and chooser.choice[key].name == "onebit"
    chooser._judge(torch.tensor([0.400, 0.060, 0.0], dtype=torch.float64), 100)
    assert chooser.choice[key].name == "onebit" and chooser._conditions[(1e-3, 1e-7)][0][key].name == "onebit"
    chooser._step, chooser._last_probe = 181, 180
    chooser._decide(fast, [key], 181, 2)  # back on the fast condition: none at once
    assert chooser.choice.get(key, chooser.none).name == "none" and chooser.decisions[-1].event == "recalled"
    assert chooser._trial is None and chooser.link.beta == pytest.approx(1e-9)  # the estimate kept there, this probe
    chooser._step, chooser._last_probe = 261, 260
    chooser._decide(drop, [key], 261, 2)
    assert chooser.choice[key].name == "onebit" and chooser.decisions[-1].event == "recalled"
    assert "switch(es)" in chooser.describe()


def test_auto_proposes_the_next_cheapest_once_the_cheapest_lost_and_a_loser_waits_for_another_condition() -> None:
    # onebit priced cheapest, fp16 next: onebit loses its trial, the next decision tries fp16 (not none for ever);
    # on the simulated backend a loser is not retried while the model's condition stays, however a noisy probe
    # moves the estimate
    from gradwire.exchange.chooser import TRIAL_STEPS, AutoChooser, Decision, _fitted

    chooser, key = _chooser("auto:fp16/onebit", 1 << 20, 9, 7)
    assert isinstance(chooser, AutoChooser)
    chooser._periods = [(s, ("none",), 0.400, s != 7) for s in range(2, 9)]
    busbytes = 4e6

    def agreed(beta: float) -> torch.Tensor:  # cpu: none 0, fp16 1 ms, onebit 0.1 ms; the model: 1 Gbit/s, steady
        return torch.tensor([1e-3, 1e-3 + beta * busbytes, busbytes, 1.0, 0.05, 0.0, 1e-3, 1e-4, 1e-3, 1e-7, 4.0],
                            dtype=torch.float64)

    slow = agreed(1e-7)
    chooser.link, chooser._condition, chooser._verified = _fitted(slow), (1e-3, 1e-7), True
    chooser.decisions.append(Decision(2, {str(key): "none"}, 1e-3, 1.0, 0.0))  # past the run's first decision
    chooser._decide(slow, [key], 8, 2)
    assert chooser._trial is not None and chooser.choice[key].name == "onebit"
    chooser._judge(torch.tensor([0.400, 0.420, 0.0], dtype=torch.float64), 9 + TRIAL_STEPS + 1)
    assert chooser.choice.get(key, chooser.none).name == "none"
    chooser._step, chooser._last_probe = 21, 20
    chooser._periods += [(s, ("none",), 0.400, s != 20) for s in range(14, 21)]
    chooser._decide(agreed(2e-7), [key], 21, 2)  # the estimate moves 50%, the model's condition does not
    assert chooser._trial is not None and chooser.choice[key].name == "fp16"  # the next-cheapest, not onebit again


@pytest.mark.parametrize("trial_s, retried", [(0.420, True), (0.400 * 1.29, True), (0.400 * 1.31, False),
                                              (0.800, False)], ids=["near", "29pct", "31pct", "twice"])
def test_auto_on_the_simulated_backend_retries_a_near_loser_when_its_condition_comes_back(
        trial_s: float, retried: bool) -> None:
    # a trial's verdict holds for one stretch of the model's condition: the same drop, seen again later, tries
    # the candidate that lost by less than DECISIVE_LOSS (its loss may have been the host's noise), not one that
    # lost by more; within the stretch neither is retried
    from gradwire.exchange.chooser import DECISIVE_LOSS, TRIAL_STEPS, AutoChooser, Decision, _fitted

    assert DECISIVE_LOSS == pytest.approx(0.3)

    chooser, key = _chooser("auto:onebit", 1 << 20, 9, 7)
    assert isinstance(chooser, AutoChooser)
    chooser._periods = [(s, ("none",), 0.400, s != 7) for s in range(2, 9)]
    busbytes = 4e6

    def agreed(model_beta: float) -> torch.Tensor:
        return torch.tensor([1e-3, 1e-3 + model_beta * busbytes, busbytes, 1.0, 0.05, 0.0, 1e-4, 1e-3, model_beta,
                             4.0], dtype=torch.float64)

    slow, fast = agreed(1e-7), agreed(1e-10)
    chooser.link, chooser._condition, chooser._verified = _fitted(slow), (1e-3, 1e-7), True
    chooser.decisions.append(Decision(2, {str(key): "none"}, 1e-3, 1.0, 0.0))
    chooser._decide(slow, [key], 8, 2)
    assert chooser._trial is not None and chooser.choice[key].name == "onebit"
    chooser._judge(torch.tensor([0.400, trial_s, 0.0], dtype=torch.float64), 9 + TRIAL_STEPS + 1)
    chooser._step, chooser._last_probe = 21, 20
    chooser._decide(slow, [key], 21, 2)
    assert chooser._trial is None and chooser.choice.get(key, chooser.none).name == "none"  # not in this stretch
    chooser._step, chooser._last_probe = 101, 100
    chooser._decide(fast, [key], 101, 2)  # the link back: none stands there
    chooser._step, chooser._last_probe = 181, 180
    chooser._periods += [(s, ("none",), 0.400, s != 180) for s in range(170, 185)]
    chooser._decide(slow, [key], 181, 2)  # the drop again: none is recalled (it stood), then onebit is retried
    chooser._step, chooser._last_probe = 191, 190
    chooser._decide(slow, [key], 191, 2)
    assert (chooser._trial is not None) is retried
    assert chooser.choice.get(key, chooser.none).name == ("onebit" if retried else "none")


def test_auto_on_the_simulated_backend_probes_only_alpha_the_model_states_the_bandwidth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # where the group states its modelled link (network_now), the probe sends its three one-element all_reduces
    # only: alpha is the larger of theirs and the model's (an op there also waits for the inner backend), the
    # bandwidth is the model's. In an outage (inf) the whole probe is sent.
    from gradwire.exchange.futures import Sequencer

    chooser, key = _chooser("auto:onebit", 1 << 20, 9, 7)
    assert isinstance(chooser, chooser_module.AutoChooser)
    sent: list[int] = []
    real_all_reduce = dist.all_reduce

    def counted(tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(tensor.numel())
        return real_all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(chooser_module.dist, "all_reduce", counted)
    monkeypatch.setattr(chooser_module.dist, "get_world_size", lambda group=None: 2)  # priced as two ranks
    for model_alpha in (1e-9, 10.0):  # below what the small all_reduces take here, and far above it
        sent.clear()
        monkeypatch.setattr(chooser_module, "_network_now", lambda group, a=model_alpha: (a, 1e-8, 5.0))
        chooser._probe([key], Sequencer(), None)
        assert chooser._probe_future is not None
        chooser._probe_future.wait()
        assert sent == [1, 1, 1]
        small, large, busbytes = chooser._probed
        assert (small > 1e-9) if model_alpha < 1 else (small == 10.0)
        assert busbytes > 0 and large == pytest.approx(small + 1e-8 * busbytes)
        assert chooser_module._fitted(torch.tensor(chooser._probed)).beta == pytest.approx(1e-8)
    sent.clear()
    monkeypatch.setattr(chooser_module, "_network_now", lambda group: (float("inf"), float("inf"), 2.0))
    chooser._probe([key], Sequencer(), None)
    assert chooser._probe_future is not None
    chooser._probe_future.wait()
    assert sent.count(1) == 3 and len(sent) > 3 and max(sent) > 1  # the large ones too


def test_auto_prices_the_cpu_by_the_coding_and_the_exchanges_memory_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # the price of a compressed exchange's CPU: the coding per pattern (two-phase: c (1 + 1/w) + 3 d), fitted as a
    # line on two sizes, plus the memory work none does not do (fresh copies and passes, per element); on the
    # default CNN the coding alone was a fifth of what a whole onebit exchange cost beyond none's
    from gradwire.compress import AutoCompressor

    auto = get_compressor("auto:onebit")
    assert isinstance(auto, AutoCompressor)
    chooser = chooser_module.AutoChooser(auto)
    monkeypatch.setattr(chooser, "_coding", lambda compressor, n: (1e-4 + 2e-9 * n, 1e-9 * n))
    chooser._memory = 5e-9
    onebit = chooser.candidates[1]
    n = 601610
    coding = (1e-4 + 2e-9 * n) * 1.5 + 3 * 1e-9 * n
    assert chooser.cpu_seconds(onebit, n, 2) == pytest.approx(coding + 5e-9 * n)
    assert chooser.cpu_seconds(chooser.none, n, 2) == 0.0
    # measured: the copies and passes at the run's largest exchange (capped), a positive cost per element
    fresh = chooser_module.AutoChooser(auto)
    fresh._largest = 1 << 22
    per_element = fresh._memory_per_element()
    assert 0 < per_element < 1e-6 and fresh._memory == per_element
    # the coding is timed on one sample per size, drawn once for every candidate (drawing took as long as coding)
    draws = []
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda n, **kw: draws.append(n) or randn(n, **kw))
    several = chooser_module.AutoChooser(get_compressor("auto:fp16/int8/onebit"))  # type: ignore[arg-type]
    for candidate in several.candidates[1:]:
        several._cpu_line(candidate, 2)
    assert sorted(draws) == sorted(chooser_module.CPU_SIZES)


def test_the_interpreters_exit_waits_for_callbacks_still_running_on_a_backend_thread() -> None:
    # a script that exits right after its last step must not finalize while a backend thread is inside an
    # exchange's callback (it aborted ~1 run in 30 of auto_link_job.py): atexit waits for the counted ones
    import threading
    import time

    from gradwire.exchange import futures

    finished: list[float] = []
    slow = futures.counted(lambda: (time.sleep(0.3), finished.append(time.monotonic())))
    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.05)
    assert futures._running == 1
    futures._drain_at_exit()
    assert finished and futures._running == 0 and time.monotonic() >= finished[0] + futures.EXIT_MARGIN_SECONDS
    thread.join()


def test_a_checkpoint_of_another_world_size_loads_the_mean_of_the_ranks_parts_with_a_warning() -> None:
    # two "ranks" of a saved run (two states fed different gradients), loaded by a run of one rank
    key = StateKey.of("w", 3000)
    parts = []
    for seed in (1, 2):
        state = CompressionState("onebit", momentum=0.9, warmup_iters=0, min_compress_numel=0)
        for step in range(3):
            state.reduce(_g(10 * seed + step), key).wait()
            state.end_step()
        parts.append(state.local_state_dict())
    assert any(e["chunk"] is not None for e in parts[0]["error_feedback"]["buffers"])  # a served chunk's residual
    loaded = CompressionState("onebit", momentum=0.9, warmup_iters=0, min_compress_numel=0)
    with pytest.warns(RuntimeWarning, match="saved by 2 ranks and this run has 1: .* mean of the saved ranks'"):
        loaded.load_state_dict({"world": 2, "ranks": parts})
    for store in ("momentum", "error_feedback"):
        (entry,) = loaded.local_state_dict()[store]["buffers"]  # the served chunks restart
        mine = [next(e["value"] for e in p[store]["buffers"] if e["chunk"] is None) for p in parts]
        torch.testing.assert_close(entry["value"], (mine[0] + mine[1]) / 2, rtol=0, atol=1e-7)
    assert loaded.step == 3


def test_a_gathered_checkpoint_of_the_same_world_size_loads_this_ranks_part_silently() -> None:
    state = CompressionState("topk:0.1", momentum=0.9, warmup_iters=0, min_compress_numel=0)
    state.reduce(_g(0, 3000), StateKey.of("w", 3000)).wait()
    state.end_step()
    saved = state.state_dict()  # one rank, no process group: a gather of one part
    assert saved["world"] == 1 and len(saved["ranks"]) == 1
    other = CompressionState("topk:0.1", momentum=0.9, warmup_iters=0, min_compress_numel=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        other.load_state_dict(saved)
    assert torch.equal(other.local_state_dict()["momentum"]["buffers"][0]["value"],
                       saved["ranks"][0]["momentum"]["buffers"][0]["value"])


def test_auto_restricted_to_a_byte_per_element_keeps_none_fp16_int8():
    from gradwire.compress import get_compressor
    from gradwire.exchange.chooser import AutoChooser

    chooser = AutoChooser(get_compressor("auto"))
    assert chooser.restrict(8.0, "the script clips") == ["onebit"]
    assert [c.name for c in chooser.candidates] == ["none", "fp16", "int8"]
    assert chooser.restricted == ("the script clips", ["onebit"])
    assert AutoChooser(get_compressor("auto:fp16")).restrict(8.0, "x") == []
