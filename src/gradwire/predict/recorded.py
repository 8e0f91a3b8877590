"""A :class:`StepProfile` from what ``gradwire profile`` recorded (:mod:`gradwire.profile.steps`).

Per rank, the profile holds one dict per training step. This module pools
every rank's steps after the first ``skip`` (warm-up: DDP runs its first
iteration on one bucket and rebuilds them after it) and takes medians:

1. The bucket layout is the most common one (bucket sizes in order); steps of
   another layout (the first iteration, a resume) are left out.
2. Comm hooks' own time is taken out of backward and out of the ready times
   (bucket ``i`` is ready ``sum of earlier hooks`` sooner without them): the
   profile then describes the step without any strategy, and the step model
   adds the hook time of the strategy it prices.
3. ``optimizer``: what follows the end of the communication in backward
   (DDP's copy of the results into the gradients), plus the time between
   backward's return and the optimizer step that was not spent waiting for a
   collective, plus the optimizer step itself.
4. The exchanges: the collectives of the group the first bucket's
   collective went to, in issue order, cut into exchanges (an all_to_all and
   the all_gather after it are one two-phase exchange; any other collective
   is one). When there are as many exchanges as buckets, each bucket's
   measured costs (:class:`MeasuredExchange`: its hook, the real
   collectives' durations, the gaps between them, the decode after them)
   are kept for predictions of the strategy that ran. A real collective's
   duration is its own share: gloo runs a group's collectives one at a time,
   so the time one spent queued behind the previous one is not its own.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Sequence

from gradwire.predict.timeline import Bucket, MeasuredExchange, StepProfile

__all__ = ["exchanges_of", "load_profile_dir", "profile_from_steps"]

#: the collectives a gradient exchange is made of
_EXCHANGE_OPS = frozenset({"all_reduce", "all_to_all", "all_gather"})


def exchanges_of(collectives: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Cut one step's collectives (one group, issue order) into exchanges (module doc, point 4)."""
    out: list[list[dict[str, Any]]] = []
    for c in collectives:
        if c["op"] == "all_gather" and out and out[-1][-1]["op"] == "all_to_all" and len(out[-1]) == 1:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _neutral(step: dict[str, Any]) -> tuple[float, list[float], float]:
    """(backward without hooks, ready times without hooks, compute after the communication)."""
    hooks = [b["hook"] for b in step["buckets"]]
    ready, before = [], 0.0
    for b, h in zip(step["buckets"], hooks):
        ready.append(max(0.0, b["ready"] - before))
        before += h
    backward = max(0.0, step["backward"] - sum(hooks))
    ready = [min(r, backward) for r in ready]
    in_backward = [c for c in step["collectives"] if c["issued"] <= step["backward"] and c["completed"] is not None]
    ends = [b["done"] for b in step["buckets"] if b["done"] is not None] or [c["completed"] for c in in_backward]
    returned = step["backward"] + step["backward_wait"]
    copy = returned - max([step["backward"], *ends])
    after = max(0.0, copy) + max(0.0, step["after_backward"] - step["waited"]) + step["optimizer"]
    return backward, ready, after


def _measured(steps: list[dict[str, Any]], layout: tuple[int, ...]) -> tuple[MeasuredExchange, ...] | None:
    """Per bucket, the medians of its exchange's costs over ``steps`` (None: buckets and exchanges do not pair)."""
    rows: list[list[MeasuredExchange]] = []
    for step in steps:
        exchange_colls = [c for c in step["collectives"] if c["op"] in _EXCHANGE_OPS]
        first = next((c for c in exchange_colls if c["issued"] >= step["buckets"][0]["ready"] - 1e-9), None)
        if first is None:
            return None
        group = sorted((c for c in exchange_colls if c["group"] == first["group"]), key=lambda c: c["seq"])
        exchanges = exchanges_of(group)
        if len(exchanges) != len(layout):
            return None
        if any(c["completed"] is None or c["inner"] is None for c in group):
            return None
        own, inner_free = {}, 0.0
        for c in group:  # the real collectives run one at a time: each one's own share of its inner time
            end = c["issued"] + c["inner"]
            own[id(c)] = max(0.0, end - max(c["issued"], inner_free))
            inner_free = max(inner_free, end)
        row = []
        for bucket, ex in zip(step["buckets"], exchanges):
            gaps = [max(0.0, b["issued"] - a["completed"]) for a, b in zip(ex, ex[1:])]
            tail = None if bucket["done"] is None else max(0.0, bucket["done"] - ex[-1]["completed"])
            row.append(MeasuredExchange(tuple(c["op"] for c in ex), bucket["hook"], tuple(own[id(c)] for c in ex),
                                        tuple(gaps), tail))
        rows.append(row)
    out = []
    for per_bucket in zip(*rows):
        ops = per_bucket[0].ops
        if any(m.ops != ops for m in per_bucket):
            return None
        tails = [m.tail for m in per_bucket if m.tail is not None]
        out.append(MeasuredExchange(
            ops, _median([m.hook for m in per_bucket]),
            tuple(_median(v) for v in zip(*(m.inner for m in per_bucket))),
            tuple(_median(v) for v in zip(*(m.gaps for m in per_bucket))),
            _median(tails) if len(tails) == len(per_bucket) else None))
    return tuple(out)


