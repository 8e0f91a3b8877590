"""Run an unchanged script under the gradwire backend (used by ``gradwire profile``).

``gradwire profile`` starts the job with :func:`child_env`: ``_site/`` first
on PYTHONPATH, the spec in ``GRADWIRE_NET``, the output folder in
``GRADWIRE_PROFILE_DIR``. In every Python process of the job,
``_site/sitecustomize.py`` runs the sitecustomize it shadows, then waits for
``torch.distributed`` to be imported and wraps its ``init_process_group``.
Only a call of that imports gradwire; it lands in :func:`init_process_group`
here, which:

1. makes ``init_process_group`` use backend ``gradwire`` whatever the script
   names (gloo, nccl, or the default), with the spec from ``GRADWIRE_NET``;
2. starts a :class:`ProfileSession` right after init, so the rendezvous
   (waiting for the other ranks to start) is not profiled;
3. writes ``$GRADWIRE_PROFILE_DIR/rank<N>.json`` (and a trace) when the script
   calls ``destroy_process_group`` or exits — before teardown, because gloo
   teardown occasionally aborts the process.

``gradwire compare -- CMD`` starts the job the same way, with the strategy
in ``GRADWIRE_STRATEGY``: then :mod:`gradwire.compare.child` also starts
right after init (it applies the strategy where the script builds its DDP
model and times the steps), its summary goes into ``rank<N>.json`` under
``"compare"`` with how the script ended (``destroy_process_group`` or
``exit``), and no trace is written (a comparison runs many trainings).
"""
from __future__ import annotations

import atexit
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["DIR_ENV", "NET_ENV", "SITE_DIR", "STRATEGY_ENV", "TORCH_PROFILER_ENV", "child_env", "init_process_group"]

DIR_ENV = "GRADWIRE_PROFILE_DIR"
NET_ENV = "GRADWIRE_NET"
TORCH_PROFILER_ENV = "GRADWIRE_PROFILE_TORCH"
#: the strategy of a ``gradwire compare -- CMD`` run (see gradwire.compare.child)
STRATEGY_ENV = "GRADWIRE_STRATEGY"
#: the folder ``gradwire profile`` puts first on the job's PYTHONPATH
SITE_DIR = Path(__file__).resolve().parent / "_site"
_session = None
_installed = False


def child_env(net: str, out: Path, torch_profiler: bool = False,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job run under the profile: ``base`` (default ``os.environ``) plus ours."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[NET_ENV] = net
    env[DIR_ENV] = str(out)
    if torch_profiler:
        env[TORCH_PROFILER_ENV] = "1"
    else:
        env.pop(TORCH_PROFILER_ENV, None)
    return env


def _dump(how: str = "exit") -> None:
    global _session
    if _session is None:
        return
    session, _session = _session, None
    out = Path(os.environ[DIR_ENV])
    import torch.distributed as dist

    from gradwire.compare import child

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    compared = child.summary(how)  # first: it waits for the strategy's averages still in flight
    session.trace = None if compared is not None else out / f"trace.rank{rank}.json"
    result = session.stop()
    result.rank = rank
    record = result.as_dict()
    if compared is not None:
        record["compare"] = compared
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def init_process_group(real_init: Callable[..., Any], backend: str | None = None, *args: Any, **kwargs: Any) -> None:
    """Stand-in for ``torch.distributed.init_process_group`` in a profiled job.

    ``real_init`` is torch's own; the backend the script names is replaced by
    ``gradwire``, and ``device_id`` is dropped (it would bind a CUDA backend
    that the gradwire group does not have).
    """
    global _session
    from gradwire.profile.session import ProfileSession

    _install()
    kwargs.pop("device_id", None)
    real_init("gradwire", *args, **kwargs)
    _session = ProfileSession(torch_profiler=os.environ.get(TORCH_PROFILER_ENV) == "1").__enter__()
    if os.environ.get(STRATEGY_ENV):
        from gradwire.compare import child

        child.start(Path(os.environ[DIR_ENV]))


def _install() -> None:
    """Once per process: register the backend, dump on destroy_process_group and at exit."""
    global _installed
    if _installed:
        return
    _installed = True
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import gradwire  # noqa: F401 - registers the backend

    real_destroy = dist.destroy_process_group

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs.get("group"):
            _dump("destroy_process_group")
        return real_destroy(*args, **kwargs)

    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group
    atexit.register(_dump)
