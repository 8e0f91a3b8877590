"""``gradwire profile``'s report on a network that changes: the steps' spread beside their mean."""
from gradwire.cli.profile import report
from gradwire.net import parse_spec


def _rank(rank: int, steps: list[float]) -> dict:
    ops = {"all_reduce": {"calls": 3, "payload_bytes": 1000, "wire_bytes": 1100, "model_seconds": 0.1,
                          "inner_seconds": 0.01, "exposed_seconds": 0.05}}
    return {"rank": rank, "wall_seconds": sum(steps), "comm_seconds": 0.1, "exposed_seconds": 0.05,
            "hidden_seconds": 0.05, "ops": ops, "steps": [{"step": s} for s in steps]}


def test_a_changing_network_reports_the_steps_p50_p95_and_max(capsys) -> None:
    steps = [0.010] * 18 + [0.050, 0.200]
    report([_rank(0, steps), _rank(1, steps)], parse_spec("bandwidth=1gbit,drop=100mbit:for=5s:every=30s"))
    out = capsys.readouterr().out
    assert "rank 0: 20 steps, mean 21.5 ms, p50 10.0 / p95 50.0 / max 200.0 ms" in out
    report([_rank(0, steps)], parse_spec("1gbe"))
    assert "p95" not in capsys.readouterr().out
