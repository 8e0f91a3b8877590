"""The DDP comm hooks: thin adapters onto the compressed exchange (:mod:`gradwire.exchange`).

``compression_hook`` sends compressed buckets; ``scheme_hook`` first lets an
optimizer scheme (:func:`gradwire.exchange.scheme_for`) prepare each bucket. ``compression_hook``, step by step:

1. The bucket's parameters name its elements (a
   :class:`~gradwire.compress.StateKey`): momentum and residuals follow each
   parameter when DDP rebuilds its buckets.
2. :meth:`CompressionState.reduce_params` runs the whole exchange: momentum,
   plain average during warm-up and for small buckets, otherwise error
   feedback, compression and the pattern's collectives, decompressed in
   place into the bucket buffer in the last callback: the same average on
   every rank (the local correction, an option, adds the rank's own error). Small buckets of a compressing step wait for the next ones and
   leave as one exchange (fusion, up to ``state.fuse_numel`` elements, or
   at the step's last bucket).
3. ``bucket.is_last()`` advances ``state.step``.

The hook never waits: it returns the chained future at once, so DDP keeps
overlapping communication with the rest of the backward pass. A failed
collective fails the returned future, so ``backward()`` raises as it does
with PyTorch's own hooks. It works on any process group whose Work returns a
future (gloo, nccl, gradwire's backend).

Example::

    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook
    state = CompressionState("onebit", momentum=0.9)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)  # no momentum: the state owns it
"""
# No ``from __future__ import annotations`` here: DDP's register_comm_hook checks
# the hook's annotations against the real dist.GradBucket and Future[Tensor].
import torch
import torch.distributed as dist

from gradwire.exchange import CompressionState, OptimizerScheme, completed

__all__ = ["compression_hook", "scheme_hook"]


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over ``state.process_group`` through ``state.compressor``.

    Args:
        state: a :class:`CompressionState`.
        bucket: the DDP gradient bucket.

    Returns:
        A Future whose value is the bucket buffer holding the averaged result.
    """
    _, fut = state.reduce_params(bucket.buffer(), bucket.parameters(), last=bucket.is_last())
    if bucket.is_last():
        state.end_step()
    return fut


def scheme_hook(scheme: OptimizerScheme, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: :meth:`OptimizerScheme.prepare` the bucket, then :func:`compression_hook` on its state.

    A scheme that exchanges in its step (:class:`~gradwire.exchange.LocalMomentsAdam`) gets the bucket back as
    it is: this rank's own gradient.
    """
    if getattr(scheme, "local_gradients", False):
        return completed(bucket.buffer())
    scheme.prepare(bucket.buffer(), bucket.parameters())
    return compression_hook(scheme.state, bucket)
