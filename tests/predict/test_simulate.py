"""The step replay: overlap, the link queue, floors, callbacks, the wait kinds. Expected times by hand."""
from dataclasses import replace

import pytest

from gradwire.net import NetworkModel, parse_spec
from gradwire.predict import Bucket, StepProfile, predict
from gradwire.predict.simulate import Exchange, Kind, Phase, Plan, Pricer, simulate, spec_for_world
from tests.net import textbook as tb

NET = "bandwidth=1gbit,latency=50us"
ALPHA, BETA = 50e-6, tb.tcp_beta(1e9)  # NET's alpha and beta: TCP framing, 1448 payload bytes per 1514


def _comm(op: str, p: int, n: int) -> float:
    """Textbook time of one ``op`` on NET (tests/net/textbook.py), not the model's own number."""
    return tb.auto(op, p, n, ALPHA, BETA)[0]


def fixed(seconds):
    """A pricer where every collective takes ``seconds`` (the replay's arithmetic, apart from the network)."""
    return lambda op, nbytes, start: (seconds, 0)


def _one(op="all_reduce", n=1000, **kw):
    return Exchange(kw.pop("encode", 0.0), (Phase(op, n, **kw),), 0.0)


def test_one_bucket_at_the_end_of_backward_is_compute_then_comm():
    prof = StepProfile("m", 0.010, 0.030, 0.005, (Bucket(4_000_000, 0.030),))
    p = predict(prof, "sync", NET, 4)
    comm = _comm("all_reduce", 4, 4_000_000)
    assert p.comm_seconds == pytest.approx(comm)
    assert p.step_seconds == pytest.approx(0.045 + comm)
    assert p.efficiency == pytest.approx(0.045 / (0.045 + comm))
    assert p.wire_bytes_per_step == tb.tcp_wire(3 / 2 * 4_000_000)  # Rabenseifner's share, framed


def test_an_early_bucket_overlaps_backward_and_the_link_is_a_queue():
    # two buckets of c = 10 ms each; F = 5, B = 30, O = 2 (ms)
    plan = Plan(Kind.BLOCKING, (_one(), _one()))
    # bucket 0 at 1 ms: done at 11, hidden; bucket 1 at 30: the step waits 10 ms after backward
    assert simulate(0.005, 0.030, 0.002, [0.001, 0.030], plan, fixed(0.010)).step_seconds == pytest.approx(0.047)
    # both at 25 and 26 ms: the second queues behind the first, 25 + 10 + 10 = 45 > B
    assert simulate(0.005, 0.030, 0.002, [0.025, 0.026], plan, fixed(0.010)).step_seconds == pytest.approx(0.052)
    # the old upper bound (everything after backward) would have said 5 + 30 + 20 + 2 = 57


def test_hooks_push_the_rest_of_backward_back():
    plan = Plan(Kind.BLOCKING, (_one(encode=0.004), _one(encode=0.004)))
    # backward 30 + 8 of hooks; bucket 1 ready at 30 + 4 (after hook 0), issued after its own hook at 38
    res = simulate(0.0, 0.030, 0.0, [0.010, 0.030], plan, fixed(0.005))
    assert res.step_seconds == pytest.approx(0.038 + 0.005)
    assert res.codec_seconds == pytest.approx(0.008)


def test_a_real_collective_is_a_floor_and_real_collectives_run_one_at_a_time():
    plan = Plan(Kind.BLOCKING, (_one(floor=0.020), _one(floor=0.020)))
    # modelled 1 ms each, but the real ones take 20 ms in turn: 0 -> 20, 20 -> 40
    assert simulate(0.0, 0.010, 0.0, [0.0, 0.0], plan, fixed(0.001)).step_seconds == pytest.approx(0.040)


def test_two_phase_waits_for_its_server_step_and_the_next_exchange_waits_its_turn():
    ex = Exchange(0.0, (Phase("all_to_all", 100), Phase("all_gather", 100, before=0.003)), decode=0.002)
    plan = Plan(Kind.BLOCKING, (ex, ex))
    # exchange 0: a2a 0-1, serve 1-4, ag 4-5, decode 5-7; exchange 1 issues after ag 0 was issued (4):
    # a2a 5-6 (link busy until 5), serve 7-10 (the callback thread decodes 0 until 7), ag 10-11, decode 11-13
    res = simulate(0.0, 0.0, 0.0, [0.0, 0.0], plan, fixed(0.001))
    assert res.step_seconds == pytest.approx(0.013)
    assert res.comm_seconds == pytest.approx(0.004)
    assert res.codec_seconds == pytest.approx(0.010)


