"""One small definition per collective, as nccl-tests has one file per collective.

Each definition fills in the same hooks the shared driver calls:

1. ``layout``: how a requested size maps to buffers (``S`` follows nccl-tests:
   the full gathered buffer for all_gather and reduce_scatter, one rank's whole
   buffer for all_to_all);
2. ``bus_factor``: busbw = algbw * factor (nccl-tests' definitions);
3. ``buffers`` / ``expected``: deterministic input and the output it must give;
4. ``run``: one call, out-of-place or in-place.

torch.distributed has only in-place all_reduce, broadcast and reduce; their
out-of-place variant copies the input into the output buffer first (what user
code writes), and that copy is part of the measured time. all_to_all and
sendrecv have no safe in-place form with gloo, so those columns read N/A.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gradwire.bench.config import COLLECTIVE_NAMES, REDOPS, BenchConfig
from gradwire.net import NetworkModel

__all__ = ["COLLECTIVES", "Buffers", "Collective", "RankSetup", "check_world", "fill", "reference_reduce"]


@dataclass(frozen=True)
class Buffers:
    """Buffers of one row: ``size`` bytes (nccl-tests S), element counts per buffer."""

    size: int
    count: int
    send: int
    recv: int


@dataclass(frozen=True)
class RankSetup:
    """What a rank knows when it builds, runs and checks a collective."""

    rank: int
    world: int
    dtype: torch.dtype
    redop: str
    root: int
    device: torch.device

    @property
    def op(self) -> Any:
        return getattr(dist.ReduceOp, REDOPS[self.redop])


def fill(ctx: RankSetup, rank: int, numel: int, offset: int = 0) -> torch.Tensor:
    """Deterministic input of ``rank``: small integers, exact in every dtype.

    Values 1..8 differ by rank and position, so a misplaced chunk shows up;
    for ``prod`` they are 1 or 2, so products stay in range for fp16.
    """
    idx = torch.arange(offset, offset + numel, dtype=torch.int64)
    if ctx.redop == "prod":
        values = 1 + (idx + rank) % 2
    else:
        values = 1 + (idx * 13 + rank * 7) % 8
    return values.to(torch.float64)


def reference_reduce(ctx: RankSetup, numel: int) -> torch.Tensor:
    """The reduction of every rank's :func:`fill` in float64."""
    stack = torch.stack([fill(ctx, r, numel) for r in range(ctx.world)])
    if ctx.redop in ("sum", "avg"):
        out = stack.sum(0)
        return out / ctx.world if ctx.redop == "avg" else out
    if ctx.redop == "prod":
        return stack.prod(0)
    return stack.amax(0) if ctx.redop == "max" else stack.amin(0)


def _buf(ctx: RankSetup, values: torch.Tensor) -> torch.Tensor:
    return values.to(ctx.dtype).to(ctx.device)


def _empty(ctx: RankSetup, numel: int) -> torch.Tensor:
    return torch.zeros(numel, dtype=ctx.dtype, device=ctx.device)


