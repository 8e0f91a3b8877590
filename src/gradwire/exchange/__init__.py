"""The compressed exchange: one state for every front end, and the collectives that send compressed gradients.

- :class:`CompressionState` (:mod:`.state`): the one object that runs a
  compressed exchange (compressor, error feedback, momentum, warm-up, cutoff,
  launch order, the patterns), for every front end: the DDP comm hooks
  (:mod:`gradwire.hooks`), the strategies (:mod:`gradwire.strategies`) and
  :func:`allreduce_compressed`.
- :func:`allreduce_compressed` (:mod:`.allreduce`): the same exchange for custom loops.
- :func:`scheme_for` (:mod:`.schemes`): the exchange under the user's SGD, Adam
  or AdamW (momentum, decay and Adam's frozen variance split between the
  optimizer and the exchange); :func:`gradwire.hooks.scheme_hook` is its DDP hook.
  :class:`LocalMomentsAdam` (:mod:`.local_moments`): Adam/AdamW for a script
  that clips by norm under a 1-bit-class exchange.
- :mod:`.checkpoint`: ``state_dict()`` gathers every rank's momentum and
  residuals (a collective), so that rank 0 alone saves and every rank resumes.
- :mod:`.chooser`: what ``auto`` sends, chosen from the measured link.
- :mod:`.patterns`: the exchange patterns (all_reduce, all_gather, two
  phases) as non-blocking future chains; :mod:`.futures`: the chains' helpers
  and the launch order.

The compressors themselves live in :mod:`gradwire.compress`; the names that
the rest of the package needs are re-exported here, so that strategies
reach compression through this package only. The DDP comm hooks live one
layer up, in :mod:`gradwire.hooks` (``compression_hook``, ``scheme_hook``):
the exchange does not know about DDP's buckets.
"""
from __future__ import annotations

from gradwire.compress import COMPRESSORS, AutoCompressor, Compressor, ErrorFeedback, StateKey, get_compressor

from .allreduce import allreduce_compressed
from .checkpoint import CheckpointError
from .futures import Sequencer, Turn, completed, then, then_async
from .local_moments import LocalMomentsAdam
from .schemes import OptimizerScheme, UnsupportedOptimizer, scheme_for
from .state import FUSE_NUMEL, MIN_COMPRESS_NUMEL, CompressionState, ParamNames, fuse_layouts

__all__ = [
    "COMPRESSORS", "AutoCompressor", "CheckpointError", "FUSE_NUMEL", "MIN_COMPRESS_NUMEL", "CompressionState", "Compressor", "ErrorFeedback", "LocalMomentsAdam",
    "OptimizerScheme",
    "ParamNames", "Sequencer", "StateKey", "Turn", "UnsupportedOptimizer", "allreduce_compressed", "completed",
    "fuse_layouts", "get_compressor", "scheme_for", "then", "then_async",
]
