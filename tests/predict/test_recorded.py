"""From recorded steps to a step profile: hooks taken out, medians, exchanges paired with buckets."""
import pytest

from gradwire.predict.recorded import exchanges_of, profile_from_steps
from gradwire.profile.steps import BucketStamp, steps, strategy_label


def _coll(op, seq, issued, completed, inner, nbytes=100, group="g"):
    return {"op": op, "group": group, "seq": seq, "nbytes": nbytes, "issued": issued, "started": issued,
            "completed": completed, "inner": inner}


def _step(scale=1.0):
    """Two buckets with a 2 ms hook each and a two-phase exchange each (times in seconds from backward's call)."""
    s = scale
    return {
        "forward": 0.010 * s, "backward": 0.030 * s, "backward_wait": 0.008 * s, "after_backward": 0.003 * s,
        "waited": 0.001 * s, "optimizer": 0.002 * s, "step": 0.053 * s,
        "buckets": [
            {"index": 0, "nbytes": 4000, "element_size": 4, "ready": 0.010 * s, "hook": 0.002 * s, "done": 0.020 * s},
            {"index": 1, "nbytes": 8000, "element_size": 4, "ready": 0.025 * s, "hook": 0.002 * s, "done": 0.036 * s},
        ],
        "collectives": [
            _coll("all_to_all", 1, 0.012 * s, 0.014 * s, 0.002 * s),
            _coll("all_gather", 2, 0.016 * s, 0.018 * s, 0.002 * s),
            _coll("all_to_all", 3, 0.027 * s, 0.030 * s, 0.004 * s),  # real op 27 -> 31
            _coll("all_gather", 4, 0.030 * s, 0.034 * s, 0.004 * s),  # real op queued behind it: 31 -> 34
            _coll("broadcast", 0, 0.001 * s, 0.002 * s, 0.001 * s, group="other"),  # not an exchange
        ],
    }


def test_hooks_are_taken_out_and_the_rest_is_medians():
    ranks = [[_step(1.0)] * 5 + [_step(5.0)], [_step(1.0), _step(2.0), _step(1.0), _step(1.0), _step(1.0)]]
    prof = profile_from_steps(ranks, "job", "onebit", skip=1)
    # steps 1 ... last but one of each rank, side by side: (1, 2), (1, 1), (1, 1); the slower rank of each: 2, 1, 1
    assert prof.world == 2 and prof.forward == pytest.approx(0.010)
    assert prof.backward == pytest.approx(0.030 - 0.004)  # the two hooks' 4 ms out
    assert [b.ready for b in prof.buckets] == pytest.approx([0.010, 0.025 - 0.002])
    # after the communication: returned at 38 ms, the last bucket done at 36: 2 ms of copy; 3 - 1 ms not waiting;
    # the optimizer's 2 ms
    assert prof.optimizer == pytest.approx(0.002 + 0.002 + 0.002)
    assert prof.loop_seconds == pytest.approx(0.053)
    first, second = prof.exchanges
    assert first.ops == ("all_to_all", "all_gather") and first.hook == pytest.approx(0.002)
    assert first.gaps == pytest.approx((0.002,)) and first.tail == pytest.approx(0.002)
    assert second.inner == pytest.approx((0.004, 0.003))  # the all_gather's real op waited 1 ms for the all_to_all's
    assert second.tail == pytest.approx(0.002)


def test_exchanges_pair_an_all_to_all_with_the_all_gather_after_it():
    ops = ["all_reduce", "all_to_all", "all_gather", "all_gather", "all_to_all", "all_reduce"]
    cut = exchanges_of([{"op": o} for o in ops])
    assert [[c["op"] for c in ex] for ex in cut] == [["all_reduce"], ["all_to_all", "all_gather"], ["all_gather"],
                                                     ["all_to_all"], ["all_reduce"]]


def test_exchanges_follow_each_bucket_s_collectives_when_the_strategy_says_them():
    ops = ["all_reduce"] * 6  # PyTorch's PowerSGD: three all_reduces per bucket, two buckets
    cut = exchanges_of([{"op": o} for o in ops], [("all_reduce",) * 3] * 2)
    assert [len(ex) for ex in cut] == [3, 3]
    # collectives that do not agree with what the strategy says: no exchange from there on
    assert exchanges_of([{"op": o} for o in ops], [("all_to_all", "all_gather")]) == []


