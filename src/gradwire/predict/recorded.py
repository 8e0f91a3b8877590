"""A :class:`StepProfile` from what ``gradwire profile`` recorded (:mod:`gradwire.profile.steps`).

Per rank, the profile holds one dict per training step. This module pools
every rank's steps after the first ``skip`` (warm-up: DDP runs its first
iteration on one bucket and rebuilds them after it) and takes medians:

1. The bucket layout is the most common one (bucket sizes in order); steps of
   another layout (the first iteration, a resume) are left out. In each step
   the slowest rank's times count (:func:`profile_from_steps`).
2. Comm hooks' own time is taken out of backward and out of the ready times
   (bucket ``i`` is ready ``sum of earlier hooks`` sooner without them): the
   profile then describes the step without any strategy, and the step model
   adds the hook time of the strategy it prices.
3. ``optimizer``: what follows the end of the communication in backward
   (DDP's copy of the results into the gradients, also kept alone as
   ``finalize``), plus the time between
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
5. Gradient accumulation: a step is an optimizer step, and its micro-steps
   (the backwards that did not synchronise, :mod:`gradwire.profile.steps`)
   run before its synchronising forward. The steps of the most common
   count are kept (``accumulate``), and the ranks are aligned on the step's
   start: a bucket is ready when the last rank, micro-steps and all,
   reaches it. ``micro`` is a rank's typical micro-step (the mean over
   ranks, median over steps: ranks wait for each other only at the
   exchange); without accumulation, the typical forward + backward, which
   ``predict --accumulate N`` repeats.
6. Shared cores: when the ranks of a CPU job outnumbered the cores of their
   host (``host`` of each rank's record: hostname, cores, CUDA), every time
   above is that of a rank computing on a share of a core. The profile keeps
   the times as measured and says by how much (``shared``: ranks per core on
   the most crowded host); :func:`gradwire.predict.calibrated` gives each
   rank its core back.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace
from typing import Any, Sequence

from gradwire.predict.timeline import Bucket, MeasuredExchange, StepProfile

__all__ = ["exchanges_of", "load_profile_dir", "profile_from_steps", "shared_cores"]

#: the collectives a gradient exchange is made of
_EXCHANGE_OPS = frozenset({"all_reduce", "all_to_all", "all_gather"})


def exchanges_of(collectives: Sequence[dict[str, Any]],
                 per_bucket: Sequence[Sequence[str]] | None = None) -> list[list[dict[str, Any]]]:
    """Cut one step's collectives (one group, issue order) into exchanges (module doc, point 4).

    ``per_bucket``: the collectives each bucket's exchange issues, when the
    strategy says so (PyTorch's PowerSGD: three all_reduces); the cut then
    follows it as far as the collectives' ops agree with it, and stops there.
    """
    out: list[list[dict[str, Any]]] = []
    if per_bucket is not None:
        at = 0
        for ops in per_bucket:
            part = list(collectives[at:at + len(ops)])
            if [c["op"] for c in part] != list(ops):
                break
            out.append(part)
            at += len(ops)
        return out
    for c in collectives:
        if c["op"] == "all_gather" and out and out[-1][-1]["op"] == "all_to_all" and len(out[-1]) == 1:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _neutral(step: dict[str, Any]) -> tuple[float, list[float], float, float]:
    """(backward without hooks, ready times without hooks, compute after the communication, of which DDP's
    copy of the results into the gradients)."""
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
    return backward, ready, after, max(0.0, copy)


def _exchange_row(step: dict[str, Any], layout: tuple[int, ...], following: dict[str, Any] | None = None,
                  per_bucket: Sequence[Sequence[str]] | None = None) -> list[MeasuredExchange] | None:
    """One step's exchanges paired with its buckets (module doc, point 4); None when they do not pair.

    ``following``: the next step of the same rank. An exchange that overlaps
    the next step (``delayed``'s) issues its last collectives in that step's
    window; with both steps' origins recorded they are set on this step's
    times and taken too.
    """
    exchange_colls = [c for c in step["collectives"] if c["op"] in _EXCHANGE_OPS]
    # the first collective of this step's first exchange: issued once its bucket was ready, and, where the plan
    # says how an exchange opens, of that op. Trap: the previous step's exchange may still issue its last
    # collectives after this bucket is ready (delayed's all_gather, behind a slow server step at many ranks)
    opening = per_bucket[0][0] if per_bucket else None
    first = next((c for c in exchange_colls if c["issued"] >= step["buckets"][0]["ready"] - 1e-9
                  and (opening is None or c["op"] == opening)), None)
    if first is None:
        return None
    later = []
    if following is not None and "origin" in step and "origin" in following:
        shift = following["origin"] - step["origin"]
        later = [dict(c, issued=c["issued"] + shift, completed=None if c["completed"] is None else c["completed"] + shift)
                 for c in following["collectives"] if c["op"] in _EXCHANGE_OPS]
    seen = {c["seq"] for c in exchange_colls if c["group"] == first["group"]}
    group = sorted((c for c in exchange_colls + [c for c in later if c["seq"] not in seen]
                    if c["group"] == first["group"] and c["seq"] >= first["seq"]), key=lambda c: c["seq"])
    exchanges = exchanges_of(group, per_bucket)[:len(layout)]
    group = [c for ex in exchanges for c in ex]
    if len(exchanges) != len(layout) or any(c["completed"] is None or c["inner"] is None for c in group):
        return None
    own, inner_free = {}, 0.0
    for c in group:  # the real collectives run one at a time: each one's own share of its inner time
        end = c["issued"] + c["inner"]
        own[id(c)] = max(0.0, end - max(c["issued"], inner_free))
        inner_free = max(inner_free, end)
    row, previous = [], None
    for bucket, ex in zip(step["buckets"], exchanges):
        lead = _lead(bucket, ex[0], previous)
        previous = ex[0]
        gaps = [max(0.0, b["issued"] - a["completed"]) for a, b in zip(ex, ex[1:])]
        # a hook that hands DDP its bucket at once (delayed) completes before its exchange: decode unseen
        seen_done = bucket["done"] is not None and bucket["done"] >= ex[-1]["completed"]
        tail = bucket["done"] - ex[-1]["completed"] if seen_done else None
        row.append(MeasuredExchange(tuple(c["op"] for c in ex), bucket["hook"], tuple(own[id(c)] for c in ex),
                                    tuple(gaps), tail, lead))
    return row


def _lead(bucket: dict[str, Any], first: dict[str, Any], previous: dict[str, Any] | None) -> float:
    """Seconds from the later of the hook's return and the previous exchange's first issue to this exchange's
    first issue (:attr:`MeasuredExchange.lead`).

    Trap: a hook gated behind the whole previous exchange (a ``Sequencer``'s
    turn, or one bucket at a time in real time) also counts its wait here;
    the step model uses ``lead`` only where the clock gates a hook behind the
    previous hook alone (``Plan.chained``), whose end is the previous first
    issue.
    """
    start = bucket["ready"] + bucket["hook"]
    if previous is not None:
        start = max(start, previous["issued"])
    return max(0.0, first["issued"] - start)


def _medians(rows: list[list[MeasuredExchange]]) -> tuple[MeasuredExchange, ...] | None:
    """Per bucket, the medians over steps; None when a bucket's collectives differ from step to step."""
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
            _median(tails) if len(tails) == len(per_bucket) else None, _median([m.lead for m in per_bucket])))
    return tuple(out)


