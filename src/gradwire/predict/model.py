"""Predict step time on N ranks from one measured step profile: pure, no process group.

A :class:`StepProfile` is what one short run on ``loopback`` measured for a
strategy on this machine: compute per step (forward, backward, compression,
optimizer), the real communication the loopback run still waited for, and the
collectives each step issues (op, bytes, calls per step). The prediction for
N ranks on a network spec prices those collectives with the network model
(virtual time: nothing runs) and combines them with compute:

1. bytes at N ranks: per-rank contributions stay the same, so all_reduce,
   broadcast, reduce, reduce_scatter and all_to_all buffers keep their size and
   all_gather / gather buffers grow as N / N_measured — except the second phase
   of a two-phase compressed all_reduce, whose gathered buffer is the whole
   compressed vector at any N;
2. ``comm`` = Σ calls × modelled seconds of each collective at N;
3. blocking strategies (sync DDP, compressed sync, local SGD): the step waits
   for its communication after compute: ``step = compute + max(comm, real)``,
   where ``real`` is what the loopback run itself waited (a simulated network
   never completes faster than the real collective under it). DDP's overlap of
   earlier buckets with backward is not credited: exact for single-bucket
   models, an upper bound otherwise;
4. overlapped strategies (delayed, async-average): a step's communication runs
   behind the next step's compute: ``step = max(compute + real, comm)``.

``compute + real`` is the loopback run's median step (``loop_seconds``) when
the profile has it, not the sum of the two medians: an overlapped strategy
waits in a few steps only (median wait 0, mean 1.5 ms on the digits CNN), and
the sum of medians then misses those waits (measured: -10% at 2 ranks).

Scaling efficiency is compute / step: the share of each step a rank spends
computing (1.0 = communication fully hidden).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from gradwire.net import NetworkModel, parse_spec

__all__ = ["Collective", "Prediction", "StepProfile", "predict", "predict_many"]

#: strategies whose communication overlaps the next step's compute
OVERLAPPED = frozenset({"delayed", "async-average"})
_GROWS = frozenset({"all_gather", "gather"})


@dataclass(frozen=True)
class Collective:
    """A collective a step issues: ``calls`` per step of ``nbytes`` each (nccl-tests size convention)."""

    op: str
    nbytes: float
    calls: float


@dataclass
class StepProfile:
    """One strategy's step, measured on this machine on ``loopback``."""

    strategy: str
    world: int
    compute_seconds: float
    real_comm_seconds: float
    collectives: list[Collective] = field(default_factory=list)
    overlapped: bool = False
    two_phase: bool = False
    loop_seconds: float | None = None
    """median step of the loopback run (None: ``compute_seconds + real_comm_seconds``)"""

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepProfile":
        d = dict(d)
        d["collectives"] = [Collective(**c) for c in d["collectives"]]
        return cls(**d)


@dataclass(frozen=True)
class Prediction:
    strategy: str
    world: int
    step_seconds: float
    compute_seconds: float
    comm_seconds: float
    wire_bytes_per_step: float

    @property
    def efficiency(self) -> float:
        return self.compute_seconds / self.step_seconds if self.step_seconds > 0 else 1.0


def _bytes_at(c: Collective, profile: StepProfile, world: int) -> int:
    if c.op in _GROWS and not profile.two_phase:
        return int(round(c.nbytes * world / profile.world))
    return int(round(c.nbytes))


def predict(profile: StepProfile, net: str, world: int) -> Prediction:
    """Step time of ``profile``'s strategy on ``world`` ranks of network ``net``."""
    if world < 2:
        raise ValueError(f"world size must be >= 2, got {world}")
    spec = parse_spec(net)
    if isinstance(spec.topology, tuple):  # keep ranks per node, scale the number of nodes (auto: refused by the model)
        per_node = spec.topology[1]
        if world % per_node:
            raise ValueError(f"world size {world} is not a multiple of {per_node} ranks per node ({net})")
        spec = replace(spec, topology=(world // per_node, per_node))
    model = NetworkModel(spec, world)
    comm = wire = 0.0
    for c in profile.collectives:
        cost = model.cost(c.op, _bytes_at(c, profile, world))
        comm += c.calls * cost.seconds
        wire += c.calls * cost.wire_bytes
    compute, real = profile.compute_seconds, profile.real_comm_seconds
    loop = profile.loop_seconds if profile.loop_seconds is not None else compute + real
    if profile.overlapped:
        step = max(loop, comm)
    else:
        step = loop + max(0.0, comm - real)
    return Prediction(profile.strategy, world, step, compute, comm, wire)


def predict_many(profiles: Sequence[StepProfile], net: str, worlds: Sequence[int]) -> list[Prediction]:
    """Every profile at every world size."""
    return [predict(p, net, n) for p in profiles for n in worlds]
