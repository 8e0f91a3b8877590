"""Replaying what each strategy really does: its traits, PyTorch's hooks, the host's cores and collectives. Pure.

Expected times by hand; the hooks' collectives against PyTorch's own hooks run in this process with every
collective answered on the spot.
"""
import math
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from gradwire.strategies import parse_strategy
from gradwire.strategies.torch_exchanges import TorchFP16Exchange, TorchPowerSGDExchange
from gradwire.predict import Bucket, MeasuredExchange, StepProfile, predict
from gradwire.predict.calibrate import Calibration, reference_step
from gradwire.predict.codec import CodecCost, HookCost, Line
from gradwire.predict.describe import describe_model
from gradwire.predict.host import Floors, Host
from gradwire.predict.plans import bucket_exchange, plan_for
from gradwire.predict.simulate import Epochs, Exchange, Kind, Phase, Plan, advance, simulate

#: the digits CNN's parameters, in bucket order (DDP's rebuilt bucket: the head's first)
CNN_WIDE = ((10,), (10, 256), (256,), (256, 2048), (128,), (128, 64, 3, 3), (64,), (64, 1, 3, 3))
CNN_NUMEL = sum(math.prod(s) for s in CNN_WIDE)


def fixed(seconds):
    return lambda op, nbytes, start: (seconds, 0)


# -- the training thread around background work ------------------------------------------------------------
def test_work_runs_in_the_gaps_the_background_leaves():
    assert advance(0.0, 10.0, []) == 10.0
    assert advance(0.0, 10.0, [(2.0, 5.0)]) == 13.0
    assert advance(0.0, 10.0, [(2.0, 5.0), (4.0, 6.0)]) == 14.0  # overlapping intervals count once
    assert advance(3.0, 10.0, [(2.0, 5.0)]) == 15.0  # only the part still ahead
    assert advance(0.0, 10.0, [(11.0, 20.0), (-5.0, -1.0)]) == 10.0  # after the end, before the start
    assert advance(0.0, 10.0, [(9.0, 12.0), (12.5, 13.0)]) == 13.5  # the work pushed into the next one


def _delayed(floor=0.0, decode=0.0):
    return Plan(Kind.NEXT_STEP, (Exchange(0.0, (Phase("all_reduce", 1000, floor=floor),), decode),))


def test_on_busy_cores_an_overlapped_real_collective_costs_the_next_step_its_time():
    # forward 10, backward 20 (bucket ready at 5 ms), the network 1 ms: the real collective of 4 ms runs
    # during backward; with a core to spare it is free, on busy cores the step grows by it
    free = simulate(0.010, 0.020, 0.0, [0.005], _delayed(floor=0.004), fixed(0.001))
    busy = simulate(0.010, 0.020, 0.0, [0.005], _delayed(floor=0.004), fixed(0.001), busy_cores=True)
    assert free.step_seconds == pytest.approx(0.030)
    assert busy.step_seconds == pytest.approx(0.034)
    # a callback's decode is background work too
    assert simulate(0.010, 0.020, 0.0, [0.005], _delayed(decode=0.002), fixed(0.001),
                    busy_cores=True).step_seconds == pytest.approx(0.032)


def test_a_real_collective_holds_the_core_for_the_cpu_it_uses_not_its_wall_time():
    # 4 ms of wall, 1 ms of it this rank's CPU: the next step loses 1 ms
    plan = Plan(Kind.NEXT_STEP, (Exchange(0.0, (Phase("all_reduce", 1000, floor=0.004, held=0.001),)),))
    assert simulate(0.010, 0.020, 0.0, [0.005], plan, fixed(0.001),
                    busy_cores=True).step_seconds == pytest.approx(0.031)
    host = Host(Floors({"all_reduce": [(1, 0.004)]}), Floors({"all_reduce": [(1, 0.001)]}))
    (phase,) = bucket_exchange(1000, 4, None, 2, host=host).phases
    assert (phase.floor, phase.held) == (0.004, 0.001)


