"""DDP comm hooks and collective helpers that send compressed gradients.

- :func:`compression_hook` with :class:`CompressionState`: for
  ``ddp.register_comm_hook(state, compression_hook)``.
- :func:`allreduce_compressed`: the same exchange for custom loops.
- :mod:`gradwire.hooks.exchange`: the patterns (all_reduce, all_gather,
  two-phase) as non-blocking future chains.
"""
from __future__ import annotations

from .allreduce import allreduce_compressed
from .exchange import Sequencer, exchange
from .hook import compression_hook
from .state import CompressionState

__all__ = ["CompressionState", "Sequencer", "allreduce_compressed", "compression_hook", "exchange"]
