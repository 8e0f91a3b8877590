"""``gradwire doctor``: do all ranks of a job run the same stack, and can they talk?

Every rank collects its versions, backends and the interface gloo will use;
the ranks then exchange that over gloo, check that an all_reduce gives the
right sum, and probe each pair with send/recv ping-pong (small messages for
latency, ~4 MB for bandwidth). :func:`verdict` turns what came back into
OK / WARN / FAIL lines; any FAIL makes the command exit non-zero.
"""
from __future__ import annotations

import fcntl
import os
import platform
import socket
import statistics
import struct
import time
from dataclasses import dataclass, field
from datetime import timedelta

__all__ = ["Check", "DoctorReport", "Probe", "RankInfo", "collect_info", "doctor_rank", "run_doctor", "verdict"]

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass
class RankInfo:
    """What one rank runs and how gloo will reach it."""

    rank: int
    host: str
    pid: int
    python: str
    torch: str
    gradwire: str
    backends: dict[str, bool]
    """gloo, nccl, mpi -> available in this torch build"""
    cuda: str | None
    """CUDA version torch was built with (None: CPU build)"""
    nccl: str | None
    gpus: int
    iface: str
    """interface gloo will use"""
    iface_source: str
    """how it was found: GLOO_SOCKET_IFNAME, or hostname resolution"""
    address: str
    default_route: str | None
    """interface of the default route, for comparison"""
    gradwire_backend: bool = True


@dataclass
class Probe:
    """Ping-pong between two ranks."""

    src: int
    dst: int
    latency_s: float | None = None
    """half the median round trip of a small message"""
    bandwidth: float | None = None
    """bytes/s of the large message: size / (median round trip / 2)"""
    error: str | None = None


@dataclass
class Check:
    """One line of the verdict."""

    name: str
    status: str
    detail: str


@dataclass
class DoctorReport:
    """Everything rank 0 learned, and the verdict."""

    infos: list[RankInfo]
    probes: list[Probe]
    allreduce_ok: bool
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)


def _iface_address(name: str) -> str | None:
    """IPv4 address of interface ``name`` (Linux ioctl SIOCGIFADDR), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def _default_route() -> str | None:
    try:
        with open("/proc/net/route") as fh:
            for line in fh.readlines()[1:]:
                parts = line.split()
                if len(parts) > 1 and parts[1] == "00000000":
                    return parts[0]
    except OSError:
        pass
    return None


def gloo_interface() -> tuple[str, str, str]:
    """``(interface, how it was chosen, address)`` as gloo picks it.

    gloo takes ``GLOO_SOCKET_IFNAME`` if set, else the address the hostname
    resolves to (loopback if it resolves there).
    """
    named = os.environ.get("GLOO_SOCKET_IFNAME")
    if named:
        first = named.split(",")[0]
        return first, "GLOO_SOCKET_IFNAME", _iface_address(first) or "no IPv4 address"
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        return "?", f"hostname {host!r} does not resolve ({exc})", "?"
    names = [n for _, n in socket.if_nameindex()]
    iface = next((n for n in names if _iface_address(n) == address), "lo" if address.startswith("127.") else "?")
    return iface, f"hostname {host!r} resolves to {address}", address


def collect_info(rank: int) -> RankInfo:
    """This process's versions, backends and network interface (no process group needed)."""
    import torch
    import torch.distributed as dist

    import gradwire

    nccl = None
    if torch.cuda.is_available() and dist.is_nccl_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a broken NCCL is reported, not fatal here
            nccl = "unavailable"
    iface, source, address = gloo_interface()
    return RankInfo(
        rank, socket.gethostname(), os.getpid(), platform.python_version(), torch.__version__, gradwire.__version__,
        {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()},
        torch.version.cuda, nccl, torch.cuda.device_count() if torch.cuda.is_available() else 0,
        iface, source, address, _default_route(), "gradwire" in dist.Backend.backend_list,
    )


