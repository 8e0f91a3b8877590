"""The ``local`` network: every collective answered from the rank's own data, with no communication at all.

An ideal that really is a bound. ``loopback`` prices every op at 0 s but
still runs the real collectives, so the host's own transfers (copies,
sockets, waiting for the slowest rank) stay in the step. Under ``local``
nothing leaves the rank: no inner collective runs, no time is modelled, no
byte goes on the wire. Each op is answered as if every rank of the group
held the same tensors as this one:

- all_reduce / reduce (the root): SUM multiplies by the group size, AVG,
  MAX, MIN, BAND and BOR leave the tensor as it is, PRODUCT raises it to the
  group size, BXOR gives zero for an even group size and the tensor for an
  odd one; a reduce leaves the other ranks' buffers as they are;
- reduce_scatter: this rank's own chunk (the one addressed to it), reduced
  as above;
- all_gather: the own tensor in every slot; gather: the same, on the root;
- all_to_all: the chunk this rank addresses to itself, in every slot (what
  every peer holding the same tensor would send it);
- broadcast, barrier, and a scatter's non-root ranks: nothing to do;
- point-to-point ops are refused (:func:`no_peers`): a receive has no data
  of its own to answer with, and a send that nobody receives would hide a
  mismatch.

DDP trains under it: its buckets are summed to ``world x`` the own
gradient and divided by the world, so each rank steps on its own gradient;
ranks fed different data drift apart, which is what an ideal without
communication means.

Traps: bool tensors under SUM / PRODUCT stay as they are (gloo treats them
as OR / AND); integer SUM wraps around as the real sum would; an all_to_all
whose output splits differ from the split addressed to this rank cannot be
answered from the own data and is refused.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_to_all", "chunk_of", "no_peers", "reduce_"]

_OP = dist.ReduceOp
#: ops whose result over equal tensors is the tensor itself
_IDEMPOTENT = (_OP.AVG, _OP.MAX, _OP.MIN, _OP.BAND, _OP.BOR)


def reduce_(tensors: Sequence[torch.Tensor], op: Any, world: int) -> list[torch.Tensor]:
    """Reduce each tensor in place as if all ``world`` ranks held it; return them."""
    op = getattr(op, "op", op)  # the RedOpType of a ReduceOp (``RedOpType == ReduceOp`` is False, so ``in`` fails)
    for t in tensors:
        if op in _IDEMPOTENT or (t.dtype == torch.bool and op in (_OP.SUM, _OP.PRODUCT)):
            continue
        if op == _OP.SUM:
            t.mul_(world)
        elif op == _OP.PRODUCT:
            t.pow_(world)
        elif op == _OP.BXOR:
            if world % 2 == 0:
                t.zero_()
        else:
            raise NotImplementedError(f"gradwire: the local network cannot answer ReduceOp {op} from the rank's own "
                                      "data; use SUM, AVG, MAX, MIN, PRODUCT or a bitwise op")
    return list(tensors)


def chunk_of(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The ``rank``-th of ``world`` equal chunks of ``t`` along its first dimension."""
    return t.reshape(world, -1)[rank].view(-1)


def all_gather(outputs: Sequence[torch.Tensor], inp: torch.Tensor) -> None:
    """Copy ``inp`` into every output slot (the slots may be one flat tensor's views)."""
    for out in outputs:
        out.copy_(inp.reshape(out.shape))


def all_to_all(output: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int],
               rank: int, world: int) -> torch.Tensor:
    """Every output chunk is the input chunk this rank addresses to itself (module doc)."""
    in_sizes = list(in_splits) or [inp.shape[0] // world] * world
    out_sizes = list(out_splits) or [output.shape[0] // world] * world
    mine = in_sizes[rank]
    if any(s != mine for s in out_sizes):
        raise ValueError(f"gradwire: the local network answers all_to_all with the chunk rank {rank} addresses to "
                         f"itself ({mine} rows) in every slot, but the output splits are {out_sizes}; give every "
                         "slot that size, or use a network with links (e.g. loopback)")
    own = inp.narrow(0, sum(in_sizes[:rank]), mine)
    for k in range(world):
        output.narrow(0, k * mine, mine).copy_(own)
    return output


def no_peers(op: str, peer: int | None) -> NotImplementedError:
    """The error of a point-to-point op on the local network."""
    whom = "any rank" if peer is None else f"rank {peer}"
    return NotImplementedError(
        f"gradwire: the local network has no peers: a {op} with {whom} cannot be answered from this rank's own "
        "data. Point-to-point ops need a network with links (loopback runs them at 0 s of modelled time).")