def _layout(step: dict[str, Any]) -> tuple[int, ...]:
    return tuple(b["nbytes"] for b in step["buckets"])


def _micro_steps(step: dict[str, Any]) -> int:
    """Backward passes of the step (1 in a record written before micro-steps were recorded)."""
    return int(step.get("micro_steps", 1))


def shared_cores(hosts: Sequence[dict[str, Any] | None]) -> float:
    """Ranks per core on the most crowded host, counting the ranks that computed on the CPU (module doc, 5).

    1.0 when every rank had a core (or a CUDA device), or when a rank's host is unknown.
    """
    if not hosts or any(not h for h in hosts):
        return 1.0
    per_host: dict[str, list[int]] = {}
    for h in hosts:
        if h and not h.get("cuda"):
            per_host.setdefault(str(h.get("hostname")), []).append(int(h.get("cores") or 1))
    crowd = [len(cores) / min(cores) for cores in per_host.values()]
    return max([1.0, *crowd])


def profile_from_steps(ranks: Sequence[Sequence[dict[str, Any]]], name: str, strategy: str | None = None,
                       skip: int = 3, batch_size: int | None = None, source: str = "profile",
                       hosts: Sequence[dict[str, Any] | None] | None = None,
                       net: str | None = None, per_bucket: Sequence[Sequence[str]] | None = None) -> StepProfile:
    """The step as its slowest rank sets it, medians over steps ``skip`` ... last but one (module doc).

    Every rank runs the same steps, and a step's collectives start when the
    last rank joins them. Per step: forward and optimizer are those of the
    rank that computed longest; bucket ``i`` is ready (and backward ends)
    when the last rank reaches it, counted from each rank's own step start.
    The real collectives' floors are the shortest any rank saw (the last
    rank to join waited for nobody). ``batch_size``: samples per rank per
    micro-step (None: the one the steps recorded, if any). ``hosts``: each rank's ``host`` record
    (:func:`shared_cores`); ``net``: the network spec the run ran on;
    ``per_bucket``: the collectives of each bucket's exchange, when known
    (:func:`exchanges_of`).

    Raises:
        ValueError: no step after ``skip``, or no step with DDP buckets.
    """
    world = len(ranks)
    # the last step's window runs to whatever followed training (a final average, teardown): left out
    per_rank = [list(steps)[skip:-1] for steps in ranks]
    next_of = {id(s): n for steps in ranks for s, n in zip(list(steps)[skip:-1], list(steps)[skip + 1:])}
    aligned = list(zip(*per_rank))
    if not aligned:
        counts = ", ".join(str(len(s)) for s in ranks)
        raise ValueError(f"{name}: no training step after the first {skip} and before the last (steps per rank: "
                         f"{counts or 'none'}); profile more steps")
    with_buckets = [k for k in aligned if all(s["buckets"] for s in k)]
    if not with_buckets:
        raise ValueError(f"{name}: no step synchronised its gradients (no DDP gradient bucket: every backward ran "
                         "under no_sync() or with require_backward_grad_sync=False, or the model is not DDP); "
                         "predict needs DDP steps whose last micro-step exchanges the gradients")
    layout = Counter(_layout(k[0]) for k in with_buckets).most_common(1)[0][0]
    steps = [k for k in with_buckets if all(_layout(s) == layout for s in k)]
    accumulate = Counter(_micro_steps(k[0]) for k in steps).most_common(1)[0][0]
    by_layout = len(steps)
    steps = [k for k in steps if all(_micro_steps(s) == accumulate for s in k)]
    forward, backward, ready, after, loop, micro, copies = [], [], [], [], [], [], []
    rows: list[list[MeasuredExchange]] = []  # the steps whose exchanges pair with the buckets on every rank
    for k in steps:
        neutral = [_neutral(s) for s in k]
        # each rank's time from the step's start to its synchronising backward: micro-steps and forward
        lead = [s["forward"] + sum(s.get("micro_seconds") or ()) for s in k]
        slowest = max(range(world), key=lambda r: lead[r] + neutral[r][0] + neutral[r][2])
        f = lead[slowest]
        # from the step's start, a bucket's collective can start when the last rank has it ready
        b = max(lead[r] + neutral[r][0] for r in range(world)) - f
        forward.append(k[slowest]["forward"])
        # a micro-step: each rank's own, averaged (the ranks wait for each other only at the exchange, so over
        # many micro-steps a rank's typical one counts, not the slowest rank's); without accumulation, the
        # synchronising one's forward and backward stand in (what ``--accumulate`` repeats)
        micro.append(statistics.fmean(
            (lead[r] - k[r]["forward"]) / (accumulate - 1) if accumulate > 1 else k[r]["forward"] + neutral[r][0]
            for r in range(world)))
        backward.append(b)
        ready.append([min(b, max(0.0, max(lead[r] + neutral[r][1][i] for r in range(world)) - f))
                      for i in range(len(layout))])
        after.append(neutral[slowest][2])
        copies.append(min(neutral[slowest][3], neutral[slowest][2]))
        loop += [s["step"] for s in k]  # every rank's: a step's slowest rank is its noisiest
        exchanges = [_exchange_row(s, layout, next_of.get(id(s)), per_bucket) for s in k]
        mine = exchanges[slowest]
        if mine is not None and all(e is not None and [m.ops for m in e] == [m.ops for m in mine]
                                    for e in exchanges):
            floors = [tuple(min(v) for v in zip(*(e[i].inner for e in exchanges if e is not None)))
                      for i in range(len(mine))]
            rows.append([replace(m, inner=f) for m, f in zip(mine, floors)])
    b = _median(backward)
    buckets = tuple(Bucket(nbytes, min(_median(col), b), size) for nbytes, col, size in
                    zip(layout, zip(*ready), (x["element_size"] for x in steps[0][0]["buckets"])))
    if batch_size is None:  # the batch the profile saw (samples per rank per micro-step), the most common
        seen = Counter(s["batch"] for k in steps for s in k if s.get("batch"))
        batch_size = seen.most_common(1)[0][0] if seen else None
    notes = [f"{len(steps)} steps of {world} ranks, {len(layout)} buckets"
             + (f", {accumulate} micro-steps each" if accumulate > 1 else "")]
    if by_layout < len(aligned):
        notes.append(f"{len(aligned) - by_layout} steps of another bucket layout left out")
    if len(steps) < by_layout:
        notes.append(f"{by_layout - len(steps)} steps of another count of micro-steps left out")
    # measured exchanges only when most steps paired (else the pairing itself is in doubt)
    measured = _medians(rows) if 2 * len(rows) > len(steps) else None
    shared = shared_cores(hosts or [])
    if shared > 1:
        notes.append(f"{shared:.3g} ranks per CPU core: measured on shared cores")
    return StepProfile(name, _median(forward), b, _median(after), buckets, world, strategy, measured, batch_size,
                       source, _median(loop), tuple(notes), net=net, shared=shared, accumulate=accumulate,
                       micro=_median(micro), finalize=min(_median(copies), _median(after)))


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
    net = None
    try:
        if merged.exists():
            whole = json.loads(merged.read_text())
            ranks, net = whole["ranks"], whole.get("net")
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
    return profile_from_steps([r["steps"] for r in ranks], folder.name or str(folder), strategy, skip, batch_size,
                              hosts=[r.get("host") for r in ranks], net=net)
