"""Which network the ``gradwire`` backend simulates.

Resolution order, read when a process group is created:
1. ``gradwire.configure(net=...)`` called in this process before
   ``init_process_group``;
2. the environment variable ``GRADWIRE_NET`` (so torchrun and spawned workers
   inherit it without code changes);
3. ``loopback`` (the simulated network adds nothing).
"""
from __future__ import annotations

import os

from gradwire.net import NetSpec, parse_spec

__all__ = ["ENV_VAR", "configure", "current_spec"]

ENV_VAR = "GRADWIRE_NET"
_configured: NetSpec | None = None


def configure(net: str | NetSpec | None = None) -> NetSpec:
    """Set the network for process groups created from now on in this process.

    Args:
        net: a spec string (``"10gbe,latency=200us"``), a :class:`NetSpec`, or
            None to fall back to ``$GRADWIRE_NET`` / loopback.

    Returns:
        The parsed spec. A bad spec raises ValueError here, not at init time.
    """
    global _configured
    _configured = None if net is None else NetSpec.of(net)
    return current_spec()


def current_spec() -> NetSpec:
    """The spec a process group created now would use.

    ``$GRADWIRE_NET`` is where a spec crosses into a process (torchrun, spawned
    ranks, a command's children) as a string: it is parsed here, once per call.
    """
    if _configured is not None:
        return _configured
    return parse_spec(os.environ.get(ENV_VAR) or None)