def test_delayed_hides_the_network_until_the_network_is_the_bound():
    # one bucket at the end of backward; compute per step C = F + B + O = 10 + 20 + 5 ms
    plan = Plan(Kind.NEXT_STEP, (_one(),))
    # comm 20 ms < C: waited for after the next backward, it has arrived: the step is the compute
    assert simulate(0.010, 0.020, 0.005, [0.020], plan, fixed(0.020)).step_seconds == pytest.approx(0.035)
    # comm 50 ms > C: the link is the bound, one exchange per step
    assert simulate(0.010, 0.020, 0.005, [0.020], plan, fixed(0.050)).step_seconds == pytest.approx(0.050)
    # sync on the same numbers: compute + comm
    sync = Plan(Kind.BLOCKING, (_one(),))
    assert simulate(0.010, 0.020, 0.005, [0.020], sync, fixed(0.050)).step_seconds == pytest.approx(0.085)


@pytest.mark.parametrize("overlapped, comm, expected", [
    (False, 0.040, 0.010 + 0.040 / 4),  # localsgd:4: a blocking average every 4 steps
    (True, 0.020, 0.010),  # async-average:4: hidden behind 4 steps of 10 ms
    (True, 0.100, 0.100 / 4),  # ... unless it takes longer than 4 steps: the next launch waits
])
def test_model_averaging_every_h_steps(overlapped, comm, expected):
    plan = Plan(Kind.AVERAGE, (_one(),), period=4, overlapped=overlapped)
    assert simulate(0.002, 0.006, 0.002, [0.006], plan, fixed(comm)).step_seconds == pytest.approx(expected)


def test_strategies_are_priced_through_the_network_model():
    prof = StepProfile("m", 0.010, 0.030, 0.005, (Bucket(4_000_000, 0.030),))
    fp16 = predict(prof, "fp16", NET, 4)  # one all_reduce of the half-precision bucket, free to compress
    assert fp16.comm_seconds == pytest.approx(_comm("all_reduce", 4, 2_000_000))
    # onebit at 4 ranks: chunks of 512 * ceil(1e6 / 2048) = 250,368 elements; a row is 250,368 / 8 sign bytes
    # plus 489 fp32 scales padded to 1,960 bytes = 33,256 bytes; all_to_all and all_gather of 4 rows
    onebit = predict(prof, "onebit", NET, 4)
    row = 250_368 // 8 + 1_960
    assert onebit.comm_seconds == pytest.approx(_comm("all_to_all", 4, 4 * row) + _comm("all_gather", 4, 4 * row))


def test_pricer_is_the_network_model():
    specs = ["10gbe", "1gbe,algorithm=tree", "100gbe,topology=2x4,intra=nvlink,algorithm=hierarchical",
             "25gbe,topology=4x2,intra=nvlink", "bandwidth=1gbit,latency=1ms,loss=0.1%", "loopback"]
    for text in specs:
        world = 8
        spec = spec_for_world(text, world)
        model, pricer = NetworkModel(spec, world), Pricer(text, world)
        for op in ("all_reduce", "all_to_all", "all_gather", "broadcast"):
            for n in (0, 1000, 1 << 20, 50_000_000):
                cost = model.cost(op, n)
                assert pricer(op, n) == (pytest.approx(cost.seconds), cost.wire_bytes)
    jittered = Pricer("1gbe,jitter=1ms", 4)  # jitter: every call is the model's, one sequence number after another
    model = NetworkModel("1gbe,jitter=1ms", 4)
    assert [jittered("all_reduce", 1000)[0] for _ in range(3)] == [model.cost("all_reduce", 1000, seq=k).seconds
                                                                   for k in range(3)]


def test_topology_keeps_ranks_per_node():
    assert spec_for_world("10gbe,topology=2x8", 64).topology == (8, 8)
    prof = StepProfile("m", 0.0, 0.020, 0.0, (Bucket(4_000_000, 0.020),))
    # 2 ranks per node kept, 4 nodes at 8 ranks: node-local reduce and broadcast on NVLink, ring of 4 leaders
    p = predict(prof, "sync", "10gbe,topology=2x2,intra=nvlink,algorithm=hierarchical", 8)
    ai, bi = 3e-6, 8 / 2.4e12  # nvlink: unframed
    ae, be = 20e-6, tb.tcp_beta(10e9)
    assert p.comm_seconds == pytest.approx(2 * (ai + 4e6 * bi) + 6 * ae + 3 / 2 * 4e6 * be)
    with pytest.raises(ValueError, match="does not fit nodes of 4 ranks"):
        predict(prof, "sync", "10gbe,topology=2x4", 6)
    with pytest.raises(ValueError, match="topology=auto"):
        spec_for_world("10gbe,topology=auto", 8)
    with pytest.raises(ValueError, match=">= 2"):
        predict(prof, "sync", NET, 1)
    assert parse_spec("10gbe").topology is None and spec_for_world("10gbe", 7).topology is None


