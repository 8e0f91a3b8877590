"""What the host says: privileges, process start times, the processes inside a namespace (``/proc`` reads).

Traps:

- A network namespace outlives the removal of its name while any process is
  still inside it, and its interfaces with it. Removing a stale set therefore
  kills what runs inside first (:func:`kill_inside`).
- The command field of ``/proc/<pid>/stat`` may hold spaces and parentheses;
  fields are counted after its last ``)``.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gradwire.emulate.layout import RunId

__all__ = ["EmulationUnavailable", "NETNS_DIR", "alive", "check_host", "host_problem", "kill_inside",
           "pids_inside", "start_time", "this_run"]

#: where ``ip netns`` and pyroute2 keep a namespace's name (a bind mount of it)
NETNS_DIR = Path("/run/netns")


class EmulationUnavailable(RuntimeError):
    """This host cannot emulate; the message is one line saying what is needed."""


def host_problem(euid: int, has_netns: bool) -> str | None:
    """Why emulation cannot run for a process with effective uid ``euid``, or None."""
    if euid != 0:
        return ("gradwire emulate needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces, "
                "veth pairs and qdiscs; run it as root")
    if not has_netns:
        return "gradwire emulate needs a kernel with network namespaces (CONFIG_NET_NS): /proc/self/ns/net is missing"
    return None


def check_host() -> None:
    """Raise :class:`EmulationUnavailable` if this process cannot make namespaces at all."""
    problem = host_problem(os.geteuid(), os.path.exists("/proc/self/ns/net"))
    if problem:
        raise EmulationUnavailable(problem)


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22; fields after comm start at 3


def this_run() -> RunId:
    """The run id of this process."""
    start = start_time(os.getpid())
    assert start is not None
    return RunId(os.getpid(), start)


def alive(run: RunId) -> bool:
    """Whether the process that owns ``run`` still exists (the same process, not a recycled pid)."""
    return start_time(run.pid) == run.start


def _inode(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pids_inside(namespace: str) -> list[int]:
    """Processes whose network namespace is ``namespace`` (by name under :data:`NETNS_DIR`)."""
    target = _inode(NETNS_DIR / namespace)
    if target is None:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _inode(entry / "ns" / "net") == target:
            pids.append(int(entry.name))
    return pids


def kill_inside(namespace: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process inside ``namespace``; wait up to ``timeout`` s for them to go. Returns the pids."""
    pids = pids_inside(namespace)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.02)
    return pids


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie holds no namespace)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] != "Z"