def test_a_replay_over_a_long_horizon_drops_the_background_no_later_work_can_meet(monkeypatch):
    # a changing price, overlapped exchanges on busy cores, 1500 steps and more: the same steps as a replay that keeps
    # every interval ever held (the old quadratic one), and the list of held intervals stays short
    import gradwire.predict.simulate as sim

    def changing(op, nbytes, start):
        return (0.001 if int(start / 0.5) % 2 == 0 else 0.008), 0

    plan = Plan(Kind.NEXT_STEP, (Exchange(0.0005, (Phase("all_reduce", 1000, floor=0.002, held=0.001),), 0.0005),
                                 Exchange(0.0, (Phase("all_reduce", 1000, floor=0.002),), 0.0002)))
    seen = []
    kept = sim.advance
    monkeypatch.setattr(sim, "advance", lambda t, s, held: seen.append(len(held)) or kept(t, s, held))
    pruned = simulate(0.002, 0.004, 0.0005, [0.002, 0.004], plan, changing, horizon=20.0, busy_cores=True)
    assert len(pruned.durations) > 1500 and max(seen) < 20

    def every_interval(self, t, seconds):
        return t + max(0.0, seconds) if seconds <= 0 else kept(t, seconds, self.background)

    monkeypatch.setattr(sim._State, "compute", every_interval)
    assert simulate(0.002, 0.004, 0.0005, [0.002, 0.004], plan, changing, horizon=20.0,
                    busy_cores=True).durations == pruned.durations


# -- the run's shape around its steps (epochs, partial batches, evaluations) ---------------------------------
def _drop_every(period, slow=0.008, fast=0.001):
    """A price on a network slow in the second half of every ``period``."""
    return lambda op, nbytes, start: (slow if (start % period) >= period / 2 else fast, 0)


def test_a_replay_of_epochs_without_pauses_or_partial_batches_is_the_plain_replay():
    plan = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 1000),)),))
    plain = simulate(0.002, 0.004, 0.001, [0.004], plan, _drop_every(0.05), horizon=2.0)
    shaped = simulate(0.002, 0.004, 0.001, [0.004], plan, _drop_every(0.05), horizon=2.0, epochs=Epochs(7))
    assert shaped.durations == plain.durations and shaped.step_seconds == plain.step_seconds


def test_steps_that_lock_to_the_period_meet_one_phase_of_it_epoch_after_epoch():
    # 2 steps of 10 ms (exchange 1 ms) and a 30 ms evaluation: an epoch lasts the 50 ms period, so every epoch's
    # steps meet the fast half; back to back, the steps drift through the period and half of them meet the slow one
    plan = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 1000),)),))
    shape = Epochs(2, pause=0.030)
    locked = simulate(0.003, 0.006, 0.0, [0.006], plan, _drop_every(0.050), horizon=5.0, epochs=shape)
    assert set(round(d, 6) for d in locked.durations) == {0.010}
    drifting = simulate(0.003, 0.006, 0.0, [0.006], plan, _drop_every(0.050), horizon=5.0)
    assert max(drifting.durations) == pytest.approx(0.017) and drifting.step_seconds > 0.011
    # the step's seconds leave the evaluation out, as a training loop times its steps
    assert locked.step_seconds == pytest.approx(0.010)


def test_a_partial_last_batch_scales_the_epochs_last_compute_and_a_delayed_exchange_runs_through_the_pause():
    plan = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 1000),)),))
    shaped = simulate(0.002, 0.004, 0.0, [0.004], plan, fixed(0.001), horizon=1.0, epochs=Epochs(3, last=0.5))
    assert shaped.durations[:3] == pytest.approx((0.007, 0.007, 0.004))  # the last: 3 ms of compute + 1 ms
    # delayed: the epoch's last exchange (10 ms, issued as its step ends) runs on through the 2 ms evaluation,
    # so the next epoch's first step waits 2 ms less for it than a step right after
    def first_of_epoch(pause):
        return simulate(0.002, 0.004, 0.0, [0.004], _delayed(), fixed(0.010), horizon=1.0,
                        epochs=Epochs(2, pause=pause)).durations[2]

    assert first_of_epoch(0.002) == pytest.approx(0.008) and first_of_epoch(0.0) == pytest.approx(0.010)