def _pingpong(me: int, src: int, dst: int, nbytes: int, iters: int) -> float:
    """Median round trip of ``nbytes`` between ``src`` and ``dst``, seen from ``src``."""
    import torch
    import torch.distributed as dist

    buf = torch.full((max(nbytes // 4, 1),), float(src + 1))
    trips = []
    for i in range(iters + 2):  # two warm-up trips
        t0 = time.perf_counter()
        if me == src:
            dist.send(buf, dst)
            dist.recv(buf, dst)
        else:
            dist.recv(buf, src)
            dist.send(buf, src)
        if i >= 2:
            trips.append(time.perf_counter() - t0)
    if me == src and not bool((buf == float(src + 1)).all()):
        raise RuntimeError(f"echo from rank {dst} came back changed")
    return statistics.median(trips)


def doctor_rank(rank: int, world: int, timeout: float = 60.0, large_bytes: int = 4 << 20,
                iters: int = 10, external: bool = False) -> DoctorReport:
    """One rank's part: exchange infos, check all_reduce, probe every pair."""
    import torch
    import torch.distributed as dist

    info = collect_info(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    try:
        infos: list = [None] * world
        dist.all_gather_object(infos, info)
        t = torch.full((1024,), float(rank + 1))
        dist.all_reduce(t)
        allreduce_ok = bool((t == world * (world + 1) / 2).all())
        probes = []
        for src in range(world):
            for dst in range(src + 1, world):
                probe = Probe(src, dst)
                if rank in (src, dst):
                    try:
                        small = _pingpong(rank, src, dst, 4, iters)
                        large = _pingpong(rank, src, dst, large_bytes, max(iters // 2, 2))
                        probe.latency_s, probe.bandwidth = small / 2, large_bytes / (large / 2)
                    except Exception as exc:  # noqa: BLE001 - a failed probe is a verdict line
                        probe.error = f"{type(exc).__name__}: {exc}"
                probes.append(probe)
                dist.barrier()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, probes)
        # each pair is measured by its src rank
        merged = [next(p for p in gathered[pr.src] if (p.src, p.dst) == (pr.src, pr.dst)) for pr in probes]
        report = DoctorReport(list(infos), merged, allreduce_ok)
        report.checks = verdict(report.infos, report.probes, allreduce_ok)
        return report
    finally:
        if external:
            dist.destroy_process_group()


def run_doctor(world_size: int = 2, timeout: float = 60.0, large_bytes: int = 4 << 20) -> DoctorReport:
    """Spawn ``world_size`` ranks (or be one rank under torchrun) and return rank 0's report."""
    from gradwire.bench.driver import under_torchrun

    if under_torchrun():
        return doctor_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout, large_bytes, external=True)
    if world_size < 2:
        raise ValueError(f"doctor needs a world size >= 2 to probe pairs, got {world_size}")
    from gradwire.launch import spawn

    return spawn(doctor_rank, world_size, (timeout, large_bytes), timeout=timeout * (world_size + 2))[0]


def _same(infos: list[RankInfo], what: str, attr: str, status_if_differ: str = FAIL) -> Check:
    values: dict[str, list[int]] = {}
    for i in infos:
        value = getattr(i, attr)
        values.setdefault("none" if value is None else str(value), []).append(i.rank)
    if len(values) == 1:
        return Check(what, OK, f"{next(iter(values))} on all {len(infos)} ranks")
    detail = "; ".join(f"{v} on ranks {ranks}" for v, ranks in values.items())
    return Check(what, status_if_differ, f"differs: {detail}")


def verdict(infos: list[RankInfo], probes: list[Probe], allreduce_ok: bool) -> list[Check]:
    """The verdict lines for what the ranks reported (pure: testable without processes)."""
    checks = [_same(infos, "python version", "python"), _same(infos, "torch version", "torch"),
              _same(infos, "gradwire version", "gradwire")]
    checks.append(_same(infos, "CUDA (torch build)", "cuda"))
    checks.append(_same(infos, "NCCL version", "nccl"))
    for name in ("gloo", "nccl", "mpi"):
        have = [i.rank for i in infos if i.backends.get(name)]
        if len(have) == len(infos):
            checks.append(Check(f"backend {name}", OK, "available on all ranks"))
        elif not have:
            checks.append(Check(f"backend {name}", FAIL if name == "gloo" else OK, "not in this torch build"))
        else:
            checks.append(Check(f"backend {name}", FAIL, f"only on ranks {have}"))
    missing = [i.rank for i in infos if not i.gradwire_backend]
    checks.append(Check("backend gradwire", FAIL if missing else OK,
                        f"not registered on ranks {missing}" if missing else "registered on all ranks"))
    hosts = {i.host for i in infos}
    for i in infos:
        loop = i.iface == "lo" or i.address.startswith("127.")
        status = WARN if loop and len(hosts) > 1 else (FAIL if i.iface == "?" else OK)
        checks.append(Check(f"gloo interface rank {i.rank}", status,
                            f"{i.iface} ({i.iface_source}); default route via {i.default_route or 'none'}"))
    checks.append(Check("all_reduce on gloo", OK if allreduce_ok else FAIL,
                        "sum is correct" if allreduce_ok else "returned a wrong sum"))
    for p in probes:
        if p.error or p.latency_s is None or p.bandwidth is None:
            checks.append(Check(f"probe {p.src}<->{p.dst}", FAIL, p.error or "no measurement"))
        else:
            checks.append(Check(f"probe {p.src}<->{p.dst}", OK,
                                f"latency {p.latency_s * 1e6:.0f} us, bandwidth {p.bandwidth / 1e9:.3f} GB/s"))
    return checks
