"""Run a compressor's communication pattern on a process group, without blocking.

Every function returns a ``torch.futures.Future`` whose value is the flat
tensor it was given, overwritten with the averaged (decompressed) result:

1. ``compensate`` (error feedback) in place, ``compress`` on the caller's thread.
2. ``update`` the residual from this rank's own payload, before sending it.
3. Exchange: ``all_reduce`` of each payload tensor (pre-divided by the world
   size; several rounds for PowerSGD), or ``all_gather`` of the payload
   serialised into one uint8 buffer, or two-phase ``all_to_all_single`` +
   ``all_gather`` (server step in between).
4. Decompress in place into the flat tensor in the last callback.

Trap (ordering): gloo matches collectives by the order they are issued, so a
second-phase collective launched from a completion callback must never race a
first-phase collective of the next bucket launched by DDP. A :class:`Sequencer`
orders every launch: tensor ``i+1`` starts its collectives only after tensor
``i`` issued its last one. Single-collective patterns never wait.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from gradwire.compress import Compressor, ErrorFeedback, Pattern
from gradwire.compress.base import deserialize, serialize
from gradwire.compress import twophase

__all__ = ["Sequencer", "completed", "exchange", "then_async"]


def completed(value: Any) -> Future:
    """A future that already holds ``value``."""
    fut: Future = Future()
    fut.set_result(value)
    return fut


def then_async(fut: Future, fn: Callable[[Any], Future]) -> Future:
    """Like ``fut.then(fn)`` for an ``fn`` that returns a Future: the result settles with it."""
    out: Future = Future()

    def settle(inner: Future) -> None:
        try:
            out.set_result(inner.value())
        except BaseException as exc:  # noqa: BLE001 - forwarded to the waiter
            out.set_exception(exc)

    def step(done: Future) -> None:
        try:
            fn(done.value()).add_done_callback(settle)
        except BaseException as exc:  # noqa: BLE001 - forwarded to the waiter
            out.set_exception(exc)

    fut.add_done_callback(step)
    return out


class Sequencer:
    """Issue collectives in one deterministic order on every rank (see module doc)."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail: Future = completed(None)

    def start(self) -> tuple[Future, Future]:
        """Reserve the next slot: (gate to wait for, token to complete after the last launch)."""
        gate, token = self._tail, Future()
        self._tail = token
        return gate, token


def _write(flat: Tensor, result: Tensor) -> Tensor:
    if result.data_ptr() != flat.data_ptr():
        flat.copy_(result.reshape(flat.shape))
    return flat


