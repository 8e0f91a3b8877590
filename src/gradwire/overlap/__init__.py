"""Deprecated: the strategies moved to :mod:`gradwire.strategies`; this name goes in the next release.

Importing ``gradwire.overlap`` warns once (a :class:`DeprecationWarning`) and
hands over the names it exported before, from their new place. Its submodules
(``gradwire.overlap.registry``, ``.base``, ...) are gone: import them from
:mod:`gradwire.strategies`, and the script injection from :mod:`gradwire.compare.inject`.
"""
from __future__ import annotations

import warnings

from gradwire.strategies import (
    STRATEGIES, AsyncAverageStrategy, AsyncGradientHandler, CannotApply, DelayedStrategy, ExchangeModel, ExchangeTraits,
    HandlerStrategy, LocalSGDStrategy, Strategy, StrategyChoice, StrategySpec, SyncStrategy, Timing, broadcast_module,
    build_strategy, check_composition, network_wait, parse_strategy, split_exposed, step_comm_seconds,
)

warnings.warn("gradwire.overlap moved to gradwire.strategies; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = [
    "STRATEGIES", "AsyncAverageStrategy", "CannotApply", "ExchangeModel", "ExchangeTraits", "Timing", "StrategyChoice", "AsyncGradientHandler", "DelayedStrategy",
    "HandlerStrategy", "LocalSGDStrategy", "Strategy", "StrategySpec", "SyncStrategy", "broadcast_module",
    "build_strategy", "check_composition", "network_wait", "parse_strategy", "split_exposed",
    "step_comm_seconds",
]
