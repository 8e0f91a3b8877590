"""Run an unchanged script under the gradwire backend (used by ``gradwire profile``).

``gradwire profile`` puts ``_site/`` on PYTHONPATH; its ``sitecustomize``
imports this module in every Python process of the job, which:

1. makes ``init_process_group`` use backend ``gradwire`` whatever the script
   names (gloo, nccl, or the default), with the spec from ``GRADWIRE_NET``;
2. starts a :class:`ProfileSession` right after init;
3. writes ``$GRADWIRE_PROFILE_DIR/rank<N>.json`` (and a trace) when the script
   calls ``destroy_process_group`` or exits — before teardown, because gloo
   teardown occasionally aborts the process.
"""
from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

DIR_ENV = "GRADWIRE_PROFILE_DIR"
TORCH_PROFILER_ENV = "GRADWIRE_PROFILE_TORCH"
_session = None


def _dump() -> None:
    global _session
    if _session is None:
        return
    session, _session = _session, None
    out = Path(os.environ[DIR_ENV])
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    session.trace = out / f"trace.rank{rank}.json"
    result = session.stop()
    result.rank = rank
    (out / f"rank{rank}.json").write_text(json.dumps(result.as_dict()))


def install() -> None:
    """Patch torch.distributed in this process (idempotent)."""
    if not os.environ.get(DIR_ENV):
        return
    import torch.distributed as dist

    import gradwire
    from gradwire.profile.session import ProfileSession

    if getattr(dist.init_process_group, "_gradwire_patched", False):
        return
    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group

    def init_process_group(backend: str | None = None, *args, **kwargs):  # type: ignore[no-untyped-def]
        global _session
        kwargs.pop("device_id", None)
        real_init("gradwire", *args, **kwargs)
        _session = ProfileSession(torch_profiler=os.environ.get(TORCH_PROFILER_ENV) == "1").__enter__()

    def destroy_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not args and not kwargs.get("group"):
            _dump()
        return real_destroy(*args, **kwargs)

    init_process_group._gradwire_patched = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.destroy_process_group = destroy_process_group
    import torch.distributed.distributed_c10d as c10d

    c10d.init_process_group = init_process_group
    c10d.destroy_process_group = destroy_process_group
    atexit.register(_dump)
    _ = gradwire  # registered on import