def test_the_fetch_between_two_steps_moves_the_next_ones_on_the_schedule_but_is_in_no_steps_seconds():
    # steps of 10 ms, a 5 ms fetch between two of an epoch's steps and a 20 ms evaluation after its last one:
    # epochs of 45 ms: on a link slow in the second half of every 100 ms, the second epoch's exchanges (at 54 and
    # 76 ms) meet the slow half; without the fetch the first of them leaves at 49 ms, still in the fast one
    plan = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 1000),)),))
    shape = Epochs(2, pause=0.020, gap=0.005)
    run = simulate(0.003, 0.006, 0.0, [0.006], plan, _drop_every(0.100), horizon=0.9, epochs=shape)
    assert run.durations[:4] == pytest.approx((0.010, 0.010, 0.017, 0.017))
    tight = simulate(0.003, 0.006, 0.0, [0.006], plan, _drop_every(0.100), horizon=0.9,
                     epochs=Epochs(2, pause=0.020))
    assert tight.durations[:4] == pytest.approx((0.010, 0.010, 0.010, 0.017))


def test_a_replay_of_a_run_takes_its_warm_up_steps_first_and_meets_the_schedule_after_them():
    # 3 warm-up steps on a 4 ms all_reduce, then 1 ms: the steps after them start where the run's did
    warm = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 4000),)),))
    plan = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 1000),)),))

    def price(op, nbytes, start):
        return (nbytes / 1e6, 0)

    run = simulate(0.002, 0.004, 0.0, [0.004], plan, price, horizon=0.2, epochs=Epochs(5), first=(warm, 3))
    assert run.durations[:5] == pytest.approx((0.010, 0.010, 0.010, 0.007, 0.007))
    # a replay that starts at the run's step 2 has one warm-up step left, and its epochs end where the run's do
    later = simulate(0.002, 0.004, 0.0, [0.004], plan, price, horizon=0.2, epochs=Epochs(5, last=0.5, offset=2),
                     first=(warm, 1))
    assert later.durations[:4] == pytest.approx((0.010, 0.007, 0.004, 0.007))
    # without a run's shape (a steady state or a long mean) the warm-up is the caller's (``predict(steps=)``)
    plain = simulate(0.002, 0.004, 0.0, [0.004], plan, price, horizon=0.2, first=(warm, 3))
    assert plain.durations[0] == pytest.approx(0.007)


def test_a_run_shape_says_what_is_wrong_with_it():
    with pytest.raises(ValueError, match="Epochs.steps must be a whole number of steps >= 1, got 0"):
        Epochs(0)
    with pytest.raises(ValueError, match=r"pause, gap and start must be >= 0 s and last a share in \(0, 1\]"):
        Epochs(3, last=1.5)
    with pytest.raises(ValueError, match=r"got 0.0, -0.001, 0.0, 1.0"):
        Epochs(3, gap=-0.001)
    with pytest.raises(ValueError, match="Epochs.offset must be a whole number of steps >= 0, got -1"):
        Epochs(3, offset=-1)


def test_on_busy_cores_a_blocking_exchange_after_backward_costs_only_its_own_time():
    plan = Plan(Kind.BLOCKING, (Exchange(0.0, (Phase("all_reduce", 1000, floor=0.004),)),))
    for busy in (False, True):
        assert simulate(0.010, 0.020, 0.001, [0.020], plan, fixed(0.001),
                        busy_cores=busy).step_seconds == pytest.approx(0.035)


def test_one_bucket_at_a_time_starts_each_exchange_when_the_last_one_completed():
    ex = Exchange(0.002, (Phase("all_reduce", 1000),), 0.001)
    parallel = Plan(Kind.BLOCKING, (ex, ex))
    serial = Plan(Kind.BLOCKING, (ex, ex), serial=True)
    # buckets at 5 and 6 ms of a 20 ms backward, 10 ms on the link each
    # in turn through the sequencer: hooks at 5 and 8 (after the first hook), on the link 7-17 and 17-27
    assert simulate(0.0, 0.020, 0.0, [0.005, 0.006], parallel, fixed(0.010)).step_seconds == pytest.approx(0.028)
    # one at a time: the second hook waits for the first exchange (done at 18) and runs on the callback thread,
    # not on backward (which ends at 22): 18 + 2 = 20, on the link 20-30, decoded 31
    assert simulate(0.0, 0.020, 0.0, [0.005, 0.006], serial, fixed(0.010)).step_seconds == pytest.approx(0.031)


