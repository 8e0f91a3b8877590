"""gradwire: make the network a variable in PyTorch distributed training.

``import gradwire`` registers the torch.distributed backend ``gradwire``::

    import gradwire, torch.distributed as dist
    gradwire.configure("1gbe")            # or: export GRADWIRE_NET=1gbe
    dist.init_process_group("gradwire")   # every collective now runs on a simulated 1 GbE
    ...
    print(gradwire.stats().as_dict())     # calls, bytes on the wire, modelled seconds per op

``gradwire.report(step=..., loss=...)`` puts a script's own metrics into the
table of ``gradwire compare -- CMD`` (a no-op anywhere else).
"""
from __future__ import annotations

__version__ = "0.1.0"

from gradwire.backend import (  # noqa: E402 - registers the backend
    clock,
    configure,
    events,
    export_trace,
    network,
    reset_stats,
    stats,
)
from gradwire._report import report  # noqa: E402
from gradwire.exchange.futures import drain_at_destroy, stage_callbacks_on_the_clock  # noqa: E402

drain_at_destroy()  # an exchange's callbacks end before its group can go (the function's trap)
stage_callbacks_on_the_clock()  # a callback on an op's future runs at the same instant on any host (its trap)

__all__ = ["__version__", "clock", "configure", "events", "export_trace", "network", "report", "reset_stats", "stats"]
