"""The doctor's verdict from fabricated rank reports (no processes needed)."""
from __future__ import annotations

from dataclasses import replace

from gradwire.bench.doctor import FAIL, OK, WARN, Probe, RankInfo, collect_info, gloo_interface, verdict


def _info(rank: int, **kw) -> RankInfo:
    base = RankInfo(rank, "node0", 100 + rank, "3.11.7", "2.13.0", "0.1.0", {"gloo": True, "nccl": False, "mpi": False},
                    None, None, 0, "eth0", "hostname 'node0' resolves to 10.0.0.1", "10.0.0.1", "eth0")
    return replace(base, **kw)


def _status(checks, name: str) -> str:
    return next(c.status for c in checks if c.name == name)


def test_healthy_ranks_pass() -> None:
    checks = verdict([_info(0), _info(1)], [Probe(0, 1, 50e-6, 1e9)], True)
    assert all(c.status == OK for c in checks), checks


def test_version_mismatch_fails_and_names_the_ranks() -> None:
    checks = verdict([_info(0), _info(1, torch="2.12.0")], [Probe(0, 1, 50e-6, 1e9)], True)
    bad = next(c for c in checks if c.name == "torch version")
    assert bad.status == FAIL and "2.12.0 on ranks [1]" in bad.detail
    assert _status(checks, "python version") == OK


def test_failed_probe_wrong_allreduce_and_missing_gloo_fail() -> None:
    checks = verdict([_info(0), _info(1, backends={"gloo": False, "nccl": False, "mpi": False})],
                     [Probe(0, 1, error="RuntimeError: timed out")], False)
    assert _status(checks, "probe 0<->1") == FAIL
    assert _status(checks, "all_reduce on gloo") == FAIL
    assert _status(checks, "backend gloo") == FAIL


def test_loopback_interface_warns_across_hosts() -> None:
    lo = dict(iface="lo", address="127.0.1.1")
    checks = verdict([_info(0, **lo), _info(1, host="node1", **lo)], [Probe(0, 1, 50e-6, 1e9)], True)
    assert _status(checks, "gloo interface rank 1") == WARN


def test_collect_info_and_interface_here(monkeypatch) -> None:
    info = collect_info(0)
    assert info.backends["gloo"] and info.gradwire_backend
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert gloo_interface()[:2] == ("lo", "GLOO_SOCKET_IFNAME")
