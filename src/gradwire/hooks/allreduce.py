"""``allreduce_compressed``: average a list of tensors through a compressor, without DDP.

For custom training loops:

1. Each tensor gets a flat, contiguous working view (a copy when it is not
   contiguous) and its key (its position, or ``keys``).
2. :func:`~gradwire.hooks.exchange.exchange` runs the compressor's pattern;
   launches are ordered so that every rank issues the same collectives.
3. The results are written back into the tensors in place.

Example::

    ef = ErrorFeedback()
    loss.backward()
    allreduce_compressed([p.grad for p in model.parameters()], "topk:0.01", error_feedback=ef)
    opt.step()
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from gradwire.compress import Compressor, ErrorFeedback, get_compressor

from .exchange import Sequencer, exchange

__all__ = ["allreduce_compressed"]


def allreduce_compressed(
    tensors: Sequence[Tensor],
    compressor: str | Compressor,
    group: dist.ProcessGroup | None = None,
    error_feedback: ErrorFeedback | None = None,
    keys: Sequence[Hashable] | None = None,
    async_op: bool = False,
) -> Future | None:
    """Replace each tensor by its average over ``group``, sent compressed.

    Args:
        tensors: this rank's tensors (same shapes on every rank); overwritten.
        compressor: a name such as ``"onebit"`` or a Compressor (keep the same
            object across steps: it may hold state, e.g. PowerSGD's warm start).
        group: process group; None for the default group.
        error_feedback: residual memory kept by the caller across steps.
        keys: names of the tensors for error feedback; default their positions.
        async_op: return a Future (value: the list of tensors) instead of waiting.

    Integer tensors are summed uncompressed and divided with truncation; empty
    tensors are left as they are.
    """
    comp = get_compressor(compressor)
    keys = list(range(len(tensors))) if keys is None else list(keys)
    if len(keys) != len(tensors):
        raise ValueError(f"got {len(keys)} keys for {len(tensors)} tensors")
    sequencer = Sequencer()
    futures = []
    for tensor, key in zip(tensors, keys):
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
        fut = exchange(flat, key, comp, group, error_feedback, sequencer)
        if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
            fut = fut.then(lambda f, t=tensor: t.copy_(f.value().view(t.shape)))
        futures.append(fut)
    done = torch.futures.collect_all(futures).then(lambda _: list(tensors))
    if async_op:
        return done
    done.wait()
    for fut in futures:
        fut.value()  # re-raise a failed tensor's error
    return None
