"""Module-level rank functions for the hooks tests (spawn pickles them by name)."""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn


def _init(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def _rank_tensor(rank: int, numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * seed + rank))


def allreduce_names(rank: int, world: int, names: list[str], numel: int) -> dict[str, Any]:
    """allreduce_compressed of a per-rank tensor with every compressor; returns results and the true mean."""
    from gradwire.compress import ErrorFeedback
    from gradwire.exchange import allreduce_compressed

    _init(rank, world)
    out: dict[str, Any] = {"mean": torch.stack([_rank_tensor(r, numel) for r in range(world)]).mean(0)}
    for name in names:
        t = _rank_tensor(rank, numel)
        allreduce_compressed([t], name, error_feedback=ErrorFeedback())
        out[name] = t
    # Odd shapes in one call: non-contiguous, empty, integer, tiny.
    a = _rank_tensor(rank, 7 * 5).view(7, 5).t()
    e = torch.empty(0)
    i = torch.full((3,), 2 * (rank + 1), dtype=torch.int64)
    s = _rank_tensor(rank, 3)
    allreduce_compressed([a, e, i, s], "onebit", error_feedback=ErrorFeedback())
    out["mixed"] = (a.clone(), e.clone(), i.clone(), s.clone())
    return out


def _onebit_dense(x: torch.Tensor, block: int = 512) -> torch.Tensor:
    """onebit by hand: each 512-element block (aligned at the tensor's start) -> sign * sqrt(mean x^2)."""
    out = torch.empty_like(x)
    for start in range(0, x.numel(), block):
        part = x[start:start + block]
        rms = part.double().pow(2).mean().sqrt().float()
        out[start:start + block] = torch.where(part < 0, -rms, rms)
    return out


