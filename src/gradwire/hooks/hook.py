"""``compression_hook``: a DDP comm hook that sends compressed buckets.

1. Key the bucket by ``bucket.index()``; if DDP rebuilt its buckets, each
   parameter's momentum and residual move to its new place.
2. With ``state.momentum``: ``m = beta m + g`` in the bucket buffer.
3. During warm-up, or for a small bucket: plain average (all_reduce).
   Otherwise :func:`~gradwire.hooks.exchange.exchange` with the compressor and
   error feedback: compress now, exchange asynchronously, decompress in place
   into the bucket buffer in the last callback; with ``state.local_correction``
   add this rank's own change of residuals (see :mod:`gradwire.hooks.state`).
4. ``bucket.is_last()`` advances ``state.step``.

The hook never waits: it returns the chained future at once, so DDP keeps
overlapping communication with the rest of the backward pass. It works on any
process group whose Work returns a future (gloo, nccl, gradwire's backend).

Example::

    from gradwire.hooks import CompressionState, compression_hook
    state = CompressionState("onebit", momentum=0.9)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)  # no momentum: the hook owns it

Trap: the bucket layout of the first iteration differs from later ones when
DDP rebuilds buckets; the state follows the parameters (see
:mod:`gradwire.hooks.state`), and the default warm-up keeps the first
iteration uncompressed.
"""
# No ``from __future__ import annotations`` here: DDP's register_comm_hook checks
# the hook's annotations against the real dist.GradBucket and Future[Tensor].
import torch
import torch.distributed as dist

from gradwire.compress.none import NoneCompressor

from .exchange import exchange
from .state import CompressionState

__all__ = ["compression_hook"]

_PLAIN = NoneCompressor()


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over ``state.process_group`` through ``state.compressor``.

    Args:
        state: a :class:`CompressionState`.
        bucket: the DDP gradient bucket.

    Returns:
        A Future whose value is the bucket buffer holding the averaged result.
    """
    buf = bucket.buffer()
    key = bucket.index()
    state.check_layout(key, bucket.parameters())
    if state.momentum:
        state.apply_momentum(key, buf)
    if state.compressing(buf.numel()):
        correct = state.corrector(key, buf.numel()) if state.local_correction else None
        fut = exchange(buf, key, state.compressor, state.process_group, state.error_feedback, state.sequencer)
        if correct is not None:
            fut = fut.then(lambda f: correct(f.value()))
    else:
        fut = exchange(buf, key, _PLAIN, state.process_group, None, state.sequencer)
    if bucket.is_last():
        state.end_step()
    return fut