# torch >= 2.12 names; the *_tensor spellings are deprecated aliases there
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Collective:
    """Base definition; subclasses override what differs from all_reduce."""

    name: str = ""
    #: op name of :class:`gradwire.net.NetworkModel` that prices this collective
    model_op: str = ""
    min_world: int = 1
    reduces: bool = False
    rooted: bool = False
    has_in_place: bool = True
    #: point-to-point calls a rank issues per iteration (each is priced as one ``send``)
    p2p_calls: int = 0

    def layout(self, nbytes: int, elem: int, p: int) -> Buffers:
        count = nbytes // elem
        return Buffers(count * elem, count, count, count)

    def bus_factor(self, p: int) -> float:
        return 1.0

    def buffers(self, ctx: RankSetup, lay: Buffers, in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
        send = _buf(ctx, fill(ctx, ctx.rank, lay.send))
        return send, (send if in_place else _empty(ctx, lay.recv))

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        """What ``recv`` must hold on this rank after one call (None: nothing defined)."""
        return reference_reduce(ctx, lay.recv)

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        raise NotImplementedError

    def model_seconds(self, model: NetworkModel, size: int) -> float:
        """Modelled seconds of one call on ``model`` (what the gradwire backend charges)."""
        return model.cost(self.model_op, size).seconds

    def reduction(self, lay: Buffers, p: int) -> tuple[float, int, int]:
        """``(flops, bytes, ops)`` of the arithmetic one rank does in one call: a ring's additions.

        A reducing collective on a ring of ``p`` ranks adds ``p - 1`` chunks of
        ``1/p`` of the buffer on each rank, one op per chunk, each reading two
        chunks and writing one; the others compute nothing.
        """
        if not self.reduces or p < 2:
            return 0.0, 0, 0
        share = (p - 1) / p
        return lay.count * share, int(3 * lay.size * share), p - 1


class AllReduce(Collective):
    name = model_op = "all_reduce"
    reduces = True

    def bus_factor(self, p: int) -> float:
        return 2 * (p - 1) / p

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        if not in_place:
            recv.copy_(send)
        dist.all_reduce(recv, op=ctx.op)


class Broadcast(Collective):
    name = model_op = "broadcast"
    rooted = True

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        return fill(ctx, ctx.root, lay.recv)

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        if not in_place and ctx.rank == ctx.root:
            recv.copy_(send)
        dist.broadcast(recv, src=ctx.root)


class Reduce(Collective):
    name = model_op = "reduce"
    reduces = rooted = True

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        return reference_reduce(ctx, lay.recv) if ctx.rank == ctx.root else None

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        if not in_place:
            recv.copy_(send)
        dist.reduce(recv, dst=ctx.root, op=ctx.op)


class AllGather(Collective):
    name = model_op = "all_gather"

    def layout(self, nbytes: int, elem: int, p: int) -> Buffers:
        base = nbytes // elem // p
        return Buffers(base * p * elem, base * p, base, base * p)

    def bus_factor(self, p: int) -> float:
        return (p - 1) / p

    def buffers(self, ctx: RankSetup, lay: Buffers, in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
        mine = _buf(ctx, fill(ctx, ctx.rank, lay.send, ctx.rank * lay.send))
        if not in_place:
            return mine, _empty(ctx, lay.recv)
        recv = _empty(ctx, lay.recv)
        send = recv[ctx.rank * lay.send:(ctx.rank + 1) * lay.send]
        send.copy_(mine)
        return send, recv

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        return torch.cat([fill(ctx, r, lay.send, r * lay.send) for r in range(ctx.world)])

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        _all_gather(recv, send)


class ReduceScatter(Collective):
    name = model_op = "reduce_scatter"
    reduces = True

    def layout(self, nbytes: int, elem: int, p: int) -> Buffers:
        base = nbytes // elem // p
        return Buffers(base * p * elem, base * p, base * p, base)

    def bus_factor(self, p: int) -> float:
        return (p - 1) / p

    def buffers(self, ctx: RankSetup, lay: Buffers, in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
        send = _buf(ctx, fill(ctx, ctx.rank, lay.send))
        recv = send[ctx.rank * lay.recv:(ctx.rank + 1) * lay.recv] if in_place else _empty(ctx, lay.recv)
        return send, recv

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        return reference_reduce(ctx, lay.send)[ctx.rank * lay.recv:(ctx.rank + 1) * lay.recv]

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        _reduce_scatter(recv, send, op=ctx.op)


class AllToAll(Collective):
    name = model_op = "all_to_all"
    has_in_place = False

    def layout(self, nbytes: int, elem: int, p: int) -> Buffers:
        base = nbytes // elem // p
        return Buffers(base * p * elem, base * p, base * p, base * p)

    def bus_factor(self, p: int) -> float:
        return (p - 1) / p

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        chunk = lay.send // ctx.world
        return torch.cat([fill(ctx, r, lay.send)[ctx.rank * chunk:(ctx.rank + 1) * chunk] for r in range(ctx.world)])

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        dist.all_to_all_single(recv, send)


class SendRecv(Collective):
    """Every rank sends to rank + 1 and receives from rank - 1 at the same time."""

    name = "sendrecv"
    model_op = "send"
    min_world = 2
    has_in_place = False
    p2p_calls = 1  # send and recv overlap on a full-duplex link

    def expected(self, ctx: RankSetup, lay: Buffers) -> torch.Tensor | None:
        return fill(ctx, (ctx.rank - 1) % ctx.world, lay.recv)

    def run(self, ctx: RankSetup, send: torch.Tensor, recv: torch.Tensor, in_place: bool) -> None:
        req = dist.isend(send, (ctx.rank + 1) % ctx.world)
        dist.recv(recv, (ctx.rank - 1) % ctx.world)
        assert req is not None  # this rank is in the group
        req.wait()

    def model_seconds(self, model: NetworkModel, size: int) -> float:
        # The gradwire backend models a full-duplex NIC: a rank's send holds
        # its transmit side and its recv the receive side, so the two overlap;
        # the slowest rank sets the row's time.
        p = model.world_size
        return max(
            max(model.cost("send", size, src=r, dst=(r + 1) % p).seconds,
                model.cost("send", size, src=(r - 1) % p, dst=r).seconds)
            for r in range(p)
        )


#: the collectives by CLI name, in the order ``--op all`` runs them
COLLECTIVES: dict[str, Collective] = {
    c.name: c for c in (AllReduce(), AllGather(), ReduceScatter(), Broadcast(), Reduce(), AllToAll(), SendRecv())
}
assert tuple(COLLECTIVES) == COLLECTIVE_NAMES, "keep gradwire.bench.config.COLLECTIVE_NAMES in step"


def check_world(config: BenchConfig, world_size: int) -> None:
    """Raise ValueError if ``world_size`` cannot run every collective ``config`` asks for."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    for op in config.ops:
        need = COLLECTIVES[op].min_world
        if world_size < need:
            raise ValueError(f"{op} needs a world size >= {need}, got {world_size}")
    if config.root >= world_size:
        raise ValueError(f"-r (root {config.root}) must be a rank of the world (0..{world_size - 1})")