def two_phase_vs_dense(rank: int, world: int, numel: int) -> dict[str, Any]:
    """onebit's two-phase exchange with error feedback, and a dense reference computed from every rank's input.

    The reference never calls the code under test: rank ``r`` compensates and
    compresses its whole tensor (blocks of 512), each chunk's server averages
    the ranks' approximations, compensates with its own residual and
    re-compresses the chunk; the result is the concatenated chunks.
    """
    from gradwire.compress import ErrorFeedback
    from gradwire.exchange import allreduce_compressed

    _init(rank, world)
    ef = ErrorFeedback()
    block = 512
    length = max(block, block * -(-numel // (block * world)))  # chunks: multiples of the block, the last shorter
    bounds = [(min(r * length, numel), max(0, min(length, numel - r * length))) for r in range(world)]
    worker = [torch.zeros(numel) for _ in range(world)]
    server = [torch.zeros(count) for _, count in bounds]
    results, refs = [], []
    for step in range(3):  # several steps: the residuals take part
        t = _rank_tensor(rank, numel, seed=step)
        inputs = [_rank_tensor(r, numel, seed=step) for r in range(world)]
        allreduce_compressed([t], "onebit", error_feedback=ef)
        results.append(t.clone())
        approx = []
        for r in range(world):
            c = inputs[r] + worker[r]
            approx.append(_onebit_dense(c, block))
            worker[r] = c - approx[-1]
        ref = torch.empty(numel)
        for j, (start, count) in enumerate(bounds):
            if not count:
                continue
            avg = sum(a[start:start + count] for a in approx) / world
            a = avg + server[j]
            sent = _onebit_dense(a, block)
            server[j] = a - sent
            ref[start:start + count] = sent
        refs.append(ref)
    return {"results": results, "refs": refs}


def warmup_hook(rank: int, world: int, spec: str) -> dict[str, Any]:
    """The hook on a fake bucket for a few steps: which steps were exact averages, which ops ran."""
    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    _init(rank, world)
    state = CompressionState(spec, min_compress_numel=0)
    exact = []
    for step in range(5):
        t = _rank_tensor(rank, 4096, seed=step)
        mean = torch.stack([_rank_tensor(r, 4096, seed=step) for r in range(world)]).mean(0)
        out = compression_hook(state, _FakeBucket(t)).wait()
        exact.append(bool(torch.allclose(out, mean, atol=1e-6)))
    return {"exact": exact, "warmup_iters": state.warmup_iters}


class _FakeBucket:
    """The part of dist.GradBucket the hook uses: one tensor, index 0, always the last bucket."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def buffer(self) -> torch.Tensor:
        return self.t

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def parameters(self) -> list[torch.Tensor]:
        return [self.t]


class Net(nn.Module):
    """A small CNN for 8x8 inputs with several DDP buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def wide() -> nn.Module:
    """One parameter, hence one bucket whose first-iteration layout equals the rebuilt one
    (what an exact resume needs, see gradwire.exchange.state)."""
    return nn.Linear(64, 500, bias=False)


def mlp() -> nn.Module:
    """A plain Sequential of Linear layers: with DDP's default buckets its first-iteration bucket
    order differs from the rebuilt one (weights and biases swap), the ordinary resume case."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


MODELS = {"wide": wide, "mlp": mlp}


def _batch(rank: int, step: int, model: str = "cnn") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    if model == "mlp":
        return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
    if model == "wide":
        return torch.randn(16, 64, generator=g), torch.randint(0, 500, (16,), generator=g)
    return torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)


def _make(spec: dict[str, Any]):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    torch.manual_seed(0)
    model = MODELS.get(spec.get("model", "cnn"), Net)()
    cap = spec.get("bucket_cap_mb", 0.01)
    ddp = DDP(model) if cap is None else DDP(model, bucket_cap_mb=cap)
    state, seen = None, set()
    if spec.get("compressor") is not None:
        state = CompressionState(
            spec["compressor"], momentum=spec.get("hook_momentum", 0.0), warmup_iters=spec.get("warmup", 1),
            min_compress_numel=0, local_correction=spec.get("local_correction"),
            **({"fuse_numel": spec["fuse_numel"]} if "fuse_numel" in spec else {}),
        )
        ddp.register_comm_hook((state, seen), _counting_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=spec.get("momentum", 0.0))
    return ddp, state, opt, seen


def _counting_hook(state_and_seen, bucket):
    """compression_hook, recording which bucket indices DDP used."""
    from gradwire.hooks import compression_hook

    state, seen = state_and_seen
    seen.add(bucket.index())
    return compression_hook(state, bucket)


def _steps(ddp, opt, rank: int, start: int, stop: int, model: str = "cnn") -> None:
    for step in range(start, stop):
        x, y = _batch(rank, step, model)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def ddp_train(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Train a few steps with DDP (+ hook per ``spec``).

    ``save_at=k, path=P``: write a checkpoint (model, optimizer, hook state) to ``P.rank<N>`` after step k and
    stop. ``resume_from=P, resume_at=k``: a new process (a new model, DDP and state) loads it and trains
    steps k.. (``torch.load(weights_only=True)``: the hook's state is plain types).
    """
    _init(rank, world)
    steps = spec.get("steps", 6)
    model = spec.get("model", "cnn")
    ddp, state, opt, seen = _make(spec)
    out: dict[str, Any] = {}
    start = 0
    if spec.get("resume_from"):
        ckpt = torch.load(f"{spec['resume_from']}.rank{rank}", weights_only=True)
        ddp.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        state.load_state_dict(ckpt["hook"])
        start = spec["resume_at"]
    stop = spec.get("save_at", steps)
    _steps(ddp, opt, rank, start, stop, model)
    if spec.get("save_at") is not None:
        torch.save({"model": ddp.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()},
                   f"{spec['path']}.rank{rank}")
    out["params"] = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    out["buckets"] = len(seen) if state is not None else None
    if state is not None and state.error_feedback is not None:
        out["residual"] = _applied_residual(state, list(ddp.parameters()), world)
    return out


def fused_train(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`ddp_train` counting the exchange's collectives (all_to_all: one per compressed exchange)."""
    counts = {"all_to_all_single": 0, "all_gather": 0}
    for name in counts:
        real = getattr(dist, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(dist, name, counted)
    out = ddp_train(rank, world, spec)
    out["collectives"] = counts
    return out


def _applied_residual(state, params: list[torch.Tensor], world: int) -> torch.Tensor:
    """What the local correction has added to this rank's updates in total, in parameter order:
    the worker residual, plus ``world`` times the server residual on the chunk this rank serves."""
    ef = state.error_feedback
    where = {}  # segment name -> its slice of the flat parameter vector
    offset = 0
    for p in params:
        where[state.names.name(p)] = (offset, p.numel())
        offset += p.numel()
    total = torch.zeros(offset)
    for key in ef.keys():
        r = ef.residual(key)
        start, count = key.chunk if key.chunk is not None else (0, key.total)
        scale = 1.0 if key.chunk is None else float(world)
        at = 0
        for name, numel in key.segments:  # the part of [start, start + count) inside each segment
            lo, hi = max(at, start), min(at + numel, start + count)
            if lo < hi:
                dst, _ = where[name]
                total[dst + lo - at: dst + hi - at] += scale * r[lo - start: hi - start]
            at += numel
    return total


def hook_returns_future(rank: int, world: int) -> dict[str, Any]:
    """Call the hook on a fake bucket directly: it must return a Future before waiting."""
    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    _init(rank, world)

    state = CompressionState("onebit", warmup_iters=0, min_compress_numel=0)
    results = []
    for step in range(2):
        t = _rank_tensor(rank, 4097, seed=step)
        fut = compression_hook(state, _FakeBucket(t))
        results.append(type(fut).__name__)
        value = fut.wait()
        results.append(bool(value.data_ptr() == t.data_ptr()))
    return {"results": results, "step": state.step}


def nonfinite_one_tensor(rank: int, world: int, name: str) -> dict[str, Any]:
    """A NaN on rank 0 in one tensor: that result shows it, the other tensor is unaffected."""
    from gradwire.compress import ErrorFeedback
    from gradwire.exchange import allreduce_compressed

    _init(rank, world)
    ef = ErrorFeedback()
    out = []
    for step in range(2):
        bad, good = _rank_tensor(rank, 1001, seed=step), _rank_tensor(rank, 1001, seed=10 + step)
        if rank == 0 and step == 0:
            bad[17] = float("nan")
        allreduce_compressed([bad, good], name, error_feedback=ef)
        out.append((bool(torch.isfinite(bad).all()), bool(torch.isfinite(good).all())))
    return {"finite": out}


def local_correction_steps(rank: int, world: int, name: str, steps: int, correct: bool,
                           plan: list[str] | None = None) -> dict[str, Any]:
    """The hook (no momentum) on one fixed bucket for a few steps: every rank's inputs and outputs.

    ``plan``: under ``auto``, the candidate each step uses (set by hand instead of measured).
    """
    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    _init(rank, world)
    state = CompressionState(name, warmup_iters=0, min_compress_numel=0, local_correction=correct)
    param = torch.zeros(4099)  # one identity for the bucket's parameters: the residuals persist
    if plan is not None:  # the plan chooses, not the chooser's probes (the first would decide at once)
        assert state.auto is not None
        state.auto._next_probe = steps + 1
    outs = []
    for step in range(steps):
        if plan is not None:
            assert state.auto is not None
            state.auto.choice[state.names.key([param])] = next(c for c in state.auto.candidates
                                                                if c.name == plan[step])
        t = _rank_tensor(rank, 4099, seed=step)
        bucket = _FakeBucket(t)
        bucket.parameters = lambda: [param]  # type: ignore[method-assign]
        outs.append(compression_hook(state, bucket).wait().clone())
    ins = [torch.stack([_rank_tensor(r, 4099, seed=step) for r in range(world)]) for step in range(steps)]
    return {"ins": ins, "outs": outs}


def overflow_steps(rank: int, world: int, compressor: str, steps: int, bad_step: int | None, bad_ranks: list[int],
                   drop_step: int | None = None, scaler: bool = False) -> dict[str, Any]:
    """DDP + the hook (momentum 0.9); at ``bad_step`` the loss of ``bad_ranks`` is multiplied by inf, and the
    optimizer step is skipped where the gradients are not finite (GradScaler's rule, or GradScaler itself).
    ``drop_step``: leave that batch out altogether (the reference of a skipped step)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    _init(rank, world)
    torch.manual_seed(0)
    model = mlp()
    ddp = DDP(model)
    state = CompressionState(compressor, momentum=0.9, min_compress_numel=0)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    amp = torch.amp.GradScaler("cpu", init_scale=1.0) if scaler else None
    out: dict[str, Any] = {"skipped": [], "finite_after": True}
    for step in range(steps):
        if step == drop_step:
            continue
        x, y = _batch(rank, step, "mlp")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        if step == bad_step and rank in bad_ranks:
            loss = loss * float("inf")
        if step == bad_step:
            out["before"] = state.local_state_dict()
        if amp is not None:
            amp.scale(loss).backward()
            amp.step(opt)
            amp.update()
            out["skipped"].append(step == bad_step and amp.get_scale() < 1.0)
        else:
            loss.backward()
            finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            if finite:
                opt.step()
            else:
                out["skipped"].append(step)
        if step == bad_step:
            out["after"] = state.local_state_dict()
        elif bad_step is not None and step > bad_step:
            out["finite_after"] &= all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    out["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return out


def auto_train(rank: int, world: int, net: str, steps: int, candidates: str = "") -> dict[str, Any]:
    """DDP under ``auto`` (one 131 k-element bucket): its decisions and parameters. On the gradwire backend
    with network ``net``; ``net="gloo"``: on plain gloo, where the link is measured by probes."""
    import gradwire
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradwire.exchange import CompressionState
    from gradwire.hooks import compression_hook

    torch.set_num_threads(1)
    if net != "gloo":
        gradwire.configure(net)
    dist.init_process_group("gloo" if net == "gloo" else "gradwire", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = nn.Linear(256, 512)
    ddp = DDP(model)
    state = CompressionState("auto" + (f":{candidates}" if candidates else "") + ":every=4", momentum=0.9)
    ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    target = torch.randn(512, 256, generator=torch.Generator().manual_seed(7))
    losses = []
    for step in range(steps):
        x = torch.randn(32, 256, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = (ddp(x) - x @ target.t()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert state.auto is not None
    out = {"summary": state.auto.summary(), "losses": losses,
           "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
           "residual": sum(float(state.error_feedback.residual(k).abs().sum()) for k in state.error_feedback.keys())
           if state.error_feedback is not None else 0.0}
    if net != "gloo":  # the probes' all_reduces of one element, in the network's log
        out["one_element_all_reduces"] = sum(1 for e in gradwire.events()
                                             if e.op == "all_reduce" and e.payload_bytes == 4)
    dist.destroy_process_group()
    return out


def auto_relaid(rank: int, world: int, second: list[list[int]], steps: int) -> dict[str, Any]:
    """``auto`` on a 10 Mbit/s model (compression wins by far there, whatever the host's coding costs) whose
    exchanges change layout after the first step, as DDP's rebuilt buckets do: step 0 sends parameters 0+1 and 2, every later step the buckets ``second`` (indices). Its summary, the
    layouts it holds a compressor for, and the last step's relative distance of each exchange from the exact mean
    (an uncompressed average is exact to rounding)."""
    import gradwire
    from gradwire.exchange import CompressionState

    torch.set_num_threads(1)
    gradwire.configure("bandwidth=10mbit")
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    params = [torch.zeros(n) for n in (40_000, 30_000, 50_000)]
    state = CompressionState("auto:every=50", momentum=0.0, fuse_numel=0)
    errors = []
    for step in range(steps):
        layout = [[0, 1], [2]] if step == 0 else second
        exchanges = []
        for i, bucket in enumerate(layout):
            mine = torch.cat([_rank_tensor(rank, params[j].numel(), seed=10 * step + j) for j in bucket])
            mean = torch.stack([torch.cat([_rank_tensor(r, params[j].numel(), seed=10 * step + j) for j in bucket])
                                for r in range(world)]).mean(0)
            exchanges.append((state.reduce_params(mine, [params[j] for j in bucket], last=i == len(layout) - 1)[1],
                              mean))
        state.end_step()
        errors = [float((fut.wait() - mean).norm() / mean.norm()) for fut, mean in exchanges]
    assert state.auto is not None
    out = {"summary": state.auto.summary(), "compressed": sorted(str(k) for k in state.auto.choice),
           "errors": errors}
    dist.destroy_process_group()
    return out


def momentum_average(rank: int, world: int) -> dict[str, Any]:
    """``none`` with the state's momentum: each step's result and the momentum, with what plain gloo gives for
    the same arithmetic (every rank's ``x + beta m``, divided by the world size, summed). At step 1 rank 0's
    vector holds an inf: its momentum must stay."""
    from gradwire.compress import StateKey
    from gradwire.exchange import CompressionState

    _init(rank, world)
    state = CompressionState("none", momentum=0.5, warmup_iters=0)
    key = StateKey.of("p0", 1001)
    m = torch.zeros(1001)
    out = []
    for step in range(3):
        x = _rank_tensor(rank, 1001, seed=step)
        if rank == 0 and step == 1:
            x[5] = float("inf")
        sent = torch.add(x, m, alpha=0.5)
        finite = bool(torch.isfinite(sent).all())
        rows = [torch.empty(1001) for _ in range(world)]
        dist.all_gather(rows, sent / world)
        want = sum(rows[1:], rows[0])
        got = state.reduce(x.clone(), key).wait()
        if finite:
            m = sent
        kept = state.momentum_buffers.buffer(key, torch.zeros(1001))
        out.append({"equal": bool(torch.equal(got, want)) if finite else not bool(torch.isfinite(got).all()),
                    "momentum_equal": bool(torch.equal(kept, m))})
    return {"steps": out}
