"""Output paths: checked before any work, and folders that never lose what a user saved.

A command that runs for minutes and then cannot write its result has lost
those minutes. :func:`check_output_file` and :func:`check_output_dir` say,
before anything runs, whether a path can be written, without creating it.
"""
from __future__ import annotations

import datetime
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable

__all__ = ["OutputPathError", "check_output_dir", "check_output_file", "keep_previous"]


class OutputPathError(ValueError):
    """An output path that cannot be written; the message says why and what would do."""


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _nearest_existing(path: Path) -> Path:
    """``path`` or the closest folder above it that exists (``.`` for a relative path)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(".")


def _check_writable_dir(folder: Path, target: Path) -> None:
    """Raise unless a file can be created in ``folder`` (to hold ``target``).

    Probes by creating and removing a temporary file: ``os.access`` answers yes
    to root for read-only mounts and for ``/proc``, where creating fails.
    """
    if not folder.is_dir():
        raise OutputPathError(f"cannot create {str(target)!r}: {str(folder)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".gradwire-probe-")
    except OSError as exc:
        raise OutputPathError(
            f"cannot create {str(target)!r}: {str(folder)!r} is not writable ({_reason(exc)}); "
            "give a path in a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """Check that a file can be written at ``path``, before any work; return it as a Path.

    Creates nothing: folders missing on the way are created by the writer
    later, so only the nearest existing folder above ``path`` is probed. An
    existing regular file is checked for write permission (it will be
    replaced); an existing device such as ``/dev/stdout`` is accepted.

    Raises:
        OutputPathError: an empty path, a folder where a file should go, a file
            where a folder should be, or a place where nothing can be created.
    """
    text = os.fspath(path)
    if not text:
        raise OutputPathError("the path is empty; give a file name such as results.json")
    target = Path(text)
    if target.is_dir():
        raise OutputPathError(f"{text!r} is a folder; give a file name, e.g. {str(target / 'out.json')!r}")
    if os.path.lexists(target):
        mode = target.stat().st_mode if target.exists() else 0
        if stat.S_ISREG(mode) and not os.access(target, os.W_OK):
            raise OutputPathError(f"{text!r} exists and is not writable; give another file name")
        if stat.S_ISREG(mode) or stat.S_ISCHR(mode):
            return target
        raise OutputPathError(f"{text!r} exists and is not a regular file; give another file name")
    _check_writable_dir(_nearest_existing(target.parent), target)
    return target


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is, or can become, a folder to write into; return it as a Path.

    Creates nothing (see :func:`check_output_file`).

    Raises:
        OutputPathError: an empty path, an existing file, or a place where
            nothing can be created.
    """
    text = os.fspath(path)
    if not text:
        raise OutputPathError("the path is empty; give a folder name")
    target = Path(text)
    if os.path.lexists(target) and not target.is_dir():
        raise OutputPathError(f"{text!r} is a file, not a folder; give a folder (it is created if missing)")
    folder = target if target.is_dir() else _nearest_existing(target)
    _check_writable_dir(folder, target)
    return target


def keep_previous(out: Path, patterns: Iterable[str]) -> Path | None:
    """Move an earlier run's files (glob ``patterns`` in ``out``) into ``out/previous-<time>/``.

    Returns the folder they went to, or None when there was nothing to keep.
    """
    old = sorted({f for pattern in patterns for f in out.glob(pattern) if f.is_file()})
    if not old:
        return None
    stamp = datetime.datetime.fromtimestamp(max(f.stat().st_mtime for f in old)).strftime("%Y%m%d-%H%M%S")
    keep = out / f"previous-{stamp}"
    keep.mkdir(exist_ok=True)
    for f in old:
        f.rename(keep / f.name)
    return keep
