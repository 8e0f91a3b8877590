"""DDP comm hooks and collective helpers that send compressed gradients.

- :class:`CompressionState`: the one object that runs a compressed exchange
  (compressor, error feedback, momentum, warm-up, cutoff, launch order, the
  patterns), for every front end.
- :func:`compression_hook`: for ``ddp.register_comm_hook(state, compression_hook)``.
- :func:`allreduce_compressed`: the same exchange for custom loops.
- :func:`scheme_for` / :func:`scheme_hook` (:mod:`.optim`): the exchange under
  the user's SGD, Adam or AdamW (momentum, decay and Adam's frozen variance
  split between the optimizer and the exchange).

The compressors themselves live in :mod:`gradwire.compress`; the names that
the rest of the package needs are re-exported here, so that strategies
reach compression through this package only.
"""
from __future__ import annotations

from gradwire.compress import COMPRESSORS, AutoCompressor, Compressor, ErrorFeedback, StateKey, get_compressor

from .allreduce import allreduce_compressed
from .futures import Sequencer, Turn, completed, then, then_async
from .hook import compression_hook
from .optim import OptimizerScheme, UnsupportedOptimizer, scheme_for, scheme_hook
from .state import FUSE_NUMEL, MIN_COMPRESS_NUMEL, CompressionState, ParamNames, fuse_layouts

__all__ = [
    "COMPRESSORS", "AutoCompressor", "FUSE_NUMEL", "MIN_COMPRESS_NUMEL", "CompressionState", "Compressor", "ErrorFeedback", "OptimizerScheme",
    "ParamNames", "Sequencer", "StateKey", "Turn", "UnsupportedOptimizer", "allreduce_compressed", "completed",
    "compression_hook", "fuse_layouts", "get_compressor", "scheme_for", "scheme_hook", "then", "then_async",
]
