"""DDP comm hooks that send compressed gradients: thin adapters onto :mod:`gradwire.exchange`.

- :func:`compression_hook`: for ``ddp.register_comm_hook(state, compression_hook)``
  with a :class:`gradwire.exchange.CompressionState`.
- :func:`scheme_hook`: for ``ddp.register_comm_hook(scheme, scheme_hook)`` with
  the scheme :func:`gradwire.exchange.scheme_for` made for the user's optimizer.

The exchange itself (the state, the optimizer schemes, ``auto``'s chooser,
the patterns, :func:`~gradwire.exchange.allreduce_compressed`) lives in
:mod:`gradwire.exchange`. Its names were importable from here before; for one
release they still are, with a :class:`DeprecationWarning` that names the new place.
"""
from __future__ import annotations

import warnings
from typing import Any

from .hook import compression_hook, scheme_hook

__all__ = ["compression_hook", "scheme_hook"]

#: the names this package exported before the exchange moved to :mod:`gradwire.exchange`
_MOVED = frozenset({
    "COMPRESSORS", "AutoCompressor", "FUSE_NUMEL", "MIN_COMPRESS_NUMEL", "CompressionState", "Compressor",
    "ErrorFeedback", "OptimizerScheme", "ParamNames", "Sequencer", "StateKey", "Turn", "UnsupportedOptimizer",
    "allreduce_compressed", "completed", "fuse_layouts", "get_compressor", "scheme_for", "then", "then_async",
})


def __getattr__(name: str) -> Any:
    """An old name of the exchange: warn, then hand over :mod:`gradwire.exchange`'s object."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"gradwire.hooks.{name} moved to gradwire.exchange.{name}; the old name goes in the next release",
                  DeprecationWarning, stacklevel=2)
    import gradwire.exchange

    return getattr(gradwire.exchange, name)
