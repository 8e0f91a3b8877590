"""Loaded at start-up by every Python process of a job under ``gradwire profile``.

It must cost a process that never uses torch.distributed nothing, and hide
nothing:

1. The sitecustomize this one shadows (the next one on ``sys.path``: a
   user's on PYTHONPATH, a distribution's in site-packages) runs as Python
   would have run it, and becomes ``sys.modules["sitecustomize"]``.
2. Nothing heavy is imported here. A finder on ``sys.meta_path`` waits for
   ``torch.distributed`` to be imported and then wraps its
   ``init_process_group`` and ``destroy_process_group``; only a call of
   init imports gradwire (:func:`gradwire.profile.bootstrap.init_process_group`).
   A shell tool, pip or a data-loading helper starts as fast as without the
   profile, and so does a process that imports torch but starts no process
   group.

Only the standard library may be imported here: this file runs before
anything else in every interpreter of the job. Traps: ``import torch`` itself
imports ``torch.distributed``, in the middle of torch's own import; the
wrappers installed then must not touch torch until they are called. Both
are wrapped at load, not when init runs: a script that imports them by name
(``from torch.distributed import destroy_process_group``, as PyTorch's DDP
tutorials do) holds torch's own functions from then on, and a destroy that
the bootstrap never sees would leave the rank's record to the exit, after a
teardown that may abort the process.
"""
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
_TARGET = "torch.distributed"


def _run_shadowed() -> None:
    """Find the next ``sitecustomize`` on sys.path past this folder and run it, as site.py would."""
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_gradwire_profile_site"] = sys.modules[__name__]  # this module lives on under another name
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # site.py's own words for a failing sitecustomize
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             f"{err.__class__.__name__}: {err}\n")


def _wrap_init(dist: object) -> None:
    """Replace ``dist.init_process_group`` and ``destroy_process_group`` by ones that hand over to the profile."""
    real_init = getattr(dist, "init_process_group", None)
    real_destroy = getattr(dist, "destroy_process_group", None)
    if real_init is None or real_destroy is None or getattr(real_init, "_gradwire_profile", False):
        return  # a torch built without distributed support, or wrapped already

    @functools.wraps(real_init)
    def init_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        from gradwire.profile.bootstrap import init_process_group as profiled

        return profiled(real_init, *args, **kwargs)

    @functools.wraps(real_destroy)
    def destroy_process_group(*args, **kwargs):  # type: ignore[no-untyped-def]
        bootstrap = sys.modules.get("gradwire.profile.bootstrap")  # imported by the first init, if any
        if bootstrap is None:
            return real_destroy(*args, **kwargs)
        return bootstrap.destroy_process_group(real_destroy, *args, **kwargs)

    c10d = sys.modules.get(_TARGET + ".distributed_c10d")
    for name, wrapper in (("init_process_group", init_process_group), ("destroy_process_group", destroy_process_group)):
        wrapper._gradwire_profile = True  # type: ignore[attr-defined]
        setattr(dist, name, wrapper)
        if c10d is not None:
            setattr(c10d, name, wrapper)


class _WrapWhenLoaded(importlib.abc.Loader):
    """Delegates to the real loader; once the module ran, wraps its init_process_group."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self._loader.exec_module(module)
        _wrap_init(module)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._loader, name)  # get_source, get_resource_reader, ...


class _WatchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lends the real spec of torch.distributed a wrapping loader, once."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _WrapWhenLoaded(spec.loader)
                return spec
        return None


if os.environ.get("GRADWIRE_PROFILE_DIR"):
    if _TARGET in sys.modules:  # imported already (a .pth file ran before us)
        _wrap_init(sys.modules[_TARGET])
    else:
        sys.meta_path.insert(0, _WatchImport())
_run_shadowed()
