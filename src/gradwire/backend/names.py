"""The backend name a ``gradwire`` group reports: the one the script asked for.

Under ``gradwire profile`` and ``gradwire compare -- CMD`` a script's
``init_process_group("gloo")`` (or ``"nccl"``, or no backend) runs on the
``gradwire`` backend. Libraries choose their per-backend paths by name:
Lightning 2.6 averages a logged value with SUM-then-divide only when
``get_backend() == "gloo"``, and sends ``ReduceOp.AVG`` otherwise. A group
that answered ``"gradwire"`` would send such a script down a path it never
takes on the backend it asked for. So a stand-in group reports the name the
script asked for, everywhere torch reads a name:

- ``dist.get_backend(group)`` reads ``_world.pg_map[group][0]`` and
  ``dist.get_backend_config(group)`` reads ``_world.pg_backend_config``:
  :func:`report_as` rewrites both entries, as torch would have written them
  for the requested backend (``"undefined"`` and ``"cpu:gloo"`` for no
  backend on a CPU host, ``"gloo"`` and ``"cpu:gloo,cuda:gloo"`` for gloo);
- ``group.name()``, ``group._get_backend_name()`` and the C++ callers of
  ``getBackendName`` (DDP's logging data) ask the group itself
  (:meth:`GradwireProcessGroup.getBackendName`), which answers the single
  backend of that config, or ``"undefined"`` for a mix such as
  ``"cpu:gloo,cuda:nccl"`` (as a plain torch group does).

A script that asks for ``gradwire`` keeps seeing ``"gradwire"``.

Traps:
- torch's ``new_group`` without a backend takes the default group's name
  from ``pg_map``: with ``"gloo"`` there it would build a plain gloo group,
  outside the simulated network. :func:`install` wraps torch's
  ``_new_group_with_tag`` (which ``new_group``, ``new_subgroups`` and
  DeviceMesh go through): on a stand-in default group, a new group asked for
  with no backend or with the default group's reported name is a
  ``gradwire`` group that reports that name too. A group asked for by
  another name (``new_group(backend="gloo")`` beside an ``nccl`` default)
  is that backend's, as without gradwire.
- gradwire's own code never asks the name whether a group is a gradwire
  group (a stand-in says ``"gloo"``): it asks ``isinstance(group,
  GradwireProcessGroup)`` (:func:`is_gradwire`).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d_py

__all__ = ["GRADWIRE", "is_gradwire", "install", "report_as", "requested_name"]

GRADWIRE = "gradwire"


def is_gradwire(group: Any) -> bool:
    """Is ``group`` a gradwire group, whatever name it reports?"""
    from gradwire.backend.process_group import GradwireProcessGroup

    return isinstance(group, GradwireProcessGroup)


def requested_name(backend: Any = None, device_id: Any = None) -> str:
    """The name torch stores for ``init_process_group(backend, device_id=...)``.

    >>> requested_name("GLOO"), requested_name(None)
    ('gloo', 'undefined')
    """
    if backend is None and device_id is not None:
        backend = dist.Backend.default_device_backend_map.get(getattr(device_id, "type", str(device_id)))
    return str(dist.Backend(backend or "undefined"))


def _name_or_none(backend: Any) -> str | None:
    try:
        return requested_name(backend)
    except ValueError:  # not a name torch knows: torch's own new_group says so
        return None


def group_level_name(config: str) -> str:
    """What ``group.name()`` says for a backend config: its one backend, else ``"undefined"``.

    >>> group_level_name("cpu:gloo,cuda:gloo"), group_level_name("cpu:gloo,cuda:nccl")
    ('gloo', 'undefined')
    """
    backends = {part.split(":", 1)[-1] for part in config.split(",") if part}
    return backends.pop() if len(backends) == 1 else "undefined"


def report_as(group: Any, backend: Any) -> str:
    """Make the gradwire ``group`` report ``backend`` (a name as ``init_process_group`` takes it); return it.

    Raises:
        TypeError: ``group`` is not a gradwire group (a plain group's name is its own).
    """
    if not is_gradwire(group):
        raise TypeError(f"gradwire: report_as takes a gradwire process group, got {type(group).__name__}; "
                        "only a group that stands in for another backend reports that backend's name")
    name = requested_name(backend)
    config = str(c10d_py.BackendConfig(dist.Backend(name)))
    world = c10d_py._world
    entry = world.pg_map.get(group)
    if entry is None:
        raise ValueError("gradwire: report_as needs a group torch has registered (call it after "
                         "init_process_group / new_group returned it)")
    world.pg_map[group] = (name, entry[1])
    world.pg_backend_config[group] = config
    group._set_reported(name, group_level_name(config) if name != GRADWIRE else GRADWIRE)
    if group is world.default_pg:
        c10d_py._backend = name  # torch's own record of the default group's backend
    return name


def install() -> None:
    """Make new groups of a stand-in default group gradwire groups that report its name (idempotent)."""
    original = c10d_py._new_group_with_tag
    if getattr(original, "_gradwire", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
        default = c10d_py._world.default_pg
        reported = getattr(default, "reported_backend", GRADWIRE) if is_gradwire(default) else GRADWIRE
        if reported == GRADWIRE:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        asked = bound.arguments.get("backend")
        if asked and _name_or_none(asked) != reported:
            return original(*args, **kwargs)  # another backend by name: that backend's group
        bound.arguments["backend"] = GRADWIRE
        group = original(*bound.args, **bound.kwargs)
        if is_gradwire(group):  # None or NON_GROUP_MEMBER on a rank outside the group
            report_as(group, reported)
        return group

    _new_group_with_tag._gradwire = True  # type: ignore[attr-defined]
    c10d_py._new_group_with_tag = _new_group_with_tag
