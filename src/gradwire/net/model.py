"""The network model: price one collective on a (sub)group of a simulated cluster.

``NetworkModel(spec, world_size).cost(op, nbytes, ranks=..., seq=...)`` is all
the backend calls. It is a pure function of its arguments: every rank that
prices the same call with the same ``seq`` gets the same number, so the ranks
agree on when a collective finishes without talking to each other.

Byte conventions follow nccl-tests: ``nbytes`` is the buffer for all_reduce,
broadcast and reduce; the FULL gathered buffer for all_gather, reduce_scatter,
gather and scatter; one rank's whole input for all_to_all; the message for send.

Topology: global rank ``r`` lives on node ``r // ranks_per_node`` (flat: every
rank is its own node). A group inside one node runs on the intra-node link,
otherwise flat algorithms run on the inter-node link; a straggler in the group
slows that link by its factor, since the slowest hop paces a ring or a tree.

Jitter is drawn once per sequential latency step of the chosen algorithm
(a ring all_reduce on p ranks has 2(p-1) steps, a send has one) from
``numpy.random.default_rng((seed, seq))``, never from global random state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from gradwire.net.algorithms import OPS, Group, check_op, choose
from gradwire.net.link import Link
from gradwire.net.schedule import Condition, Schedule, finish_time
from gradwire.net.spec import AUTO_TOPOLOGY, NetSpec, Straggler

#: shape of the Lomax (Pareto II) jitter; 3 gives a mean of jitter/2, like uniform
PARETO_SHAPE = 3.0


@dataclass(frozen=True)
class OpCost:
    """What one collective costs on the modelled network."""

    seconds: float
    """modelled time of the collective incl. jitter/loss, for the whole group"""
    payload_bytes: int
    """bytes of data this op handed to the network (the op's buffer, see module doc)"""
    sent_bytes: int
    """payload bytes one rank sends under the chosen algorithm (max over ranks)"""
    wire_bytes: int
    """sent_bytes plus protocol framing and expected retransmissions"""
    algorithm: str
    """the algorithm that was priced (after ``auto`` or a fallback)"""


def busbw_factor(op: str, p: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor (0 for barrier)."""
    check_op(op)
    if op == "barrier" or p < 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (p - 1) / p
    return 1.0


class NetworkModel:
    """Prices collectives for one world of ``world_size`` ranks on ``spec``.

    Args:
        spec: a :class:`NetSpec`, a spec string, or None for loopback.
        world_size: number of ranks in the default group.

    Raises:
        ValueError: the topology does not hold ``world_size`` ranks, or a
            straggler names a rank outside the world.

    Example::

        model = NetworkModel("1gbe", world_size=4)
        model.cost("all_reduce", 16 << 20).seconds   # about 0.21 s
    """

    def __init__(self, spec: NetSpec | str | None, world_size: int) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        self.spec: NetSpec = NetSpec.of(spec)
        self.world_size: int = world_size
        topo = self.spec.topology
        if topo == AUTO_TOPOLOGY:
            raise ValueError("topology=auto is resolved with torchrun's environment when the gradwire backend creates "
                             "its group; to price it here write topology=NODESxRANKS")
        assert not isinstance(topo, str)  # resolved above (auto is the only string)
        if topo is not None and topo[0] * topo[1] != world_size:
            raise ValueError(
                f"topology {topo[0]}x{topo[1]} holds {topo[0] * topo[1]} ranks but world_size is {world_size}; "
                f"use topology=NxM with N*M == {world_size}, or topology=flat"
            )
        self._per_node = 1 if topo is None else topo[1]
        for s in self.spec.stragglers:
            if s.rank >= world_size:
                raise ValueError(f"straggler rank {s.rank} is outside the world (ranks 0..{world_size - 1})")
        self._link_factor = {s.rank: s.link for s in self.spec.stragglers}
        self._compute_factor = {s.rank: s.compute for s in self.spec.stragglers}
        self.inter_link: Link = self.spec.inter_link()
        self.intra_link: Link = self.spec.intra_link()
        #: how the network changes over time; None: it does not
        self.schedule: Schedule | None = Schedule(self.spec.events) if self.spec.events else None
        for event in self.spec.events:
            rank = getattr(event, "rank", None)
            if rank is not None and rank >= world_size:
                raise ValueError(f"{event.to_string()}: rank {rank} is outside the world (ranks 0..{world_size - 1})")
        self._static: dict[Condition, NetworkModel] = {}
        self._priced: dict[tuple[tuple[object, ...], Condition], OpCost] = {}
        self._inner: dict[str, NetworkModel] = {}

    def __repr__(self) -> str:
        return f"NetworkModel({self.spec.to_string()!r}, world_size={self.world_size})"

    @property
    def is_zero(self) -> bool:
        """True when every collective costs 0 s (loopback); bytes are still counted."""
        links = (self.inter_link, self.intra_link)
        return (self.schedule is None and self.spec.jitter == 0
                and all(link.latency == 0 and link.beta == 0 for link in links))

    def condition(self, t: float) -> tuple[Condition, float]:
        """The network's condition ``t`` seconds after the start of the job, and when it next changes."""
        if self.schedule is None:
            return Condition(), math.inf
        return self.schedule.condition(t, self.spec.bandwidth)

    def at(self, cond: Condition) -> "NetworkModel":
        """The static model of the spec under ``cond`` (cached)."""
        model = self._static.get(cond)
        if model is None:
            spec = self.spec
            factors = {s.rank: s for s in spec.stragglers}
            for rank, factor in cond.links:
                old = factors.get(rank, Straggler(rank))
                factors[rank] = Straggler(rank, link=old.link * factor, compute=old.compute)
            spec = NetSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                              "bandwidth": spec.bandwidth if cond.bandwidth is None else cond.bandwidth,
                              "latency": spec.latency if cond.latency is None else cond.latency,
                              "loss": spec.loss if cond.loss is None else cond.loss,
                              "stragglers": tuple(factors.values()), "events": ()})
            if len(self._static) > 1024:
                self._static.clear()
            model = self._static[cond] = NetworkModel(spec, self.world_size)
        return model

    def for_inner(self, inner: str) -> "NetworkModel":
        """This model as the inner backend ``inner`` ("gloo" or "nccl") carries an op (cached).

        ``transport=auto`` prices the transport of the backend that runs the op
        (:mod:`gradwire.net.transport`); a spec that names its transport, or an
        inner backend the model does not know, keeps this model.
        """
        if self.spec.tcp.transport != "auto" or inner not in ("nccl",):
            return self
        model = self._inner.get(inner)
        if model is None:
            spec = replace(self.spec, tcp=replace(self.spec.tcp, transport=inner))
            model = self._inner[inner] = NetworkModel(spec, self.world_size)
        return model

    def node_of(self, rank: int) -> int:
        """The node a global rank lives on."""
        return rank // self._per_node

    def compute_factor(self, rank: int) -> float:
        """How much slower this rank computes (straggler ``compute=``); 1.0 by default."""
        return self._compute_factor.get(rank, 1.0)

    def group(self, ranks: Sequence[int]) -> Group:
        """The shape and links of a group of global ranks."""
        counts: dict[int, int] = {}
        for r in ranks:
            counts[self.node_of(r)] = counts.get(self.node_of(r), 0) + 1
        factor = min((self._link_factor.get(r, 1.0) for r in ranks), default=1.0)
        intra, inter = self.intra_link.scaled(factor), self.inter_link.scaled(factor)
        return Group(len(ranks), len(counts), max(counts.values(), default=1),
                     inter if len(counts) > 1 else intra, intra, inter)

    def cost(
        self,
        op: str,
        nbytes: int,
        *,
        ranks: Sequence[int] | None = None,
        seq: int = 0,
        src: int | None = None,
        dst: int | None = None,
        start: float | None = None,
        horizon: float = 24 * 3600.0,
        idle: float | None = 0.0,
    ) -> OpCost:
        """Price one collective.

        Args:
            op: one of :data:`OPS`.
            nbytes: bytes by the nccl-tests convention of ``op`` (module doc).
            ranks: global ranks of the group; default the whole world.
            seq: the call's sequence number in its group; seeds the jitter.
            src, dst: global ranks of a ``send``; the link between them is
                priced. If either is unknown (``recv`` from any source) the
                slowest link of the group is used.

            start: seconds since the job's start at which the op starts (a
                changing network prices it on the conditions it meets, see
                :func:`gradwire.net.schedule.finish_time`; ``inf`` when an
                outage outlasts ``horizon``); None: the condition at 0.
            horizon: how far past ``start`` to look for the op's end.
            idle: seconds since the group's connections last carried data (TCP
                restarts its window after an idle longer than the RTO, see
                :mod:`gradwire.net.tcp`); None: a connection's first data; 0: warm.

        Returns:
            An :class:`OpCost`; ``seconds`` is never negative.
        """
        if self.schedule is not None:
            return self._cost_over_time(op, nbytes, ranks, seq, src, dst, 0.0 if start is None else start, horizon,
                                        idle)
        check_op(op)
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or seq < 0:
            raise ValueError(f"seq must be an int >= 0, got {seq!r}")
        nbytes = 0 if op == "barrier" else int(nbytes)
        members = self._members(ranks)
        if op == "send" and src is not None and dst is not None:
            members = self._members([src, dst]) if src != dst else [src]
            if len(members) == 1:  # a rank sending to itself crosses no link
                return OpCost(0.0, nbytes, 0, 0, "direct")
        group = self.group(members)
        if idle != 0.0:
            group = replace(group, idle=idle)
        name, base = choose(op, self.spec.algorithm, group, nbytes)
        seconds = 0.0 if self.is_zero or group.p == 1 else base.seconds + self._jitter(base.steps, seq)
        sent = math.ceil(base.sent_bytes - 1e-9) if base.sent_bytes > 0 else 0
        return OpCost(max(seconds, 0.0), nbytes, sent, base.wire_bytes if sent else 0, name)

    def _cost_over_time(self, op: str, nbytes: int, ranks: Sequence[int] | None, seq: int, src: int | None,
                        dst: int | None, t0: float, horizon: float, idle: float | None = 0.0) -> OpCost:
        """:meth:`cost` on a changing network: priced on the conditions from ``t0`` on (piecewise)."""
        assert self.schedule is not None
        key = (op, nbytes, None if ranks is None else tuple(ranks), src, dst, idle)

        def static(cond: Condition) -> OpCost:
            if self.spec.jitter:  # each op draws its own jitter
                return self.at(cond).cost(op, nbytes, ranks=ranks, seq=seq, src=src, dst=dst, idle=idle)
            cached = self._priced.get((key, cond))
            if cached is None:
                if len(self._priced) > 65536:
                    self._priced.clear()
                cached = self._priced[(key, cond)] = self.at(cond).cost(op, nbytes, ranks=ranks, seq=seq,
                                                                        src=src, dst=dst, idle=idle)
            return cached

        cond, end = self.condition(t0)
        # bytes as the link at the op's start carries them (an outage moves none: the link it resumes on)
        first = static(replace(cond, down=False))
        if not cond.down and t0 + first.seconds <= end:  # ends before the next change: the static price
            return first
        seconds = finish_time(t0, self.schedule.segments(t0, self.spec.bandwidth),
                              lambda c: static(c).seconds, t0 + horizon) - t0
        return OpCost(seconds, first.payload_bytes, first.sent_bytes, first.wire_bytes, first.algorithm)

    def _members(self, ranks: Sequence[int] | None) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        members = [int(r) for r in ranks]
        bad = [r for r in members if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"ranks {bad} are outside the world (ranks 0..{self.world_size - 1})")
        if len(set(members)) != len(members):
            raise ValueError(f"ranks of a group must be distinct, got {members}")
        if not members:
            raise ValueError("a group needs at least one rank")
        return members

    def _jitter(self, steps: int, seq: int) -> float:
        """Sum of ``steps`` jitter draws, the same on every rank for (seed, seq)."""
        scale = self.spec.jitter
        if scale == 0 or steps == 0:
            return 0.0
        rng = np.random.default_rng((self.spec.seed, seq))
        dist = self.spec.jitter_dist
        if dist == "uniform":
            draws = rng.uniform(0.0, scale, steps)
        elif dist == "normal":
            draws = np.abs(rng.normal(0.0, scale, steps))
        else:
            draws = scale * rng.pareto(PARETO_SHAPE, steps)
        return float(draws.sum())