def test_on_the_simulated_clock_a_chained_hook_takes_nothing_from_backward():
    """``Plan.chained``: each hook runs off the training thread, after the previous exchange completed. Buckets
    at 5 and 6 ms, hooks of 2 ms, 1 ms on the link, 1 ms of decode."""
    ex = Exchange(0.002, (Phase("all_reduce", 1000),), 0.001)
    serial = Plan(Kind.BLOCKING, (ex, ex), serial=True)
    chained = Plan(Kind.BLOCKING, (ex, ex), serial=True, chained=True)
    # a 20 ms backward, in real time: the first hook on backward (5-7), the second after the first exchange (9-11)
    assert simulate(0.0, 0.020, 0.0, [0.005, 0.006], serial, fixed(0.001)).step_seconds == pytest.approx(0.022)
    # on the clock: the hooks beside backward (5-7, then 9-11 after the first exchange): backward's 20 ms
    assert simulate(0.0, 0.020, 0.0, [0.005, 0.006], chained, fixed(0.001)).step_seconds == pytest.approx(0.020)
    # a 10 ms backward: the second exchange ends the step, gated by the first (hook 9-11, link 11-12, decode
    # 12-13), not by the first hook alone (hook 7-9, done at 11)
    assert simulate(0.0, 0.010, 0.0, [0.005, 0.006], chained, fixed(0.001)).step_seconds == pytest.approx(0.013)
    three = Plan(Kind.BLOCKING, (ex, ex, ex), serial=True, chained=True)  # each 4 ms after the one before
    assert simulate(0.0, 0.010, 0.0, [0.005, 0.006, 0.007], three, fixed(0.001)).step_seconds == pytest.approx(0.017)


def test_powersgd_on_the_simulated_clock_is_planned_by_the_clock_s_rules():
    """A profile recorded on the clock: the hook's work is its ``lead`` (the hook reads 0 there). The same
    profile in real time keeps the hook on the training thread."""
    measured = MeasuredExchange(("all_reduce",) * 3, 0.0, (0.0,) * 3, (0.0008, 0.0006), 0.0005, lead=0.003)
    prof = StepProfile("cnn", 0.002, 0.004, 0.001, (Bucket(4 * CNN_NUMEL, 0.004, shapes=CNN_WIDE),), world=2,
                       strategy="torch-powersgd:4", exchanges=(measured,), source="measured",
                       net="loopback,clock=sim,device=a100")
    plan = plan_for("torch-powersgd:4", prof, 2)
    (ex,) = plan.exchanges
    assert plan.serial and plan.chained
    assert ex.encode == pytest.approx(0.003)
    assert [p.before for p in ex.phases] == pytest.approx([0.0, 0.0008, 0.0006]) and ex.decode == pytest.approx(0.0005)
    real = plan_for("torch-powersgd:4", replace(prof, net="loopback"), 2)
    assert real.serial and not real.chained and real.exchanges[0].encode == 0.0


# -- the host's real collectives --------------------------------------------------------------------------
def test_floors_are_linear_between_the_sizes_measured():
    f = Floors({"all_reduce": [(1000, 0.001), (3000, 0.003), (5000, 0.004)]})
    assert f("all_reduce", 10) == 0.001  # below the smallest: its latency
    assert f("all_reduce", 2000) == pytest.approx(0.002)
    assert f("all_reduce", 4000) == pytest.approx(0.0035)
    assert f("all_reduce", 7000) == pytest.approx(0.005)  # on along the last segment
    assert f("all_gather", 7000) == 0.0  # an op not measured
    assert f.scaled(2.0)("all_reduce", 2000) == pytest.approx(0.004)
    assert Floors.from_dict(f.as_dict()) == f


