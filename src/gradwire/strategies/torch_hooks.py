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
hook one bucket at a time (:func:`gradwire.exchange.futures.one_bucket_at_a_time`).

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

from gradwire.exchange import Compressor
from gradwire.exchange.futures import one_bucket_at_a_time

from .averaging import _Averaging
from .base import CannotApply, DDPAttachment, ExchangeTraits, Timing
from .sync import BUCKET_CAP_MB, SyncStrategy
from .torch_exchanges import TorchFP16Exchange, TorchPowerSGDExchange

__all__ = ["DEFAULT_START", "TorchFP16Strategy", "TorchPostLocalSGDStrategy", "TorchPowerSGDStrategy"]

#: plain all_reduce steps before ``torch-powersgd`` compresses (PyTorch's ``start_powerSGD_iter``)
DEFAULT_START = 10


class TorchFP16Strategy(SyncStrategy):
    """DDP with ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``."""

    name = "torch-fp16"
    compressor_owns_momentum = False
    hook_description = "PyTorch's fp16_compress_hook"

    @classmethod
    def exchange_traits(cls, params: Mapping[str, float], compressor: Optional[str]) -> ExchangeTraits:
        return ExchangeTraits(TorchFP16Exchange(), BUCKET_CAP_MB)

    def comm_hook(self) -> tuple[Callable[[Any, dist.GradBucket], torch.futures.Future], Any]:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        return fp16_compress_hook, self.group


class TorchPowerSGDStrategy(SyncStrategy):
    """DDP with PyTorch's ``powerSGD_hook`` at matrix approximation rank ``R``."""

    name = "torch-powersgd"
    compressor_owns_momentum = False

    @classmethod
    def exchange_traits(cls, params: Mapping[str, float], compressor: Optional[str]) -> ExchangeTraits:
        """PyTorch's three all_reduces per bucket after ``start`` plain steps, one bucket at a time (module doc)."""
        return ExchangeTraits(TorchPowerSGDExchange(int(params["R"])), BUCKET_CAP_MB,
                              warmup_steps=int(params.get("start", DEFAULT_START)), one_bucket_at_a_time=True)

    def __init__(self, R: int, compressor: Optional[Union[str, Compressor]] = None, momentum: float = 0.9,  # noqa: N803
                 group: Optional[dist.ProcessGroup] = None, start: int = DEFAULT_START) -> None:
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


class TorchPostLocalSGDStrategy(_Averaging):
    """``torch-postlocalsgd:H[:warmup=W]``: PyTorch's own post-local SGD, as a peer of ``localsgd`` and ``diloco``.

    The pieces PyTorch ships (``torch.distributed.algorithms``): DDP's
    ``post_localSGD_hook`` averages gradients for the first ``W`` iterations and
    then lets them stay local (``post_local_gradient_allreduce=False``: its
    default would keep all-reducing within a node's subgroup, which on one
    machine is every rank), and ``PeriodicModelAverager`` averages the
    parameters every ``H`` steps after ``W``, as ``PostLocalSGDOptimizer.step``
    does after the optimizer's own step.
    """

    name = "torch-postlocalsgd"
    timing = Timing.AVERAGE

    def __init__(self, H: int, compressor: Optional[Union[str, Compressor]] = None, momentum: float = 0.9,  # noqa: N803
                 group: Optional[dist.ProcessGroup] = None, warmup: int = 0) -> None:
        super().__init__(H, compressor, momentum, group)
        if warmup < 0:
            raise ValueError(f"torch-postlocalsgd: warmup must be >= 0 steps, got {warmup}")
        self.warmup = warmup
        self._averager: Any = None

    def _make(self) -> tuple[Callable[[Any, dist.GradBucket], torch.futures.Future], Any]:
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        self._averager = PeriodicModelAverager(period=self.period, warmup_steps=self.warmup, process_group=self.group)
        state = PostLocalSGDState(process_group=self.group, subgroup=None, start_localSGD_iter=max(1, self.warmup),
                                  post_local_gradient_allreduce=False)
        return post_localSGD_hook, state

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        ddp = DDP(model, process_group=self.group)
        ddp.register_comm_hook(*reversed(self._make()))
        return ddp

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        self.group = self.dedicated_group()
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        hook, state = self._make()
        return DDPAttachment(hook, state, f"PyTorch's post_localSGD_hook and PeriodicModelAverager, every "
                                          f"{self.period} steps after {self.warmup}")

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()
        self.steps += 1
        with self.waiting():
            self._averager.average_parameters(self.params)
        self.averages = self._averager.step

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        from .base import average_parameters

        average_parameters(self.params, self.group)
