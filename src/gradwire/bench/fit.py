"""Fit the alpha-beta model to a sweep, so the simulator can be calibrated on a real cluster.

Every row of a sweep gives one equation ``t = alpha * a + beta * v``, where
``a`` is the number of sequential latency steps and ``v`` the bytes the
busiest rank serialises under the collective's algorithm at that size and
world size (the cost functions of :mod:`gradwire.net.algorithms`, evaluated on
unit links). Both are known, so alpha and beta come out of a linear least
squares fit. The residuals are relative (each equation divided by its ``t``):
small messages then pin alpha and large ones beta, instead of the largest
message deciding everything.

The fitted spec prices each op with the same algorithm the fit assumed, so
feeding it back to ``--net`` reproduces the fitted times; use it for what-if
runs (other world sizes, compression) on a model of your own cluster.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from gradwire.bench.collectives import COLLECTIVES
from gradwire.bench.driver import BenchResult
from gradwire.net import ALGORITHMS, DEFAULT_ALGORITHM, FRAMINGS, NetworkModel
from gradwire.net.algorithms import Group, choose
from gradwire.net.link import Link

__all__ = ["Fit", "OpFit", "fit_result", "fit_points", "terms"]

_LATENCY_UNIT = Link(math.inf, 1.0, "none")  # 1 s per step, free bytes: cost = steps
_BYTE_UNIT = Link(8.0, 0.0, "none")  # 1 s per byte, no latency: cost = serialised bytes


@dataclass(frozen=True)
class OpFit:
    """alpha and beta of one op (or of all ops together, ``op == "all"``)."""

    op: str
    alpha: float
    """latency per step, seconds"""
    beta: float
    """seconds per payload byte"""
    rms_error: float
    """root mean square of the relative residuals ``model / measured - 1``"""
    max_error: float
    """largest absolute relative residual"""
    points: int


@dataclass(frozen=True)
class Fit:
    """The fit of a sweep and the network spec it implies."""

    per_op: tuple[OpFit, ...]
    overall: OpFit
    algorithm: str
    protocol: str
    world_size: int

    @property
    def bandwidth(self) -> float:
        """Line rate in bits/s that gives payload rate ``1 / beta`` under :attr:`protocol`."""
        if self.overall.beta <= 0:
            return math.inf
        return 8.0 / self.overall.beta / FRAMINGS[self.protocol].efficiency

    @property
    def spec(self) -> str:
        """A ready ``--net`` spec from the overall fit."""
        parts = [f"bandwidth={_sig(self.bandwidth / 1e9)}gbit" if math.isfinite(self.bandwidth) else "bandwidth=inf",
                 f"latency={_sig(self.overall.alpha * 1e6)}us", f"protocol={self.protocol}"]
        if self.algorithm != "auto":
            parts.append(f"algorithm={self.algorithm}")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"per_op": [asdict(f) for f in self.per_op], "overall": asdict(self.overall),
                "algorithm": self.algorithm, "protocol": self.protocol, "world_size": self.world_size,
                "bandwidth_bits": self.bandwidth, "spec": self.spec}

    def format(self) -> str:
        """Comment lines for the end of the table."""
        eff = FRAMINGS[self.protocol].efficiency
        lines = [
            f"# alpha-beta fit: t = alpha * steps + beta * bytes ({self.algorithm} algorithm, "
            f"p = {self.world_size}, {self.protocol} framing)",
            f"#  {'op':<16}{'alpha(us)':>11}{'bw(Gbit/s)':>12}{'rms err':>9}{'max err':>9}{'points':>8}",
        ]
        for f in (*self.per_op, self.overall) if len(self.per_op) > 1 else self.per_op:
            bw = 8.0 / f.beta / eff / 1e9 if f.beta > 0 else math.inf
            lines.append(f"#  {f.op:<16}{f.alpha * 1e6:>11.2f}{bw:>12.4f}{f.rms_error:>9.2%}"
                         f"{f.max_error:>9.2%}{f.points:>8}")
        lines.append(f'# fitted network: --net "{self.spec}"')
        return "\n".join(lines) + "\n"


def _sig(x: float) -> str:
    return f"{x:.4g}"


def terms(op: str, algorithm: str, p: int, size: int, model: NetworkModel | None = None) -> tuple[float, float]:
    """``(steps, bytes)`` of one call of bench collective ``op`` under ``algorithm``.

    ``algorithm == "auto"`` takes the algorithm ``model`` picks at this size.
    """
    coll = COLLECTIVES[op]
    model_op = coll.model_op
    if algorithm == "auto":
        if model is None:
            raise ValueError("fitting with algorithm auto needs the network model that chose the algorithms")
        name, _ = choose(model_op, model.spec.algorithm, model.group(range(p)), size)
    elif algorithm in ALGORITHMS:
        name = algorithm if ALGORITHMS[algorithm].applies(model_op) else DEFAULT_ALGORITHM[model_op]
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}; valid: auto, {', '.join(ALGORITHMS)}")
    fn = ALGORITHMS[name].costs[model_op]
    group_of = lambda link: Group(p, p, 1, link, link, link)  # noqa: E731 - flat: one rank per node
    calls = max(coll.p2p_calls, 1)
    return calls * fn(group_of(_LATENCY_UNIT), size).seconds, calls * fn(group_of(_BYTE_UNIT), size).seconds


def fit_points(points: Sequence[tuple[float, float, float]], op: str = "all") -> OpFit:
    """Least squares on relative residuals for ``(steps, bytes, seconds)`` points, alpha, beta >= 0."""
    pts = np.array([p for p in points if p[2] > 0], dtype=float).reshape(-1, 3)
    if len(pts) < 2 or len({round(v, 6) for v in pts[:, 1]}) < 2:
        raise ValueError(f"fitting alpha and beta of {op} needs at least two different sizes; widen -b/-e")
    a = pts[:, :2] / pts[:, 2:3]
    ones = np.ones(len(pts))
    (alpha, beta), *_ = np.linalg.lstsq(a, ones, rcond=None)
    if alpha < 0 or beta < 0:  # clamp to the better one-parameter fit
        cands = []
        for j in (0, 1):
            x = np.zeros(2)
            col = a[:, j]
            x[j] = max(float(col @ ones / (col @ col)), 0.0) if col @ col > 0 else 0.0
            cands.append((float(np.sum((a @ x - 1) ** 2)), x))
        alpha, beta = min(cands, key=lambda c: c[0])[1]
    rel = a @ np.array([alpha, beta]) - 1
    return OpFit(op, float(alpha), float(beta), float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), len(pts))


def fit_result(result: BenchResult, algorithm: str | None = None, protocol: str | None = None) -> Fit:
    """Fit alpha and beta per op and over all ops of a sweep.

    Args:
        result: the sweep; per op and size the faster placement is used (the
            out-of-place variant of an in-place-only op includes a copy).
        algorithm: the algorithm whose coefficients are assumed. Default: the
            simulated network's own choice when the gradwire backend ran the
            sweep, else ``ring`` (what gloo runs for large all_reduces).
        protocol: framing of the fitted spec; default the simulated network's,
            else ``tcp``.
    """
    spec = result.net
    model = NetworkModel(spec, result.world_size) if spec is not None and result.simulated else None
    algorithm = algorithm or (model.spec.algorithm if model is not None else "ring")
    protocol = protocol or (spec.protocol if spec is not None and model is not None else "tcp")
    if protocol not in FRAMINGS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(FRAMINGS)}")
    best: dict[tuple[str, int], float] = {}
    for r in result.rows:
        if r.time_us is not None and r.time_us > 0:
            key = (r.op, r.size)
            best[key] = min(best.get(key, math.inf), r.time_us * 1e-6)
    by_op: dict[str, list[tuple[float, float, float]]] = {}
    for (op, size), seconds in best.items():
        steps, volume = terms(op, algorithm, result.world_size, size, model)
        by_op.setdefault(op, []).append((steps, volume, seconds))
    if not by_op:
        raise ValueError("nothing to fit: the sweep has no timed rows")
    per_op = tuple(fit_points(pts, op) for op, pts in by_op.items())
    overall = fit_points([p for pts in by_op.values() for p in pts], "all")
    return Fit(per_op, overall, algorithm, protocol, result.world_size)
