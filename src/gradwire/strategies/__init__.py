"""Training strategies (synchronous, delayed, local SGD, DiLoCo, PyTorch's hooks), composable with every compressor.

- :func:`parse_strategy` / :func:`build_strategy`: ``"onebit+delayed"``,
  ``"topk:0.01+localsgd:4:warmup=50"``, ... (see :mod:`.registry`, one entry
  per strategy with its traits).
- Strategies, one file each: ``sync`` (DDP, :mod:`.sync`), ``delayed`` (local
  gradient now, its average a step later, :mod:`.delayed`), ``localsgd:H`` and
  ``async-average:H`` (:mod:`.averaging`), ``handler``
  (:class:`AsyncGradientHandler`, :mod:`.handler`), ``diloco:H`` and
  ``streaming-diloco:H`` (:mod:`.diloco`), PyTorch's ``torch-fp16``,
  ``torch-powersgd:R`` and ``torch-postlocalsgd:H`` as peers
  (:mod:`.torch_hooks`), torchft's ``torchft-diloco:H`` (:mod:`.torchft_diloco`);
  what they share in :mod:`.base`.
- :func:`step_comm_seconds`: modelled network seconds per step from the
  backend's event log; :func:`split_exposed`: how much of each step's waiting
  was for the modelled network (the rest: the peer, or CPU work).
"""
from __future__ import annotations

from .averaging import AsyncAverageStrategy, LocalSGDStrategy
from .base import CannotApply, ExchangeModel, ExchangeTraits, Strategy, Timing, broadcast_module
from .delayed import DelayedStrategy
from .handler import AsyncGradientHandler, HandlerStrategy
from .metrics import network_wait, split_exposed, step_comm_seconds
from .registry import (
    NOT_AN_AVERAGE, STRATEGIES, StrategyChoice, StrategyEntry, StrategySpec, build_strategy, check_composition,
    parse_strategy, register_strategy,
)
from .sync import SyncStrategy

__all__ = [
    "NOT_AN_AVERAGE", "StrategyEntry", "register_strategy",
    "STRATEGIES", "AsyncAverageStrategy", "CannotApply", "ExchangeModel", "ExchangeTraits", "Timing", "StrategyChoice", "AsyncGradientHandler", "DelayedStrategy",
    "HandlerStrategy", "LocalSGDStrategy", "Strategy", "StrategySpec", "SyncStrategy", "broadcast_module",
    "build_strategy", "check_composition", "network_wait", "parse_strategy", "split_exposed",
    "step_comm_seconds",
]