def exchange(
    flat: Tensor,
    key: Hashable,
    compressor: Compressor,
    group: dist.ProcessGroup | None = None,
    error_feedback: ErrorFeedback | None = None,
    sequencer: Sequencer | None = None,
) -> Future:
    """Average the 1-D contiguous ``flat`` over ``group`` through ``compressor``; result in place.

    Args:
        flat: this rank's tensor; it is overwritten (first with the compensated
            value, finally with the result).
        key: names the tensor for error feedback and compressor state.
        compressor: what to send; its ``pattern`` picks the collectives.
        group: process group (None: the default group).
        error_feedback: residual memory, or None for none.
        sequencer: orders launches across calls (a fresh one if None).

    Returns:
        A Future whose value is ``flat`` once it holds the average.
    """
    gate, token = (sequencer or Sequencer()).start()
    world = dist.get_world_size(group)
    if flat.numel() == 0:  # nothing to send, but keep the order: pass the gate on
        gate.add_done_callback(lambda _: token.set_result(None))
        return completed(flat)
    if not flat.is_floating_point():
        return then_async(gate, lambda _: _allreduce_int(flat, group, world, token))
    if error_feedback is not None:
        error_feedback.compensate(flat, key)
    if compressor.pattern is Pattern.TWO_PHASE:
        lend = error_feedback.workspace(key, flat) if error_feedback is not None else None
        send, approx, plan = twophase.split_encode(flat, world, compressor, key, approx=lend)
        if error_feedback is not None:
            error_feedback.update(key, flat, approx)
        return then_async(gate, lambda _: _two_phase(flat, key, compressor, send, plan, group, error_feedback, token))
    payload, ctx = compressor.compress(flat, key)
    if compressor.pattern is Pattern.ALLGATHER:
        if error_feedback is not None:
            error_feedback.update(key, flat, compressor.decompress(payload, ctx))
        return then_async(gate, lambda _: _allgather(flat, compressor, payload, ctx, group, world, token))

    def launch(payload: list[Tensor], round_index: int) -> Future:
        try:
            last = round_index == compressor.rounds - 1
            if last and error_feedback is not None:
                error_feedback.update(key, flat, compressor.decompress(payload, ctx))
            for p in payload:
                p.div_(world)
            futs = [dist.all_reduce(p, group=group, async_op=True).get_future() for p in payload]
        except BaseException:
            token.set_result(None)  # release the next tensor's gate; the error reaches our waiter
            raise
        if last:
            token.set_result(None)
        fut = futs[0] if len(futs) == 1 else torch.futures.collect_all(futs)
        if last:
            return fut.then(lambda _: _finish(flat, compressor, payload, ctx))
        return then_async(fut, lambda _: launch(_next_round(compressor, payload, ctx, token), round_index + 1))

    return then_async(gate, lambda _: launch(payload, 0))


def _next_round(compressor: Compressor, payload: list[Tensor], ctx: Any, token: Future) -> list[Tensor]:
    try:
        return compressor.next_round(payload, ctx)
    except BaseException:
        token.set_result(None)
        raise


def _finish(flat: Tensor, compressor: Compressor, payload: list[Tensor], ctx: Any) -> Tensor:
    compressor.finish(payload, ctx)
    return _write(flat, compressor.decompress(payload, ctx))


def _allreduce_int(flat: Tensor, group: Any, world: int, token: Future) -> Future:
    fut = dist.all_reduce(flat, group=group, async_op=True).get_future()
    token.set_result(None)
    return fut.then(lambda _: flat.copy_(torch.div(flat, world, rounding_mode="trunc")))


def _allgather(flat: Tensor, compressor: Compressor, payload: list[Tensor], ctx: Any, group: Any, world: int,
               token: Future) -> Future:
    try:
        buf, layout = serialize(payload)
        gathered = torch.empty(world, buf.numel(), dtype=torch.uint8, device=buf.device)
        fut = dist.all_gather(list(gathered.unbind(0)), buf, group=group, async_op=True).get_future()
    finally:
        token.set_result(None)

    def decompress(_: Any) -> Tensor:
        payloads = [deserialize(row, layout) for row in gathered.unbind(0)]
        return _write(flat, compressor.combine(payloads, ctx))

    return fut.then(decompress)


def _two_phase(flat: Tensor, key: Hashable, compressor: Compressor, send: Tensor, plan: twophase.Plan, group: Any,
               error_feedback: ErrorFeedback | None, token: Future) -> Future:
    rank, world = dist.get_rank(group), send.shape[0]
    recv = torch.empty_like(send)
    try:
        fut = dist.all_to_all_single(recv, send, group=group, async_op=True).get_future()
    except BaseException:
        token.set_result(None)
        raise

    def server(_: Any) -> Future:
        try:
            row = twophase.server_reduce(recv, plan, rank, compressor, error_feedback, key)
            rows = torch.empty(world, row.numel(), dtype=torch.uint8, device=row.device)
            gathered = dist.all_gather(list(rows.unbind(0)), row, group=group, async_op=True).get_future()
        finally:
            token.set_result(None)
        return gathered.then(lambda _: twophase.gather_decode(rows, plan, compressor, out=flat))

    return then_async(fut, server)
