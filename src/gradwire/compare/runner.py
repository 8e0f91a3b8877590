"""Run the comparison: one multi-process training run per (network, strategy).

Every run starts fresh processes, initialises the ``gradwire`` backend on its
network and trains the model once per seed with the same data order
(:func:`gradwire.train.loop.train_rank`); seeds share the run's processes, so
the start-up cost is paid once per strategy. The ``compute-only`` run is
``sync`` on ``loopback``: the same work with no modelled network cost.

A run that fails (a rank raised, or the run timed out) is recorded with the
rank's traceback and the comparison goes on; results are written to
``results.json`` after every run, so nothing finished is lost. An earlier
comparison in the same folder is moved to ``previous-<time>/``, not overwritten.
"""
from __future__ import annotations

import datetime
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from gradwire._files import keep_previous
from gradwire.compare.config import COMPUTE_ONLY, CompareConfig

__all__ = ["run_compare", "run_one"]


def _rank(rank: int, world: int, net: str, configs: list) -> list[dict]:
    """One rank of a run: every seed of one strategy on one network."""
    import torch
    import torch.distributed as dist

    import gradwire
    from gradwire.train.loop import train_rank

    torch.set_num_threads(1)
    gradwire.configure(net)
    dist.init_process_group("gradwire", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    out = []
    for cfg in configs:
        r = train_rank(cfg)
        out.append(_summarise(r))
    return out


def _summarise(r: Any) -> dict:
    """What the report needs from one rank's RunResult (small enough to pickle quickly)."""
    return {
        "seed": r.config["seed"], "epoch_seconds": r.epoch_seconds, "epoch_accuracy": r.epoch_accuracy,
        "step_seconds": r.step_seconds, "step_compute": r.step_compute, "step_exposed": r.step_exposed,
        "step_comm_model": r.step_comm_model, "collectives": r.collectives, "test_accuracy": r.test_accuracy,
        "wire_bytes": r.stats.get("total", {}).get("wire_bytes", 0),
        "payload_bytes": r.stats.get("total", {}).get("payload_bytes", 0),
        "stats": r.stats, "param_checksum": r.param_checksum, "num_parameters": r.num_parameters,
    }


def run_one(cfg: CompareConfig, net: str, strategy: str) -> dict:
    """Train ``strategy`` on ``net`` for every seed in one multi-process run."""
    from gradwire.launch import RankError, spawn
    from gradwire.train.loop import TrainConfig

    name = strategy
    train_strategy, train_net = ("sync", "loopback") if strategy == COMPUTE_ONLY else (strategy, net)
    configs = [TrainConfig(strategy=train_strategy, net=train_net, model=cfg.model, seed=s, epochs=cfg.epochs,
                           batch_size=cfg.batch_size, lr=cfg.lr) for s in cfg.seeds]
    t0 = time.perf_counter()
    try:
        ranks = spawn(_rank, cfg.workers, (train_net, configs), timeout=cfg.timeout)
    except (RankError, TimeoutError) as exc:
        return {"strategy": name, "net": net, "ok": False, "error": str(exc), "seconds": time.perf_counter() - t0}
    # every rank trained in lockstep; rank 0 speaks for the run, the others confirm agreement
    seeds = ranks[0]
    agree = all(abs(r[i]["param_checksum"] - seeds[i]["param_checksum"]) <= 1e-6 * max(1.0, abs(seeds[i]["param_checksum"]))
                for r in ranks for i in range(len(seeds)))
    return {"strategy": name, "net": net, "ok": True, "ranks_agree": agree, "seeds": seeds,
            "seconds": time.perf_counter() - t0}


#: what a comparison writes into its folder
OUTPUTS = ("results.json", "table.md", "accuracy.png", "breakdown.png")


def run_compare(cfg: CompareConfig, on_run: Callable[[dict], None] | None = None) -> dict:
    """Run every (net, strategy) plus one compute-only run; save results.json as runs finish."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    keep_previous(out, OUTPUTS)
    path = out / "results.json"
    results: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                     "started": datetime.datetime.now().isoformat(timespec="seconds"), "runs": []}
    plan = [(cfg.nets[0], COMPUTE_ONLY)] + [(net, s) for net in cfg.nets for s in cfg.strategies]
    for net, strategy in plan:
        run = run_one(cfg, net, strategy)
        results["runs"].append(run)
        path.write_text(json.dumps(results, indent=1))
        if on_run is not None:
            on_run(run)
    return results
