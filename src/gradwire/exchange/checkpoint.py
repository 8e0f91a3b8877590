"""Checkpoints of per-rank exchange state: gathered by one collective, saved by one rank, each rank's part at load.

The exchange's parameters are the same on every rank (every rank applies
the same average), but its momentum and error-feedback residuals are not:
each comes from the rank's own gradients. A script that saves on rank 0
alone (as PyTorch's tutorials do) needs every rank's part in that one file,
so ``state_dict()`` is a collective, as torch's ``ZeroRedundancyOptimizer``
consolidates its shards before rank 0 saves:

1. every rank serialises its part (``torch.save`` bytes);
2. an all_gather of the sizes, waited for at most ``timeout`` seconds: a
   rank that never calls (``state_dict()`` inside ``if rank == 0:``) shows
   here, and the ranks that called raise :class:`CheckpointError` saying
   that every rank must call it, instead of waiting forever;
3. an all_gather of the padded bytes; every rank returns
   ``{"world": W, "ranks": [part_0, ..., part_{W-1}]}`` (save it on one).

At load (:func:`own_part`), a rank of the same world size takes its own
part. On another world size no part is a rank's own; the caller's ``merge``
builds an approximate one (the exchange: the mean of the ranks' momenta and
worker residuals, whose average is what the update carries; server
residuals restart at zero) and the returned problem says so, for a warning.
A part saved by the per-rank ``local_state_dict()`` loads as it is.

Trap: the gather holds the state of all W ranks at once on every rank for
a moment (W times the momentum and residuals); call it between steps, never
with an exchange in flight.
"""
from __future__ import annotations

import datetime
import io
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["GATHER_TIMEOUT", "CheckpointError", "gather_parts", "mean_tensors", "own_part"]

#: seconds a rank waits in ``state_dict()`` for the others to call it too (they may be evaluating first)
GATHER_TIMEOUT = 300.0


class CheckpointError(RuntimeError):
    """A checkpoint collective that not every rank joined (the message says what to do)."""


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """Where the group's collectives take tensors: the current GPU under NCCL, else the CPU."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(part: dict[str, Any]) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(part, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _decode(data: torch.Tensor) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True)
    return loaded


def gather_parts(part: dict[str, Any], group: dist.ProcessGroup | None, what: str,
                 timeout: float = GATHER_TIMEOUT) -> dict[str, Any]:
    """Every rank's ``part`` of ``group``, on every rank: ``{"world": W, "ranks": [...]}`` (module doc).

    ``what`` names the call for the error (``"CompressionState.state_dict()"``).

    Raises:
        CheckpointError: not every rank called it within ``timeout`` seconds.
    """
    if not dist.is_available() or not dist.is_initialized():
        return {"world": 1, "ranks": [part]}
    world = dist.get_world_size(group)
    device = _device(group)
    data = _encode(part).to(device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    work = dist.all_gather(sizes, size, group=group, async_op=True)
    try:
        assert work is not None
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise CheckpointError(f"{what} is a collective: every rank of the group must call it (this rank waited "
                              f"{timeout:g} s for the others; call it outside `if rank == 0:`, then save on one "
                              f"rank) [{str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}]") from None
    longest = int(max(int(s) for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    rows = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(rows, padded, group=group)
    return {"world": world, "ranks": [_decode(row[:int(n)]) for row, n in zip(rows, sizes)]}


def own_part(saved: dict[str, Any], rank: int, world: int,
             merge: Callable[[list[dict[str, Any]], int], dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """This rank's part of a gathered checkpoint, and what is approximate about it (None: nothing).

    ``saved`` without ``"ranks"`` is one rank's part (``local_state_dict()``)
    and is returned as it is. On another world size ``merge(parts, rank)``
    builds the part.
    """
    if "ranks" not in saved:
        return saved, None
    parts = list(saved["ranks"])
    if len(parts) == world:
        return parts[rank], None
    return merge(parts, rank), (
        f"it was saved by {len(parts)} ranks and this run has {world}: no saved part is this rank's own, so each "
        f"rank starts from the mean of the saved ranks' momenta and worker residuals (their average carries over, "
        f"each rank's own share does not), the server residuals restart at zero and the compressor's random "
        f"streams are those of saved rank {rank % len(parts)}")


def mean_tensors(values: list[Any]) -> Any:
    """The element-wise mean of tensors (None where any is None; their dtype kept)."""
    if any(v is None for v in values):
        return None
    stacked = torch.stack([v.double() for v in values])
    return stacked.mean(0).to(values[0].dtype)
