"""``sync``: DDP's own bucketed overlap, the baseline every other strategy is compared to.

DDP launches one all_reduce per bucket as soon as the bucket's gradients are
ready, so communication overlaps the rest of the backward pass; at the end of
backward it waits (in C++) for every bucket's future before ``backward()``
returns. With a compressor, :func:`gradwire.hooks.compression_hook` replaces
the bucket all_reduce and owns the momentum.

Exposed time (how it is measured): DDP's wait happens in C++, out of reach of
``Work.wait()`` accounting. A timing hook wraps the comm hook and stamps the
moment the *last* bucket's hook returned, i.e. backward's compute (including
any compression) is over; :meth:`SyncStrategy.step` runs right after
``backward()`` returned, when every bucket future completed. That interval is
recorded as the step's wait window (:meth:`Strategy.add_wait`): the
communication that was not hidden behind backward, split into network and
late-peer time like every other wait (:func:`gradwire.strategies.split_exposed`).
"""
# No ``from __future__ import annotations``: register_comm_hook checks the
# hook's annotations against the real dist.GradBucket and Future[Tensor].
import time
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire.exchange import Compressor
from gradwire.exchange.state import warmup_steps

from .base import DDPAttachment, ExchangeTraits, Strategy, Timing, average_parameters

__all__ = ["BUCKET_CAP_MB", "SyncStrategy"]

#: the ``bucket_cap_mb`` sync gives DDP: DDP's default size, but given explicitly, so that DDP caps the
#: first bucket at it too (left to DDP, the first bucket is capped at 1 MiB)
BUCKET_CAP_MB = 25.0


class _TimedHook:
    """State of :func:`_timed_hook`: the wrapped hook and the stamp of the last bucket."""

    __slots__ = ("hook", "state", "last_bucket_done")

    def __init__(self, hook: Callable[[Any, dist.GradBucket], torch.futures.Future], state: Any) -> None:
        self.hook = hook
        self.state = state
        self.last_bucket_done: Optional[float] = None


def _timed_hook(timed: _TimedHook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    fut = timed.hook(timed.state, bucket)
    if bucket.is_last():
        timed.last_bucket_done = time.perf_counter()
    return fut


class SyncStrategy(Strategy):
    """DDP with (optionally compressed) bucketed all_reduce; optimizer steps every iteration.

    Args:
        bucket_cap_mb: DDP's bucket size; smaller buckets start communicating earlier.
    """

    name = "sync"
    timing = Timing.BLOCKING
    owns_step = False
    #: what :meth:`attach_ddp` says it applied
    hook_description = "gradwire's compression hook"

    def __init__(self, compressor: Optional[Union[str, Compressor]] = None, momentum: float = 0.9,
                 group: Optional[dist.ProcessGroup] = None, bucket_cap_mb: float = BUCKET_CAP_MB) -> None:
        super().__init__(compressor, momentum, group)
        self.bucket_cap_mb = bucket_cap_mb
        self._timed: Optional[_TimedHook] = None
        self._step_started: Optional[float] = None
        self._attached_state: Any = None

    @classmethod
    def exchange_traits(cls, params: Mapping[str, float], compressor: Optional[str]) -> ExchangeTraits:
        return ExchangeTraits(compressor, BUCKET_CAP_MB, warmup_steps(compressor))

    def wrap(self, model: nn.Module) -> nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        ddp = DDP(model, process_group=self.group, bucket_cap_mb=self.bucket_cap_mb)
        self._timed = _TimedHook(*self.comm_hook())
        ddp.register_comm_hook(self._timed, _timed_hook)
        return ddp

    def comm_hook(self) -> tuple[Callable[[Any, dist.GradBucket], torch.futures.Future], Any]:
        """The DDP comm hook and its state: plain all_reduce, or gradwire's compression hook."""
        if self.compressor is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            return allreduce_hook, self.group
        from gradwire.exchange import CompressionState
        from gradwire.hooks import compression_hook

        return compression_hook, CompressionState(self.compressor, process_group=self.group, momentum=self.momentum)

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        """The comm hook on the script's DDP, its exchange on a group of its own (:meth:`dedicated_group`)."""
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        self.group = self.dedicated_group()
        hook, self._attached_state = self.comm_hook()
        return DDPAttachment(hook, self._attached_state, self.hook_description)

    def scheme_exchange(self) -> Any:
        from gradwire.exchange import CompressionState

        state = self._attached_state
        return state if isinstance(state, CompressionState) else None

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the parameters once when the compression hook applies local corrections (``correct=1``).

        With the local correction every rank sits within ``lr * residual`` of
        the common model (see :mod:`gradwire.exchange.state`); one exact
        average at the end makes the replicas identical again. Off (the
        default) they are identical already and nothing is sent.
        """
        state = self._timed.state if self._timed is not None else None
        if getattr(state, "local_correction", False):
            average_parameters(self.params, self.group)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        now = time.perf_counter()
        assert self._timed is not None, "call wrap() first"
        last = self._timed.last_bucket_done
        if last is not None:
            self.add_wait(last, now)
        self._timed.last_bucket_done = None
        optimizer.step()
        self.steps += 1
