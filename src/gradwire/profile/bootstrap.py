"""Run an unchanged script under the gradwire backend (used by ``gradwire profile``).

``gradwire profile`` starts the job with :func:`child_env`: ``_site/`` first
on PYTHONPATH, the spec in ``GRADWIRE_NET``, the output folder in
``GRADWIRE_PROFILE_DIR``. In every Python process of the job,
``_site/sitecustomize.py`` runs the sitecustomize it shadows, then waits for
``torch.distributed`` to be imported and wraps its ``init_process_group`` and
``destroy_process_group`` (before a script can import them by name). Only a
call of init imports gradwire; it lands in :func:`init_process_group` here,
which:

1. makes ``init_process_group`` use backend ``gradwire`` whatever the script
   names (gloo, nccl, or the default), with the spec from ``GRADWIRE_NET``;
   the group reports the name the script asked for (``get_backend()`` says
   ``gloo``), so that libraries keep their per-backend paths
   (:mod:`gradwire.backend.names`);
2. starts a :class:`ProfileSession` right after init, so the rendezvous
   (waiting for the other ranks to start) is not profiled;
3. writes ``$GRADWIRE_PROFILE_DIR/rank<N>.json`` (and a trace) when the script
   calls ``destroy_process_group`` (:func:`destroy_process_group`) or exits —
   before teardown, because gloo teardown occasionally aborts the process.
   The record says which (``ended_by``).

A launcher that needs more in every rank names a module in
``GRADWIRE_AFTER_INIT`` (``child_env(..., after_init=...)``). The module
provides ``start(out: Path)``, called right after init, and
``summary(how: str) -> dict | None``, called before the rank's record is
written; a summary goes into ``rank<N>.json`` under the module's
``RECORD_KEY`` with how the script ended (``destroy_process_group`` or
``exit``), and then no trace is written. ``gradwire compare -- CMD`` names
:mod:`gradwire.compare.child` this way (it applies the strategy where the
script builds its DDP model and times the steps). The module is named, not
imported here, so that the profile does not depend on its users.
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["AFTER_INIT_ENV", "DIR_ENV", "NET_ENV", "OPS_ENV", "SITE_DIR", "TORCH_PROFILER_ENV", "child_env",
           "destroy_process_group", "init_process_group"]

DIR_ENV = "GRADWIRE_PROFILE_DIR"
NET_ENV = "GRADWIRE_NET"
TORCH_PROFILER_ENV = "GRADWIRE_PROFILE_TORCH"
#: optimizer steps whose every op ``gradwire profile --ops`` times (:mod:`gradwire.profile.ops`)
OPS_ENV = "GRADWIRE_PROFILE_OPS"
#: a module to start in every rank right after init (see the module doc)
AFTER_INIT_ENV = "GRADWIRE_AFTER_INIT"
#: the folder ``gradwire profile`` puts first on the job's PYTHONPATH
SITE_DIR = Path(__file__).resolve().parent / "_site"
_session = None
_installed = False


def child_env(net: str, out: Path, torch_profiler: bool = False,
              base: Mapping[str, str] | None = None, after_init: str | None = None, ops: int = 0) -> dict[str, str]:
    """The environment of a job run under the profile: ``base`` (default ``os.environ``) plus ours.

    ``after_init`` names a module to start in every rank after init (see the module doc); ``ops``: time
    every op of that many optimizer steps (``--ops``).
    """
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[NET_ENV] = net
    env[DIR_ENV] = str(out)
    if torch_profiler:
        env[TORCH_PROFILER_ENV] = "1"
    else:
        env.pop(TORCH_PROFILER_ENV, None)
    if after_init:
        env[AFTER_INIT_ENV] = after_init
    else:
        env.pop(AFTER_INIT_ENV, None)
    if ops:
        env[OPS_ENV] = str(ops)
    else:
        env.pop(OPS_ENV, None)
    return env


def _after_init() -> Any:
    """The module named in ``GRADWIRE_AFTER_INIT``, or None."""
    name = os.environ.get(AFTER_INIT_ENV)
    return importlib.import_module(name) if name else None


def _dump(how: str = "exit") -> None:
    global _session
    if _session is None:
        return
    session, _session = _session, None
    out = Path(os.environ[DIR_ENV])
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    extra = _after_init()
    summary = None if extra is None else extra.summary(how)  # first: it may wait for work still in flight
    session.trace = None if summary is not None else out / f"trace.rank{rank}.json"
    result = session.stop()
    result.rank = rank
    record = result.as_dict()
    record["ended_by"] = how
    if summary is not None:
        record[extra.RECORD_KEY] = summary
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def init_process_group(real_init: Callable[..., Any], backend: str | None = None, *args: Any, **kwargs: Any) -> None:
    """Stand-in for ``torch.distributed.init_process_group`` in a profiled job.

    ``real_init`` is torch's own; the backend the script names is replaced by
    ``gradwire`` and reported under the name the script asked for, and
    ``device_id`` is dropped (it would bind a CUDA backend that the gradwire
    group does not have).
    """
    global _session
    import torch.distributed as dist

    from gradwire.backend import names
    from gradwire.profile.session import ProfileSession

    _install()
    asked = names.requested_name(backend, kwargs.pop("device_id", None))
    real_init("gradwire", *args, **kwargs)
    names.report_as(dist.distributed_c10d._get_default_group(), asked)
    _session = ProfileSession(torch_profiler=os.environ.get(TORCH_PROFILER_ENV) == "1",
                              ops=int(os.environ.get(OPS_ENV, "0") or 0)).__enter__()
    extra = _after_init()
    if extra is not None:
        extra.start(Path(os.environ[DIR_ENV]))


def destroy_process_group(real_destroy: Callable[..., Any], group: Any = None) -> Any:
    """Stand-in for ``torch.distributed.destroy_process_group``: the rank's record first, when the default group goes.

    The sitecustomize's wrapper calls it with torch's own function once an
    init has imported this module (:func:`_install` wraps a torch that the
    sitecustomize did not).
    """
    if group is None or group is _default_group():
        _dump("destroy_process_group")
    return real_destroy() if group is None else real_destroy(group)


def _default_group() -> Any:
    import torch.distributed as dist

    return dist.GroupMember.WORLD if dist.is_initialized() else None


def _install() -> None:
    """Once per process: register the backend, dump on destroy_process_group and at exit."""
    global _installed
    if _installed:
        return
    _installed = True
    import functools

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import gradwire  # noqa: F401 - registers the backend

    real_destroy = dist.destroy_process_group
    if not getattr(real_destroy, "_gradwire_profile", False):  # no sitecustomize wrapped it at torch's load
        @functools.wraps(real_destroy)
        def destroy(group: Any = None) -> Any:
            return destroy_process_group(real_destroy, group)

        dist.destroy_process_group = c10d.destroy_process_group = destroy
    atexit.register(_dump)