def test_a_measured_profile_is_calibrated_against_its_own_run():
    from gradwire.predict import calibrated

    # sync, one bucket at the end of backward, no floors: on loopback the replay is F + B + O = 20 ms; the run took
    # 30: backward stretched from 10 to 20 ms
    prof = StepProfile("m", 0.005, 0.010, 0.005, (Bucket(4_000_000, 0.010),), world=2, strategy="sync",
                       source="measured", loop_seconds=0.030, net="loopback")
    cal = calibrated(prof)
    assert cal.stretch == pytest.approx(2.0, rel=1e-3)
    assert (cal.forward, cal.backward, cal.optimizer) == pytest.approx((0.005, 0.020, 0.005), rel=1e-3)
    assert cal.buckets[0].ready == pytest.approx(0.020, rel=1e-3)
    assert predict(cal, "sync", "loopback", 2).step_seconds == pytest.approx(0.030, rel=1e-3)
    # a network slower than backward hides the stretch: an early bucket's all_reduce of 4 MB is the bound
    early = StepProfile("m", 0.005, 0.010, 0.005, (Bucket(4_000_000, 0.001),), world=2, strategy="sync",
                        source="measured", loop_seconds=0.030, net="loopback")
    comm = _comm("all_reduce", 2, 4_000_000)
    assert comm > 0.030
    assert predict(calibrated(early), "sync", NET, 2).step_seconds == pytest.approx(0.005 + 0.002 + comm + 0.005,
                                                                                     rel=1e-3)
    described = StepProfile("m", 0.005, 0.010, 0.005, (Bucket(4_000_000, 0.010),))
    assert calibrated(described) is described


def test_calibration_replays_the_run_on_the_network_it_ran_on():
    from gradwire.predict import calibrated

    # a run on NET whose step is exactly the replay on NET: nothing to stretch (on loopback it would be stretched)
    prof = StepProfile("m", 0.005, 0.010, 0.005, (Bucket(4_000_000, 0.001),), world=2, strategy="sync",
                       source="profile", net=NET)
    prof.loop_seconds = predict(prof, "sync", NET, 2).step_seconds
    assert calibrated(prof).stretch == pytest.approx(1.0, abs=1e-3)
    unknown = StepProfile("m", 0.005, 0.010, 0.005, (Bucket(4_000_000, 0.001),), world=2, strategy="sync",
                          source="profile", loop_seconds=0.5)
    cal = calibrated(unknown)
    assert cal.stretch == 1.0 and "network its run used is unknown" in cal.notes[-1]
    auto = StepProfile("m", 0.005, 0.010, 0.005, (Bucket(4_000_000, 0.001),), world=2, strategy="sync",
                       source="profile", loop_seconds=0.5, net="1gbe,topology=auto")
    assert calibrated(auto).stretch == 1.0 and "topology=auto" in calibrated(auto).notes[-1]


def test_ranks_that_shared_cores_get_a_core_each_and_their_run_stays_a_floor():
    from gradwire.predict import calibrated
    from gradwire.predict.timeline import MeasuredExchange

    ex = (MeasuredExchange(("all_reduce",), 0.002, (0.001,), (), 0.0004),)
    # 4 ranks on 2 cores: every CPU time measured at half a core
    prof = StepProfile("m", 0.010, 0.020, 0.004, (Bucket(4_000_000, 0.016),), world=4, strategy="sync",
                       exchanges=ex, source="measured", loop_seconds=0.070, net="loopback", shared=2.0)
    cal = calibrated(prof)
    assert (cal.forward, cal.backward, cal.optimizer, cal.buckets[0].ready) == pytest.approx(
        (0.005, 0.010, 0.002, 0.008))
    assert cal.exchanges is not None and cal.exchanges[0].hook == pytest.approx(0.001)
    assert cal.exchanges[0].tail == pytest.approx(0.0002) and cal.exchanges[0].inner == (0.001,)
    assert cal.stretch == 0.5 and "a core per rank" in cal.notes[-1]
    # the same strategy at the same world size: never below the run itself (loopback adds nothing)
    fast = "bandwidth=400gbit,latency=1us"
    assert predict(cal, "sync", fast, 4).step_seconds == pytest.approx(0.070)
    assert predict(cal, "sync", "loopback", 4).step_seconds == pytest.approx(0.070)
    # elsewhere the rank has its core: another world size, another strategy
    assert predict(cal, "sync", fast, 8).step_seconds < 0.030
    assert predict(cal, "fp16", fast, 4).step_seconds < 0.030
    # a slow network is above the floor: the model's own price
    slow = predict(cal, "sync", "bandwidth=100mbit", 4).step_seconds
    assert slow > 0.5 and slow == pytest.approx(predict(replace(cal, loop_seconds=None), "sync",
                                                        "bandwidth=100mbit", 4).step_seconds)
    # a run on a network is no floor for faster ones
    on_net = replace(cal, net="bandwidth=100mbit", loop_seconds=2.0)
    assert predict(on_net, "sync", fast, 4).step_seconds < 0.030
    with pytest.raises(ValueError, match="shared"):
        replace(prof, shared=0.5)


