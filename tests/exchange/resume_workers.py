"""Rank functions for tests/exchange/test_resume.py: an uninterrupted run against an interrupted and resumed one.

:func:`serve` keeps two ranks alive across many examples (a property test
would otherwise pay a process start per example): it reads specs from its
queue, runs :func:`example` and :func:`~gradwire.launch.report`\\ s the result.
:func:`resume_from_files` is the resumed half in new processes.

A spec names the model, DDP's ``bucket_cap_mb``, the compressor, the scheme
(``hook``: the state's momentum and SGD without it; ``sgd``: ``scheme_for``
of SGD with momentum and decay; ``adamw``: ``scheme_for`` of AdamW, its
variance refreshed and followed every step), the warm-up, the number of steps,
the step after which the checkpoint is written, how the resumed run loads
(``after``: the model after ``DDP(...)``; ``before_ddp``: into the module,
then ``DDP(module)``, which broadcasts rank 0's parameters, as PyTorch's
tutorials do; ``init_sync``: into the module, then ``DDP(module,
init_sync=False)``; ``opt_first``: the optimizer before ``scheme_for``) and
which file (``own``: each rank saves its checkpoint; ``rank0``: rank 0
alone saves, as users write it, and every rank loads that one). The exchange's
``state_dict()`` gathers every rank's part, so both are exact. ``resume_cap``:
the resumed run's ``bucket_cap_mb``, when it differs (a warning says so).
"""
from __future__ import annotations

import datetime
import io
import queue
import time
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def tanh_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))


def deep_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 64))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 4 * 4, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.tanh(self.conv(x.view(-1, 1, 8, 8))), 2)
        return self.fc(x.flatten(1))


MODELS: dict[str, Callable[[], nn.Module]] = {"tanh": tanh_mlp, "deep": deep_mlp, "cnn": SmallCNN}


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)


class Run:
    """One training run of ``spec`` on this rank: model, DDP, optimizer, exchange and scheme."""

    def __init__(self, spec: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
        from gradwire.exchange import CompressionState, scheme_for
        from gradwire.hooks import compression_hook, scheme_hook

        torch.manual_seed(0)
        model = MODELS[spec["model"]]()
        load = spec.get("load", "after")
        if checkpoint is not None and load in ("init_sync", "before_ddp"):
            model.load_state_dict({k.removeprefix("module."): v for k, v in checkpoint["model"].items()})
        cap = spec["cap"] if checkpoint is None else spec.get("resume_cap", spec["cap"])
        kwargs: dict[str, Any] = {} if cap is None else {"bucket_cap_mb": cap}
        if checkpoint is not None and load == "init_sync":
            kwargs["init_sync"] = False
        self.ddp = DDP(model, **kwargs)
        self.model = model
        scheme, warmup = spec["scheme"], spec["warmup"]
        self.state = CompressionState(spec["compressor"], momentum=0.9 if scheme == "hook" else 0.0,
                                      warmup_iters=warmup, min_compress_numel=spec.get("min_numel", 0))
        if scheme == "adamw":
            self.opt: torch.optim.Optimizer = torch.optim.AdamW(self.ddp.parameters(), lr=3e-3, weight_decay=0.01)
        else:
            self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.05, momentum=0.0 if scheme == "hook" else 0.9,
                                       weight_decay=0.0 if scheme == "hook" else 1e-3)
        if checkpoint is not None and load == "opt_first":
            self.opt.load_state_dict(checkpoint["opt"])
        self.scheme = None
        if scheme == "hook":
            self.ddp.register_comm_hook(self.state, compression_hook)
        else:
            self.scheme = scheme_for(self.opt, self.state, adam_warmup=max(1, warmup), track_every=1)
            self.ddp.register_comm_hook(self.scheme, scheme_hook)
        if checkpoint is not None:
            if load not in ("init_sync", "before_ddp"):
                self.ddp.load_state_dict(checkpoint["model"])
            if load != "opt_first":
                self.opt.load_state_dict(checkpoint["opt"])
            if self.scheme is not None:
                self.scheme.load_state_dict(checkpoint["exchange"])
            else:
                self.state.load_state_dict(checkpoint["exchange"])

    def train(self, rank: int, start: int, stop: int) -> None:
        for step in range(start, stop):
            x, y = _batch(rank, step)
            self.opt.zero_grad()
            nn.functional.mse_loss(self.ddp(x), y).backward()
            if self.scheme is not None:
                self.scheme.step()
            else:
                self.opt.step()

    def checkpoint(self) -> dict[str, Any]:
        exchange = self.scheme.state_dict() if self.scheme is not None else self.state.state_dict()
        return {"model": self.ddp.state_dict(), "opt": self.opt.state_dict(), "exchange": exchange}

    def result(self) -> dict[str, Any]:
        return {"params": [p.detach().clone() for p in self.model.parameters()], "state": self.checkpoint()}


def _roundtrip(checkpoint: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def example(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Uninterrupted, then interrupted at ``save`` and resumed in this process (and saved to ``path``, if given)."""
    straight = Run(spec)
    straight.train(rank, 0, spec["steps"])
    first = Run(spec)
    first.train(rank, 0, spec["save"])
    ckpt = first.checkpoint()  # a collective: every rank calls it
    rank0 = spec.get("file") == "rank0"
    if spec.get("path") and (rank == 0 or not rank0):
        torch.save(ckpt, f"{spec['path']}.rank{rank}")
    del first
    if rank0:  # one snapshot, rank 0's, loaded by every rank
        shared = [ckpt]
        dist.broadcast_object_list(shared, src=0)
        ckpt = shared[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Run(spec, _roundtrip(ckpt))
        resumed.train(rank, spec["save"], spec["steps"])
    return {"straight": straight.result(), "resumed": resumed.result(),
            "warnings": [str(w.message) for w in caught if "CompressionState resumed" in str(w.message)]}


def _init(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))


def serve(rank: int, world: int, tasks: list[Any]) -> str:
    """Run the examples put on ``tasks[rank]`` until None arrives; report ``(id, result)`` for each."""
    from gradwire.launch import report

    _init(rank, world)
    while True:
        try:
            spec = tasks[rank].get(timeout=300)
        except queue.Empty:
            return "idle"
        if spec is None:
            return "done"
        report((spec["id"], example(rank, world, spec)))


def resume_from_files(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """New processes: load this rank's checkpoint from ``spec['path']`` and train to the end."""
    _init(rank, world)
    saver = 0 if spec.get("file") == "rank0" else rank
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Run(spec, torch.load(f"{spec['path']}.rank{saver}", weights_only=True))
        resumed.train(rank, spec["save"], spec["steps"])
    return {**resumed.result(),
            "warnings": [str(w.message) for w in caught if "CompressionState resumed" in str(w.message)]}


def lonely_state_dict(rank: int, world: int, scheme: str) -> str:
    """Rank 0 alone calls ``state_dict()`` (inside ``if rank == 0:``); it must raise, not hang. Returns the error."""
    from gradwire.exchange import CheckpointError

    _init(rank, world)
    run = Run({"model": "tanh", "cap": None, "compressor": "onebit", "scheme": scheme, "warmup": 1})
    run.train(rank, 0, 2)
    if rank != 0:
        time.sleep(3.0)  # alive, busy elsewhere: rank 0's wait must end by its timeout
        return ""
    try:
        run.scheme.state_dict(timeout=1.0) if run.scheme is not None else run.state.state_dict(timeout=1.0)
    except CheckpointError as exc:
        return str(exc)
    return "no error"
