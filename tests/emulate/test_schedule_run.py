"""A changing network on real links (root): rates change under a running TCP stream, gloo survives an outage."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradwire.emulate import Emulation, netlink
from gradwire.emulate.agents import start_agent
from gradwire.emulate.controller import Controller
from gradwire.emulate.host import this_run
from gradwire.emulate.layout import Layout
from gradwire.emulate.plan import plan_network
from gradwire.net import parse_spec

HERE = Path(__file__).parent
METER = str(HERE / "tcp_meter.py")
WORKER = str(HERE / "outage_worker.py")
GRADWIRE = [sys.executable, "-m", "gradwire.cli.main", "emulate"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
PAYLOAD = 1448 / 1514  # TCP payload per byte of Ethernet frame (the model's tcp framing)


def applied_end(line: str) -> float:
    """When a change the controller printed was in place: ``(applied at 14.002s, in 3.1 ms)`` -> 14.0051."""
    began, took = re.search(r"\(applied at ([0-9.]+)s, in ([0-9.]+) ms\)", line).groups()
    return float(began) + float(took) / 1e3


def rate_between(marks, t0, a, b):
    """Payload bits/s the receiver got between ``a`` and ``b`` seconds after ``t0``."""
    inside = [(t - t0, n) for t, n in marks if a <= t - t0 <= b]
    (ta, na), (tb, nb) = inside[0], inside[-1]
    return (nb - na) * 8 / (tb - ta)


@pytest.mark.parametrize("kind, event", [("htb", "drop=25mbit"), ("tbf", "drop=25mbit"), ("htb", "slow=0:link=0.25")])
def test_a_drop_mid_stream_is_the_rate_the_packets_get(caps, kind, event, tmp_path, no_leftovers):
    if kind not in caps.qdiscs:
        pytest.skip(f"this kernel has no {kind}")
    lay = Layout(2, 1, this_run())
    # slow=0: node 0's uplink alone, which carries the stream from node 0 to node 1
    plan = plan_network(parse_spec(f"bandwidth=100mbit,{event}:for=2.5s:at=2.5s"), lay, caps, limiter=kind)
    out = tmp_path / "marks.json"
    with Emulation(plan):
        controller = Controller(plan, netlink.Links(plan))
        try:
            controller.prime()
            t0 = time.monotonic()
            recv = start_agent(lay.node_ns(1), [sys.executable, METER, "recv", str(lay.address(1).ip), "5001",
                                                str(out)], {})
            send = start_agent(lay.node_ns(0), [sys.executable, METER, "send", str(lay.address(1).ip), "5001",
                                                "7.5"], {})
            controller.start(t0)  # after the agents' start: no thread while this process forks them
            assert send.wait(timeout=30) == 0 and recv.wait(timeout=30) == 0
        finally:
            controller.close()
        assert controller.error is None and [a.change.at for a in controller.applied] == [2.5, 5.0]
        print("changes applied in", [f"{a.seconds * 1e3:.1f} ms, {a.late * 1e3:.1f} ms late" for a in controller.applied])
        assert all(a.late < 0.5 and a.seconds < 1.0 for a in controller.applied)
        assert len(controller.applied[0].change.rates) == (1 if event.startswith("slow") else 4)
    marks = json.loads(out.read_text())
    # the rate of each stretch, from half a second after its change was made (the old rate's queue drains first)
    done = [a.began + a.seconds + 0.5 for a in controller.applied]
    for (a, b), line in (((0.7, 2.4), 100e6), ((done[0], 4.9), 25e6), ((done[1], 7.4), 100e6)):
        got = rate_between(marks, t0, a, b)
        assert abs(got / (line * PAYLOAD) - 1) < 0.1, (a, b, got, line * PAYLOAD)


def test_gloo_resumes_after_an_outage_and_the_network_is_restored(caps, tmp_path, no_leftovers):
    # the outage starts well after the group exists (torch's import and the rendezvous take seconds here: 5-8 s
    # quiet, 13 s on a busy run of the suite)
    at, length, late = 20.0, 1.5, 3.0
    # TCP's backed-off retransmission timers (0.2, 0.4, 0.8, 1.6, 3.2 s) may first find the links up again several
    # seconds after the outage; on a busy host the restore itself may land late. The calls go on past the latest
    # resumption allowed (a restore up to `late` s late), so that calls after it run
    until = at + 2 * (length + late) + 4.0
    proc = subprocess.run(
        [*GRADWIRE, "--net", f"bandwidth=100mbit,outage={length}s:at={at}s", "--nodes", "2", "--timeout", "120", "--",
         sys.executable, WORKER, str(tmp_path), str(1 << 20), str(until)],
        env=ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "switch port" in ln]
    assert "schedule from t=0" in proc.stderr and len(lines) == 4, proc.stderr  # --plan's two lines, then applied
    assert lines[2].startswith(f"gradwire emulate: t={at:.3f}s: every switch port down (outage) (applied at ")
    down, up = (applied_end(line) for line in lines[2:4])
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(ranks) == 2
    for r in ranks:
        assert r["group_at"] < at - 2, "the group came up too late to meet the outage"
        calls = r["calls"]
        assert all(ok for _, _, ok in calls)
        across = [(b, e) for b, e, _ in calls if b < at + length and e > at]
        assert across, "no call met the outage"
        # the calls that met the outage ended after it: they waited and resumed on the same connections, at the
        # first retransmission after the links were up again. A retransmission timer doubles, so the next one
        # after the restore comes within the time the connection has been backing off (since the links went
        # down), plus the first timeout and the call's own transfer: 1.5 s of slack
        resumed = max(e for _, e in across) - up
        print(f"rank {r['rank']}: group at {r['group_at']:.2f} s; links down at {down:.2f} s, up at {up:.2f} s; "
              f"calls resumed {resumed:.2f} s after")
        assert up - (at + length) < late, f"the restore landed {up - at - length:.2f} s late: the host is too busy"
        assert 0 < resumed < (up - down) + 1.5, across  # TCP's backoff, not a reconnect or a timeout of gloo's
        after = [(b, e) for b, e, _ in calls if b > at + length]
        assert calls[-1][1] > until and len(after) >= 3, after
    assert "after a timeout" in proc.stderr  # what the packets met says the outage cost retransmission timeouts


def test_sigterm_during_an_outage_restores_and_removes_everything(caps, no_leftovers):
    proc = subprocess.Popen([*GRADWIRE, "--net", "bandwidth=100mbit,outage=60s:at=0.5s", "--nodes", "2", "--",
                             sys.executable, "-c", "import time; time.sleep(120)"], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not [n for n in netlink.namespaces() if n.startswith(f"gw-{proc.pid}-")] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # the outage has begun
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "every switch port down (outage) (applied at" in err
    assert [n for n in netlink.namespaces() if n.startswith(f"gw-{proc.pid}-")] == []


def test_a_change_the_kernel_refuses_stops_the_run_and_says_which(caps, monkeypatch, no_leftovers):
    from gradwire.emulate import prepare, run
    from gradwire.emulate.host import EmulationUnavailable

    real = netlink.Links.set_rate
    calls = []

    def refuse_the_schedule(self, port, rate):
        calls.append(rate.rate)
        if len(calls) == 5:  # prime's four ports pass, the first change of the schedule fails
            raise OSError(95, "refused by the test")
        real(self, port, rate)

    monkeypatch.setattr(netlink.Links, "set_rate", refuse_the_schedule)
    plan, _ = prepare(parse_spec("bandwidth=100mbit,drop=50mbit:for=5s:at=0.5s"), 2, 1)
    t0 = time.monotonic()
    with pytest.raises(EmulationUnavailable, match=r"t=0\.500s: 50 Mbit/s on every link failed: OSError.*refused by "
                                                   r"the test.*the run was stopped"):
        run(plan, [sys.executable, "-c", "import time; time.sleep(60)"], grace=5)
    assert time.monotonic() - t0 < 40
    # the half-made change was undone before teardown: every port back at 100 Mbit/s
    assert calls[5:] == [100e6] * 4
