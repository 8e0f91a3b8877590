"""The ``local`` network: every reduction answered from the rank's own data, with no communication.

An ideal that really is a bound. ``loopback`` prices every op at 0 s but
still runs the real collectives, so the host's own transfers (copies,
sockets, waiting for the slowest rank) stay in the step. Under ``local``
the reductions (:data:`ANSWERED`: all_reduce, reduce, reduce_scatter, what
training's gradients go through) never leave the rank: no inner collective
runs, no time is modelled, no byte goes on the wire. Each is answered as if
every rank of the group held the same tensors as this one. The other ops
(broadcast, all_gather, gather, scatter, all_to_all, barrier,
point-to-point) carry data a rank cannot make up (a broadcast's receivers
hold uninitialised buffers: the size tensor of ``broadcast_object_list``),
so they run on the real inner group, priced at 0 s as on ``loopback``;
they are rare and small in training (the start's parameter broadcast,
metrics, barriers). The answers:

- all_reduce / reduce (the root): SUM multiplies by the group size, AVG,
  MAX, MIN, BAND and BOR leave the tensor as it is, PRODUCT raises it to the
  group size, BXOR gives zero for an even group size and the tensor for an
  odd one; a reduce leaves the other ranks' buffers as they are;
- reduce_scatter: this rank's own chunk (the one addressed to it), reduced
  as above.

DDP trains under it: its buckets are summed to ``world x`` the own
gradient and divided by the world, so each rank steps on its own gradient;
ranks fed different data drift apart, which is what an ideal without
communication means.

Traps: bool tensors under SUM / PRODUCT stay as they are (gloo treats them
as OR / AND); integer SUM wraps around as the real sum would.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

__all__ = ["ANSWERED", "chunk_of", "reduce_"]

#: the ops answered on the rank under ``local``; the others run on the real inner group at 0 s
ANSWERED = frozenset({"all_reduce", "reduce", "reduce_scatter"})

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
