"""PyTorch's own DDP comm hooks as strategies, so they run as peers in every comparison.

- ``torch-fp16``: ``default_hooks.fp16_compress_hook`` (cast to fp16, all_reduce, cast back).
- ``torch-powersgd:R``: ``powerSGD_hook.powerSGD_hook`` with rank ``R``; PyTorch's
  defaults otherwise (error feedback and warm start on, uncompressed all_reduce
  for the first ``start`` iterations — 10 unless ``:start=N`` is given).

They are the compression, so they compose with no gradwire compressor, and the
optimizer keeps its momentum (PyTorch's hooks feed back the error of the
gradient, not of the momentum).

Trap: PyTorch's ``powerSGD_hook`` issues its second all_reduce from the
first one's completion callback; on a simulated network that callback runs
late, on another thread, and races the next bucket's all_reduce, so the ranks
could pair different collectives. ``torch-powersgd`` therefore runs the
hook one bucket at a time (:func:`gradwire.hooks.futures.one_bucket_at_a_time`).

Trap: PyTorch's ``powerSGD_hook`` calls ``torch.cuda.synchronize(device)`` with
the bucket's device whenever CUDA is available, so a CPU model on a machine
with a GPU fails inside the hook's callback ("Expected a cuda device, but got:
cpu"). ``torch-powersgd`` refuses that case at ``wrap`` with the way out;
gradwire's own trainings (``compare``, ``run_training``) hide the GPUs from
their CPU ranks.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire.hooks import Compressor
from gradwire.hooks.futures import one_bucket_at_a_time

from .base import CannotApply, DDPAttachment
from .sync import SyncStrategy

__all__ = ["TorchFP16Strategy", "TorchPowerSGDStrategy"]


class TorchFP16Strategy(SyncStrategy):
    """DDP with ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``."""

    name = "torch-fp16"
    compressor_owns_momentum = False
    hook_description = "PyTorch's fp16_compress_hook"

    @classmethod
    def equivalent_compressor(cls, params: Mapping[str, int], compressor: Optional[str]) -> Optional[str]:
        return "fp16"

    def comm_hook(self) -> tuple[Callable[[Any, dist.GradBucket], torch.futures.Future], Any]:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        return fp16_compress_hook, self.group


class TorchPowerSGDStrategy(SyncStrategy):
    """DDP with PyTorch's ``powerSGD_hook`` at matrix approximation rank ``R``."""

    name = "torch-powersgd"
    compressor_owns_momentum = False

    @classmethod
    def equivalent_compressor(cls, params: Mapping[str, int], compressor: Optional[str]) -> Optional[str]:
        return f"powersgd:{params['R']}"

    def __init__(self, R: int, compressor: Optional[Union[str, Compressor]] = None, momentum: float = 0.9,  # noqa: N803
                 group: Optional[dist.ProcessGroup] = None, start: int = 10) -> None:
        super().__init__(compressor, momentum, group)
        self.rank = R
        self.start = start
        self.hook_description = f"PyTorch's powerSGD_hook, rank {R}"

    @staticmethod
    def _check_device(model: torch.nn.Module) -> None:
        on_cpu = any(p.device.type == "cpu" for p in model.parameters())
        if on_cpu and torch.cuda.is_available():
            raise CannotApply(
                "PyTorch's powerSGD_hook cannot train a CPU model on a machine with CUDA "
                "(it calls torch.cuda.synchronize on the CPU bucket's device); move the model to the GPU, "
                "hide the GPUs (CUDA_VISIBLE_DEVICES=) or use gradwire's powersgd:R")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        try:
            self._check_device(model)
        except CannotApply as exc:
            raise RuntimeError(f"torch-powersgd: {exc}") from None
        return super().wrap(model)

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        self._check_device(ddp.module)
        return super().attach_ddp(ddp)

    def comm_hook(self) -> tuple[Callable[[Any, dist.GradBucket], torch.futures.Future], Any]:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        state = ps.PowerSGDState(process_group=self.group, matrix_approximation_rank=self.rank,
                                 start_powerSGD_iter=self.start)
        return one_bucket_at_a_time(ps.powerSGD_hook), state
