"""The network a plan builds (root): qdiscs where planned, TCP at the shaped rate, nothing left behind."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradwire.emulate import Emulation, netlink
from gradwire.emulate.agents import start_agent
from gradwire.emulate.host import pids_inside, start_time, this_run
from gradwire.emulate.layout import Layout, RunId
from gradwire.emulate.plan import plan_network
from gradwire.emulate.runner import clean
from gradwire.net import parse_spec

PAIR = str(Path(__file__).parent / "tcp_pair.py")


def test_probe_finds_a_rate_limiter(caps):
    assert caps.qdiscs <= {"tbf", "htb", "netem"}
    assert caps.qdiscs & {"tbf", "htb"}, caps.describe()


def transfer_seconds(lay: Layout, nbytes: int, out: Path, both_ways: bool = False) -> list[float]:
    """Send ``nbytes`` over TCP from node 0 to node 1 (and at once from 1 to 0); return each sender's seconds."""
    pairs = [(0, 1), (1, 0)] if both_ways else [(0, 1)]
    recv = [start_agent(lay.node_ns(dst), [sys.executable, PAIR, "recv", str(lay.address(dst).ip), f"500{dst}"], {})
            for _, dst in pairs]
    send = [start_agent(lay.node_ns(src), [sys.executable, PAIR, "send", str(lay.address(dst).ip), f"500{dst}",
                                           str(nbytes), str(out / f"from{src}")], {}) for src, dst in pairs]
    assert all(p.wait(timeout=30) == 0 for p in send + recv)
    return [float((out / f"from{src}").read_text()) for src, _ in pairs]


@pytest.mark.parametrize("kind", ["tbf", "htb"])
def test_links_carry_tcp_at_the_shaped_rate_and_go_away(caps, kind, tmp_path, no_leftovers):
    if kind not in caps.qdiscs:
        pytest.skip(f"this kernel has no {kind}")
    lay = Layout(2, 1, this_run())
    plan = plan_network(parse_spec("bandwidth=100mbit"), lay, caps, limiter=kind)
    with Emulation(plan):
        assert set(lay.namespaces) <= set(netlink.namespaces())
        for port in plan.ports:
            assert netlink.qdisc_kinds(port.namespace, port.device)[0] == kind
        nbytes = 2 << 20
        (seconds,) = transfer_seconds(lay, nbytes, tmp_path)
        if kind == "htb":  # ACKs first: data both ways at once still gets the link rate each way
            both = transfer_seconds(lay, nbytes, tmp_path, both_ways=True)
        # what the packets met: the namespaces' own TCP counters, at least the 2 MB in MSS-sized segments
        met = netlink.traffic(plan)
        assert met.segments >= nbytes // 65536 and met.timeouts == 0 and met.shaper_drops == 0
        assert met.describe().startswith(f"real packets: {met.segments} TCP segments sent")
    # payload at 1448 of every 1514 bytes; the bucket's head start is 32 KiB (1.6 %)
    model = nbytes / (100e6 / 8 * 1448 / 1514)
    assert 0.9 < seconds / model < 1.25, (seconds, model)
    if kind == "htb":
        assert all(0.9 < t / model < 1.25 for t in both), (both, model)
    assert not set(lay.namespaces) & set(netlink.namespaces())


def test_a_failed_build_leaves_nothing(caps, monkeypatch, no_leftovers):
    lay = Layout(2, 1, this_run())
    plan = plan_network(parse_spec("bandwidth=100mbit"), lay, caps)
    shaped = []

    def fail_third(port):
        if len(shaped) == 2:
            raise RuntimeError("refused by the test")
        shaped.append(port)
        real_shape(port)

    real_shape = netlink._shape
    monkeypatch.setattr(netlink, "_shape", fail_third)
    with pytest.raises(RuntimeError, match="refused by the test"):
        with Emulation(plan):
            pass
    assert not set(lay.namespaces) & set(netlink.namespaces())


def test_a_stale_set_and_what_runs_inside_are_removed(caps):
    gone = subprocess.Popen(["sleep", "30"])
    dead = RunId(gone.pid, start_time(gone.pid))
    gone.kill()
    gone.wait()
    lay = Layout(1, 1, dead)
    plan = plan_network(parse_spec("bandwidth=100mbit"), lay, caps)
    netlink.build(plan)  # as a run killed with -9 would leave it
    live = Layout(1, 1, this_run())
    inside = start_agent(lay.node_ns(0), ["sleep", "60"], {})
    try:
        with Emulation(plan_network(parse_spec("bandwidth=100mbit"), live, caps)):
            deadline = time.monotonic() + 5
            while not pids_inside(lay.node_ns(0)) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert pids_inside(lay.node_ns(0)) == [inside.pid]
            assert set(lay.namespaces) <= set(netlink.stale())
            assert not set(live.namespaces) & set(netlink.stale())  # a live run's set is not stale
            removed = clean()
            assert set(lay.namespaces) <= set(removed) and not set(live.namespaces) & set(removed)
            assert inside.wait(timeout=5) == -signal.SIGKILL
            assert not set(lay.namespaces) & set(netlink.namespaces())
            assert set(live.namespaces) <= set(netlink.namespaces())
    finally:
        inside.kill()
        netlink.teardown(lay)


def test_traffic_says_when_the_model_would_miss_time():
    clean_run = netlink.Traffic(segments=1000, retransmitted=3, timeouts=0, shaper_drops=0, link_drops=0,
                                probes=2, duplicates=1)
    assert clean_run.describe() == ("real packets: 1000 TCP segments sent, 3 resent (0 after a timeout, "
                                    "2 tail-loss probes; 1 received twice); dropped: 0 by the shapers, 0 by the links")
    lossy = netlink.Traffic(segments=1000, retransmitted=40, timeouts=2, shaper_drops=37, link_drops=0)
    assert lossy.describe().endswith("(time the model of a spec without loss does not price)")