def test_shared_cores_counts_cpu_ranks_per_host():
    from gradwire.predict.recorded import shared_cores

    cpu = {"hostname": "a", "cores": 2, "cuda": False}
    assert shared_cores([cpu, cpu]) == 1.0
    assert shared_cores([cpu] * 4) == 2.0
    assert shared_cores([cpu] * 3 + [dict(cpu, hostname="b")] * 3) == 1.5
    assert shared_cores([dict(cpu, cuda=True)] * 8) == 1.0  # a device each
    assert shared_cores([cpu] * 4 + [None]) == 1.0  # a rank that did not say: nothing assumed
    assert shared_cores([]) == 1.0


def test_a_changing_network_gives_the_step_time_distribution_over_its_schedule():
    """1 Gbit/s dropping to 100 Mbit/s for 5 s in every 30 s: the steady steps are the static ones, the
    steps in a drop take the slow link's time, and the mean lies between, weighted by time."""
    prof = StepProfile("m", 0.010, 0.030, 0.005, (Bucket(4_000_000, 0.030),))
    base = "bandwidth=1gbit,latency=50us"
    fast = predict(prof, "sync", base, 2)
    slow = predict(prof, "sync", "bandwidth=100mbit,latency=50us", 2)
    changing = predict(prof, "sync", base + ",drop=100mbit:for=5s:every=30s", 2)
    assert fast.percentiles is None and changing.percentiles is not None
    p50, p95, longest = changing.percentiles
    assert p50 == pytest.approx(fast.step_seconds)
    assert longest == pytest.approx(slow.step_seconds, rel=0.02)
    # time-weighted: 25 s of fast steps and 5 s of slow ones in every 30 s
    steps = 25 / fast.step_seconds + 5 / slow.step_seconds
    assert changing.step_seconds == pytest.approx(30 / steps, rel=0.03)
    # an outage holds one step for its length
    outage = predict(prof, "sync", base + ",outage=5s:at=10s", 2)
    assert outage.percentiles is not None and outage.percentiles[2] == pytest.approx(5 + fast.step_seconds, rel=0.02)


@pytest.mark.parametrize("comm, expected", [(3.0, 6.5), (0.1, 4.0)])
def test_the_simulated_clocks_copy_out_runs_beside_a_blocking_exchange(comm, expected):
    """``finalize``: DDP's copy of the results into the gradients, charged by the simulated clock before the
    rank observes the exchange: forward 1, backward 2 (the bucket ready at its end), optimizer 1 of which 0.5 is
    that copy. Without it the copy follows the exchange (1 + 2 + comm + 1)."""
    plan = Plan(Kind.BLOCKING, (_one(),))
    after = simulate(1.0, 2.0, 1.0, [2.0], plan, fixed(comm)).step_seconds
    assert after == pytest.approx(4.0 + comm)
    beside = simulate(1.0, 2.0, 1.0, [2.0], plan, fixed(comm), finalize=0.5).step_seconds
    assert beside == pytest.approx(expected)  # max(3 + 0.5, 3 + comm) + 0.5


def test_a_profile_recorded_on_the_simulated_clock_replays_its_copy_out_beside_the_exchange():
    prof = StepProfile("m", 0.010, 0.030, 0.005, (Bucket(4_000_000, 0.030),), finalize=0.002)
    comm = _comm("all_reduce", 2, 4_000_000)
    host = predict(replace(prof, net="loopback"), "sync", NET, 2).step_seconds
    sim = predict(replace(prof, net="loopback,clock=sim,device=cpu-core"), "sync", NET, 2).step_seconds
    assert host == pytest.approx(0.045 + comm)
    assert sim == pytest.approx(0.043 + comm) and comm > 0.002