def test_a_host_floors_every_collective_of_an_exchange():
    host = Host(Floors({"all_to_all": [(1, 0.002)], "all_gather": [(1, 0.003)]}))
    ex = bucket_exchange(1 << 20, 4, "onebit", 2, host=host)
    assert [(p.op, p.floor) for p in ex.phases] == [("all_to_all", 0.002), ("all_gather", 0.003)]


# -- what the strategies say of themselves ----------------------------------------------------------------
def test_each_strategy_says_its_codec_bucket_size_and_warm_up():
    traits = {s: parse_strategy(s).exchange for s in ("sync", "onebit", "delayed", "onebit+delayed", "torch-fp16",
                                                         "torch-powersgd:4", "torch-powersgd:2:start=5")}
    assert (traits["sync"].codec, traits["sync"].bucket_cap_mb, traits["sync"].warmup_steps) == (None, 25.0, 0)
    assert (traits["onebit"].codec, traits["onebit"].warmup_steps) == ("onebit", 1)
    assert (traits["delayed"].bucket_cap_mb, traits["delayed"].copies) == (0.05, 2)
    assert (traits["onebit+delayed"].codec, traits["onebit+delayed"].bucket_cap_mb) == ("onebit", 25.0)
    assert traits["torch-fp16"].codec == TorchFP16Exchange() and traits["torch-fp16"].warmup_steps == 0
    psgd = traits["torch-powersgd:4"]
    assert (psgd.codec, psgd.warmup_steps, psgd.one_bucket_at_a_time) == (TorchPowerSGDExchange(4), 10, True)
    assert traits["torch-powersgd:2:start=5"].warmup_steps == 5


def test_an_explicit_bucket_cap_makes_the_digits_cnn_one_bucket():
    one = describe_model("cnn-wide", 10.0, 25.0, input_shape=(1, 8, 8))
    assert [b.nbytes for b in one.buckets] == [4 * CNN_NUMEL] and one.buckets[0].shapes == CNN_WIDE
    # delayed's small buckets: the head's weight alone first, ready early in backward (FLOPs spread)
    small = describe_model("cnn-wide", 10.0, 0.05, input_shape=(1, 8, 8))
    assert small.buckets[0].nbytes == 4 * (10 + 2560 + 256 + 256 * 2048) and small.buckets[0].ready < 0.002


def test_a_bucket_s_shapes_must_hold_its_bytes():
    with pytest.raises(ValueError, match="shapes"):
        Bucket(400, 0.0, 4, ((10, 11),))


# -- PyTorch's hooks, as they run ---------------------------------------------------------------------------
class _Group:
    def __init__(self, world):
        self.world = world

    def size(self):
        return self.world


class _Bucket:
    """What PyTorch's hooks read of a DDP GradBucket."""

    def __init__(self, shapes):
        self.flat = torch.randn(sum(math.prod(s) for s in shapes))
        self.views, at = [], 0
        for s in shapes:
            self.views.append(self.flat[at:at + math.prod(s)].view(s))
            at += math.prod(s)

    def buffer(self):
        return self.flat

    def gradients(self):
        return self.views

    def index(self):
        return 0

    def is_last(self):
        return True


@pytest.fixture
def waited():
    """Per all_reduce of :func:`issued`, in order: whether the hook called ``wait()`` on its future."""
    return []


@pytest.fixture
def issued(monkeypatch, waited):
    """Every all_reduce PyTorch's hooks issue, answered on the spot: its bytes, in order."""
    sizes = []

    class Waited(torch.futures.Future):
        def __init__(self, at):
            super().__init__()
            self.at = at

        def wait(self):
            waited[self.at] = True
            return super().wait()

    class Work:
        def __init__(self, tensor, at):
            self.tensor = tensor
            self.at = at

        def get_future(self):
            fut = Waited(self.at)
            fut.set_result([self.tensor])
            return fut

    def all_reduce(tensor, group=None, async_op=False):
        sizes.append(tensor.numel() * tensor.element_size())
        waited.append(False)
        return Work(tensor, len(sizes) - 1)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return sizes


