"""The alpha-beta fit: exact on synthetic points, and recovers a simulated network's alpha and beta."""
from __future__ import annotations

import pytest

from gradwire.bench.config import BenchConfig
from gradwire.bench.driver import BenchResult, BenchRow
from gradwire.bench.fit import fit_points, fit_result, terms
from gradwire.net import NetworkModel, parse_spec


def test_terms_are_the_algorithm_coefficients() -> None:
    n = 1 << 20
    assert terms("all_reduce", "ring", 2, n) == pytest.approx((2, n))
    assert terms("all_reduce", "ring", 4, n) == pytest.approx((6, 1.5 * n))
    assert terms("all_gather", "ring", 4, n) == pytest.approx((3, 0.75 * n))
    assert terms("all_to_all", "ring", 4, n) == pytest.approx((3, 0.75 * n))  # ring has none: pairwise
    assert terms("sendrecv", "ring", 2, n) == pytest.approx((1, n))  # send and recv overlap (full duplex)
    model = NetworkModel("1gbe", 2)  # auto picks recursive doubling at p = 2: one step
    assert terms("all_reduce", "auto", 2, n, model) == pytest.approx((1, n))
    with pytest.raises(ValueError, match="unknown algorithm"):
        terms("all_reduce", "butterfly", 2, n)


def test_fit_points_recovers_exact_parameters() -> None:
    alpha, beta = 50e-6, 1 / 117e6
    pts = [(2, n, 2 * alpha + n * beta) for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22)]
    f = fit_points(pts)
    assert f.alpha == pytest.approx(alpha, rel=1e-9)
    assert f.beta == pytest.approx(beta, rel=1e-9)
    assert f.rms_error < 1e-9 and f.points == 4


def test_fit_points_never_negative() -> None:
    f = fit_points([(1, 1000, 1.0), (1, 2000, 0.9)])  # time falls with size: no positive alpha, beta fits
    assert f.alpha >= 0 and f.beta >= 0


def test_fit_needs_two_sizes() -> None:
    with pytest.raises(ValueError, match="at least two different sizes"):
        fit_points([(1, 1000, 1.0)], "all_reduce")


# all_reduce at p = 4 (tests/net/textbook.py): (steps, bytes / n) of each algorithm
_ALL_REDUCE_P4 = {"ring": (6, 1.5), "tree": (4, 4), "recursive_doubling": (2, 2), "rabenseifner": (4, 1.5)}


def _synthetic(spec: str, alpha: float, beta: float, algorithm: str) -> BenchResult:
    """A 4-rank all_reduce sweep whose times are the textbook costs (auto: the cheapest algorithm)."""
    def seconds(n: int) -> float:
        algs = _ALL_REDUCE_P4 if algorithm == "auto" else {algorithm: _ALL_REDUCE_P4[algorithm]}
        return min(steps * alpha + volume * n * beta for steps, volume in algs.values())

    rows = [BenchRow("all_reduce", n, n // 4, "float", "sum", -1, "in-place", seconds(n) * 1e6, None, None, 0)
            for n in (1 << 12, 1 << 16, 1 << 20, 1 << 24)]
    return BenchResult(BenchConfig(), 4, "gradwire", parse_spec(spec), True, [], rows)


@pytest.mark.parametrize("spec, alpha, beta, algorithm", [
    ("bandwidth=1gbit,latency=2ms,protocol=none", 2e-3, 8 / 1e9, "auto"),
    ("10gbe,algorithm=ring", 20e-6, 8 / 10e9 * 1514 / 1448, "ring"),
    ("1gbe", 50e-6, 8 / 1e9 * 1514 / 1448, "auto"),
])
def test_fitted_spec_reproduces_the_model(spec: str, alpha: float, beta: float, algorithm: str) -> None:
    fit = fit_result(_synthetic(spec, alpha, beta, algorithm))
    truth = parse_spec(spec)
    fitted = parse_spec(fit.spec)
    assert fit.overall.alpha == pytest.approx(alpha, rel=1e-6)
    assert fit.overall.beta == pytest.approx(beta, rel=1e-6)
    assert fit.overall.rms_error < 1e-9
    assert fitted.latency == pytest.approx(truth.latency, rel=1e-3)
    assert fitted.bandwidth == pytest.approx(truth.bandwidth, rel=1e-3)
    assert fitted.protocol == truth.protocol
    assert "fitted network: --net" in fit.format()


@pytest.mark.slow
def test_fit_recovers_a_simulated_network(tmp_path) -> None:
    """2 ranks on a virtual-clock network with known alpha and beta; the fit is within 5 %."""
    from gradwire.cli.main import main

    out = tmp_path / "fit.json"
    # latency well above gloo's own ~1-2 ms on a busy loopback: the clock shows max(model, real)
    spec = "bandwidth=100mbit,latency=10ms,protocol=none,clock=virtual"
    rc = main(["bench", "--backend", "gradwire", "--net", spec, "-b", "4K", "-e", "1M", "-f", "4",
               "-n", "3", "-w", "1", "-c", "0", "--fit", "--json", str(out)])
    assert rc == 0
    import json

    fit = json.loads(out.read_text())["fit"]["overall"]
    assert fit["alpha"] == pytest.approx(10e-3, rel=0.05)
    assert 8 / fit["beta"] == pytest.approx(100e6, rel=0.05)