def profile_from_steps(ranks: Sequence[Sequence[dict[str, Any]]], name: str, strategy: str | None = None,
                       skip: int = 3, batch_size: int | None = None, source: str = "profile") -> StepProfile:
    """Medians over every rank's steps after the first ``skip`` (module doc).

    Raises:
        ValueError: no step after ``skip``, or no step with DDP buckets.
    """
    world = len(ranks)
    # the last step's window runs to whatever followed training (a final average, teardown): left out
    pooled = [s for steps in ranks for s in list(steps)[skip:-1]]
    if not pooled:
        counts = ", ".join(str(len(s)) for s in ranks)
        raise ValueError(f"{name}: no training step after the first {skip} and before the last (steps per rank: "
                         f"{counts or 'none'}); "
                         "profile more steps")
    with_buckets = [s for s in pooled if s["buckets"]]
    if not with_buckets:
        raise ValueError(f"{name}: no DDP gradient bucket in the profiled steps; predict prices DDP jobs "
                         "(DistributedDataParallel, with or without a comm hook)")
    layouts = Counter(tuple(b["nbytes"] for b in s["buckets"]) for s in with_buckets)
    layout = layouts.most_common(1)[0][0]
    steps = [s for s in with_buckets if tuple(b["nbytes"] for b in s["buckets"]) == layout]
    neutral = [_neutral(s) for s in steps]
    backward = _median([n[0] for n in neutral])
    ready = [min(_median(col), backward) for col in zip(*(n[1] for n in neutral))]
    sizes = [b["element_size"] for b in steps[0]["buckets"]]
    buckets = tuple(Bucket(nbytes, r, size) for nbytes, r, size in zip(layout, ready, sizes))
    notes = [f"{len(steps)} steps of {world} ranks, {len(layout)} buckets"]
    if len(steps) < len(pooled):
        notes.append(f"{len(pooled) - len(steps)} steps of another bucket layout left out")
    return StepProfile(name, _median([s["forward"] for s in steps]), backward, _median([n[2] for n in neutral]),
                       buckets, world, strategy, _measured(steps, layout), batch_size, source,
                       _median([s["step"] for s in steps]), tuple(notes))


def load_profile_dir(path: str, skip: int = 3, batch_size: int | None = None) -> StepProfile:
    """The profile written by ``gradwire profile --out DIR`` (``profile.json``, else the ``rank*.json`` files).

    Raises:
        ValueError: the folder holds no profile, or one without per-step records.
    """
    import json
    from pathlib import Path

    folder = Path(path)
    hint = "give the --out folder of `gradwire profile --net SPEC --out DIR -- torchrun ... train.py`"
    if not folder.is_dir():
        raise ValueError(f"--profile {str(folder)!r} is not a folder; {hint}")
    merged = folder / "profile.json"
    try:
        if merged.exists():
            ranks = json.loads(merged.read_text())["ranks"]
        else:
            ranks = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"--profile {str(folder)!r}: cannot read the profile ({exc}); {hint}") from None
    if not ranks:
        raise ValueError(f"--profile {str(folder)!r} holds no profile.json or rank*.json; {hint}")
    if not all(isinstance(r, dict) and r.get("steps") for r in ranks):
        raise ValueError(f"--profile {str(folder)!r} has no per-step records (written by an older gradwire, or "
                         f"the job made no backward()/optimizer steps); profile it again")
    ranks = sorted(ranks, key=lambda r: r.get("rank", 0))
    hooks = ranks[0].get("hooks") or []
    strategy = hooks[0] if hooks else "sync"
    return profile_from_steps([r["steps"] for r in ranks], folder.name or str(folder), strategy, skip, batch_size)
