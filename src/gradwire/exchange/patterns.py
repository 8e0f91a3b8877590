"""The exchange patterns as non-blocking future chains (used by :class:`~gradwire.exchange.CompressionState`).

Every function averages the 1-D contiguous ``flat`` over ``group`` and
returns a Future whose value is ``flat``, overwritten with the (decompressed)
average. They take a :class:`~gradwire.exchange.futures.Turn` and issue their
collectives in it; compression runs on the caller's thread before the turn
opens, so it overlaps the previous exchange.

- :func:`average`: plain all_reduce of the pre-divided tensor (DDP's order
  of operations); integers are summed and divided with truncation.
- :func:`allreduce_rounds`: all_reduce of each payload tensor, pre-divided
  (linear payloads); several rounds for PowerSGD, the next round's payload
  computed from the averaged one.
- :func:`allgather`: every rank's payload serialised into one uint8 row,
  all_gather, then ``combine`` (decode each and average).
- :func:`two_phase`: DeepSpeed's compressed all_reduce: all_to_all of
  compressed chunks, each rank averages the chunk it serves and re-compresses
  it with its own (server) error feedback, all_gather of the compressed
  chunks (tensor steps in :mod:`gradwire.compress.twophase`).

Error feedback of the worker: ``update_residual(approx)`` receives this rank's
own decoded payload before it is sent (``c - approx`` is what was dropped).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from gradwire.compress import Compressor, ErrorFeedback, StateKey, is_finite
from gradwire.compress import twophase
from gradwire.compress.base import deserialize, serialize

from .futures import Turn, completed, then

__all__ = ["allgather", "allreduce_rounds", "average", "two_phase"]

UpdateResidual = Callable[[Tensor], Any]


def _write(flat: Tensor, result: Tensor) -> Tensor:
    if result.data_ptr() != flat.data_ptr():
        flat.copy_(result.reshape(flat.shape))
    return flat


def average(turn: Turn, flat: Tensor, group: dist.ProcessGroup | None, divided: bool = False) -> Future:
    """The plain average: ``flat / world`` all_reduced (integers: summed, then divided with truncation).

    ``divided``: the caller wrote ``flat`` already divided by the world size (the momentum step does it in the
    pass that writes ``flat``: one pass over the bucket fewer).
    """
    world = dist.get_world_size(group)
    if flat.numel() == 0:  # nothing to send; keep the order
        return turn.issue(lambda _: completed(flat))
    if not flat.is_floating_point():
        fut = turn.issue(lambda _: dist.all_reduce(flat, group=group, async_op=True).get_future())
        return then(fut, lambda _: flat.copy_(torch.div(flat, world, rounding_mode="trunc")))
    if not divided:
        flat.div_(world)
    return then(turn.issue(lambda _: dist.all_reduce(flat, group=group, async_op=True).get_future()), lambda _: flat)


def allreduce_rounds(turn: Turn, flat: Tensor, key: StateKey, compressor: Compressor,
                     group: dist.ProcessGroup | None, update_residual: UpdateResidual | None) -> Future:
    """Linear payloads: all_reduce each round's payload; PowerSGD's second round from the first's average."""
    world, rounds = dist.get_world_size(group), compressor.rounds
    first, ctx = compressor.compress(flat, key)
    current = [first]  # the payload of the round in flight

    def launch(index: int) -> Callable[[Any], Future]:
        def issue(_: Any) -> Future:
            if index:
                current[0] = compressor.next_round(current[0], ctx)
            if index == rounds - 1 and update_residual is not None:
                update_residual(compressor.decompress(current[0], ctx))
            for p in current[0]:
                p.div_(world)
            futs = [dist.all_reduce(p, group=group, async_op=True).get_future() for p in current[0]]
            return then(torch.futures.collect_all(futs), lambda done: [f.value() for f in done])

        return issue

    fut = turn.issue(launch(0), last=rounds == 1)
    for index in range(1, rounds):
        fut = turn.issue(launch(index), after=fut, last=index == rounds - 1)

    def finish(_: Any) -> Tensor:
        compressor.finish(current[0], ctx)
        return _write(flat, compressor.decompress(current[0], ctx))

    return then(fut, finish)


def allgather(turn: Turn, flat: Tensor, key: StateKey, compressor: Compressor, group: dist.ProcessGroup | None,
              update_residual: UpdateResidual | None) -> Future:
    """All_gather every rank's serialised payload, then decode each and average (``combine``)."""
    world = dist.get_world_size(group)
    payload, ctx = compressor.compress(flat, key)
    if update_residual is not None:
        update_residual(compressor.decompress(payload, ctx))
    buf, layout = serialize(payload)
    gathered = torch.empty(world, buf.numel(), dtype=torch.uint8, device=buf.device)
    fut = turn.issue(lambda _: dist.all_gather(list(gathered.unbind(0)), buf, group=group, async_op=True).get_future())

    def decompress(_: Any) -> Tensor:
        payloads = [deserialize(row, layout) for row in gathered.unbind(0)]
        return _write(flat, compressor.combine(payloads, ctx))

    return then(fut, decompress)


def two_phase(turn: Turn, flat: Tensor, key: StateKey, compressor: Compressor, group: dist.ProcessGroup | None,
              error_feedback: ErrorFeedback | None, finite: bool) -> Future:
    """all_to_all of compressed chunks, server average + re-compression, all_gather of the chunks.

    With error feedback, the worker residual of ``key`` and the server
    residual of the chunk this rank serves (``key.serving(start, count)``)
    are updated, unless the step is not finite (``finite`` for the worker;
    the server checks its average).
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ef = error_feedback
    lend = ef.workspace(key, flat) if ef is not None and finite else None
    send, approx, plan = twophase.split_encode(flat, world, compressor, key, approx=lend)
    if ef is not None:
        ef.update(key, flat, approx, finite)
    recv = torch.empty_like(send)
    rows = torch.empty(world, plan.row_bytes, dtype=torch.uint8, device=send.device)
    fut = turn.issue(lambda _: dist.all_to_all_single(recv, send, group=group, async_op=True).get_future(),
                     last=False)

    def serve(_: Any) -> Future:
        chunk = twophase.server_combine(recv, plan, rank, compressor)
        served = key.serving(*plan.bounds[rank])
        ok = True
        if ef is not None:
            ef.compensate(chunk, served)
            ok = is_finite(chunk)
        row, chunk_approx = twophase.encode_row(chunk, plan, rank, compressor, key,
                                                approx=ef.workspace(served, chunk) if ef is not None and ok else None)
        if ef is not None:
            ef.update(served, chunk, chunk_approx, ok)
        return dist.all_gather(list(rows.unbind(0)), row, group=group, async_op=True).get_future()

    fut = turn.issue(serve, after=fut)
    return then(fut, lambda _: twophase.gather_decode(rows, plan, compressor, out=flat))
