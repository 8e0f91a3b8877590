"""Networks that change: the events' grammar, their composition, and the price of an op across a change."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.net import NetworkModel, parse_spec
from gradwire.net.schedule import (
    CHANGE_KINDS, RATE, Condition, Drop, NetworkChange, Schedule, Trace, finish_time, register_change,
)

GBIT = 1e9
#: 16 MB all_reduce on 2 ranks without framing: 2 (p-1)/p * 16e6 bytes at 1 Gbit/s
T_FAST = 16e6 * 8 / GBIT


def _model(events: str, world: int = 2) -> NetworkModel:
    return NetworkModel(f"bandwidth=1gbit,latency=0us,protocol=none,{events}", world)


@pytest.mark.parametrize("text", [
    "1gbe,drop=100mbit:for=5s:every=30s", "1gbe,drop=100mbit:for=5s:every=30s:at=3s", "1gbe,outage=5s:at=20s",
    "1gbe,outage=5s:at=20s:every=60s", "1gbe,slow=1:link=0.2:for=5s:every=30s", "1gbe,cross=400mbit:flows=2",
    "1gbe,cross=400mbit:on=2s:off=3s:at=1s", "flaky-cloud", "shared-wan",
])
def test_every_event_round_trips(text: str) -> None:
    spec = parse_spec(text)
    assert spec.events
    assert parse_spec(spec.to_string()) == spec


@pytest.mark.parametrize("text, words", [
    ("1gbe,drop=100mbit", "for="),
    ("1gbe,drop=100mbit:for=5s:every=3s", "longer than for="),
    ("1gbe,drop=0bit:for=1s", "bandwidth"),
    ("1gbe,outage=5s", "at="),
    ("1gbe,outage=0s:at=1s", "for= must be a time > 0"),
    ("1gbe,cross=100mbit:on=1s", "on= and off= together"),
    ("1gbe,cross=100mbit:flows=0", "flows="),
    ("1gbe,slow=x:link=0.5:for=1s", "RANK is an integer"),
    ("1gbe,drop=100mbit:for=5s:when=3s", "unknown part"),
    ("1gbe,trace=/no/such/file.csv", "no such file"),
])
def test_bad_events_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("=", "=").replace("(", r"\(")):
        parse_spec(text)


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the world"):
        NetworkModel("1gbe,slow=5:link=0.5:for=1s:every=10s", 4)


def test_constant_network_and_before_any_event_are_the_static_price() -> None:
    static = NetworkModel("bandwidth=1gbit,latency=0us,protocol=none", 2).cost("all_reduce", 16_000_000).seconds
    changing = _model("drop=100mbit:for=3s:every=10s:at=5s")
    assert static == pytest.approx(T_FAST)
    assert changing.cost("all_reduce", 16_000_000, start=0.0).seconds == pytest.approx(static)
    assert changing.cost("all_reduce", 16_000_000, start=5.2).seconds == pytest.approx(10 * static)


def test_an_op_across_a_drop_is_priced_piecewise() -> None:
    m = _model("drop=100mbit:for=1s:every=10s:at=1s")
    # 0.1 s at 1 Gbit/s moves 0.1 / 0.128 of the op; the rest goes at a tenth of the rate
    done = 0.1 / T_FAST
    assert m.cost("all_reduce", 16_000_000, start=0.9).seconds == pytest.approx(0.1 + (1 - done) * 10 * T_FAST)
    # and one that starts in the drop and ends after it
    left = 1 - 0.05 / (10 * T_FAST)
    assert m.cost("all_reduce", 16_000_000, start=1.95).seconds == pytest.approx(0.05 + left * T_FAST)
    # periodic: the same at the next period
    assert m.cost("all_reduce", 16_000_000, start=10.9).seconds == pytest.approx(
        m.cost("all_reduce", 16_000_000, start=0.9).seconds)


def test_an_outage_holds_ops_in_flight_and_they_resume() -> None:
    m = _model("outage=5s:at=1s")
    assert m.cost("all_reduce", 16_000_000, start=0.95).seconds == pytest.approx(5 + T_FAST)
    assert m.cost("all_reduce", 16_000_000, start=3.0).seconds == pytest.approx(3 + T_FAST)
    assert math.isinf(m.cost("all_reduce", 16_000_000, start=0.95, horizon=3.0).seconds)


def test_cross_traffic_takes_its_fair_share() -> None:
    # one flow that would take all of the link: half each
    assert _model("cross=10gbit").cost("all_reduce", 16_000_000).seconds == pytest.approx(2 * T_FAST)
    # a slow flow leaves the rest
    assert _model("cross=200mbit").cost("all_reduce", 16_000_000).seconds == pytest.approx(T_FAST / 0.8)
    # on/off
    m = _model("cross=10gbit:on=1s:off=1s:at=1s")
    assert m.cost("all_reduce", 16_000_000, start=0.0).seconds == pytest.approx(T_FAST)
    assert m.cost("all_reduce", 16_000_000, start=1.1).seconds == pytest.approx(2 * T_FAST)


def test_a_slow_uplink_that_comes_and_goes_paces_the_group() -> None:
    m = _model("slow=1:link=0.5:for=1s:every=10s:at=1s", world=4)
    assert m.cost("all_reduce", 16_000_000, start=1.5).seconds == pytest.approx(
        2 * m.cost("all_reduce", 16_000_000, start=0.0).seconds)
    # a group without rank 1 does not see it
    assert m.cost("all_reduce", 16_000_000, ranks=[2, 3], start=1.5).seconds == pytest.approx(T_FAST)


def test_csv_and_mahimahi_traces(tmp_path) -> None:
    csv = tmp_path / "link.csv"
    csv.write_text("time,bandwidth,latency,loss\n0s,1gbit,0us,0\n2s,100mbit,,\n4s,1gbit,,\n")
    m = NetworkModel(f"bandwidth=10gbit,protocol=none,trace={csv}:repeat", 2)
    assert m.cost("all_reduce", 16_000_000, start=0.0).seconds == pytest.approx(T_FAST)
    assert m.cost("all_reduce", 16_000_000, start=2.5).seconds == pytest.approx(10 * T_FAST)
    assert m.cost("all_reduce", 16_000_000, start=4.0).seconds == pytest.approx(T_FAST)  # repeats: row 0 again
    held = NetworkModel(f"bandwidth=10gbit,protocol=none,trace={csv}", 2)  # no repeat: the last row holds
    assert held.cost("all_reduce", 16_000_000, start=4.5).seconds == pytest.approx(T_FAST)
    mm = tmp_path / "cell.up"  # one 1500-byte packet per ms: 12 Mbit/s
    mm.write_text("\n".join(str(ms) for ms in range(1, 1001)) + "\n")
    trace = Trace.load(str(mm))
    assert trace.mahimahi and trace.period == 1.0
    assert trace.base(0.55).bandwidth == pytest.approx(12e6)
    spec = parse_spec(f"bandwidth=1gbit,protocol=none,trace={mm}")
    assert parse_spec(spec.to_string()) == spec


@settings(max_examples=60, deadline=None)
@given(start=st.floats(0, 40), rate=st.sampled_from([1e7, 1e8, 5e8]), duration=st.floats(0.05, 4),
       every=st.floats(5, 15))
def test_work_is_conserved_across_any_schedule(start: float, rate: float, duration: float, every: float) -> None:
    """Integrating 1 / T(condition) from start to the returned end gives exactly one op."""
    sched = Schedule(parse_spec(f"bandwidth=1gbit,drop={rate:g}bit:for={duration}s:every={every}s").events)

    def seconds(cond: Condition) -> float:
        return T_FAST * GBIT / (cond.bandwidth or GBIT)

    end = finish_time(start, sched.segments(start, GBIT), seconds)
    done, t = 0.0, start
    for seg_end, cond in sched.segments(start, GBIT):
        stop = min(seg_end, end)
        done += (stop - t) / seconds(cond)
        t = stop
        if t >= end:
            break
    assert done == pytest.approx(1.0, rel=1e-9)
    assert T_FAST * (1 - 1e-9) <= end - start <= T_FAST * GBIT / rate * (1 + 1e-9)


@settings(max_examples=80, deadline=None)
@given(k=st.integers(0, 10_000), duration_ms=st.integers(1, 9), every_ms=st.integers(10, 40),
       at_ms=st.sampled_from([None, 0, 1, 7]))
def test_the_next_change_is_always_later_even_at_a_boundary(k: int, duration_ms: int, every_ms: int,
                                                           at_ms: int | None) -> None:
    """At a window's edge computed in floats (0.03 s is 2.9999999999999996 periods of 0.01 s) the next change is
    still after ``t``: a caller stepping from change to change (the backend's outage check) must advance."""
    at = "" if at_ms is None else f":at={at_ms}ms"
    model = _model(f"drop=100mbit:for={duration_ms}ms:every={every_ms}ms{at}")
    for t in (k * every_ms / 1000, k * every_ms / 1000 + duration_ms / 1000, (at_ms or 0) / 1000 + k * every_ms * 1e-3):
        cond, change = model.condition(t)
        assert change > t
        assert model.condition(change)[1] > change


def test_stepping_through_a_fast_schedule_advances() -> None:
    """10 s of a drop every 10 ms (the first opening at 10 ms), stepped change by change: 1999 changes, each
    after the last."""
    model = _model("drop=200mbit:for=5ms:every=10ms")
    t, changes = 0.0, 0
    while t < 10.0:
        nxt = model.condition(t)[1]
        assert nxt > t
        t, changes = nxt, changes + 1
    assert changes == 1999


@pytest.mark.parametrize("text, words", [
    ("1gbe,link=a/b", "letters, digits"),
    ("1gbe,link=" + "x" * 65, "1 to 64"),
    ("1gbe,link=sw1,clock=virtual", "clock=realtime"),
])
def test_a_bad_shared_link_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_spec(text)
    assert parse_spec("1gbe,link=sw-1.a").link == "sw-1.a"


def test_a_kind_of_change_that_is_not_registered_fails_loudly() -> None:
    @dataclass(frozen=True)
    class Unregistered(NetworkChange):
        key = "unregistered"
        stage = RATE

        def state(self, t: float) -> tuple[bool, float]:
            return True, math.inf

        def apply(self, cond: Condition, bandwidth: float) -> Condition:
            return cond

    with pytest.raises(TypeError, match="Unregistered is not a registered kind.*@register_change"):
        Schedule((Unregistered(),))


def test_registration_refuses_a_taken_key_and_a_kind_without_a_stage_or_parser() -> None:
    class Twin(Drop):
        pass

    with pytest.raises(ValueError, match="'drop' is taken by Drop"):
        register_change(Twin)

    class Bandwidth(Drop):
        key = "bandwidth"

    with pytest.raises(ValueError, match="'bandwidth' already means something else"):
        register_change(Bandwidth)

    class NoStage(NetworkChange):
        key = "nostage"

    with pytest.raises(ValueError, match="needs a stage"):
        register_change(NoStage)

    class NoParser(NetworkChange):
        key = "noparser"
        stage = RATE

    with pytest.raises(ValueError, match="reads its own token"):
        register_change(NoParser)
    assert {"nostage", "noparser"}.isdisjoint(CHANGE_KINDS)


def test_an_unknown_kind_of_change_is_refused_with_the_valid_keys() -> None:
    with pytest.raises(ValueError, match="unknown spec key 'flap'.*drop"):
        parse_spec("1gbe,flap=5s")
