"""Output folders that never lose what a user saved."""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Iterable

__all__ = ["keep_previous"]


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
