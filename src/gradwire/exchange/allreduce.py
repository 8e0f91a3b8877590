"""``allreduce_compressed``: average a list of tensors through a compressor, without DDP.

For custom training loops:

1. Each tensor gets a flat, contiguous working view (a copy when it is not
   contiguous) and its key (``keys[i]``, default its position).
2. A :class:`~gradwire.exchange.CompressionState` with no warm-up and no size
   cutoff runs the compressor's pattern; launches are ordered so that every
   rank issues the same collectives.
3. The results are written back into the tensors in place.

Example::

    ef = ErrorFeedback()
    loss.backward()
    allreduce_compressed([p.grad for p in model.parameters()], "topk:0.01", error_feedback=ef)
    opt.step()
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from gradwire.compress import Compressor, ErrorFeedback, StateKey

from .futures import then
from .state import CompressionState

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
        error_feedback: residual memory kept by the caller across steps (None: none).
        keys: names of the tensors for error feedback; default their positions.
        async_op: return a Future (value: the list of tensors) instead of waiting.

    Integer tensors are summed uncompressed and divided with truncation; empty
    tensors are left as they are. A failed collective raises (or fails the
    returned future).
    """
    names = [str(i) for i in range(len(tensors))] if keys is None else [str(k) for k in keys]
    if len(names) != len(tensors):
        raise ValueError(f"got {len(names)} keys for {len(tensors)} tensors; pass one key per tensor")
    state = CompressionState(compressor, group, error_feedback=False if error_feedback is None else error_feedback,
                             warmup_iters=0, min_compress_numel=0, local_correction=False)
    futures = []
    for tensor, name in zip(tensors, names):
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
        fut = state.reduce(flat, StateKey.of(name, flat.numel()))
        if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
            fut = then(fut, _copy_into(tensor))
        futures.append(fut)

    def results(futs: list[Future]) -> list[Tensor]:
        for f in futs:
            f.value()  # the first failure fails the whole call
        return list(tensors)

    done = then(torch.futures.collect_all(futures), results)
    if async_op:
        return done
    done.wait()
    return None


def _copy_into(tensor: Tensor) -> Callable[[Tensor], Tensor]:
    """A callback writing its (flat) value back into ``tensor``."""
    return lambda value: tensor.copy_(value.view(tensor.shape))