def test_a_hook_whose_work_ran_off_the_training_thread_is_measured_as_its_lead():
    """On the simulated clock a chained hook (PyTorch's PowerSGD) reads 0 on the training thread: its
    compression is the time from its bucket's ready instant to its first collective (``lead``)."""
    step = {"forward": 0.010, "backward": 0.030, "backward_wait": 0.012, "after_backward": 0.0, "waited": 0.0,
            "optimizer": 0.002, "step": 0.054,
            "buckets": [{"index": 0, "nbytes": 4000, "element_size": 4, "ready": 0.030, "hook": 0.0, "done": 0.042}],
            "collectives": [_coll("all_reduce", 1, 0.035, 0.035, 0.0), _coll("all_reduce", 2, 0.037, 0.037, 0.0),
                            _coll("all_reduce", 3, 0.040, 0.040, 0.0)]}
    prof = profile_from_steps([[step] * 4], "job", "torch-powersgd:4", skip=1,
                              per_bucket=[("all_reduce",) * 3])
    (ex,) = prof.exchanges
    assert ex.hook == 0.0 and ex.lead == pytest.approx(0.005)
    assert ex.gaps == pytest.approx((0.002, 0.003)) and ex.tail == pytest.approx(0.002)
    assert prof.backward == pytest.approx(0.030)  # nothing of it taken out of backward


def _overlapping(origin):
    """delayed's one bucket: its all_to_all in this step's window, its all_gather in the next one's."""
    step = dict(_step(), origin=origin)
    step["buckets"] = [dict(step["buckets"][0], done=0.0125)]  # the hook hands the bucket back at once
    step["collectives"] = [_coll("all_gather", 2 * origin - 1, 0.001, 0.003, 0.002),  # the last step's
                           _coll("all_to_all", 2 * origin, 0.012, 0.015, 0.003)]
    return step


def test_an_exchange_that_runs_into_the_next_step_is_measured_across_both():
    # steps every 0.05 s of the clock; this step's all_gather is issued 1 ms into the next step's window,
    # 0.051 s after this step's origin: 36 ms after the all_to_all completed (at 0.015)
    ranks = [[_overlapping(k * 0.05) for k in range(6)]]
    for s in ranks[0]:
        s["origin"] = round(s["origin"], 3)
    ranks = [[dict(s, collectives=[dict(c, seq=i * 2 + j) for j, c in enumerate(s["collectives"])])
              for i, s in enumerate(ranks[0])]]
    prof = profile_from_steps(ranks, "job", "onebit+delayed", skip=1, per_bucket=[("all_to_all", "all_gather")])
    (ex,) = prof.exchanges
    assert ex.ops == ("all_to_all", "all_gather") and ex.gaps == pytest.approx((0.051 - 0.015,))
    assert ex.tail is None  # handed back before its exchange ended: the decode is not seen
    without = [[{k: v for k, v in s.items() if k != "origin"} for s in ranks[0]]]  # the next step's is unseen
    assert profile_from_steps(without, "job", skip=1, per_bucket=[("all_to_all", "all_gather")]).exchanges is None


def test_the_previous_steps_last_collective_after_this_bucket_is_ready_is_not_this_exchange():
    """At many ranks a slow server step issues the previous exchange's all_gather after this step's bucket is
    ready (at 0.011 s, the bucket at 0.010): the exchange opens with the all_to_all the plan says it opens with."""
    ranks = [[_overlapping(k * 0.05) for k in range(6)]]
    for i, s in enumerate(ranks[0]):
        s["origin"] = round(s["origin"], 3)
        s["collectives"] = [_coll("all_gather", 2 * i - 1, 0.011, 0.013, 0.002), _coll("all_to_all", 2 * i, 0.012, 0.015,
                                                                                       0.003)]
    prof = profile_from_steps(ranks, "job", "onebit+delayed", skip=1, per_bucket=[("all_to_all", "all_gather")])
    (ex,) = prof.exchanges
    assert ex.ops == ("all_to_all", "all_gather") and ex.gaps == pytest.approx((0.061 - 0.015,))