#: default message sizes of :func:`describe`: 4 KiB, 1 MiB, 16 MiB, 256 MiB
DESCRIBE_SIZES: tuple[int, ...] = (4 << 10, 1 << 20, 16 << 20, 256 << 20)


@dataclass(frozen=True)
class DescribeRow:
    """One line of ``gradwire net describe``."""

    op: str
    world_size: int
    nbytes: int
    seconds: float
    algorithm: str
    algbw: float
    """nbytes / seconds in bytes/s (``inf`` for zero time, 0 for barrier)"""
    busbw: float
    """algbw times the nccl-tests factor of the op"""


def describe(
    spec: NetSpec | str | None,
    world_sizes: Sequence[int] = (2, 4, 8),
    sizes: Sequence[int] = DESCRIBE_SIZES,
    ops: Sequence[str] = OPS,
) -> list[DescribeRow]:
    """Model every op at every size and world size (``seq=0``) for a summary table.

    A spec with a fixed topology only fits one world size: other world sizes
    are replaced by that one. Barrier is priced once per world size, at 0 bytes.
    Send goes from rank 0 to the last rank, so it crosses nodes when there are any.
    """
    spec = NetSpec.of(spec)
    if isinstance(spec.topology, tuple):  # topology=auto: NetworkModel says it cannot be priced here
        world_sizes = (spec.topology[0] * spec.topology[1],)
    rows: list[DescribeRow] = []
    for world in dict.fromkeys(world_sizes):
        model = NetworkModel(spec, world)
        for op in ops:
            check_op(op)
            for nbytes in (0,) if op == "barrier" else sizes:
                c = model.cost(op, nbytes, src=0, dst=world - 1) if op == "send" else model.cost(op, nbytes)
                algbw = nbytes / c.seconds if c.seconds > 0 else (math.inf if nbytes else 0.0)
                rows.append(DescribeRow(op, world, nbytes, c.seconds, c.algorithm, algbw,
                                        algbw * busbw_factor(op, 2 if op == "send" else world)))
    return rows


__all__ = ["OPS", "OpCost", "NetworkModel", "DescribeRow", "describe", "busbw_factor", "PARETO_SHAPE"]
