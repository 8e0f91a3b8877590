"""The machine a job trains on, as the step model needs it: its real collectives and its cores. Pure.

A simulated network runs every collective on a real inner group too
(:mod:`gradwire.backend`): an op completes at ``max(modelled time, the real
collective)``, and the real collective costs the host CPU (gloo's threads,
loopback TCP, the backend's own completion). On a fast simulated network
that real time is the op's time; on a host whose every core trains, it is
also compute lost wherever it overlaps a step. A described cluster has
neither (no :class:`Host`: the network is all there is).

:class:`Floors` holds what :func:`gradwire.predict.calibrate.calibrate`
measured of each op on the host: seconds per call at a few sizes, on the
``gradwire`` backend over ``loopback`` (wrapper, gloo, completion thread),
with the ranks of the job, and (``Host.work``) the CPU time each takes from
its rank. Between two measured sizes the time is linear in the bytes; below
the smallest it is the smallest's (latency); above the largest it goes on
along the last segment.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from gradwire.predict.codec import Line

__all__ = ["Floors", "Host"]


@dataclass(frozen=True)
class Floors:
    """Seconds of the real collective per op and size (module doc)."""

    points: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)
    """op -> ``(bytes, seconds)`` in increasing bytes (nccl-tests convention of each op)"""

    def __call__(self, op: str, nbytes: int) -> float:
        pts = self.points.get(op)
        if not pts:
            return 0.0
        sizes = [b for b, _ in pts]
        i = bisect.bisect_left(sizes, nbytes)
        if i == 0 or len(pts) == 1:  # at or below the smallest size, or a single size: a constant
            return pts[0][1]
        (b0, t0), (b1, t1) = (pts[-2], pts[-1]) if i >= len(pts) else (pts[i - 1], pts[i])
        if b1 == b0:
            return t1
        return max(0.0, t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0))

    def scaled(self, factor: float) -> "Floors":
        return Floors({op: [(b, t * factor) for b, t in pts] for op, pts in self.points.items()})

    def as_dict(self) -> dict[str, Any]:
        return {op: [list(p) for p in pts] for op, pts in self.points.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Floors":
        return cls({op: [(int(b), float(t)) for b, t in pts] for op, pts in d.items()})


@dataclass(frozen=True)
class Host:
    """The host's side of a step besides compute and the codecs (module doc)."""

    floors: Floors = Floors()
    work: Floors = Floors()
    """the CPU seconds each real collective takes from its rank (its threads and the kernel's), by op and size"""
    copy: Line = Line()
    """one pass over ``n`` fp32 elements on the training thread (a strategy's copies, adds)"""
    busy_cores: bool = False
    """every core runs a rank: background work takes its time from compute (:mod:`gradwire.predict.simulate`)"""

    def scaled(self, factor: float) -> "Host":
        """Every CPU time times ``factor`` (the host slower or faster than when it was measured)."""
        return replace(self, floors=self.floors.scaled(factor), work=self.work.scaled(factor),
                       copy=Line(self.copy.fixed * factor, self.copy.per_element * factor))