def test_unpaired_exchanges_are_not_measured_and_odd_layouts_are_left_out():
    odd = _step()
    odd["buckets"] = odd["buckets"][:1]  # the first iteration: one bucket
    ranks = [[_step(), odd, _step(), _step(), _step()]]
    prof = profile_from_steps(ranks, "job", skip=0)
    assert len(prof.buckets) == 2 and "1 steps of another bucket layout" in prof.notes[1]
    broken = _step()
    broken["collectives"] = broken["collectives"][:2]  # one exchange for two buckets
    assert profile_from_steps([[broken] * 4], "job", skip=0).exchanges is None


def test_no_steps_or_no_buckets_is_one_clear_error():
    with pytest.raises(ValueError, match="no training step after the first 3"):
        profile_from_steps([[_step()] * 3], "job")
    empty = dict(_step(), buckets=[])
    with pytest.raises(ValueError, match="no step synchronised its gradients"):
        profile_from_steps([[empty] * 6], "job")


class _Event:
    def __init__(self, op, issued, completed, nbytes=400, floating=True):
        self.op, self.group, self.seq, self.payload_bytes = op, "g", 0, nbytes
        self.issued, self.started, self.completed, self.inner_done = issued, issued, completed, completed
        self.floating = floating  # gradients; an integer all_reduce is DDP's map of used parameters


def test_steps_are_cut_at_backward_and_the_optimizer():
    backwards = [(1.0, 1.5, 1.6), (2.0, 2.4, 2.5), (3.0, 3.3, 3.6)]
    optimizer = [(1.7, 1.8), (2.6, 2.7), (3.7, 3.75)]
    events = [_Event("all_reduce", 2.1, 2.45), _Event("all_reduce", 2.35, 2.48, 800), _Event("all_reduce", 3.2, 3.5),
              _Event("all_reduce", 2.39, 2.4, 12, floating=False)]  # not a bucket
    out = steps(backwards, optimizer, [], events, waits=[(2.5, 2.55)])
    assert len(out) == 2  # the first backward only starts the series
    s = out[0]
    assert s["forward"] == pytest.approx(0.2) and s["backward"] == pytest.approx(0.4)
    assert s["backward_wait"] == pytest.approx(0.1) and s["after_backward"] == pytest.approx(0.1)
    assert s["waited"] == pytest.approx(0.05) and s["optimizer"] == pytest.approx(0.1)
    assert s["step"] == pytest.approx(0.9)
    # no comm hook: DDP's own all_reduces issued during backward's compute are the buckets
    assert [(b["nbytes"], round(b["ready"], 6)) for b in s["buckets"]] == [(400, 0.1), (800, 0.35)]
    stamp = BucketStamp(0, 4000, 4, 3.1, 3.12)
    stamp.done = 3.4
    hooked = steps(backwards, optimizer, [stamp], events, [])[1]
    assert [(b["nbytes"], round(b["hook"], 6), round(b["done"], 6)) for b in hooked["buckets"]] == [(4000, 0.02, 0.4)]


def test_strategy_labels():
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook, fp16_compress_hook

    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    assert strategy_label(allreduce_hook, None) == "sync"
    assert strategy_label(fp16_compress_hook, None) == "torch-fp16"
    assert strategy_label(compression_hook, CompressionState("onebit")) == "onebit"

    def my_hook(state, bucket):
        return None

    assert strategy_label(my_hook, None) == "hook:my_hook"


def test_the_slowest_rank_sets_the_pace_and_the_shortest_real_collective_is_the_floor():
    fast, slow = _step(1.0), _step(1.0)
    slow["backward"] = 0.040  # 10 ms more backward on this rank
    slow["collectives"] = [dict(c, inner=c["inner"] / 2) for c in slow["collectives"]]  # it joined last
    prof = profile_from_steps([[fast] * 4, [slow] * 4], "job", "onebit", skip=1)
    assert prof.backward == pytest.approx(0.040 - 0.004)
    assert prof.exchanges[0].inner == pytest.approx((0.001, 0.001))


