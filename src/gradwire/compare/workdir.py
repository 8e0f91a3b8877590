"""The working directory every training of a script starts from: what a run leaves there is noticed and moved.

Scripts read their data by relative path, so every training runs in the
directory ``gradwire compare`` was started in. But a script may also write
there, and read back on its next start what it wrote: PyTorch's DDP
tutorial saves ``snapshot.pt`` and resumes from it, so a second training
resumed where the first ended (32 steps instead of 96) and the comparison
was silently wrong. So:

1. Before the first training, :class:`WorkDir` notes every entry of the
   tree (size, modification time, inode; a link's target), leaving out the
   comparison's own output folder, ``.git`` and ``__pycache__`` (bytecode
   Python rewrites as it likes; it changes no result).
2. After each training, with all its processes stopped, it looks again.
   What the training *created* is moved into that training's folder
   (``<out>/runs/<nnn>-.../workdir/``, same relative path): the next
   training starts from the directory the first one started from, and
   nothing the training wrote is lost. A new folder moves as a whole.
3. What was there before and the training *modified* or *removed* cannot be
   put back (gradwire keeps no copy of a user's files, and never deletes
   or overwrites one): the trainings after it would start from another
   directory, perhaps resume from that file. :func:`changes` reports it;
   the comparison stops there unless told to go on (``--allow-modified``).

Not covered: files a script writes outside the working directory (an
absolute path, ``~/.cache``), and below a linked folder (links are not
followed). Anything created or changed in the tree while a training runs
is taken as the training's (an editor's swap file is moved too, and kept). Data a script downloads into the working directory is moved
too, so each training downloads it again: download it before comparing.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Changes", "PathState", "WorkDir", "changes", "snapshot"]

#: folder names never looked into: version control, and the caches of Python and its tools (they change
#: as the tools like, while a comparison runs too, and no training reads them)
SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox",
                     ".nox", ".ipynb_checkpoints"})


@dataclass(frozen=True)
class PathState:
    """What a path was when looked at: ``kind`` is ``file``, ``dir`` or ``link``."""

    kind: str
    size: int = 0
    mtime_ns: int = 0
    inode: int = 0
    target: str = ""


@dataclass
class Changes:
    """What one training did to the working directory (paths relative to it, ``/``-separated)."""

    created: list[str] = field(default_factory=list)
    """new entries, topmost only (a new folder, not each file in it)"""
    modified: list[str] = field(default_factory=list)
    """entries that were there before and changed (content, size, replaced, or another kind)"""
    removed: list[str] = field(default_factory=list)
    """entries that were there before and are gone"""

    @property
    def touched(self) -> list[str]:
        """What the training changed of what was there before it started."""
        return self.modified + self.removed

    def as_dict(self) -> dict[str, Any]:
        return {"moved": self.created, "modified": self.modified, "removed": self.removed}

    def note(self) -> str:
        """A progress line's word on the training: what was moved, what was changed ('' when nothing)."""
        said = []
        if self.created:
            said.append(f"moved what it created in the working directory into its folder's workdir/: "
                        f"{_listed(self.created)}")
        if self.modified:
            said.append(f"MODIFIED files that were there before: {_listed(self.modified)}")
        if self.removed:
            said.append(f"REMOVED files that were there before: {_listed(self.removed)}")
        return "; ".join(said)

    def refusal(self, training: str, root: Path) -> str:
        """Why the comparison stops after ``training``, which changed what ``root`` held, and what would do."""
        what = " and ".join(x for x in (f"modified {_listed(self.modified)}" if self.modified else "",
                                        f"removed {_listed(self.removed)}" if self.removed else "") if x)
        return (f"the training {training} {what} in the working directory {root}, which held them before the "
                "comparison started: every training after it would start from another directory (a script that "
                "resumes from a checkpoint there resumes from the previous training's), so the comparison stopped "
                "here; the finished trainings are kept. Move those files out of the working directory (or have "
                "the script write them elsewhere) and compare again, or give --allow-modified to go on regardless")


def _listed(paths: list[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def snapshot(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, PathState]:
    """Every entry below ``root`` (relative path -> :class:`PathState`), without following links.

    ``skip``: folders left out with all they hold (the comparison's output).
    """
    root = Path(root)
    skipped = {os.path.realpath(p) for p in skip}
    out: dict[str, PathState] = {}

    def walk(folder: str, rel: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:  # unreadable, or gone while looking: nothing below it is compared
            return
        for e in entries:
            name = f"{rel}{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
                if e.is_symlink():
                    out[name] = PathState("link", target=os.readlink(e.path))
                elif e.is_dir(follow_symlinks=False):
                    if e.name in SKIPPED or os.path.realpath(e.path) in skipped:
                        continue
                    out[name] = PathState("dir")
                    walk(e.path, name + "/")
                else:
                    out[name] = PathState("file", st.st_size, st.st_mtime_ns, st.st_ino)
            except OSError:
                continue

    walk(str(root), "")
    return out


def changes(before: dict[str, PathState], after: dict[str, PathState]) -> Changes:
    """What happened between two snapshots: created (topmost), modified, removed (each sorted)."""
    new = sorted(p for p in after if p not in before)
    fresh = set(new)
    topmost = [p for p in new if not any(q in fresh for q in _parents(p))]
    modified = sorted(p for p in before if p in after and after[p] != before[p] and
                      not (before[p].kind == after[p].kind == "dir"))
    removed = sorted(p for p in before if p not in after)
    return Changes(topmost, modified, removed)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class WorkDir:
    """The working directory of a comparison, as it was before the first training (module doc)."""

    def __init__(self, root: Path, skip: tuple[Path, ...] = ()) -> None:
        self.root = Path(root)
        self.skip = skip
        self.before = snapshot(self.root, skip)

    def collect(self, into: Path) -> Changes:
        """Move what was created since the first snapshot into ``into`` (same relative paths); what changed.

        Never overwrites: an entry already at the destination keeps its
        place and the moved one gets a ``.1`` (``.2``, ...) suffix.
        """
        found = changes(self.before, snapshot(self.root, self.skip))
        for rel in found.created:
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            n = 0
            while os.path.lexists(dest):
                n += 1
                dest = into / f"{rel}.{n}"
            shutil.move(str(self.root / rel), str(dest))
        return found