def test_the_fp16_model_issues_what_pytorch_s_hook_issues(issued, waited):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    fp16_compress_hook(_Group(2), _Bucket(CNN_WIDE)).wait()
    assert [("all_reduce", n) for n in issued] == TorchFP16Exchange().collectives(CNN_NUMEL, CNN_WIDE, 2)
    assert waited == [False]  # the decode is chained on the all_reduce's future


@pytest.mark.parametrize("rank", [1, 4])
def test_the_powersgd_model_issues_what_pytorch_s_hook_issues(issued, waited, rank):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    state = ps.PowerSGDState(process_group=_Group(2), matrix_approximation_rank=rank, start_powerSGD_iter=2)
    state.iter = 2  # past the warm-up: compressing
    bucket = _Bucket(CNN_WIDE)
    ps.powerSGD_hook(state, bucket).wait()
    ps.powerSGD_hook(state, bucket).wait()  # warm started: the same collectives
    model = TorchPowerSGDExchange(rank).collectives(CNN_NUMEL, CNN_WIDE, 2)
    assert [("all_reduce", n) for n in issued] == model * 2
    # the P and Q all_reduces are waited for inside the callbacks that issue them (the clock sees that wait:
    # tests/backend/test_simclock.py); the first is chained on
    assert waited == [False, True, True] * 2
    if rank == 4:  # by hand: biases and the first conv (64 x 9: 584 > 576) go plain; P and Q of the others
        assert model == [("all_reduce", 4 * (10 + 256 + 128 + 64 + 576)), ("all_reduce", 4 * 4 * (10 + 256 + 128)),
                         ("all_reduce", 4 * 4 * (256 + 2048 + 576))]


def test_the_powersgd_stages_run_without_a_process_group():
    model = TorchPowerSGDExchange(4)
    stages = model.stages(CNN_NUMEL, CNN_WIDE, 2, "cpu")
    assert len(stages) == len(model.collectives(CNN_NUMEL, CNN_WIDE, 2)) + 1
    for stage in stages * 2:
        stage()
    # unknown shapes: one near-square matrix, as gradwire's powersgd views a flat bucket
    assert model.collectives(1_000_000, (), 2) == [("all_reduce", 0), ("all_reduce", 16_000), ("all_reduce", 16_000)]


def test_a_hook_s_exchange_takes_its_stages_between_its_collectives():
    model = TorchPowerSGDExchange(4)
    cost = HookCost(model, measured={(CNN_NUMEL, CNN_WIDE, 2): (0.004, 0.001, 0.002, 0.003)}, scale=0.5)
    ex = bucket_exchange(CNN_NUMEL, 4, model, 2, cost, CNN_WIDE)
    assert (ex.encode, [p.before for p in ex.phases], ex.decode) == (0.002, [0.0, 0.0005, 0.001], 0.0015)
    assert [p.nbytes for p in ex.phases] == [n for _, n in model.collectives(CNN_NUMEL, CNN_WIDE, 2)]


# -- a training: its warm-up, and the strategy's own passes -----------------------------------------------
def _cnn(cap):
    return describe_model("cnn-wide", 20.0, cap, input_shape=(1, 8, 8))


def test_a_training_s_mean_step_counts_its_warm_up_steps():
    prof = _cnn(25.0)
    net = "bandwidth=500mbit,latency=100us"
    steady = predict(prof, "torch-powersgd:4", net, 2).step_seconds
    plain = predict(prof, "sync", net, 2).step_seconds
    run = predict(prof, "torch-powersgd:4", net, 2, steps=120).step_seconds
    assert run == pytest.approx((10 * plain + 110 * steady) / 120)
    assert predict(prof, "sync", net, 2, steps=120).step_seconds == pytest.approx(plain)