def _accumulated(micro, micro_seconds=0.020, lead=0.0):
    """``_step()`` as the synchronising micro-step of ``micro``, after ``micro - 1`` micro-steps."""
    s = _step()
    extra = [micro_seconds] * (micro - 1)
    return dict(s, micro_steps=micro, micro_seconds=extra, forward=s["forward"] + lead,
                step=s["step"] + sum(extra) + lead)


def test_micro_steps_come_before_the_synchronising_step_and_align_the_ranks():
    ranks = [[_accumulated(4)] * 5, [_accumulated(4, 0.024)] * 5]  # rank 1's micro-steps are 4 ms slower
    prof = profile_from_steps(ranks, "job", "onebit", skip=1)
    assert prof.accumulate == 4 and prof.micro == pytest.approx(0.022)  # a typical rank's: the ranks' mean
    assert prof.forward == pytest.approx(0.010) and prof.backward == pytest.approx(0.026)
    # the ready times are the slowest rank's (rank 1), counted from its own step start
    assert [b.ready for b in prof.buckets] == pytest.approx([0.010, 0.023])
    assert prof.compute_seconds == pytest.approx(3 * 0.022 + 0.010 + 0.026 + prof.optimizer)
    assert "4 micro-steps each" in prof.notes[0]
    # records written before micro-steps were: one backward per step, its forward + backward the micro-step
    old = profile_from_steps([[_step()] * 5], "job", skip=1)
    assert old.accumulate == 1 and old.micro == pytest.approx(0.010 + 0.026) and old.accumulation_seconds == 0


def test_steps_of_another_count_of_micro_steps_are_left_out():
    ranks = [[_accumulated(2), _accumulated(2), _accumulated(3), _accumulated(2), _accumulated(2)]]
    prof = profile_from_steps(ranks, "job", skip=0)
    assert prof.accumulate == 2 and "1 steps of another count of micro-steps left out" in prof.notes


def test_accumulating_is_the_same_micro_step_n_times():
    from gradwire.predict import predict
    from gradwire.predict.timeline import Bucket, StepProfile

    one = StepProfile("job", 0.010, 0.030, 0.005, (Bucket(4 << 20, 0.030),), world=2, loop_seconds=0.1,
                      source="profile")
    eight = one.accumulating(8)
    assert (eight.accumulate, eight.micro, eight.loop_seconds) == (8, pytest.approx(0.040), None)
    assert eight.compute_seconds == pytest.approx(7 * 0.040 + 0.045)
    assert eight.accumulating(8) is eight and StepProfile.from_dict(eight.as_dict()) == eight
    with pytest.raises(ValueError, match="accumulate must be an integer >= 1"):
        one.accumulating(0)
    net = "bandwidth=1gbit,latency=50us"
    p1, p8 = predict(one, "sync", net, 2), predict(eight, "sync", net, 2)
    comm = p1.step_seconds - one.compute_seconds  # a blocking exchange after backward, once per optimizer step
    assert comm > 0 and p8.step_seconds == pytest.approx(eight.compute_seconds + comm)
    assert p8.efficiency > p1.efficiency
    with_batch = predict(StepProfile(**dict(eight.as_dict(), batch_size=16)), "sync", net, 2)
    assert with_batch.throughput == pytest.approx(2 * 16 * 8 / with_batch.step_seconds)
    assert with_batch.steps_per_second == pytest.approx(1 / with_batch.step_seconds)


def test_steps_with_micro_steps_from_the_recorders():
    # two micro-steps per optimizer step, 10 s each; only the second backward hands DDP a bucket
    backwards = [(t + d, t + d + 1, t + d + 2) for t in (0.0, 20.0, 40.0) for d in (0.0, 10.0)]
    optimizer = [(t + 13, t + 14) for t in (0.0, 20.0, 40.0)]
    stamps = [BucketStamp(0, 400, 4, t + 10.5, t + 10.6) for t in (0.0, 20.0, 40.0)]
    got = steps(backwards, optimizer, stamps, [], [])
    assert [(s["micro_steps"], s["micro_seconds"], s["forward"], s["step"]) for s in got] == [(2, [8.0], 8.0, 20.0)] * 2
