"""The pure part of a changing emulated network: which change at which time, and the controller's order of work."""
import math
import threading
import time

import pytest

from gradwire.emulate.controller import Controller, apply
from gradwire.emulate.layout import Layout, RunId
from gradwire.emulate.plan import MIN_BURST, Capabilities, Unsupported, plan_network
from gradwire.emulate.timeline import built_state, changes, describe, restore, state_at
from gradwire.net import parse_spec
from gradwire.net.schedule import Condition

RUN = RunId(4242, 987654)
CAPS = Capabilities(frozenset({"tbf", "htb"}), frozenset({"u32"}))


def plan(spec, nodes=2, per_node=1, **kw):
    return plan_network(parse_spec(spec), Layout(nodes, per_node, RUN), CAPS, **kw)


def rates(change):
    return {i: r.rate for i, r in change.rates}


def test_a_drop_changes_every_port_at_its_start_and_end():
    p = plan("bandwidth=1gbit,drop=100mbit:for=5s:every=30s")
    first = [(c.at, rates(c), c.up) for c in list(_take(changes(p), 4))]
    every = range(len(p.ports))
    assert first == [(30.0, {i: 1e8 for i in every}, None), (35.0, {i: 1e9 for i in every}, None),
                     (60.0, {i: 1e8 for i in every}, None), (65.0, {i: 1e9 for i in every}, None)]
    c = next(changes(p))
    # the bucket and the queue follow the rate, as at build time
    assert all(r.burst == MIN_BURST and r.limit == int(1e8 / 8 * 0.1) + MIN_BURST and r.kind == "htb"
               for _, r in c.rates)


def test_an_outage_takes_the_ports_down_and_up_without_touching_rates():
    p = plan("bandwidth=1gbit,outage=2s:at=10s")
    assert [(c.at, c.rates, c.up) for c in changes(p)] == [(10.0, (), False), (12.0, (), True)]


def test_slow_shapes_the_uplink_of_the_node_that_holds_the_rank():
    p = plan("bandwidth=1gbit,slow=3:link=0.25:for=4s:at=1s", nodes=2, per_node=2)
    down, up = list(changes(p))
    where = {(p.ports[i].node, p.ports[i].direction): r.rate for i, r in down.rates}
    assert (down.at, where) == (1.0, {(1, "upload"): 2.5e8})
    assert (up.at, {(p.ports[i].node, p.ports[i].direction): r.rate for i, r in up.rates}) == (5.0, {(1, "upload"): 1e9})


def test_static_stragglers_scale_with_the_schedule_and_a_fixed_burst_stays():
    p = plan("bandwidth=1gbit,straggler=1:link=0.5,drop=100mbit:for=1s:at=0s", burst=64 << 10)
    c = next(changes(p))
    assert c.at == 0.0  # at=0: the first change comes with the first node's start
    by_node = {(p.ports[i].node, p.ports[i].direction): r.rate for i, r in c.rates}
    assert by_node == {(0, "upload"): 1e8, (0, "download"): 1e8, (1, "upload"): 5e7, (1, "download"): 5e7}
    assert {r.burst for _, r in c.rates} == {64 << 10}


