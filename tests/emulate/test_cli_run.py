"""``gradwire emulate`` end to end (root): torchrun nodes in namespaces, gloo over shaped links, teardown on every exit."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradwire.emulate import netlink
from gradwire.emulate.host import pids_inside
from gradwire.emulate.layout import PREFIX

WORKER = str(Path(__file__).parent / "worker.py")
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
GRADWIRE = [sys.executable, "-m", "gradwire.cli.main", "emulate"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def sets_of(pid: int) -> list[str]:
    return [n for n in netlink.namespaces() if n.startswith(f"{PREFIX}{pid}-")]


def start_running(args: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """Start ``gradwire emulate`` and return once a worker runs inside every node namespace."""
    proc = subprocess.Popen([*GRADWIRE, *args], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = [n for n in sets_of(proc.pid) if not n.endswith("-sw")]
        # the agent and its worker: two processes in each node
        if len(nodes) == 2 and all(len(pids_inside(n)) >= 2 for n in nodes):
            return proc, sets_of(proc.pid)
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the workers did not start within 60 s")


@pytest.mark.slow
def test_kill_9_leaves_a_set_that_the_next_run_removes_before_running_on_shaped_links(caps, tmp_path, no_leftovers):
    victim, victim_sets = start_running(["--net", "bandwidth=100mbit", "--nodes", "2", "--", *SLEEPER])
    victim.kill()  # SIGKILL: no handler runs, the namespaces stay
    victim.wait()
    assert sets_of(victim.pid) == victim_sets

    nbytes = 2 << 20
    proc = subprocess.run([*GRADWIRE, "--net", "bandwidth=100mbit,topology=2x1", "--timeout", "90", "--",
                           sys.executable, WORKER, str(tmp_path), str(nbytes)],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"removed stale namespace(s) of killed runs: {', '.join(victim_sets)}" in proc.stderr
    assert sets_of(victim.pid) == []
    assert "gradwire emulate: real packets: " in proc.stderr  # what the packets met, read before teardown
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["correct"] and r["world"] == 2 and r["group_rank"] == r["rank"] and r["topology"] == [2, 1]
        assert r["ifname"] == "gw-eth" and r["master_addr"] == "10.250.0.1"
        assert r["emulated_net"] == "bandwidth=100mbit"
    # gloo's ring all_reduce on 2 ranks sends the whole buffer once over the 100 Mbit/s link;
    # unshaped, 2 MB between namespaces takes a few milliseconds
    model = nbytes / (100e6 / 8 * 1448 / 1514)
    seconds = max(r["seconds"] for r in ranks)
    assert 0.85 < seconds / model < 1.4, (seconds, model)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_nodes_and_removes_the_network(caps, signum, no_leftovers):
    proc, sets = start_running(["--net", "bandwidth=1gbit", "--nodes", "2", "--", *SLEEPER])
    inside = [pid for n in sets for pid in pids_inside(n)]
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == 128 + signum
    assert sets_of(proc.pid) == []
    assert not [pid for pid in inside if os.path.exists(f"/proc/{pid}")], "a process of the run survived"


def test_a_spec_the_kernel_cannot_do_is_refused_before_anything_is_built(caps, capsys, no_leftovers):
    from gradwire.cli.main import main

    if "netem" in caps.qdiscs:
        pytest.skip("this kernel has netem: latency can be emulated")
    assert main(["emulate", "--net", "1gbe", "--nodes", "2", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "latency=50us needs the netem qdisc" in err