def test_delayed_s_own_passes_are_priced_by_the_host():
    prof = _cnn(0.05)
    host = Host(copy=Line(0.0, 1e-9))
    plan = plan_for("delayed", prof, 2, host=host)
    assert [e.encode for e in plan.exchanges] == pytest.approx([2 * 1e-9 * b.numel for b in prof.buckets])
    assert all(e.encode == 0 for e in plan_for("delayed", prof, 2).exchanges)  # no host: nothing priced


# -- the calibration's figures ----------------------------------------------------------------------------
def test_thereference_step_step_takes_each_place_of_an_epoch_at_its_median():
    # 3 epochs of 3 steps; the first is left out, one long step of the third does not count
    steps = [9.0, 9.0, 9.0, 2.0, 2.0, 1.0, 2.0, 8.0, 1.0, 2.0, 2.0, 1.0]
    assert reference_step(steps, 3) == pytest.approx(((2.0 + 2.0 + 1.0) / 3, 2.0))  # the mean step, the full one


def test_a_calibration_scales_every_cpu_figure_and_each_run_to_the_pace_asked_for():
    model = TorchFP16Exchange()
    ran = StepProfile("cnn", 0.010, 0.020, 0.002, (Bucket(4000, 0.020),), 2, "onebit",
                      (MeasuredExchange(("all_to_all", "all_gather"), 0.003, (0.001, 0.001), (0.0005,), 0.0005),),
                      source="measured", loop_seconds=0.040, net="loopback")
    cal = Calibration(2, Host(Floors({"all_reduce": [(1, 0.002)]}), Floors({"all_reduce": [(1, 0.001)]}),
                              Line(0.0, 1e-9), True), 0.030, 0.032,
                      (0.3, 0.6, 0.1), {"onebit": CodecCost(encode=Line(0.001, 0.0))},
                      {model.name: HookCost(model, measured={(10, (), 2): (0.004, 0.002)})}, {"onebit": ran})
    half = cal.scaled(0.5)
    assert half.compute == pytest.approx(0.015) and half.host.busy_cores
    assert half.host.floors("all_reduce", 1) == pytest.approx(0.001)
    assert half.host.work("all_reduce", 1) == pytest.approx(0.0005)
    assert half.cost_for("onebit").encode(10) == pytest.approx(0.0005)
    assert half.cost_for(model).stages(10, (), 2) == pytest.approx((0.002, 0.001))
    # a run at its own pace: computing 32 ms where the runs computed 16, every time in it halves
    paced = cal.profile("onebit", 0.016)
    assert paced.compute_seconds == pytest.approx(0.016) and paced.loop_seconds == pytest.approx(0.020)
    assert paced.buckets[0].ready == pytest.approx(0.010) and paced.exchanges[0].hook == pytest.approx(0.0015)
    assert paced.exchanges[0].gaps == pytest.approx((0.00025,)) and cal.profile("sync", 0.016) is None
    assert half.profile("onebit", 0.016).loop_seconds == pytest.approx(0.020)  # its own pace, however scaled
    # the dict a comparison saves gives the same calibration back (hooks by their model)
    back = Calibration.from_dict(cal.as_dict(), [model])
    assert back.as_dict() == cal.as_dict() and back.cost_for(model).stages(10, (), 2) == pytest.approx((0.004, 0.002))
    # delayed computed slower for its own overlapped exchanges on busy cores: without a blocking run beside it,
    # the reference's pace
    alone = replace(cal, profiles={"delayed": replace(ran, strategy="delayed")})
    assert alone.profile("delayed", 0.015).loop_seconds == pytest.approx(0.020)  # 15 ms where the reference took 30
    assert alone.scaled(0.5).profile("delayed", 0.015).loop_seconds == pytest.approx(0.020)
    # ... with blocking runs beside it (minutes apart, real collectives as it had), the median of theirs:
    # 24, 32 and 40 ms of compute against the reference's 30
    blocking = {name: ran.scaled(c / 0.032) for name, c in (("sync", 0.024), ("onebit", 0.032), ("torch-fp16", 0.040))}
    beside = replace(cal, profiles={**blocking, "delayed": replace(ran, strategy="delayed")})
    assert beside.profile("delayed", 0.016).loop_seconds == pytest.approx(0.020)  # 16 ms where they took 32