def test_a_trace_sets_rates_and_a_zero_row_is_an_outage(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("time,bandwidth\n0s,1gbit\n2s,200mbit\n3s,0\n4s,1gbit\n")
    p = plan(f"bandwidth=1gbit,trace={trace}")
    got = [(c.at, sorted(set(rates(c).values())), c.up) for c in changes(p)]
    assert got == [(2.0, [2e8], None), (3.0, [], False), (4.0, [1e9], True)]


def test_what_cannot_change_is_refused_with_the_reason(tmp_path):
    trace = tmp_path / "lat.csv"
    trace.write_text("0s,1gbit,1ms\n2s,100mbit,5ms,1%\n")
    with pytest.raises(Unsupported) as err:
        plan(f"bandwidth=1gbit,cross=100mbit:flows=2,slow=7:link=0.5:for=1s:at=1s,trace={trace}")
    reasons = " | ".join(err.value.reasons)
    assert "cross=: background flows need traffic of their own" in reasons
    assert "changes the latency: that needs netem, which this kernel lacks" in reasons
    assert "changes the loss: that needs netem" in reasons
    assert "slow= ranks [7] are outside the world of 2 ranks" in reasons
    with pytest.raises(Unsupported, match="has none: give the links a rate to start from"):
        plan("drop=100mbit:for=1s:at=1s")
    with pytest.raises(Unsupported, match="tbf takes at most"):
        plan("bandwidth=20gbit,slow=0:link=2:for=1s:at=1s", limiter="tbf")
    plan("outage=1s:at=1s")  # an unshaped network can still go down


def test_plan_lists_the_first_changes_and_says_more_follow():
    lines = describe(plan("bandwidth=1gbit,drop=100mbit:for=5s:every=30s"), shown=3)
    assert lines[0].startswith("schedule from t=0 (the first node's start): drop=100mbit")
    assert lines[1:] == ["  t=30.000s: 100 Mbit/s on every link", "  t=35.000s: 1 Gbit/s on every link",
                         "  t=60.000s: 100 Mbit/s on every link", "  ... and more (the schedule goes on; 3 shown)"]
    assert describe(plan("bandwidth=1gbit,outage=1s:at=2s"))[1:] == [
        "  t=2.000s: every switch port down (outage)", "  t=3.000s: switch ports up"]
    assert describe(plan("bandwidth=1gbit")) == []


def test_restore_is_the_built_network():
    p = plan("bandwidth=1gbit,straggler=1:link=0.5,outage=1s:at=1s")
    back = restore(p)
    assert back.up is True and tuple(r for _, r in back.rates) == built_state(p).rates
    assert state_at(p, Condition()) == built_state(p)
    assert state_at(p, Condition(down=True)).up is False


class Recorder:
    def __init__(self, fail_at=None):
        self.calls, self.closed, self.fail_at = [], False, fail_at
        self.t0 = None

    def set_rate(self, port, rate):
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            self.fail_at = None
            raise OSError(22, "refused by the test")
        self.calls.append((round(time.monotonic() - self.t0, 2), "rate", port.node, port.direction, rate.rate))

    def set_up(self, up):
        self.calls.append((round(time.monotonic() - self.t0, 2), "up" if up else "down"))

    def close(self):
        self.closed = True


def test_the_controller_applies_each_change_at_its_time_then_restores():
    p = plan("bandwidth=1gbit,drop=100mbit:for=0.4s:at=0.2s,outage=0.2s:at=0.8s")
    links = Recorder()
    seen = []
    ctl = Controller(p, links, on_change=seen.append)
    links.t0 = time.monotonic()
    ctl.start(links.t0)
    time.sleep(1.3)
    ctl.close()
    assert ctl.error is None and len(seen) == 4 and [a.change.at for a in seen] == pytest.approx([0.2, 0.6, 0.8, 1.0])
    assert all(0 <= a.late < 0.15 and a.seconds >= 0 for a in seen)  # a busy CI host wakes threads late
    kinds = [c[1:] for c in links.calls]
    assert kinds[:4] == [("rate", 0, "upload", 1e8), ("rate", 0, "download", 1e8), ("rate", 1, "upload", 1e8),
                         ("rate", 1, "download", 1e8)]
    assert kinds[8:10] == [("down",), ("up",)]
    assert abs(links.calls[0][0] - 0.2) < 0.15 and abs(links.calls[8][0] - 0.8) < 0.15
    # close: the built rates on every port and the ports up, then the sockets closed
    assert kinds[10:] == [("rate", n, d, 1e9) for n in (0, 1) for d in ("upload", "download")] + [("up",)]
    assert links.closed and not any(t.name == "gradwire-emulate-schedule" for t in threading.enumerate())
    ctl.close()  # idempotent
    assert len(links.calls) == 15


def test_the_controller_stops_at_a_failed_change_and_says_which():
    p = plan("bandwidth=1gbit,drop=100mbit:for=1s:at=0s")
    links = Recorder(fail_at=1)
    links.t0 = time.monotonic()
    ctl = Controller(p, links)
    ctl.start(links.t0)
    deadline = time.monotonic() + 5
    while ctl.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctl.error.startswith("t=0.000s: 100 Mbit/s on every link failed: OSError")
    assert "refused by the test" in ctl.error
    ctl.close()  # the half-made change is undone: every port back at its built rate
    assert ctl.applied == [] and links.closed
    assert [c[1:] for c in links.calls[1:]] == [("rate", n, d, 1e9) for n in (0, 1) for d in ("upload", "download")] \
        + [("up",)]


def test_a_closed_controller_never_changes_anything():
    p = plan("bandwidth=1gbit,drop=100mbit:for=1s:at=5s")
    links = Recorder()
    links.t0 = time.monotonic()
    ctl = Controller(p, links)
    ctl.start(links.t0)
    ctl.close()  # before the first change: the thread stops at once, nothing to restore
    assert links.calls == [] and links.closed


def test_apply_orders_down_rates_up():
    p = plan("bandwidth=1gbit,outage=1s:at=1s")
    links = Recorder()
    links.t0 = time.monotonic()
    apply(links, p, restore(p))
    assert [c[1] for c in links.calls] == ["rate"] * 4 + ["up"]
    assert math.isinf(restore(p).at)


def _take(it, n):
    for _, x in zip(range(n), it):
        yield x


def test_a_new_kind_that_sets_a_rate_is_refused_on_an_unshaped_network_by_its_stage():
    """The refusal asks each change's stage, not a list of kinds: one registered later is covered."""
    from dataclasses import dataclass, replace

    from gradwire.net.schedule import CHANGE_KINDS, RATE, NetworkChange, register_change

    @register_change
    @dataclass(frozen=True)
    class Halve(NetworkChange):
        key = "halve"
        stage = RATE

        @classmethod
        def parse(cls, head, rest):
            return cls()

        def state(self, t):
            return t >= 1.0, 1.0 if t < 1.0 else math.inf

        def apply(self, cond, bandwidth):
            return replace(cond, bandwidth=bandwidth / 2)

        def to_string(self):
            return "halve=1"

    try:
        with pytest.raises(Unsupported, match="halve= change the rate of a shaper, and this network has none"):
            plan("halve=1")
        plan("bandwidth=1gbit,halve=1")
    finally:
        CHANGE_KINDS.pop("halve", None)
