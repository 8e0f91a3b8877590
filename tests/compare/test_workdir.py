"""What a training leaves in the working directory: created -> moved into its folder; modified or removed -> said."""
from __future__ import annotations

import os
from pathlib import Path

from gradwire.compare.workdir import PathState, WorkDir, changes


def test_changes_between_snapshots_created_topmost_modified_removed():
    f = lambda size, mtime=1, ino=1: PathState("file", size, mtime, ino)  # noqa: E731
    before = {"data": PathState("dir"), "data/a.csv": f(10), "ckpt.pt": f(5), "old.log": f(3),
              "latest": PathState("link", target="run1")}
    after = {"data": PathState("dir"), "data/a.csv": f(10), "data/b.csv": f(1), "ckpt.pt": f(5, mtime=2),
             "runs": PathState("dir"), "runs/v0": PathState("dir"), "runs/v0/x": f(1),
             "latest": PathState("link", target="run2")}
    found = changes(before, after)
    assert found.created == ["data/b.csv", "runs"]  # a new folder moves as a whole
    assert found.modified == ["ckpt.pt", "latest"] and found.removed == ["old.log"]
    assert found.touched == ["ckpt.pt", "latest", "old.log"]
    assert changes(before, before).as_dict() == {"moved": [], "modified": [], "removed": []}
    assert changes(before, before).note() == ""
    assert found.note() == ("moved what it created in the working directory into its folder's workdir/: data/b.csv, "
                            "runs; MODIFIED files that were there before: ckpt.pt, latest; REMOVED files that were "
                            "there before: old.log")
    assert found.refusal("003-sync-seed1", Path("/w")).startswith(
        "the training 003-sync-seed1 modified ckpt.pt, latest and removed old.log in the working directory /w, ")
    replaced = dict(before, **{"ckpt.pt": f(5, ino=2)})  # torch.save to a temporary file, then a rename
    assert changes(before, replaced).modified == ["ckpt.pt"]


def test_collect_moves_what_a_training_created_and_keeps_what_was_there(tmp_path):
    work, out = tmp_path / "work", tmp_path / "work" / "cmp"
    (work / "data").mkdir(parents=True)
    out.mkdir()
    (work / "data" / "train.csv").write_text("the user's data")
    (work / "notes.txt").write_text("the user's notes")
    (work / ".mypy_cache").mkdir()
    (work / ".mypy_cache" / "cache.db").write_text("0")
    wd = WorkDir(work, skip=(out,))
    assert set(wd.before) == {"data", "data/train.csv", "notes.txt"}  # the comparison's own folder left out
    # a training: a snapshot, a log folder, bytecode, its results in the output folder, and a user's file changed
    (work / "snapshot.pt").write_bytes(b"state")
    (work / "logs" / "v0").mkdir(parents=True)
    (work / "logs" / "v0" / "events").write_text("1")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "m.pyc").write_bytes(b"")
    (out / "rank0.json").write_text("{}")
    (work / "notes.txt").write_text("the user's notes, and a line the script wrote")
    (work / ".mypy_cache" / "cache.db").write_text("1")  # a tool run beside the comparison: not the training's
    into = out / "runs" / "000-sync-seed0" / "workdir"
    (into / "snapshot.pt").parent.mkdir(parents=True)
    (into / "snapshot.pt").write_bytes(b"already here")  # never overwritten
    found = wd.collect(into)
    assert found.created == ["logs", "snapshot.pt"] and found.modified == ["notes.txt"] and found.removed == []
    assert sorted(os.listdir(work)) == [".mypy_cache", "__pycache__", "cmp", "data", "notes.txt"]
    assert (into / "logs" / "v0" / "events").read_text() == "1" and (into / "snapshot.pt.1").read_bytes() == b"state"
    assert (into / "snapshot.pt").read_bytes() == b"already here"
    assert (work / "data" / "train.csv").read_text() == "the user's data"  # nothing that was there is moved
    (work / "data" / "train.csv").unlink()
    assert wd.collect(tmp_path / "next").removed == ["data/train.csv"]
